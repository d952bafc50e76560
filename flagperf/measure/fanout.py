"""Every device of a host: which devices there are, and how one process is narrowed to one of them.

A round that measures every device (``devices: all``) starts one process per device; each sees only its
own device, so a case's code is the same as on a one-device host:
- a vendor with a visible-devices variable (CUDA_VISIBLE_DEVICES ...) gets it set to that one device's id;
- a vendor that splits the CPU into logical devices (``logical_devices``) gets its process pinned to its
  share of the cores, with torch's threads to match;
- otherwise the process selects the device by index (``torch.<device>.set_device``).
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

import torch

from flagperf.config.vendors import VendorManifest
from flagperf.results.schema import DeviceSpread, Metric


@dataclass(frozen=True)
class DeviceSlot:
    index: int  # the host's device index
    visible: str | None = None  # the visible-devices value for this device's process
    cpus: tuple[int, ...] | None = None  # a CPU slice: the cores its process is pinned to

    @property
    def label(self) -> str:
        if self.cpus is not None:
            return f"CPUs {','.join(str(c) for c in self.cpus)}"
        return f"device {self.visible if self.visible is not None else self.index}"


def usable_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def cpu_slices(count: int, cpus: list[int]) -> list[tuple[int, ...]]:
    """``cpus`` dealt into ``count`` equal slices of neighbouring cores (the remainder to the first ones); with
    fewer cores than slices, slices share cores round-robin (the figures then say so by being lower)."""
    if len(cpus) < count:
        return [(cpus[i % len(cpus)],) for i in range(count)]
    size, extra = divmod(len(cpus), count)
    slices, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        slices.append(tuple(cpus[start:end]))
        start = end
    return slices


def host_devices(manifest: VendorManifest, environ: dict[str, str] | None = None) -> list[DeviceSlot]:
    """The devices of this host that a round can measure, in the vendor's order."""
    env = os.environ if environ is None else environ
    if manifest.logical_devices is not None:
        return [DeviceSlot(i, cpus=cpus) for i, cpus in enumerate(cpu_slices(manifest.logical_devices,
                                                                               usable_cpus()))]
    visible_env = manifest.container.visible_devices_env
    listed = [part.strip() for part in env.get(visible_env, "").split(",") if part.strip()] if visible_env else []
    listed = list(dict.fromkeys(listed))  # a device named twice is measured once
    module = torch.get_device_module(manifest.torch_device)
    count = int(module.device_count()) if module.is_available() else 0
    if listed:  # the host (or the inventory) already narrowed the devices: those are the host's devices here
        count = min(count, len(listed)) if count else len(listed)
        indices = [int(v) if v.isdigit() else i for i, v in enumerate(listed[:count])]
        if len(set(indices)) != len(indices):  # "1,GPU-..." would give two devices index 1 (one folder, one figure)
            indices = list(range(len(indices)))
        return [DeviceSlot(index, visible=v) for index, v in zip(indices, listed[:count], strict=True)]
    if visible_env:
        return [DeviceSlot(i, visible=str(i)) for i in range(max(count, 1))]
    return [DeviceSlot(i) for i in range(max(count, 1))]


def narrow_environment(manifest: VendorManifest, slot: DeviceSlot, env: dict[str, str]) -> dict[str, str]:
    """The environment of the process that measures ``slot``: its visible device, its thread count."""
    narrowed = dict(env)
    visible_env = manifest.container.visible_devices_env
    if visible_env and slot.visible is not None:
        narrowed[visible_env] = slot.visible
    if slot.cpus is not None:
        narrowed["OMP_NUM_THREADS"] = str(len(slot.cpus))
    return narrowed


def enter_device(manifest: VendorManifest, slot: DeviceSlot) -> None:
    """In the device's own process, before anything is measured: pin to the slice, or select the device."""
    if slot.cpus is not None:
        os.sched_setaffinity(0, slot.cpus)
        torch.set_num_threads(len(slot.cpus))
        return
    if slot.visible is None:
        module = torch.get_device_module(manifest.torch_device)
        if hasattr(module, "set_device"):
            module.set_device(slot.index)


def device_spread(metrics: list[Metric]) -> list[DeviceSpread]:
    """Per metric measured on several devices: the host's min, median and max, and the lowest device."""
    by_name: dict[str, list[Metric]] = {}
    for metric in metrics:
        if metric.device is not None:
            by_name.setdefault(metric.name, []).append(metric)
    spread = []
    for name, group in by_name.items():
        values = [m.value for m in group]
        lowest = min(group, key=lambda m: m.value)
        spread.append(DeviceSpread(metric=name, unit=group[0].unit, devices=len(group), min=min(values),
                                   median=statistics.median(values), max=max(values),
                                   min_device=int(lowest.device or 0)))
    return spread
