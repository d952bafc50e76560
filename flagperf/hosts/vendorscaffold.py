"""`flagperf vendor new NAME`: a commented vendor folder that passes `flagperf vendor check` as written, with
every place a vendor fills in marked TODO (docs/vendor-guide.md walks through each file)."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from flagperf.config.adaptation import EXTERN_HOOKS
from flagperf.config.files import read_config_text
from flagperf.config.models import PEAK_UNITS, check_name
from flagperf.config.vendors import MANIFEST
from flagperf.errors import ConfigError
from flagperf.paths import PROJECT_ROOT, display_path

TODO = "TODO"  # what marks each place of the scaffold a vendor fills in (vendor check names those still marked)

VENDOR_YAML = """\
# The manifest of vendor {name} (docs/vendor-guide.md lists every key). Check with: flagperf vendor check {folder}
name: {name}                   # the folder's name; what --vendor and FlagPerf's VENDOR give
description: >-
  TODO: the chip, its software stack (driver, torch plug-in) and how it is monitored.
torch_device: {device}          # torch's device type for the chip (cuda, xpu, npu, ...: what torch.device() takes)
# true where the device allocates from host memory (a CPU, unified memory); false needs torch.<device>.mem_get_info()
shares_host_memory: {shares}
# hardware: {name}             # the <hw> of training scale files config_<hw>x<nnodes>x<nproc>.yaml (default: the name)
spec_module: spec.py           # spec_table(settings) -> the peak table, every figure with its source
spec_settings: {{}}              # handed to spec_table (e.g. a clock the device cannot report)
monitors:
  - name: system               # the host's CPU, memory, power (shared by every vendor)
    module: flagperf.monitoring.system
  - name: {name}
    script: monitor_{name}.py
container:
  dockerfile: pytorch/Dockerfile
  shm_size: 16g
  # visible_devices_env: {env}   # the variable that narrows the devices of a round
  # devices: [/dev/{name}0]        # device files passed into the container
  # device_patterns: ["/dev/{name}*"]  # device files an inventory may pass for this vendor (ACCE_CONTAINER_OPT)
  # device_requests: []            # docker's --gpus equivalent, where the vendor has a device plug-in
  # ulimits: {{memlock: -1}}          # RDMA registration, as FlagPerf's docker run sets it
"""

SPEC_PY = '''\
"""Peaks of vendor {name}'s chip: datasheet figures, each with its source (flagperf vendor check holds each
figure to one). value None is an unknown figure; supported False is a precision the chip cannot do at all."""

from __future__ import annotations

from typing import Any

DATASHEET = "TODO: the datasheet's title, revision and table (dense figures, not 2:4-sparse ones)"
# key -> (value or None, unit). The keys are the ones cases read, each in the one unit written here (vendor check
# and a run refuse another: convert GFLOPS, TB/s or GB); a figure not known yet stays None. The comment says
# which figure of the datasheet it is, as the case that reads it counts (docs/vendor-guide.md).
FIGURES: dict[str, tuple[float | None, str]] = {{
{figures}
}}
UNSUPPORTED: dict[str, str] = {{}}  # key -> why the chip cannot do it, e.g. "tf32": "no TF32 matrix unit"


def spec_table(settings: dict[str, Any]) -> dict[str, Any]:
    peaks: dict[str, Any] = {{}}
    for key, (value, unit) in FIGURES.items():
        if key in UNSUPPORTED:
            peaks[key] = {{"value": None, "unit": unit, "supported": False, "source": UNSUPPORTED[key]}}
        else:
            peaks[key] = {{"value": value, "unit": unit, "source": DATASHEET if value is not None else
                          "TODO: not filled in from the datasheet yet"}}
    return {{"device": "TODO: the device name as the driver reports it", "peaks": peaks}}
'''

# Which datasheet figure each spec-table key is, as the case that reads it counts (the scaffold's comments; the
# table in docs/vendor-guide.md says the same). Every key of PEAK_UNITS has one (tests/unit/test_vendor_walk.py).
PEAK_FIGURES = {
    "fp64": "GEMM: the matrix-unit figure where the chip has one, dense",
    "fp32": "GEMM without TF32 (the case turns it off): the plain FP32 figure",
    "tf32": "GEMM on the TF32 matrix unit, dense",
    "bf16": "GEMM, dense: a 2:4-sparse headline figure is twice the dense one",
    "fp16": "GEMM, dense",
    "fp8": "GEMM, dense",
    "int8": "GEMM, dense, in TOPS",
    "memory_bandwidth": "the datasheet's figure (a copy of N bytes counts 2N, read + write)",
    "memory_capacity": "the device's total as it reports it, bytes / 2^30 (a datasheet GB of it is GiB)",
    "h2d_bandwidth": "host to device, one direction (PCIe Gen5 x16: 64)",
    "d2h_bandwidth": "device to host, one direction",
    "p2p_bandwidth": "device to device on one host, one direction (half a bidirectional)",
    "allreduce_bandwidth": "all-reduce bus bandwidth (nccl-tests' busbw), one direction",
    "internode_bandwidth": "one device to one on another host, one direction (the NIC's Gb/s / 8)",
    "memory_side_cache": "a last-level cache on the memory side of the L2, which torch does not report; none: null",
}


def spec_figures() -> str:
    """The scaffold's FIGURES entries: every key a case reads, in its unit, with which figure it is."""
    entries = {key: f'"{key}": (None, "{unit}"),' for key, unit in PEAK_UNITS.items()}
    width = max(len(entry) for entry in entries.values())
    return "\n".join(f"    {entry:<{width}}  # {PEAK_FIGURES[key]}" for key, entry in entries.items())


