"""Main-memory bandwidth: a device-to-device copy of a buffer larger than any cache."""

from __future__ import annotations

import torch
from pydantic import Field

from flagperf.casekit import CaseContext, TimedCaseConfig
from flagperf.errors import CaseUserError
from flagperf.metrics import COPY_CONVENTION, copy_bytes
from flagperf.results import Metric


class Config(TimedCaseConfig):
    size_mib: int = Field(gt=0, le=1 << 20, description="bytes per copy, in MiB")


def run(config: Config, ctx: CaseContext) -> list[Metric]:
    peak_key = "memory_bandwidth"
    ctx.require(peak_key)
    nbytes = config.size_mib * 2**20
    free, _ = ctx.memory_info()
    if 2 * nbytes > 0.8 * free:
        raise CaseUserError(f"size_mib={config.size_mib} needs {2 * nbytes / 2**30:.2f} GiB (source and "
                            f"destination), more than 80% of the {free / 2**30:.2f} GiB free")
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=ctx.device)
    dst = torch.empty_like(src)
    chunks = ctx.time(lambda: dst.copy_(src))
    return [ctx.rate_metric("memory_copy_bandwidth", chunks, copy_bytes(nbytes), "GB/s", 1e9,
                            peak_key=peak_key, convention=COPY_CONVENTION,
                            note=f"{config.size_mib} MiB float32 buffer, GB = 1e9 bytes")]
