"""`flagperf run` (the embedded default) stopped from outside: SIGTERM or SIGINT mid-round ends the case, the
monitors and the temporary server, writes a report that says what was done, and exits 128 + the signal;
SIGKILL leaves no server and no case behind (the server's watcher and the case's parent watch stop them)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.unit.childio import output_of

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
LONG_ROUND = ["--cases", "computation-FP32", "--rounds", "2", "--set", "min_duration_s=300", "--set", "warmup_iters=0"]


def start_run(tmp_path: Path, hosts: int = 1) -> tuple[subprocess.Popen[str], Path]:
    """``hosts`` > 1: an inventory of that many local hosts, whose rounds run in the controller's host threads."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(FLAGPERF_WORK_ROOT=str(tmp_path / "work"), PREFECT_HOME=str(tmp_path / "prefect-home"))
    results = tmp_path / "results"
    inventory: list[str] = []
    if hosts > 1:
        (tmp_path / "inventory.yaml").write_text(json.dumps({"hosts": [
            {"name": f"h{i}", "transport": "local", "runtime": "process", "work_root": str(tmp_path / f"work{i}")}
            for i in range(1, hosts + 1)]}))
        inventory = ["--inventory", str(tmp_path / "inventory.yaml")]
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "run", *LONG_ROUND, *inventory, "--results",
                             str(results)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, results


def command_line(process: psutil.Process) -> str:
    """A process's command line, or "" once it has ended (a short-lived child, such as git for the provenance,
    can be a zombie between two calls)."""
    try:
        return " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):  # ZombieProcess is a NoSuchProcess
        return ""


def wait_for_the_case(proc: subprocess.Popen[str], results: Path, cases: int = 1) -> dict[psutil.Process, str]:
    """Until round 1's case processes (``cases``: one per host) run; returns every process the run has started by
    then, with its command line read at that moment."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        assert proc.poll() is None, output_of(proc)
        descendants = {p: command_line(p) for p in psutil.Process(proc.pid).children(recursive=True)}
        if sum("flagperf.entry" in command for command in descendants.values()) >= cases:
            return descendants
        time.sleep(1)
    raise AssertionError("round 1's case process never started")


def gone(processes: list[psutil.Process]) -> list[psutil.Process]:
    # generous: a case killed while it imports torch ends at its parent watch, which a loaded machine starts late
    _, alive = psutil.wait_procs(processes, timeout=300)
    return [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


# SIGINT with two hosts: their rounds run in host threads, which the interrupt stops (RoundsStopped): stopped while
# running, not failed rounds
@pytest.mark.parametrize(("sig", "hosts"), [(signal.SIGTERM, 1), (signal.SIGINT, 2)], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_everything_and_reports_what_was_done(tmp_path: Path, sig: signal.Signals, hosts: int) -> None:
    proc, results = start_run(tmp_path, hosts)
    try:
        started = wait_for_the_case(proc, results, hosts)
        assert any("uvicorn" in command for command in started.values())  # the run's own temporary server
        assert any("--parent-pid" in command.split() for command in started.values())  # a monitor
        signalled = time.monotonic()
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=300)
        print(f"exited {time.monotonic() - signalled:.1f} s after {sig.name}")  # the issue asks for < 15 s
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, out
    assert (f"interrupted: 0 of {2 * hosts} planned rounds done, {hosts} stopped while running, {hosts} not started"
            in out), out
    assert not gone(list(started)), "processes of the run outlived it"
    (run_dir,) = results.iterdir()
    report = (run_dir / "report.md").read_text(encoding="utf-8")
    assert f"**interrupted** ({sig.name})" in report
    assert "## Stopped while running" in report and "- computation-FP32 round 1 on" in report
    assert "## Not started" in report and "- computation-FP32 round 2 on" in report
    progress = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))["progress"]
    assert progress["planned"] == 2 * hosts and progress["done"] == 0
    for host in ([f"h{i}" for i in range(1, hosts + 1)] if hosts > 1 else []):  # no result: none failed
        assert f"- computation-FP32 round 1 on {host}" in report.split("## Stopped while running")[1], report
        assert not list(run_dir.glob(f"computation-FP32/round1/{host}_noderank0/result.json"))
    # The whole log of the run is in its folder, though the console showed the live view only.
    log = (run_dir / "controller.log").read_text(encoding="utf-8")
    assert "run_case[computation-FP32/round1@" in log and f"interrupted ({sig.name})" in log


def test_sigkill_leaves_no_server(tmp_path: Path) -> None:
    proc, results = start_run(tmp_path)
    try:
        started = wait_for_the_case(proc, results)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    server = [p for p, command in started.items() if "uvicorn" in command]
    case = [p for p, command in started.items() if "flagperf.entry" in command]
    assert server and case
    try:
        assert not gone(server), "the temporary server outlived the killed controller"
        # The case was caught starting (the controller killed while it may still import torch): its parent
        # watch, with the launcher's pid it was given, ends it too.
        assert not gone(case), "the case outlived the killed controller"
    finally:
        for leftover in started:
            if leftover.is_running():
                leftover.kill()
