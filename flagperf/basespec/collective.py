"""Collective and point-to-point bandwidth between ranks (FlagPerf's interconnect-MPI_* and
interconnect-P2P_* cases), over nnodes x nproc_per_node processes with torch.distributed: gloo on the
CPU, nccl on GPUs.

Conventions (nccl-tests', stated in every metric):
  algbw = S / t, S the bytes of one rank's buffer, t the time of one operation;
  all_reduce: busbw = algbw x 2(n-1)/n, n the number of ranks (the bytes each rank's link carries);
  p2p (rank 0 sends, the last rank receives, across nodes when nnodes > 1): busbw = algbw, one direction.
GB = 1e9 bytes. No "x2 for bidirectional" (FlagPerf's MPI intra-server figure doubles it; reviewers
disputed that, see its PR #552): a link's two directions are two measurements.

The round's entry (one process per node) starts the node's ranks with torchrun's environment and reads
the node's first rank's figures. All ranks take the same decisions in the shared timing loop because the
clock they read is agreed by an all-reduce (max) over a gloo group: no rank runs an operation alone.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from flagperf.config.memory import MemoryNeed
from flagperf.errors import EXIT_USER_ERROR, CaseUserError
from flagperf.measure.casekit import CaseContext, TimedCaseConfig
from flagperf.measure.hostmemory import keep_freed_host_memory
from flagperf.results.metrics import Chunk
from flagperf.results.schema import MAX_NNODES, Metric

# torch where the kernel runs: the planner and `flagperf validate` read Config here without it (see gemm.py).
if TYPE_CHECKING:
    import torch.distributed as dist

METRICS_FILE = "collective.metrics.json"
ALGBW = "algbw = bytes of one rank's buffer / time of one operation (GB = 1e9 bytes)"


class Config(TimedCaseConfig):
    operation: Literal["all_reduce", "p2p"]
    size_mib: int = Field(gt=0, le=1 << 16)
    nnodes: int = Field(default=1, ge=1, le=MAX_NNODES)
    nproc_per_node: int = Field(default=2, ge=1, le=64)
    master_port: int = Field(default=29511, ge=1024, le=65535)
    backend: Literal["auto", "gloo", "nccl"] = "auto"

    def memory_need(self) -> MemoryNeed:
        """One rank's buffers (all_reduce keeps a second one)."""
        copies = 2 if self.operation == "all_reduce" else 1
        return MemoryNeed(copies * self.size_mib * 2**20, f"size_mib={self.size_mib}", ("size_mib",))


def run(config: Config, ctx: CaseContext) -> list[Metric]:
    """The node's share: start nproc_per_node ranks, wait, report the node's first rank's figures."""
    from flagperf.training.launch import USER_ERROR_PREFIX, launch, user_error, with_teardown_note

    if ctx.job is None or ctx.out_dir is None:
        raise CaseUserError("the collective case runs from a job (python -m flagperf.entry)")
    world = config.nnodes * config.nproc_per_node
    if world < 2:
        raise CaseUserError(f"{config.operation} needs at least 2 ranks; nnodes x nproc_per_node = {world}")
    node = launch(ctx.job, ctx.out_dir, config.nnodes, config.nproc_per_node,
                  ctx.job.master_port or config.master_port, module="flagperf.basespec.collective")
    problem = user_error(ctx.out_dir)
    if problem:
        raise CaseUserError(problem.removeprefix(USER_ERROR_PREFIX))
    if node.code != 0:
        raise RuntimeError(node.failure or f"a rank failed (exit {node.code}); see rank<R>.out.log")
    data = json.loads((ctx.out_dir / METRICS_FILE).read_text(encoding="utf-8"))
    ctx.windows.append(tuple(data["window"]))  # type: ignore[arg-type]
    ctx.measured_seconds += data["seconds"]
    return [with_teardown_note(Metric.model_validate(m), node.teardown_faults) for m in data["metrics"]]


