"""One training process (started by flagperf.training.launch with torchrun's environment variables).

    RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT
    python -m flagperf.training.worker --job JOB.json
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from flagperf.config.adaptation import load_hooks, read_adaptation
from flagperf.config.cases import load_case
from flagperf.config.job import Job
from flagperf.errors import EXIT_USER_ERROR, CaseUserError, ConfigError, missing_extra
from flagperf.measure.hostmemory import keep_freed_host_memory
from flagperf.training.driver import TrainingContext
from flagperf.training.launch import JOINED, JOINING, USER_ERROR_PREFIX, leave_process_group


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_threads(configured: int | None) -> int:
    """Torch threads for one process on the cpu vendor: the configured number, else this process's share of
    the cores it may run on. Processes on one CPU share its cores, so each gets its share, not all of them.
    More threads than free cores is costly: every parallel region waits at its barrier for a thread the
    scheduler has given to someone else (bench/results/training_cpu_harness.md: digits-mlp at 2 threads on 2
    loaded cores is 7-40x slower than at 1)."""
    if configured is not None:
        return configured
    return max(1, usable_cores() // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def oversubscribed(load_average: float, threads: int) -> str | None:
    """Why this process's threads will wait for cores, or None: the host's load before training started plus
    this node's torch threads exceed its usable cores."""
    usable = usable_cores()
    wanted = threads * int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if load_average + wanted <= usable + 0.5:
        return None
    return (f"load average {load_average:.1f} on {usable} usable cores before {wanted} torch thread(s) started: "
            f"threads will wait for cores others hold, and the figure measures that contention (set cpu_threads "
            f"lower, or use a quiet host)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flagperf.training.worker")
    parser.add_argument("--job", type=Path, required=True)
    args = parser.parse_args(argv)
    keep_freed_host_memory()  # as the entry does for every case process (it records the setting)
    job = Job.model_validate_json(args.job.read_text(encoding="utf-8"))
    case = load_case(job.case)
    vendor = job.host_vendor()  # with this host's spec_settings
    config = case.config_model.model_validate(job.config)
    device_type = vendor.manifest.torch_device
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(device_type, local_rank) if device_type != "cpu" else torch.device("cpu")
    if device_type == "cpu":
        torch.set_num_threads(cpu_threads(config.cpu_threads))
    else:
        torch.get_device_module(device_type).set_device(local_rank)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    hooks = load_hooks(read_adaptation(case.folder, case.name, case.family, vendor.name, vendor.folder))
    backend = "gloo" if device_type == "cpu" else "nccl"
    if "setup_distributed" in hooks:  # the vendor's collective library (the backend's name only)
        backend = str(hooks["setup_distributed"](device_type, backend))
    if world_size > 1:
        # Said before and after: a rank whose peers never arrive (a closed port, a node that did not start)
        # waits here for the whole timeout, and its log's last line then says where it waited.
        meeting = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        rank = os.environ.get("RANK", "0")
        timeout_s = max(60, int(config.timeout_s))
        print(f"flagperf: rank {rank} of {world_size} {JOINING}{meeting} ({backend}, waiting up to {timeout_s} s "
              "for every rank)", flush=True)
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
        print(f"flagperf: rank {rank} {JOINED}{meeting}", flush=True)
    torch.manual_seed(config.seed)
    ctx = TrainingContext(config, device=device, hooks={k: v for k, v in hooks.items() if k != "setup_distributed"})
    if "setup_distributed" in hooks:
        ctx.extra["vendor_hooks"] = ["setup_distributed"]
        ctx.hooks_used.append("setup_distributed")
        ctx.extra["distributed_backend"] = backend
    peak = vendor.spec_table().peaks.get(config.precision)
    ctx.peak = (peak.value, peak.unit) if peak and peak.supported and peak.dense else None
    if ctx.peak:
        ctx.extra["mfu_peak"] = peak.model_dump()  # shown beside the MFU in the report
    ctx.extra["torch_threads"] = torch.get_num_threads()
    ctx.extra["load_average_1m"] = os.getloadavg()[0]  # other work on the host at the start (a shared machine)
    if device_type == "cpu":
        busy = oversubscribed(ctx.extra["load_average_1m"], torch.get_num_threads())
        if busy:
            ctx.extra["cpu_oversubscribed"] = busy
            print(f"warning: {busy}", file=sys.stderr, flush=True)
    ctx.event("INIT_START", {"case": job.case, "world_size": world_size, "device": str(device)})
    if ctx.rank == 0:
        ctx.event("SUBMIT_INFO", {"config": job.config})
    try:
        case.module.run(config, ctx)
    except (CaseUserError, ConfigError) as exc:  # the input's fault: the launcher reports it, nobody retries
        print(f"{USER_ERROR_PREFIX}{exc}", flush=True)
        return EXIT_USER_ERROR
    except ModuleNotFoundError as exc:  # a data reader's package (scikit-learn, Pillow): name the extra
        missing = missing_extra(exc, job.family, f"case {job.case}")
        if missing is None:
            raise
        print(f"{USER_ERROR_PREFIX}{missing}", flush=True)
        return EXIT_USER_ERROR
    ctx.finish()
    if world_size > 1:
        leave_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
