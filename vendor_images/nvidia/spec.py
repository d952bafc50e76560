"""Peaks of the visible NVIDIA GPU: datasheet figures by device name (datasheets.yaml), the capacity
from the device itself, and which precisions the architecture has at all (compute capability)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import yaml

UNITS = {"fp64": "TFLOPS", "fp32": "TFLOPS", "tf32": "TFLOPS", "bf16": "TFLOPS", "fp16": "TFLOPS", "int8": "TOPS",
         "fp8": "TFLOPS",
         "memory_bandwidth": "GB/s", "h2d_bandwidth": "GB/s", "d2h_bandwidth": "GB/s"}
# Minimum compute capability for each precision's tensor-core path used by the GEMM case.
MIN_CAPABILITY = {"tf32": (8, 0), "bf16": (8, 0), "fp16": (7, 0), "int8": (7, 5), "fp8": (8, 9)}


def _datasheet(name: str) -> dict[str, Any] | None:
    entries = yaml.safe_load((Path(__file__).parent / "datasheets.yaml").read_text())
    return next((e for e in entries if name in e["names"]), None)


def peaks_for(name: str, capability: tuple[int, int], total_bytes: int) -> dict[str, Any]:
    """The spec table of a GPU from its name, compute capability and memory (no device needed: tested on CPU)."""
    sheet = _datasheet(name)
    peaks: dict[str, Any] = {}
    for key, unit in UNITS.items():
        needed = MIN_CAPABILITY.get(key)
        if needed and capability < needed:
            peaks[key] = {"value": None, "unit": unit, "supported": False,
                          "source": f"{key} needs compute capability {needed[0]}.{needed[1]}, "
                                    f"{name} has {capability[0]}.{capability[1]}"}
        elif sheet is None:
            peaks[key] = {"value": None, "unit": unit,
                          "source": f"no datasheet entry matches {name!r}; add one to vendor_images/nvidia/"
                                    "datasheets.yaml"}
        elif sheet.get(key) is None:
            peaks[key] = {"value": None, "unit": unit,
                          "source": f"the datasheet entry for {name!r} has no {key} figure (datasheets.yaml)"}
        else:
            source = (sheet.get("sources") or {}).get(key) or sheet["source"]
            peaks[key] = {"value": float(sheet[key]), "unit": unit, "source": source, "dense": True}
    peaks["memory_capacity"] = {"value": total_bytes / 2**30, "unit": "GiB",
                                "source": "torch.cuda.mem_get_info total (what the driver exposes)"}
    return {"device": f"{name} (sm_{capability[0]}{capability[1]}, {total_bytes / 2**30:.1f} GiB)", "peaks": peaks}


def spec_table(settings: dict[str, Any]) -> dict[str, Any]:
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device is visible to torch")
    _, total = torch.cuda.mem_get_info(0)
    return peaks_for(torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0), total)
