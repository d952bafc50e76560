"""The device's synchronisation and clock, written once for every family (inference, training, the base specs).

``synchronize(device)`` waits for the work queued on a device (or on one of its streams); ``device_clock(device)``
times the device itself: its timing events where its torch module has them (CUDA, XPU, NPU ...), the host
clock otherwise (the CPU, where host and device are one). Nothing here names a vendor: the device's own torch
module (``torch.get_device_module``) is asked.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch


def device_module(device: torch.device | str) -> Any | None:
    """The device's torch module (torch.cuda, torch.xpu ...); None for the CPU, which has no queue to wait for."""
    device = torch.device(device)
    return None if device.type == "cpu" else torch.get_device_module(device.type)


def synchronize(device: torch.device | str, stream: Any | None = None) -> None:
    """Wait until the work queued on ``device`` is done; with ``stream``, only that stream's (a round's own
    stream, say: other streams' work is not waited for). A device without an index is the current one."""
    if stream is not None:
        stream.synchronize()
        return
    device = torch.device(device)
    module = device_module(device)
    if module is None:
        return
    if device.index is None:
        module.synchronize()  # every device module takes this form (MPS takes no device at all)
    else:
        module.synchronize(device)


def current_stream(device: torch.device | str) -> Any | None:
    """The stream torch queues work on for ``device`` in this thread; None where the device has no streams."""
    module = device_module(device)
    if module is None or not hasattr(module, "current_stream"):
        return None
    return module.current_stream(torch.device(device))


class Clock(Protocol):
    """Marks placed between pieces of work; ``seconds`` between two marks is valid once the device is
    synchronised."""

    name: str

    def mark(self) -> Any: ...

    def seconds(self, start: Any, end: Any) -> float: ...


class HostClock:
    name = "host clock (time.perf_counter)"

    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, start: float, end: float) -> float:
        return end - start


class EventClock:
    """Timing events recorded on the device's current stream: the time the device spent between two marks,
    not the time the host waited for it (the host may run ahead, queueing the next work)."""

    def __init__(self, device: torch.device | str) -> None:
        device = torch.device(device)
        self.module = torch.get_device_module(device.type)
        self.name = f"{device.type} events ({self.module.__name__}.Event, current stream)"

    def mark(self) -> Any:
        event = self.module.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1e3  # elapsed_time is in milliseconds


def device_clock(device: torch.device | str) -> Clock:
    """Device events where the device's torch module has them (CUDA, XPU, NPU ...); the host clock otherwise."""
    module = device_module(device)
    if module is not None and hasattr(module, "Event"):
        return EventClock(device)
    return HostClock()
