"""Memory a case needs, known from its configuration alone (a GEMM's operands, a copy's buffers).

A case's Config declares it with ``memory_need(self) -> MemoryNeed | None``. The plan checks it against
every host's probe before any round (flagperf.hosts.capacity), and the case checks it again against the
free memory when its round starts (CaseContext.check_fits): the same figure and the same share, so a size
refused in the round because the device is too small is refused before the run instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from pydantic import BaseModel

# Of the memory a case allocates from, the share it may plan to fill: the rest is for the framework's
# context, the allocator's rounding and everything else on the machine.
USABLE_SHARE = 0.8


MEMORY_SIDE_CACHE = "memory_side_cache"  # the spec table's fact (MiB) a need may depend on


class DeviceMemory(NamedTuple):
    """What a need may depend on of the device it is held against, as a host's probe tells it."""

    shares_host_memory: bool  # the vendor's device is the host's CPU (its caches and memory the host's)
    memory_side_cache_bytes: int | None = None  # a cache behind the L2 the vendor's spec table declares

    @classmethod
    def from_probe(cls, probe: dict[str, Any], shares_host_memory: bool) -> DeviceMemory:
        declared = (probe.get("peaks") or {}).get(MEMORY_SIDE_CACHE) or {}
        value = declared.get("value") if isinstance(declared, dict) else None
        return cls(shares_host_memory, int(value * 2**20) if isinstance(value, int | float) and value > 0 else None)


class MemoryNeed(NamedTuple):
    bytes: int  # on one device (on the host, where the device shares the host's memory)
    what: str  # the sizes that make it, as the user set them: "m=65536, n=4096, k=4096"
    keys: tuple[str, ...]  # the configuration keys behind it, for the error's source and key
    # where part of it depends on the device (an operation round's cache flush): the need on a given device
    on_device: Callable[[DeviceMemory], MemoryNeed] | None = None

    def on(self, device: DeviceMemory) -> MemoryNeed:
        return self.on_device(device) if self.on_device is not None else self


def memory_need(config: BaseModel) -> MemoryNeed | None:
    """The config's declared need, or None where a case's memory is not known before it runs."""
    declared = getattr(config, "memory_need", None)
    return declared() if callable(declared) else None
