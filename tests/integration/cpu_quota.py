"""A host or a night made slow on purpose: the device processes of chosen rounds moved into a cgroup with a CPU
quota while they measure (test_fleet, test_nightly). Each one is moved once its round's case.log says it is ready
to measure (its interpreter and imports ran at full speed) and moved back once its figure is logged, so that
writing its record (a second of CPU) does not take a minute under the quota and push the round towards its
timeout on a slower machine. Only those processes are slowed, not the host's sshd or another session's rounds."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

READY = "host allocator"  # a device process's last line before its case starts (flagperf.entry.run_job)
MEASURED = "gemm_fp32: "  # its line once its figure is measured, before its record is written (flagperf.entry.run_job)
DEVICE_LINE = "[device {index}] "  # how a round that measures every device marks each device's lines in case.log
ENTRY = "flagperf.entry"  # the module a round's processes run
POLL_S = 0.02  # a scan of /proc costs about 1 ms here


@dataclass
class Quota:
    """What the mover did: pid -> device index (None: a one-device round, measured in the round's own process;
    a fork of a device process, e.g. for a subprocess, is there too), and the pids moved back once measured."""

    moved: dict[int, int | None] = field(default_factory=dict)
    released: set[int] = field(default_factory=set)


def cgroup_cpu_root() -> tuple[Path, str] | None:
    """Where a CPU-quota cgroup can be made here (v1's cpu controller, or v2 with cpu enabled), and its kind."""
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v1 / "cpu.cfs_quota_us").exists() and os.access(v1, os.W_OK):
        return v1, "v1"
    v2 = Path("/sys/fs/cgroup")
    controllers = v2 / "cgroup.subtree_control"
    if controllers.exists() and "cpu" in controllers.read_text().split() and os.access(v2, os.W_OK):
        return v2, "v2"
    return None


def quota_group(share: float) -> Path:
    """A cgroup of this test session limited to ``share`` of one core (skips the test where no writable cpu
    controller is); one left by an earlier use whose processes could not all be moved out is used again."""
    found = cgroup_cpu_root()
    if found is None:
        pytest.skip("no writable cgroup with the cpu controller (v1 cpu, or v2 with cpu in subtree_control)")
    root, kind = found
    group = root / f"flagperf-slow-{os.getpid()}"
    group.mkdir(exist_ok=True)
    period = 100_000
    if kind == "v1":
        (group / "cpu.cfs_period_us").write_text(str(period))
        (group / "cpu.cfs_quota_us").write_text(str(int(share * period)))
    else:
        (group / "cpu.max").write_text(f"{int(share * period)} {period}")
    return group


def round_processes(marker: str) -> Iterator[tuple[int, Path, int | None]]:
    """(pid, job file, device index) of every process running a round (python -m flagperf.entry --job JOB) whose
    job path holds ``marker``; the index is None for a round's own process (not --device-slot): a one-device round
    measures in it, a many-device one in its children."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                raw = handle.read()
            if b"--job" not in raw:
                continue
            args = [a.decode(errors="replace") for a in raw.split(b"\0")]
            job = args[args.index("--job") + 1]
            if args[args.index("-m") + 1] != ENTRY or marker not in job:
                continue  # another round's, or the host agent that started it (its --job is the entry's)
            slot = args[args.index("--device-slot") + 1] if "--device-slot" in args else None
            yield int(name), Path(job), None if slot is None else int(json.loads(slot)["index"])
        except (OSError, ValueError, IndexError, KeyError, TypeError):
            continue  # gone meanwhile, or not ours


def own_lines(log: str, index: int | None) -> list[str]:
    """The lines of a round's case.log that a process wrote: a device's are marked with its index, the round
    process's are the unmarked ones."""
    if index is not None:
        return [line for line in log.splitlines() if line.startswith(DEVICE_LINE.format(index=index))]
    any_device = DEVICE_LINE.partition("{")[0]
    return [line for line in log.splitlines() if not line.startswith(any_device)]


@contextlib.contextmanager
def cpu_quota(marker: str, share: float) -> Iterator[Quota]:
    """A cgroup limited to ``share`` of one core, which every device process of the rounds whose job path holds
    ``marker`` is in from the moment it is ready to measure until its figure is logged (then it is moved back to
    the root group). A process first seen with its figure logged already is left alone: ``moved`` holds only those
    measured under the quota."""
    group = quota_group(share)
    stop = threading.Event()
    quota = Quota()

    def mover() -> None:
        while not stop.is_set():
            for pid, job, index in round_processes(marker):
                if pid in quota.released:
                    continue
                with contextlib.suppress(OSError):
                    lines = own_lines((job.parent / "case.log").read_text(errors="replace"), index)
                    measured = any(MEASURED in line for line in lines)
                    if pid in quota.moved and measured:
                        (group.parent / "cgroup.procs").write_text(str(pid))
                        quota.released.add(pid)
                    elif pid not in quota.moved and not measured and any(READY in line for line in lines):
                        (group / "cgroup.procs").write_text(str(pid))
                        quota.moved[pid] = index
            stop.wait(POLL_S)

    thread = threading.Thread(target=mover, daemon=True)
    thread.start()
    try:
        yield quota
    finally:
        stop.set()
        thread.join()
        for pid in (group / "cgroup.procs").read_text().split():  # one still measuring, or a child it started
            with contextlib.suppress(OSError):
                (group.parent / "cgroup.procs").write_text(pid)
        with contextlib.suppress(OSError):
            group.rmdir()