def _agreed_clock(group: dist.ProcessGroup) -> float:
    """perf_counter, reduced to the maximum over all ranks: every rank sees the same value."""
    import torch
    import torch.distributed as dist

    value = torch.tensor([time.perf_counter()], dtype=torch.float64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return float(value.item())


def rank_main(job_path: Path) -> int:
    import torch
    import torch.distributed as dist

    from flagperf.config.job import Job
    from flagperf.training.launch import USER_ERROR_PREFIX, leave_process_group

    keep_freed_host_memory()  # as the entry does for every case process (it records the setting)
    job = Job.model_validate_json(job_path.read_text(encoding="utf-8"))
    config = Config.model_validate(job.config)
    vendor = job.host_vendor()  # with this host's spec_settings
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    device_type = vendor.manifest.torch_device
    device = torch.device(device_type, local_rank) if device_type != "cpu" else torch.device("cpu")
    backend = config.backend if config.backend != "auto" else ("nccl" if device_type == "cuda" else "gloo")
    if device_type != "cpu":
        torch.get_device_module(device_type).set_device(device)
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=max(60.0, config.timeout_s / 2)))
    clock_group = dist.new_group(backend="gloo")
    try:
        spec = vendor.spec_table()
        ctx = CaseContext(device_type, spec, config.timing, logging.getLogger("flagperf.case"),
                          shares_host_memory=vendor.manifest.shares_host_memory)
        nbytes = config.size_mib * 2**20
        try:
            need = config.memory_need()
            ctx.check_fits(need.bytes, need.what)
        except CaseUserError as exc:
            print(USER_ERROR_PREFIX + str(exc), flush=True)
            return EXIT_USER_ERROR
        buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        last = world - 1

        def step() -> None:
            if config.operation == "all_reduce":
                dist.all_reduce(buffer)
            elif rank == 0:
                dist.send(buffer, dst=last)
            elif rank == last:
                dist.recv(buffer, src=0)

        def sync() -> None:
            if device_type != "cpu":
                ctx.synchronize()

        from flagperf.measure.timing import measure

        started = time.time()
        chunks: list[Chunk] = measure(step, sync, config.timing, clock=lambda: _agreed_clock(clock_group))
        seconds = sum(c.seconds for c in chunks)
        window = (started, time.time())
        ctx.windows.append(window)
        if config.operation == "all_reduce":
            factor, name = 2 * (world - 1) / world, "allreduce"
            bus = f"busbw = algbw x 2(n-1)/n with n = {world} ranks (nccl-tests); not doubled for direction"
            peak_key = "allreduce_bandwidth"
        else:
            factor, name = 1.0, "p2p"
            bus = f"busbw = algbw: one direction, rank 0 -> rank {last} (bytes counted once)"
            peak_key = "p2p_bandwidth" if config.nnodes == 1 else "internode_bandwidth"
        topology = f"{config.nnodes} node(s) x {config.nproc_per_node} ranks, {backend}, {config.size_mib} MiB"
        algbw = ctx.rate_metric(f"{name}_algbw", chunks, nbytes, "GB/s", 1e9, peak_key=None,
                                convention=ALGBW, note=topology)
        busbw = ctx.rate_metric(f"{name}_busbw", chunks, nbytes * factor, "GB/s", 1e9, peak_key=peak_key,
                                convention=bus, note=topology)
        if local_rank == 0:  # the node's entry reads its first rank's figures
            out = job_path.parent / METRICS_FILE
            out.write_text(json.dumps({"window": window, "seconds": seconds,
                                       "metrics": [algbw.model_dump(mode="json"), busbw.model_dump(mode="json")]}))
        leave_process_group(clock_group)
    finally:
        if dist.is_initialized():  # left early (an error): destroy without the final barrier
            dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flagperf.basespec.collective")
    parser.add_argument("--job", type=Path, required=True)
    args = parser.parse_args(argv)
    return rank_main(args.job)


if __name__ == "__main__":
    sys.exit(main())
