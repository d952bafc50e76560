from __future__ import annotations

import json
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
        footer = _footer(host, stage_dir / f"monitor_{name}.jsonl")
        samples = footer.get("samples") if footer else None
        stopped[name] = {"exit_code": code, "samples": samples}
        if footer is None:  # no footer: it died before it was asked to stop (killed, crashed)
            logger.warning("%s: monitor %s had died before the round ended (exit %s, no footer): its figures cover "
                           "only part of the round", label, name, code)
        elif footer.get("reason") != "signal":  # it stopped by itself: the process it watched exited, --max-seconds
            logger.warning("%s: monitor %s had stopped by itself before the round ended (%s, %s samples): its "
                           "figures cover only part of the round", label, name, footer.get("reason"), samples)
        else:
            logger.info("%s: monitor %s stopped (exit %s, %s samples)", label, name, code, samples)
    return stopped


def _footer(host: Host, path: Path) -> dict[str, Any] | None:
    """The monitor's footer, from the file's end alone (a day's samples are a hundred MiB), read on the host that
    ran it (an SSH host's file is not on the controller)."""
    try:
        lines = host.read_end(path, 64 * 1024).splitlines()
        record = json.loads(lines[-1])
    except (OSError, ValueError, IndexError):  # JSONDecodeError is a ValueError
        return None
    return record if isinstance(record, dict) and record.get("type") == "footer" else None
