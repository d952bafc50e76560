"""Main-memory bandwidth: a device-to-device copy of a buffer larger than any cache."""

from __future__ import annotations

from pydantic import Field

from flagperf.config.memory import MemoryNeed
from flagperf.measure.casekit import CaseContext, EveryDevice, TimedCaseConfig
from flagperf.results.metrics import COPY_CONVENTION, copy_bytes
from flagperf.results.schema import Metric


class Config(TimedCaseConfig, EveryDevice):
    size_mib: int = Field(gt=0, le=1 << 20, description="bytes per copy, in MiB")

    def memory_need(self) -> MemoryNeed:
        return MemoryNeed(2 * self.size_mib * 2**20, f"size_mib={self.size_mib} (source and destination)",
                          ("size_mib",))


def run(config: Config, ctx: CaseContext) -> list[Metric]:
    import torch  # here, not with the module: the planner and `flagperf validate` read Config without it

    peak_key = "memory_bandwidth"
    ctx.require(peak_key)
    nbytes = config.size_mib * 2**20
    need = config.memory_need()
    ctx.check_fits(need.bytes, need.what)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=ctx.device)
    dst = torch.empty_like(src)
    chunks = ctx.time(lambda: dst.copy_(src))
    return [ctx.rate_metric("memory_copy_bandwidth", chunks, copy_bytes(nbytes), "GB/s", 1e9,
                            peak_key=peak_key, convention=COPY_CONVENTION,
                            note=f"{config.size_mib} MiB float32 buffer, GB = 1e9 bytes")]