MONITOR_PY = '''\
"""Monitor of vendor {name}'s devices: per device utilisation and memory (required), power and temperature
(recommended), as JSON lines (flagperf.monitoring). A round starts it with the project on PYTHONPATH.
Until read_devices() is filled in from the vendor's tool or library, it says so and exits (no samples)."""

from __future__ import annotations

from typing import Any

from flagperf.monitoring import monitor_arguments, run_sampler, write_unavailable


def read_devices() -> list[dict[str, Any]]:
    """One entry per device: index (int), util_percent, mem_used_bytes, mem_total_bytes, power_w, temp_c; a
    figure the tool cannot read is None, never 0."""
    raise NotImplementedError("monitor_{name}.py: read_devices() is still the template's; fill it in from the "
                              "vendor's tool or library")


def main() -> int:
    args = monitor_arguments(__doc__ or "").parse_args()
    try:
        first = read_devices()
    except Exception as exc:  # the tool or library is missing here: the header says why
        return write_unavailable("{name}", args, str(exc) or type(exc).__name__)
    header = {{"devices": [{{"index": d["index"]}} for d in first],
              "fields": {{"util_percent": "%", "mem_used_bytes": "B", "mem_total_bytes": "B", "power_w": "W",
                         "temp_c": "C"}}}}
    return run_sampler("{name}", args, header, lambda: {{"devices": read_devices()}})


if __name__ == "__main__":
    raise SystemExit(main())
'''

DOCKERFILE = """\
# The image vendor {name}'s cases run in (tagged by the content hash of this folder and the build args, built only
# when they change). It must have torch for the chip: the in-image probe refuses an image without it.
# TODO: BASE_IMAGE is the vendor's PyTorch image (its torch and torch plug-in for the chip). Until then a plain
# Python base: pytorch_install.sh puts the engine's CPU torch on it, so the image builds and passes the probe
# as written (an inventory may pass another base: docker.build_args.BASE_IMAGE).
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${{BASE_IMAGE}}
# One COPY and one RUN: on a storage driver without copy-on-write every instruction copies the whole image.
COPY requirements.txt pytorch_install.sh /opt/flagperf/
RUN bash /opt/flagperf/pytorch_install.sh
# The project is mounted read-only and put on PYTHONPATH at run time; the entry is
# `python3 -m flagperf.entry --job <job.json>`.
"""

INSTALL_SH = """\
#!/bin/bash
# FlagPerf's <framework>_install.sh: what the cases need on top of the base image.
set -euo pipefail
export PIP_NO_CACHE_DIR=1 PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# torch only where the base has none: a vendor's PyTorch image keeps its own torch and plug-in.
# TODO: drop this once BASE_IMAGE is the vendor's PyTorch image.
if ! python3 -c "import torch" 2>/dev/null; then
  python3 -m pip install --extra-index-url https://download.pytorch.org/whl/cpu "{torch_pin}"
fi
python3 -m pip install -r /opt/flagperf/requirements.txt
"""

REQUIREMENTS = """\
# What the engine imports inside the image (entry, probe, monitors); a package the base already has is kept.
# TODO: the vendor's own packages, and what its cases import (vendor_images/cpu/pytorch/requirements.txt lists
# the shipped cases' packages: scikit-learn for the digits cases, transformers, onnxruntime, ...).
{engine_requirements}
"""

