"""Each NVIDIA GPU's health at the healthcheck, read through NVML (nvidia-ml-py) by the host probe before the host's
first round (vendor.yaml ``health_module``; the form is flagperf.results.devicehealth's). What operators read before
trusting a node, as nvidia-smi and DCGM's level-1 checks read it:

- the PCIe link: the width it trained at against the most the GPU and its slot allow (a link that came up at x8 of
  x16 moves host data at half the rate, for good); the generation is recorded, never judged here, since an idle GPU
  lowers its link speed to save power and raises it under load;
- row remapping (Ampere and later): rows waiting for a reset, and whether a remapping ever failed (a GPU to
  replace); page retirement pending (older GPUs);
- uncorrected ECC errors since the driver loaded and over the GPU's life;
- hardware slowdown active while idle (HW slowdown, HW thermal or power-brake slowdown: nothing the workload did);
- the PCIe replay count (link-level retransmissions since the driver loaded);
- a GPU NVML counts but cannot open (fallen off the bus, XID 79).

A figure a GPU or driver does not report is null, never 0. Without NVML (the package, the driver, or the GPUs
missing) the answer says why and reads nothing.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

from flagperf.errors import missing_extra

HW_SLOWDOWN = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


def _monitor() -> ModuleType:
    """The NVML monitor of this folder, whose readers (throttle reason bits, retirement) this probe shares."""
    spec = importlib.util.spec_from_file_location("flagperf_vendor_nvidia_monitor_nvml",
                                                  Path(__file__).with_name("monitor_nvml.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _lanes_missing(width: int | None, width_max: int | None) -> int | None:
    if width is None or width_max is None or width_max <= 0:
        return None
    return max(0, width_max - width)


def _flag(value: Any) -> int | None:
    return None if value is None else int(bool(value))


def device_reading(raw: dict[str, Any]) -> dict[str, Any]:
    """One GPU's recorded NVML figures (read_raw) as the health reading's device: the figures the diagnosis
    compares under ``fields``, names and lists under ``facts``."""
    rows = raw.get("remapped_rows")  # (correctable, uncorrectable, pending, failed), or None before Ampere
    correctable, uncorrectable, rows_pending, rows_failed = rows if rows is not None else (None, None, None, None)
    pages_pending = _flag(raw.get("retired_pages_pending"))
    pending_parts = [v for v in (_flag(rows_pending), _flag(rows_failed), pages_pending) if v is not None]
    reasons = raw.get("clock_event_reasons")
    fields: dict[str, float | None] = {
        "pcie_link_width": raw.get("pcie_link_width"),
        "pcie_link_width_max": raw.get("pcie_link_width_max"),
        "pcie_width_lanes_missing": _lanes_missing(raw.get("pcie_link_width"), raw.get("pcie_link_width_max")),
        "pcie_link_gen": raw.get("pcie_link_gen"),
        "pcie_link_gen_max": raw.get("pcie_link_gen_max"),
        "pcie_replay_count": raw.get("pcie_replay_count"),
        "remapped_rows_correctable": correctable,
        "remapped_rows_uncorrectable": uncorrectable,
        "row_remap_failed": _flag(rows_failed),
        # The monitor's field of the same name: 1 when rows or pages wait for a reset, or a remapping failed.
        "retirement_pending": max(pending_parts) if pending_parts else None,
        "ecc_uncorrected": raw.get("ecc_uncorrected_volatile"),
        "ecc_uncorrected_aggregate": raw.get("ecc_uncorrected_aggregate"),
        "hw_slowdown_idle": None if reasons is None else int(any(r in HW_SLOWDOWN for r in reasons)),
        "unreachable": 0,
    }
    facts = {key: raw[key] for key in ("name", "pci_bus_id", "serial") if raw.get(key) is not None}
    if reasons is not None:
        facts["clock_event_reasons"] = list(reasons)
    return {"index": int(raw["index"]), "uuid": raw.get("uuid"), "fields": fields, "facts": facts}


def unreachable_reading(index: int, error: str) -> dict[str, Any]:
    """A GPU NVML counts but cannot open: every figure unknown, and ``unreachable`` 1."""
    fields = {name: None for name in device_reading({"index": index})["fields"]} | {"unreachable": 1}
    return {"index": index, "uuid": None, "fields": fields, "facts": {"error": error[:300]}}


def read_raw(pynvml: Any, monitor: ModuleType, index: int, handle: Any) -> dict[str, Any]:
    """What NVML tells of one GPU, each query on its own (one the GPU does not support is None)."""
    call = monitor._call
    bits = monitor._clock_event_reasons(pynvml, handle)
    rows = call(pynvml.nvmlDeviceGetRemappedRows, handle) if hasattr(pynvml, "nvmlDeviceGetRemappedRows") else None
    pages = call(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, handle) \
        if rows is None and hasattr(pynvml, "nvmlDeviceGetRetiredPagesPendingStatus") else None
    pci = call(pynvml.nvmlDeviceGetPciInfo, handle)
    bus = getattr(pci, "busId", None) if pci is not None else None
    return {
        "index": index,
        "uuid": call(pynvml.nvmlDeviceGetUUID, handle),
        "name": call(pynvml.nvmlDeviceGetName, handle),
        "serial": call(pynvml.nvmlDeviceGetSerial, handle),
        "pci_bus_id": bus.decode(errors="replace") if isinstance(bus, bytes) else bus,
        "pcie_link_width": call(pynvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
        "pcie_link_width_max": call(pynvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
        "pcie_link_gen": call(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
        "pcie_link_gen_max": call(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
        "pcie_replay_count": call(pynvml.nvmlDeviceGetPcieReplayCounter, handle),
        "remapped_rows": None if rows is None else [int(v) for v in rows],
        "retired_pages_pending": pages,
        "ecc_uncorrected_volatile": call(pynvml.nvmlDeviceGetTotalEccErrors, handle,
                                         pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
        "ecc_uncorrected_aggregate": call(pynvml.nvmlDeviceGetTotalEccErrors, handle,
                                          pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
        "clock_event_reasons": None if bits is None else [name for bit, name in monitor.THROTTLE_REASONS.items()
                                                          if bits & bit],
    }


def device_health(settings: dict[str, Any]) -> dict[str, Any]:
    """Every GPU of the host (NVML's indices: all of them, whatever a round's visible-devices variable narrows)."""
    monitor = _monitor()
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # the package, the driver, or the GPUs are missing
        missing = missing_extra(exc) if isinstance(exc, ImportError) else None
        reason = f"NVML unavailable: {missing}" if missing is not None else \
            f"NVML unavailable: {type(exc).__name__}: {exc}"
        return {"available": False, "source": "NVML", "reason": reason, "devices": []}
    try:
        driver = monitor._call(pynvml.nvmlSystemGetDriverVersion)
        count = int(pynvml.nvmlDeviceGetCount())
        devices = []
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            except Exception as exc:  # e.g. NVML_ERROR_GPU_IS_LOST: fallen off the bus (XID 79), the worst finding
                devices.append(unreachable_reading(index, f"{type(exc).__name__}: {exc}"))
                continue
            devices.append(device_reading(read_raw(pynvml, monitor, index, handle)))
    finally:
        monitor._call(pynvml.nvmlShutdown)
    return {"available": True, "source": f"NVML, driver {driver}" if driver else "NVML", "devices": devices}
