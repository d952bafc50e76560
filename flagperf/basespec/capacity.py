"""Main-memory capacity: how much the case can allocate and touch, in chunks.

On an accelerator it allocates until the device refuses (halving the chunk down to 1 MiB, as FlagPerf
does). On the CPU the device memory is the host's own memory, so the allocation is bounded to a share
of what is free: the host never swaps, and the result says it was bounded rather than claiming a limit.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from pydantic import Field

from flagperf.errors import CaseUserError
from flagperf.measure.casekit import CaseContext, EveryDevice, comparable_ratio
from flagperf.results.schema import Metric

# torch where the kernel runs: the planner and `flagperf validate` read Config here without it (see gemm.py).
if TYPE_CHECKING:
    import torch

# Never more than this share of the host's free memory when the device memory is the host's.
HOST_MEMORY_CEILING = 0.8


class Config(EveryDevice):
    chunk_mib: int = Field(gt=0, le=1 << 20)
    max_fraction_of_free: float = Field(gt=0, le=1)
    max_gib: float | None = Field(default=None, gt=0, description="stop after this much, whatever is free")


def run(config: Config, ctx: CaseContext) -> list[Metric]:
    import torch

    peak_key = "memory_capacity"
    peak = ctx.require(peak_key)
    free, total = ctx.memory_info()
    fraction = config.max_fraction_of_free
    if not ctx.has_separate_memory:
        fraction = min(fraction, HOST_MEMORY_CEILING)
    # On a device with its own memory and no explicit bound, allocate until the device refuses: the
    # 'free' figure is itself an estimate, and the point is to find the real limit.
    unbounded = ctx.has_separate_memory and fraction >= 1.0 and config.max_gib is None
    bound = total if unbounded else int(free * fraction)
    if config.max_gib is not None:
        bound = min(bound, int(config.max_gib * 2**30))

    held: list[torch.Tensor] = []
    allocated = 0
    chunk = config.chunk_mib * 2**20
    stopped_by = "bound"
    start, start_epoch = time.perf_counter(), time.time()
    while chunk >= 2**20:
        if allocated + chunk > bound:
            if ctx.has_separate_memory and allocated + 2**20 <= bound:
                chunk //= 2
                continue
            break
        try:
            block = torch.empty(chunk, dtype=torch.uint8, device=ctx.device)
            block.fill_(1)  # touch every page: reserved-but-untouched memory is not capacity
        except RuntimeError as exc:  # torch.OutOfMemoryError on CUDA; a plain RuntimeError on other backends
            if not isinstance(exc, torch.OutOfMemoryError) and "out of memory" not in str(exc).lower():
                raise
            stopped_by = "device"
            chunk //= 2
            continue
        held.append(block)
        allocated += chunk
    ctx.synchronize()
    seconds = time.perf_counter() - start
    ctx.measured_seconds += seconds
    blocks = len(held)
    del held
    if allocated == 0:
        raise CaseUserError(f"nothing allocated: the bound ({bound / 2**20:.0f} MiB) is smaller than one "
                            f"{config.chunk_mib} MiB chunk; raise max_gib or lower chunk_mib")

    value = allocated / 2**30
    if stopped_by == "device":
        note = f"allocated until the device refused ({total / 2**30:.2f} GiB total)"
        ratio = comparable_ratio(value, "GiB", peak)
    else:
        note = (f"bounded by design at {bound / 2**30:.2f} GiB ({fraction:.0%} of {free / 2**30:.2f} GiB free"
                + (f", max_gib {config.max_gib}" if config.max_gib else "")
                + "): a lower bound on capacity, not a limit reached")
        ratio = None
    return [Metric(name="memory_capacity", value=value, unit="GiB", iterations=blocks,
                   window=[start_epoch, start_epoch + seconds],
                   chunks=1, measured_seconds=seconds, peak=peak, ratio=ratio,
                   convention="GiB = 2^30 bytes, allocated and written", note=note, statistic="single")]
