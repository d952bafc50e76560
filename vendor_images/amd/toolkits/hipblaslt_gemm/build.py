"""Build hipblaslt_gemm with hipcc against the ROCm installation hipcc belongs to.

    python build.py OUTPUT

hipBLASLt is looked for under ROCM_PATH, the ROCm folder of hipcc, and /opt/rocm*. The library folder goes
into the program's run path. FLAGPERF_HIP_ARCH overrides --offload-arch=native (for a build host without the
GPU, e.g. gfx942 for MI300X/MI325X, gfx950 for MI355X). Exits 1 with one line on stderr when hipcc or
hipBLASLt is missing. UNTESTED ON AMD HARDWARE.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent


def roots() -> Iterator[Path]:
    if os.environ.get("ROCM_PATH"):
        yield Path(os.environ["ROCM_PATH"])
    hipcc = shutil.which("hipcc")
    if hipcc:
        yield Path(hipcc).resolve().parents[1]
    yield Path("/opt/rocm")
    yield from sorted(Path("/opt").glob("rocm-*"), reverse=True)


def find_hipblaslt() -> tuple[Path, Path] | None:
    """(include folder, library folder) of the first ROCm tree with hipblaslt.h and libhipblaslt."""
    for root in roots():
        include = root / "include"
        if not (include / "hipblaslt" / "hipblaslt.h").is_file():
            continue
        for lib in (root / "lib", root / "lib64"):
            if lib.is_dir() and any(lib.glob("libhipblaslt.so*")):
                return include, lib
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: build.py OUTPUT", file=sys.stderr)
        return 2
    hipcc = shutil.which("hipcc")
    if hipcc is None:
        print("hipcc not found on PATH", file=sys.stderr)
        return 1
    found = find_hipblaslt()
    if found is None:
        looked = ", ".join(str(r) for r in roots())
        print(f"hipBLASLt (hipblaslt/hipblaslt.h and libhipblaslt.so) not found; looked in {looked}", file=sys.stderr)
        return 1
    include, lib = found
    arch = os.environ.get("FLAGPERF_HIP_ARCH", "native")
    command = [hipcc, "-O3", "-std=c++17", f"--offload-arch={arch}", "-I", str(include), "-L", str(lib),
               f"-Wl,-rpath,{lib}", "-o", argv[0], str(HERE / "gemm.hip"), "-lhipblaslt"]
    print(" ".join(command), file=sys.stderr)
    return subprocess.run(command, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
