from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NONE

from flagperf.config.vendors import Vendor
from flagperf.hosts.local import BackgroundProcess, Host
from flagperf.hosts.runtime import PID_FILE


@task(name="start_monitors", task_run_name="start_monitors[{label}]", cache_policy=NONE)
def start_monitors(host: Host, vendor: Vendor, stage_dir: Path, interval_s: float, max_seconds: float, label: str
                   ) -> list[tuple[str, BackgroundProcess]]:
    logger = get_run_logger()
    started: list[tuple[str, BackgroundProcess]] = []
    try:
        for entry in vendor.manifest.monitors:
            argv = [*vendor.monitor_command(entry, host.python), "--out",
                    str(stage_dir / f"monitor_{entry.name}.jsonl"), "--interval", str(interval_s),
                    "--pid-file", str(stage_dir / PID_FILE), "--max-seconds", str(int(max_seconds)),
                    "--parent-pid", str(host.controller_pid())]
            proc = host.spawn(argv, log_path=stage_dir / f"monitor_{entry.name}.log")
            started.append((entry.name, proc))
            logger.info("%s: monitor %s started (pid %d, every %.1f s)", label, entry.name, proc.pid, interval_s)
    except BaseException:
        for _, proc in started:  # none of this round's monitors outlives a failed start
            host.terminate(proc, grace_s=2.0)
        raise
    return started


@task(name="stop_monitors", task_run_name="stop_monitors[{label}]", cache_policy=NONE)
def stop_monitors(host: Host, monitors: list[tuple[str, BackgroundProcess]], stage_dir: Path, label: str
                  ) -> dict[str, Any]:
    logger = get_run_logger()
    stopped: dict[str, Any] = {}
    for name, proc in monitors:
        code = host.terminate(proc, grace_s=5.0)
        level, message, samples = stop_note(host, stage_dir / f"monitor_{name}.jsonl", label, name, code)
        stopped[name] = {"exit_code": code, "samples": samples}
        logger.log(level, "%s", message)
    return stopped


def stop_note(host: Host, path: Path, label: str, name: str, code: int | None) -> tuple[int, str, Any]:
    """How a stopped monitor ended, as (log level, line, samples): a warning where its figures cover only part of
    the round; INFO where it stopped when asked, or never sampled because its tool or library is not on this
    host (write_unavailable: the round's other monitors still ran, the analysis says why)."""
    records = _end_records(host, path)
    footer = _footer(host, path, records)
    samples = footer.get("samples") if footer else None
    if footer is None:  # no footer: it died before it was asked to stop (killed, crashed)
        return (logging.WARNING, f"{label}: monitor {name} had died before the round ended (exit {code}, no "
                                 "footer): its figures cover only part of the round", samples)
    reason = footer.get("reason")
    if reason == "unavailable":
        header = records[0] if records[0] and records[0].get("type") == "header" else {}
        sources = header.get("sources") if isinstance(header.get("sources"), dict) else {}
        why = "; ".join(str(s.get("reason")) for s in sources.values()
                        if isinstance(s, dict) and s.get("available") is False and s.get("reason")) or "not said"
        return logging.INFO, f"{label}: monitor {name} unavailable: {why}", samples
    if reason != "signal":  # it stopped by itself: the process it watched exited, --max-seconds
        return (logging.WARNING, f"{label}: monitor {name} had stopped by itself before the round ended ({reason}, "
                                 f"{samples} samples): its figures cover only part of the round", samples)
    return logging.INFO, f"{label}: monitor {name} stopped (exit {code}, {samples} samples)", samples


def _end_records(host: Host, path: Path) -> list[dict[str, Any] | None]:
    """The JSON records in the monitor file's end alone (a day's samples are a hundred MiB), read on the host that
    ran it (an SSH host's file is not on the controller); None for a line that is none (the first, cut by the
    read's start; the last, cut by a kill). The first of a short file is its header."""
    try:
        lines = host.read_end(path, 64 * 1024).splitlines()
    except (OSError, ValueError):
        return []
    records: list[dict[str, Any] | None] = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:  # JSONDecodeError is a ValueError
            record = None
        records.append(record if isinstance(record, dict) else None)
    return records


def _footer(host: Host, path: Path, records: list[dict[str, Any] | None] | None = None) -> dict[str, Any] | None:
    """The monitor's footer, from the file's end alone (``records``: those _end_records read already)."""
    records = _end_records(host, path) if records is None else records
    return records[-1] if records and records[-1] and records[-1].get("type") == "footer" else None