README = """\
# Vendor {name}

TODO (FlagPerf asks each vendor for a README): the chip and its software (driver, firmware, torch plug-in
versions), how the image is built, and the monitor's fields. Results are the run folders of `flagperf run
--vendor {name}` (report.md, summary.csv): link the runs of each case at 1x1, 1x8 and 2x8.

## Adapting a case (docs/vendor-guide.md, section 2)

FlagPerf's `<model>-<framework>/` folder of a vendor is, for each case, inside the case:

    cases/<family>/<case>/vendor/{name}.yaml           the case's settings (its mutable keys only)
    cases/inference/<case>/vendor/{name}_configurations.yaml   an inference case's settings (compiler, ...)
    cases/<family>/<case>/vendor/{name}/
      config_{hardware}x<nnodes>x<nproc>.yaml   training: a scale's settings (FlagPerf's config_<hw>x<n>x<p>.py)
      environment_variables.sh   NAME=value lines, read as data (no config/ folder)
      requirements.txt           pip-installed before the case starts
      csrc/setup.py              operators, built before the case starts
      extern/hooks.py            the case's extension points ({hooks})

A vendor kept in its own repository (outside the project) may keep the files of cases/<family>/<case>/vendor/{name}/
in this folder instead, as cases/<family>/<case>/ here (e.g. cases/training/<case>/extern/hooks.py), and the
settings file by the same name beside them (cases/training/<case>/{name}.yaml, cases/inference/<case>/
{name}_configurations.yaml): never one of them in both places (refused). Link within this folder by relative paths
only (a clone of it, or a container, has the folder elsewhere).

Inference cases run through an engine of this folder: engines/<engine>/engine.yaml (start from
vendor_images/cpu/engines/). `flagperf vendor check {name}` reads every file of this vendor in the cases.
"""


# The engine's own imports inside an image (flagperf.entry, the probe, the monitors), unpinned: a vendor's base
# image keeps the versions its torch was built against.
ENGINE_PACKAGES = ("numpy", "pyyaml", "pydantic", "psutil", "orjson")
CPU_REQUIREMENTS = PROJECT_ROOT / "vendor_images" / "cpu" / "pytorch" / "requirements.txt"


def torch_pin() -> str:
    """The CPU image's torch pin (the lock's), so a scaffolded image measures with the torch the engine is
    tested with until the vendor's own base replaces it."""
    for line in read_config_text(CPU_REQUIREMENTS, what="the CPU image's requirements").splitlines():
        if re.fullmatch(r"torch==[A-Za-z0-9.+]+", line.split("#")[0].strip()):
            return line.split("#")[0].strip()
    raise ConfigError(display_path(CPU_REQUIREMENTS), "torch", "no torch==<version> line")


def write_vendor_folder(root: Path, name: str, torch_device: str = "cpu") -> Path:
    """Writes root/<name>/ (refused when it exists: nothing is overwritten); returns the folder."""
    try:
        check_name(name, "vendor name")
        check_name(torch_device, "torch device")
    except ValueError as exc:
        raise ConfigError("vendor new", None, str(exc)) from None
    folder = root / name
    if folder.exists() or folder.is_symlink():
        raise ConfigError(display_path(folder), None, "already exists; nothing was written")
    hooks = "; ".join(f"{family}: {', '.join(points)}" for family, points in EXTERN_HOOKS.items())
    values = {"name": name, "device": torch_device, "folder": display_path(folder), "hardware": name, "hooks": hooks,
              "shares": "true" if torch_device == "cpu" else "false", "env": f"{name.upper()}_VISIBLE_DEVICES",
              "torch_pin": torch_pin(), "engine_requirements": "\n".join(ENGINE_PACKAGES), "figures": spec_figures()}
    files = {MANIFEST: VENDOR_YAML, "spec.py": SPEC_PY, f"monitor_{name}.py": MONITOR_PY,
             "pytorch/Dockerfile": DOCKERFILE, "pytorch/pytorch_install.sh": INSTALL_SH,
             "pytorch/requirements.txt": REQUIREMENTS, "README.md": README}
    staging = root / f".{name}.new-{os.getpid()}"  # renamed into place whole: never a half-written folder
    missing = [p for p in (root.absolute(), *root.absolute().parents) if not p.exists()]  # innermost first
    try:
        for rel, template in files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(template.format(**values), encoding="utf-8")
        staging.rename(folder)
    except BaseException:  # a full disk, an interrupt: nothing stays, the folders made for it neither
        for path in sorted(staging.rglob("*"), reverse=True) if staging.exists() else []:
            path.rmdir() if path.is_dir() else path.unlink()
        if staging.exists():
            staging.rmdir()
        for made in missing:
            with contextlib.suppress(OSError):
                made.rmdir()
        raise
    return folder
