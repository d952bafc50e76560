"""Peaks of the visible AMD Instinct GPU: datasheet figures by device name (datasheets.yaml) and the capacity
from the device itself. ROCm torch presents HIP devices as torch's "cuda" device type; torch.version.hip
tells it apart from a CUDA build. UNTESTED ON AMD HARDWARE (docs/vendor-guide.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

UNITS = {"fp64": "TFLOPS", "fp32": "TFLOPS", "tf32": "TFLOPS", "bf16": "TFLOPS", "fp16": "TFLOPS", "int8": "TOPS",
         "fp8": "TFLOPS", "memory_bandwidth": "GB/s", "h2d_bandwidth": "GB/s", "d2h_bandwidth": "GB/s",
         "memory_side_cache": "MiB"}
DATASHEETS = Path(__file__).parent / "datasheets.yaml"


def datasheets() -> list[dict[str, Any]]:
    return list(yaml.safe_load(DATASHEETS.read_text(encoding="utf-8")))


def peaks_for(name: str, arch: str, total_bytes: int) -> dict[str, Any]:
    """The spec table of a GPU from its name, gfx architecture and memory (no device needed: tested on CPU)."""
    sheet = next((e for e in datasheets() if name in e["names"]), None)
    peaks: dict[str, Any] = {}
    for key, unit in UNITS.items():
        if sheet is None:
            peaks[key] = {"value": None, "unit": unit, "source": f"no datasheet entry matches {name!r}; add one to "
                                                                  "vendor_images/amd/datasheets.yaml"}
        elif sheet.get(key) is None:
            peaks[key] = {"value": None, "unit": unit, "supported": False,
                          "source": f"AMD's datasheet for {name} gives no dense {key} figure (datasheets.yaml)"}
        else:
            source = (sheet.get("sources") or {}).get(key) or sheet["source"]
            peaks[key] = {"value": float(sheet[key]), "unit": unit, "source": source, "dense": True}
    peaks["memory_capacity"] = {"value": total_bytes / 2**30, "unit": "GiB",
                                "source": "torch.cuda.mem_get_info total (what the HIP runtime exposes)"}
    return {"device": f"{name} ({arch}, {total_bytes / 2**30:.1f} GiB)", "peaks": peaks}


def spec_table(settings: dict[str, Any]) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available() or not getattr(torch.version, "hip", None):
        raise RuntimeError("no ROCm (HIP) device is visible to torch (torch.version.hip is unset or no device)")
    _, total = torch.cuda.mem_get_info(0)
    arch = str(getattr(torch.cuda.get_device_properties(0), "gcnArchName", "gfx?")).split(":")[0]
    return peaks_for(torch.cuda.get_device_name(0), arch, total)
