"""The sampling loop every monitor script shares: timestamped JSON lines at a fixed rate.

File format (monitor.jsonl): the first line is a header
  {"type": "header", "monitor": NAME, "interval_s": S, "started_at": EPOCH, ...vendor facts...}
then one line per sample {"type": "sample", "t": EPOCH, ...fields...} and, on a clean stop,
  {"type": "footer", "samples": N, "stopped_at": EPOCH, "reason": "signal" | "parent-exited" | "max-seconds"}.
A missing field value is null (unavailable), never 0.

A monitor never outlives its purpose: it stops on SIGTERM/SIGINT, when the process it watches (--parent-pid:
the controller, or on an SSH host the controller's keepalive; by default the process that started it) goes away,
and after --max-seconds in any case.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

MAX_RATE_HZ = 10.0


def monitor_arguments(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, required=True, help="JSON-lines file to write")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples (>= 0.1)")
    parser.add_argument("--pid-file", type=Path, default=None, help="file holding the case process id")
    parser.add_argument("--max-seconds", type=float, default=24 * 3600, help="stop after this long regardless")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="stop when this process has exited; it need not be our parent (on an SSH host the "
                             "monitor is detached and watches the controller's keepalive). Default: the parent "
                             "at start; pass it explicitly, or a parent that exits before we start is never noticed")
    return parser


def write_unavailable(name: str, args: argparse.Namespace, reason: str) -> int:
    """A device monitor whose tool or library is missing here: a header saying why (sources.devices.available
    false) and a footer, so the analysis reports the reason instead of a monitor that never wrote; exit 0."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"type": "header", "monitor": name, "interval_s": args.interval,
                                    "started_at": time.time(), "sources": {
                                        "devices": {"available": False, "reason": reason}}}) + "\n"
                        + json.dumps({"type": "footer", "samples": 0, "stopped_at": time.time(),
                                      "reason": "unavailable"}) + "\n")
    print(reason, file=sys.stderr)
    return 0


def read_pid(pid_file: Path | None) -> int | None:
    if pid_file is None:
        return None
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


class ParentWatch:
    """Whether the process a monitor follows still runs. By its liveness, not by being our parent: a monitor
    the SSH host agent started is detached (its parent is init from the start). A process created after
    ``started_before`` (our own start) cannot be the one that started us: its pid was reused, so it counts as
    gone; psutil's is_running() catches a reuse later on the same way, by the process's creation time."""

    def __init__(self, pid: int, started_before: float) -> None:
        self.pid = pid
        self.pid_only = False  # the process is not ours to look at: followed by its pid alone
        try:
            self.process: psutil.Process | None = psutil.Process(pid)
            if self.process.create_time() > started_before:
                self.process = None
        except (psutil.NoSuchProcess, psutil.ZombieProcess):  # gone, or exited and not yet reaped
            self.process = None
        except psutil.AccessDenied:  # it exists (hidepid, another user's): alive while its pid is there
            self.process, self.pid_only = None, True

    def alive(self) -> bool:
        if self.pid_only:
            return psutil.pid_exists(self.pid)
        if self.process is None:
            return False
        try:  # a zombie has exited: only its parent has not reaped it yet
            return self.process.is_running() and self.process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
        except psutil.Error:  # not ours to look at (AccessDenied): it exists
            return True


def run_sampler(name: str, args: argparse.Namespace, header: dict[str, Any],
                sample: Callable[[], dict[str, Any]]) -> int:
    if args.interval < 1 / MAX_RATE_HZ:
        raise SystemExit(f"--interval {args.interval}: must be at least {1 / MAX_RATE_HZ} s")
    stop_reason: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:
        stop_reason.append("signal")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    parent = ParentWatch(args.parent_pid if args.parent_pid is not None else os.getppid(),
                         psutil.Process().create_time())
    started = time.time()
    deadline = time.monotonic() + args.max_seconds
    args.out.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with args.out.open("w", encoding="utf-8") as out:
        out.write(json.dumps({"type": "header", "monitor": name, "interval_s": args.interval,
                              "started_at": started, **header}) + "\n")
        out.flush()
        next_tick = time.monotonic()
        while not stop_reason:
            values = sample()  # stamped after reading: counters (energy) are read last, and may lag slow sources
            record = {"type": "sample", "t": time.time(), **values}
            out.write(json.dumps(record) + "\n")
            out.flush()
            count += 1
            if not parent.alive():
                stop_reason.append("parent-exited")
                break
            next_tick += args.interval
            now = time.monotonic()
            if now >= deadline:
                stop_reason.append("max-seconds")
                break
            # Sleep in short steps so a signal or a parent exit is noticed promptly.
            while not stop_reason and now < next_tick:
                time.sleep(min(0.1, next_tick - now))
                now = time.monotonic()
            if now > next_tick + args.interval:  # fell behind (suspended?): skip, don't burst
                next_tick = now
        if stop_reason[0] == "signal":  # one last sample, so the timed region that just ended is covered
            values = sample()
            out.write(json.dumps({"type": "sample", "t": time.time(), **values}) + "\n")
            count += 1
        out.write(json.dumps({"type": "footer", "samples": count, "stopped_at": time.time(),
                              "reason": stop_reason[0]}) + "\n")
    return 0
