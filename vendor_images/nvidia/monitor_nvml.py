"""NVML monitor for the nvidia vendor: per GPU utilisation, memory used and total, power, the
total-energy counter (relative to start), temperature, SM clock and the active throttle reasons; and the health
facts the fleet diagnosis reads (flagperf.results.diagnosis): uncorrected ECC errors (volatile: since the
driver loaded), XID critical-error events seen while it runs, and page retirement or row remapping pending.
A figure a GPU or driver does not report is null, never 0.

Uses nvidia-ml-py (NVML's Python binding), not nvidia-smi's human table. Where NVML cannot be used,
the header says why and the monitor exits at once (no samples, never zeros).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project root, for flagperf.monitoring
sys.path.insert(0, str(Path(__file__).resolve().parent))  # this folder, for nvml_common (a script has it unless -P)

from nvml_common import THROTTLE_REASONS, clock_event_reasons
from nvml_common import call as _call

from flagperf.errors import missing_extra
from flagperf.monitoring import monitor_arguments, run_sampler, write_unavailable


def retirement_pending(pynvml: Any, handle: Any) -> int | None:
    """1 when retired pages (pre-Ampere) or remapped rows (Ampere and later) wait for a GPU reset, or a row
    remapping failed; 0 when the GPU says none; None when it reports neither."""
    rows = _call(pynvml.nvmlDeviceGetRemappedRows, handle) if hasattr(pynvml, "nvmlDeviceGetRemappedRows") else None
    if rows is not None:
        _, _, pending, failed = rows
        return int(bool(pending) or bool(failed))
    pages = _call(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, handle) \
        if hasattr(pynvml, "nvmlDeviceGetRetiredPagesPendingStatus") else None
    return None if pages is None else int(bool(pages))


class XidEvents:
    """XID critical-error events per GPU index, counted from the monitor's start (an NVML event set polled
    without waiting at each sample); None for a GPU whose events cannot be registered."""

    def __init__(self, pynvml: Any, handles: dict[int, Any]) -> None:
        self.pynvml = pynvml
        self.counts: dict[int, int | None] = {i: None for i in handles}
        self.events = _call(pynvml.nvmlEventSetCreate)
        if self.events is None:
            return
        for index, handle in handles.items():
            try:
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self.events)
                self.counts[index] = 0
            except Exception:  # not supported on this GPU (or not as this user): unknown, not 0
                continue

    def poll(self, most: int = 1000) -> dict[int, int | None]:
        for _ in range(most if self.events is not None else 0):  # a storm of events cannot stall the sampling
            try:
                data = self.pynvml.nvmlEventSetWait_v2(self.events, 0)
            except Exception:  # NVML_ERROR_TIMEOUT: no event waiting
                break
            index = _call(self.pynvml.nvmlDeviceGetIndex, data.device)
            if index in self.counts and self.counts[index] is not None:
                self.counts[index] = int(self.counts[index] or 0) + 1
        return self.counts

    def close(self) -> None:
        if self.events is not None:
            _call(self.pynvml.nvmlEventSetFree, self.events)


def visible_indices(value: str | None, count: int) -> list[int]:
    """The GPUs the case can use, as NVML indices: CUDA_VISIBLE_DEVICES when it lists indices (the host
    sets CUDA_DEVICE_ORDER=PCI_BUS_ID, NVML's order), else every GPU. A host's other GPUs (idle, or someone
    else's job) must not count in this case's power, energy or utilisation."""
    if value is None or not value.strip():
        return list(range(count))
    try:
        indices = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:  # UUIDs or MIG names: sample everything rather than guess
        return list(range(count))
    return [i for i in indices if 0 <= i < count]


def main() -> int:
    parser = monitor_arguments(__doc__ or "")
    parser.add_argument("--devices", default=os.environ.get("CUDA_VISIBLE_DEVICES"),
                        help="comma-separated NVML indices (default: CUDA_VISIBLE_DEVICES, else all)")
    args = parser.parse_args()
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as exc:  # the package, the driver, or the GPUs are missing
        reason = f"NVML unavailable: {type(exc).__name__}: {exc}"
        missing = missing_extra(exc) if isinstance(exc, ImportError) else None
        if missing is not None:  # the package, not the driver: say how to install it
            reason = f"NVML unavailable: {missing}"
        return write_unavailable("nvml", args, reason)
    indices = visible_indices(args.devices, count)
    handles = [_call(pynvml.nvmlDeviceGetHandleByIndex, i) for i in indices]
    energy_start = {i: _call(pynvml.nvmlDeviceGetTotalEnergyConsumption, h) for i, h in zip(indices, handles,
                                                                                              strict=True)}
    header = {
        "driver": _call(pynvml.nvmlSystemGetDriverVersion),
        "devices": [{"index": i, "name": _call(pynvml.nvmlDeviceGetName, h), "uuid": _call(pynvml.nvmlDeviceGetUUID, h),
                     "serial": _call(pynvml.nvmlDeviceGetSerial, h),
                     "power_limit_w": (_call(pynvml.nvmlDeviceGetEnforcedPowerLimit, h) or 0) / 1000 or None,
                     "max_sm_clock_mhz": _call(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_SM)}
                    for i, h in zip(indices, handles, strict=True)],
        "fields": {"util_percent": "%", "mem_used_bytes": "B", "mem_total_bytes": "B", "power_w": "W",
                   "energy_j": "J since start (NVML total energy)", "temp_c": "C", "sm_clock_mhz": "MHz",
                   "throttle": "active clocks-event reasons",
                   "clock_event_bits": "the same as NVML's bitmask (names in throttle_bits)",
                   "ecc_uncorrected": "uncorrected ECC errors since the driver loaded (volatile)",
                   "xid_events": "XID critical-error events since the monitor started",
                   "retirement_pending": "1: retired pages or remapped rows wait for a reset (or remapping failed)"},
        # The analysis reads shares of the timed region per reason from the bitmask (flagperf.results.chipstate).
        "throttle_bits": {str(bit): name for bit, name in THROTTLE_REASONS.items()},
    }

    xid = XidEvents(pynvml, {i: h for i, h in zip(indices, handles, strict=True) if h is not None})

    def device_sample(i: int, h: Any, xids: dict[int, int | None]) -> dict[str, Any]:
        util = _call(pynvml.nvmlDeviceGetUtilizationRates, h)
        mem = _call(pynvml.nvmlDeviceGetMemoryInfo, h)
        power_mw = _call(pynvml.nvmlDeviceGetPowerUsage, h)
        energy_mj = _call(pynvml.nvmlDeviceGetTotalEnergyConsumption, h)
        start_mj = energy_start.get(i)
        reasons = clock_event_reasons(pynvml, h)
        return {
            "index": i,
            "util_percent": util.gpu if util else None,
            "mem_used_bytes": mem.used if mem else None,
            "mem_total_bytes": mem.total if mem else None,
            "power_w": power_mw / 1000 if power_mw is not None else None,
            "energy_j": (energy_mj - start_mj) / 1000 if energy_mj is not None and start_mj is not None else None,
            "temp_c": _call(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
            "sm_clock_mhz": _call(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM),
            "throttle": None if reasons is None else [name for bit, name in THROTTLE_REASONS.items() if reasons & bit],
            "clock_event_bits": reasons,
            "ecc_uncorrected": _call(pynvml.nvmlDeviceGetTotalEccErrors, h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                     pynvml.NVML_VOLATILE_ECC),
            "xid_events": xids.get(i),
            "retirement_pending": retirement_pending(pynvml, h),
        }

    def sample() -> dict[str, Any]:
        xids = xid.poll()
        return {"devices": [device_sample(i, h, xids) for i, h in zip(indices, handles, strict=True)
                            if h is not None]}

    try:
        return run_sampler("nvml", args, header, sample)
    finally:
        xid.close()
        _call(pynvml.nvmlShutdown)


if __name__ == "__main__":
    raise SystemExit(main())
