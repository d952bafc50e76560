"""Host-to-device and device-to-host bandwidth (FlagPerf's interconnect-h2d, and its reverse)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from flagperf.config.memory import MemoryNeed
from flagperf.errors import Unsupported
from flagperf.measure.casekit import CaseContext, EveryDevice, TimedCaseConfig
from flagperf.results.metrics import TRANSFER_CONVENTION
from flagperf.results.schema import Metric


class Config(TimedCaseConfig, EveryDevice):
    direction: Literal["h2d", "d2h"]
    size_mib: int = Field(gt=0, le=1 << 20)
    pinned: bool = Field(description="page-locked host buffer (what DMA engines reach at full speed)")

    def memory_need(self) -> MemoryNeed:
        return MemoryNeed(self.size_mib * 2**20, f"size_mib={self.size_mib}", ("size_mib",))


def run(config: Config, ctx: CaseContext) -> list[Metric]:
    import torch  # here, not with the module: the planner and `flagperf validate` read Config without it

    peak_key = f"{config.direction}_bandwidth"
    ctx.require(peak_key)
    if not ctx.has_separate_memory:
        raise Unsupported(f"{ctx.device} has no memory separate from the host's")
    nbytes = config.size_mib * 2**20
    need = config.memory_need()
    ctx.check_fits(need.bytes, need.what)
    host = torch.ones(nbytes, dtype=torch.uint8, pin_memory=config.pinned)
    device = torch.empty(nbytes, dtype=torch.uint8, device=ctx.device)
    if config.direction == "h2d":
        chunks = ctx.time(lambda: device.copy_(host, non_blocking=config.pinned))
    else:
        chunks = ctx.time(lambda: host.copy_(device, non_blocking=config.pinned))
    kind = "pinned" if config.pinned else "pageable"
    return [ctx.rate_metric(f"{config.direction}_bandwidth", chunks, nbytes, "GB/s", 1e9, peak_key=peak_key,
                            convention=TRANSFER_CONVENTION,
                            note=f"{config.size_mib} MiB, {kind} host memory, GB = 1e9 bytes")]
