"""Review findings, pinned down: bad values refused up front, backend errors sorted, monitors that
cover the end of a timed region and never outlive their parent, a private work folder."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from flagperf.config.plan import plan_run
from flagperf.entry import classify_runtime_error
from flagperf.errors import CaseUserError, ConfigError, Unsupported
from flagperf.hosts.local import default_work_root
from flagperf.paths import PROJECT_ROOT
from tests.unit.childio import Lines


@pytest.mark.parametrize(("setting", "words"), [
    ("timeout_s=.inf", "finite"),
    ("min_duration_s=.nan", "finite"),
    ("m=true", "integer"),
    ("min_duration_s=1000", "well below timeout_s"),
])
def test_values_that_would_waste_or_break_a_run_are_refused(tmp_path: Path, setting: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        plan_run(cases=["computation-FP32"], sets=[setting], results_dir=tmp_path)
    assert info.value.source == "--set" or "computation-FP32" in info.value.source
    assert words in info.value.message


def test_backend_runtime_errors_are_sorted() -> None:
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")
    assert isinstance(classify_runtime_error(oom), CaseUserError)
    assert isinstance(classify_runtime_error(RuntimeError("HIP out of memory")), CaseUserError)
    assert isinstance(classify_runtime_error(RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLt")),
                      Unsupported)
    crash = RuntimeError("CUDA error: an illegal memory access was encountered")
    assert classify_runtime_error(crash) is crash  # a crash stays a crash: retried


def _start_monitor(out: Path, interval: float = 1.0, via_parent: bool = False) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "flagperf.monitoring.system", "--out", str(out), "--interval", str(interval)]
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    if via_parent:  # a short-lived parent that starts the monitor and exits at once
        code = (f"import os, subprocess; p = subprocess.Popen({argv!r} + ['--parent-pid', str(os.getpid())]); "
                "print(p.pid, flush=True)")
        return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
    return subprocess.Popen(argv, env=env)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_monitor_takes_a_last_sample_when_stopped(tmp_path: Path) -> None:
    out = tmp_path / "monitor_system.jsonl"
    proc = _start_monitor(out, interval=5.0)  # slow on purpose: only the stop can cover the end
    deadline = time.time() + 30
    while (not out.exists() or '"sample"' not in out.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    region_end = time.time()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    records = _records(out)
    samples = [r for r in records if r["type"] == "sample"]
    assert records[-1] == {**records[-1], "type": "footer", "reason": "signal", "samples": len(samples)}
    assert samples[-1]["t"] >= region_end


def test_monitor_exits_when_its_parent_is_gone(tmp_path: Path) -> None:
    out = tmp_path / "monitor_system.jsonl"
    parent = _start_monitor(out, interval=0.2, via_parent=True)
    pid = int(Lines(parent.stdout).next())  # within 120 s, or the test fails with what it said
    parent.wait(timeout=30)
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).wait(timeout=30)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert _records(out)[-1]["reason"] == "parent-exited"


def test_a_monitor_the_host_agent_detached_samples_until_the_keepalive_it_follows_exits(tmp_path: Path) -> None:
    """An SSH host's monitors, as the controller starts them: `agent spawn` detaches the monitor (its parent is
    init from the start) with --parent-pid the connection's `agent keepalive`. It samples while the keepalive
    runs (it used to take one sample and quit, "parent-exited") and stops once it exits, even before it is
    reaped (a zombie has exited)."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    keepalive = subprocess.Popen([sys.executable, "-m", "flagperf.hosts.agent", "keepalive"], env=env,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    watched_pid = json.loads(Lines(keepalive.stdout).next())["pid"]
    out = tmp_path / "monitor_system.jsonl"
    spawned = subprocess.run([sys.executable, "-m", "flagperf.hosts.agent", "spawn", "--log", str(tmp_path / "m.log"),
                              "--", sys.executable, "-m", "flagperf.monitoring.system", "--out", str(out),
                              "--interval", "0.1", "--parent-pid", str(watched_pid)],
                             env=env, capture_output=True, text=True, timeout=60, check=True)
    monitor = psutil.Process(json.loads(spawned.stdout.splitlines()[-1])["pid"])
    try:
        deadline = time.time() + 120  # a guard against a hang, not a timing assumption
        while (not out.exists() or out.read_text().count('"sample"') < 3) and monitor.is_running() \
                and monitor.status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
            time.sleep(0.1)
        records = _records(out)
        assert [r["type"] for r in records[:4]] == ["header", "sample", "sample", "sample"], records[-1]
        assert monitor.is_running() and monitor.status() != psutil.STATUS_ZOMBIE
        keepalive.stdin.close()  # the connection ends; the keepalive exits and stays unreaped meanwhile
        deadline = time.time() + 120
        while monitor.is_running() and monitor.status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
            time.sleep(0.1)
        assert _records(out)[-1]["reason"] == "parent-exited"
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            monitor.kill()
        if not keepalive.stdin.closed:
            keepalive.stdin.close()
        keepalive.wait(timeout=30)


