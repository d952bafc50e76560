"""Build cublaslt_gemm with nvcc, against cuBLASLt from wherever this host has it.

    python build.py OUTPUT

cuBLASLt is looked for in the CUDA toolkit nvcc belongs to, CUDA_HOME, /usr/local/cuda*,
FLAGPERF_CUBLAS_ROOT and the pip wheels a CUDA torch brings (nvidia/cu13, nvidia/cublas). The first
folder pair with cublasLt.h and a libcublasLt is used; its library folder goes into the program's run
path, so the program runs without LD_LIBRARY_PATH. FLAGPERF_NVCC_ARCH overrides -arch=native (for a
build host without the GPU). Exits 1 with one line on stderr when nvcc or cuBLASLt is missing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent


def roots() -> Iterator[Path]:
    nvcc = shutil.which("nvcc")
    if nvcc:
        yield Path(nvcc).resolve().parents[1]
    for var in ("CUDA_HOME", "CUDA_PATH", "FLAGPERF_CUBLAS_ROOT"):
        if os.environ.get(var):
            yield Path(os.environ[var])
    # nvcc may be a wrapper script outside its toolkit (/usr/local/bin/nvcc): the usual install folders too.
    yield Path("/usr/local/cuda")
    yield from sorted(Path("/usr/local").glob("cuda-*"), reverse=True)
    for package in ("nvidia.cu13", "nvidia.cublas", "nvidia.cu12"):
        try:
            spec = importlib.util.find_spec(package)
        except ModuleNotFoundError:
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            yield Path(location)


def find_cublaslt() -> tuple[Path, Path, str] | None:
    """(include folder, library folder, library file name)."""
    for root in roots():
        for include in (root / "include", root / "targets" / "x86_64-linux" / "include",
                        root / "targets" / "sbsa-linux" / "include"):
            if not (include / "cublasLt.h").is_file():
                continue
            for lib in (root / "lib64", root / "lib", include.parent / "lib"):
                names = sorted(p.name for p in lib.glob("libcublasLt.so*")) if lib.is_dir() else []
                if names:
                    return include, lib, names[0]
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: build.py OUTPUT", file=sys.stderr)
        return 2
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        print("nvcc not found on PATH", file=sys.stderr)
        return 1
    found = find_cublaslt()
    if found is None:
        looked = ", ".join(str(r) for r in roots()) or "nowhere"
        print(f"cuBLASLt (cublasLt.h and libcublasLt.so) not found; looked in {looked}", file=sys.stderr)
        return 1
    include, lib, name = found
    arch = os.environ.get("FLAGPERF_NVCC_ARCH", "native")
    command = [nvcc, "-O3", "-std=c++17", f"-arch={arch}", "-I", str(include), "-L", str(lib),
               f"-Xlinker=-rpath={lib}", "-o", argv[0], str(HERE / "gemm.cu"), f"-l:{name}"]
    print(" ".join(command), file=sys.stderr)
    return subprocess.run(command, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
