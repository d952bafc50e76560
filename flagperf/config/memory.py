"""Memory a case needs, known from its configuration alone (a GEMM's operands, a copy's buffers).

A case's Config declares it with ``memory_need(self) -> MemoryNeed | None``. The plan checks it against
every host's probe before any round (flagperf.hosts.capacity), and the case checks it again against the
free memory when its round starts (CaseContext.check_fits): the same figure and the same share, so a size
refused in the round because the device is too small is refused before the run instead.
"""

from __future__ import annotations

from typing import NamedTuple

from pydantic import BaseModel

# Of the memory a case allocates from, the share it may plan to fill: the rest is for the framework's
# context, the allocator's rounding and everything else on the machine.
USABLE_SHARE = 0.8


class MemoryNeed(NamedTuple):
    bytes: int  # on one device (on the host, where the device shares the host's memory)
    what: str  # the sizes that make it, as the user set them: "m=65536, n=4096, k=4096"
    keys: tuple[str, ...]  # the configuration keys behind it, for the error's source and key


def memory_need(config: BaseModel) -> MemoryNeed | None:
    """The config's declared need, or None where a case's memory is not known before it runs."""
    declared = getattr(config, "memory_need", None)
    return declared() if callable(declared) else None
