"""What the NVIDIA vendor's NVML readers share (monitor_nvml.py, health.py): the clock-event reason bits and how one
query is made. Importing it does nothing else: the probe loads it beside its own modules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

THROTTLE_REASONS = {  # NVML clocks-event reason bits (nvml.h)
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# The current name first; the older one for bindings and drivers from before the rename.
CLOCK_EVENT_QUERIES = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")


def call(fn: Any, *args: Any) -> Any:
    """One query, None when it fails (the monitor's way: one unsupported query on one GPU must not stop the others)."""
    try:
        value = fn(*args)
    except Exception:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else value  # old bindings return bytes


def clock_event_reasons(pynvml: Any, handle: Any, query: Callable[..., Any] = call) -> int | None:
    """The active clock-event (throttle) reasons; None when the driver cannot say (never 'none active').
    ``query``: how each NVML call is made (call, or the health probe's, which tells errors apart)."""
    for name in CLOCK_EVENT_QUERIES:
        fn = getattr(pynvml, name, None)
        if fn is not None and (value := query(fn, handle)) is not None:
            return int(value)
    return None