def test_a_device_monitor_without_its_library_is_said_unavailable_not_stopped_early(tmp_path: Path) -> None:
    """NVML's monitor on a host without nvidia-ml-py (or its driver) writes a header saying why and a footer
    "unavailable" and exits: the round's stop says so at INFO, every round, not that it stopped before the round
    ended (a warning that was untrue); a monitor that did stop early is still a warning."""
    import logging

    from flagperf.hosts.local import LocalHost
    from tasks.monitor import stop_note

    out = tmp_path / "monitor_nvml.jsonl"
    done = subprocess.run([sys.executable, str(PROJECT_ROOT / "vendor_images" / "nvidia" / "monitor_nvml.py"),
                           "--out", str(out)], env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
                          capture_output=True, text=True, timeout=120)
    header = _records(out)[0]
    if header["sources"]["devices"]["available"]:
        pytest.skip("NVML works on this machine: its monitor samples")
    host = LocalHost(work_root=tmp_path)
    level, line, samples = stop_note(host, out, "round 1", "nvml", done.returncode)
    assert (level, samples) == (logging.INFO, 0)
    assert line == f"round 1: monitor nvml unavailable: {header['sources']['devices']['reason']}"
    early = tmp_path / "monitor_system.jsonl"
    early.write_text(json.dumps({"type": "header", "monitor": "system"}) + "\n"
                     + json.dumps({"type": "footer", "samples": 4, "reason": "parent-exited"}) + "\n")
    level, line, _ = stop_note(host, early, "round 1", "system", 0)
    assert level == logging.WARNING and "stopped by itself before the round ended (parent-exited, 4" in line


def test_a_monitor_does_not_follow_a_process_that_only_took_its_parents_pid() -> None:
    """A pid reused by a process created after the monitor is not the process that started it: gone."""
    from flagperf.monitoring import ParentWatch

    started = psutil.Process().create_time()
    assert ParentWatch(os.getpid(), started).alive()
    later = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert not ParentWatch(later.pid, started - 3600).alive()
        assert ParentWatch(later.pid, psutil.Process(later.pid).create_time()).alive()
    finally:
        later.stdin.close()
        later.wait(timeout=30)
    assert not ParentWatch(later.pid, time.time()).alive()


def test_a_monitor_follows_a_process_it_may_not_look_at_by_its_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    """A watched process psutil may not read (hidepid=2, another user's: AccessDenied) exists: the monitor samples
    while its pid is there (it used to stop at once, "parent-exited"), and stops once it is gone."""
    from flagperf import monitoring

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait(timeout=60)  # reaped: its pid names no process

    def denied(pid: int) -> psutil.Process:
        raise psutil.AccessDenied(pid)

    monkeypatch.setattr(monitoring.psutil, "Process", denied)  # a real hidepid /proc cannot be made in a test
    assert monitoring.ParentWatch(os.getpid(), time.time()).alive()
    assert not monitoring.ParentWatch(ended.pid, time.time()).alive()


def test_default_work_root_is_private(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("FLAGPERF_WORK_ROOT", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    root = default_work_root()
    assert root.parent == tmp_path and root.stat().st_mode & 0o777 == 0o700
    root.chmod(0o777)  # someone opened it up (or made it first): refused, not used
    with pytest.raises(PermissionError, match="not a private folder"):
        default_work_root()


def test_a_case_nobody_stops_stops_itself_after_its_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a container the parent watch sees only the container's init: if the controller vanished, the case's
    own deadline (timeout_s plus a grace) ends it, an exit the controller would count as infrastructure."""
    from flagperf.config.job import Job
    from flagperf.entry import EXIT_OVERRAN

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "cases"
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(fixtures))
    plan = plan_run(cases=["hold"], sets=["hold_s=120", "timeout_s=1"], results_dir=tmp_path / "results")
    case = plan.cases[0]
    job = Job(run_id=plan.run_id, case=case.name, family=case.family, round=1, host="localhost", vendor="cpu",
              config=case.config, config_origins=case.origins, run_overrides=case.run_overrides, image={})
    (tmp_path / "job.json").write_text(job.model_dump_json())
    done = subprocess.run([sys.executable, "-m", "flagperf.entry", "--job", str(tmp_path / "job.json")],
                          cwd=PROJECT_ROOT, env={**os.environ, "FLAGPERF_WORK_ROOT": str(tmp_path / "work")},
                          capture_output=True, text=True, timeout=90)
    # Its own deadline ended it (not the 120 s it asked to hold: the subprocess limit would end the test first).
    assert done.returncode == EXIT_OVERRAN, done.stdout[-2000:] + done.stderr[-2000:]
    assert "nobody stopped it" in done.stderr
