"""controller.lock (flagperf.results.controller): a controller that ends on its own before its summary never reads as
killed; one run folder gets one controller, also of two started at once; a child forked without exec keeps no lock;
the machine's boot tells a restart; a folder holding only the record is an empty one; a run folder a controller made
goes with its record where nothing else is in it; a system without open file description locks runs without one."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flagperf.errors import ConfigError
from flagperf.paths import PROJECT_ROOT
from flagperf.results import controller
from flagperf.results.controller import (
    CONTROLLER_FILE,
    ControllerGone,
    controller_gone,
    controller_record,
    held_by,
    read_record,
    this_machine,
)
from flagperf.results.summary import SUMMARY_JSON, hosts_left_out, summarize
from flagperf.site.runs import list_runs
from tests.unit.controllers import contend, told
from tests.unit.controllers import controller as controller_process

NO_PID = 2**22 + 1  # above the kernel's PID_MAX_LIMIT: no process has it


def planned_run(root: Path) -> Path:
    """A run folder of 1 round on 2 hosts with a plan and nothing measured: no summary.json."""
    run = root / "run20260301020000-dc14"
    run.mkdir(parents=True)
    (run / "plan.json").write_text(json.dumps({"rounds": 1, "hosts": [{"name": "h1"}, {"name": "h2"}],
                                               "cases": [{"name": "computation-FP32"}]}), encoding="utf-8")
    return run


def gone(run: Path) -> ControllerGone | None:
    return controller_gone(run, run / SUMMARY_JSON)


@pytest.mark.parametrize(("what", "how"), [("raise", "stopped by LookupError before writing it"),
                                           ("return", "ended without writing it"),
                                           ("SIGINT", "stopped by KeyboardInterrupt before writing it")])
def test_a_controller_that_ends_before_its_summary_reads_as_ended_never_as_killed(
        tmp_path: Path, what: str, how: str) -> None:
    """A failed healthcheck or image build (an exception out of the run), a run that returns early, Ctrl-C during
    an image build: each ends the controller without summary.json or interrupted.json. It let go of the lock as it
    ended, so compare, diagnose and the site said "killed": its record now says it ended, and how."""
    run = planned_run(tmp_path)
    proc, _ = controller_process(run)
    if what == "SIGINT":
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) != 0
    else:
        assert (told(proc, what) != 0) == (what == "raise")
    said = gone(run)
    assert said == ControllerGone(False, f"its controller (pid {proc.pid} on {socket.gethostname()}) {how}"), said
    line = hosts_left_out(run, summarize(run)) or ""
    assert (f"h1_noderank0 (computation-FP32 round1: not run: the run ended without its summary.json, its controller "
            f"(pid {proc.pid} on {socket.gethostname()}) {how})") in line, line
    assert "killed" not in line
    assert (list_runs(tmp_path)[0].outcome, list_runs(tmp_path)[0].tone) == ("ended without a report", "bad")


def test_a_controller_that_wrote_its_summary_leaves_its_record_as_it_was(tmp_path: Path) -> None:
    run = planned_run(tmp_path)
    proc, _ = controller_process(run)
    assert told(proc, "summary") == 0
    record = json.loads((run / CONTROLLER_FILE).read_text(encoding="utf-8"))
    assert record["pid"] == proc.pid and "ended" not in record
    assert gone(run) is None  # its summary is newer than its record: it ended with it


def test_of_two_controllers_started_at_once_one_runs_and_the_other_is_refused(tmp_path: Path) -> None:
    """Two retries of one run started together both ran: each checked for a holder, then locked a new file of its
    own. Now the lock is taken on the file that stays at the name, in one step: one holds it, the other is refused.
    Started together (a barrier), many times over, an earlier killed controller's record there."""
    run = planned_run(tmp_path)
    (run / CONTROLLER_FILE).write_text(json.dumps({**this_machine(), "pid": NO_PID, "started": "then"}),
                                       encoding="utf-8")
    context = multiprocessing.get_context("spawn")  # never a fork of the test process (its threads, its locks)
    times = 10
    start, outcomes, release = context.Barrier(2), context.Queue(), context.Barrier(3)
    contenders = [context.Process(target=contend, args=(str(run), times, start, outcomes, release))
                  for _ in range(2)]
    for process in contenders:
        process.start()
    try:
        for _ in range(times):
            said = sorted(outcomes.get(timeout=120) for _ in contenders)
            release.wait(timeout=120)
            assert said == ["held", "refused"]
        for process in contenders:
            process.join(timeout=120)
        assert [process.exitcode for process in contenders] == [0, 0]
    finally:
        for process in contenders:
            process.kill()


def test_a_child_forked_without_exec_keeps_no_lock_once_its_controller_is_killed(tmp_path: Path) -> None:
    """A child the controller forked (not exec'd) shared its lock and kept it after the controller died: the run
    read as still going. The child lets go of it as it is forked."""
    run = planned_run(tmp_path)
    proc, lines = controller_process(run)
    assert proc.stdin is not None
    proc.stdin.write("fork\n")
    proc.stdin.flush()
    child = int(lines.next().split()[1])
    try:
        assert held_by(run / CONTROLLER_FILE) is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=120)
        assert os.kill(child, 0) is None  # the child runs on
        said = gone(run)
        assert said is not None and said.killed, said
        assert held_by(run / CONTROLLER_FILE) is None
    finally:
        os.kill(child, signal.SIGKILL)


def test_which_machine_and_boot_a_record_is_of_tells_whether_its_controller_is_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record nobody locks: of this host and boot (the same kernel, whose lock table said free), its controller was
    killed, machine id or none; of this machine and an earlier boot, the machine restarted (said only where both
    have a machine id: two containers may share a host name); another host's, a record without a boot, or one whose
    pid runs here (a run folder copied while its controller ran), nothing is said."""
    run = planned_run(tmp_path)
    machine_id = tmp_path / "machine-id"
    machine_id.write_text("0123456789abcdef0123456789abcdef\n", encoding="utf-8")
    monkeypatch.setattr(controller, "MACHINE_ID_FILES", (machine_id,))
    here = this_machine()
    assert here["machine"] and here["boot"], "this test needs a boot id (Linux)"

    def record(**fields: Any) -> ControllerGone | None:
        (run / CONTROLLER_FILE).write_text(json.dumps({**here, "pid": NO_PID, "started": "then", **fields}),
                                           encoding="utf-8")
        return gone(run)

    who = f"its controller (pid {NO_PID} on {socket.gethostname()})"
    assert record() == ControllerGone(True, f"{who} is gone: killed, or its machine stopped")
    assert record(boot="another-boot") == ControllerGone(True, f"{who} is gone: its machine restarted since")
    assert record(pid=os.getpid()) is None  # its process runs: a copy of a run folder still going
    assert record(boot="") is None
    assert record(boot="another-boot", machine="another-machine") is None
    assert record(host="elsewhere") is None
    assert record(host="elsewhere", ended="then", how="ConfigError") == ControllerGone(
        False, f"its controller (pid {NO_PID} on elsewhere) stopped by ConfigError before writing it")
    monkeypatch.setattr(controller, "MACHINE_ID_FILES", (tmp_path / "no-machine-id",))
    assert record(machine="") == ControllerGone(True, f"{who} is gone: killed, or its machine stopped")
    assert record(machine="", boot="another-boot") is None


def test_a_controller_killed_before_its_machine_restarted_reads_as_such(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller killed for real, its record read on this boot (killed) and on a later one (the boot id file
    another's: restarted), with the machine id the test gave it; read with no machine id, a restart is not told."""
    run = planned_run(tmp_path)
    machine_id = tmp_path / "machine-id"
    machine_id.write_text("fedcba9876543210fedcba9876543210\n", encoding="utf-8")
    monkeypatch.setattr(controller, "MACHINE_ID_FILES", (machine_id,))
    proc, _ = controller_process(run, machine_id)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=120)
    who = f"its controller (pid {proc.pid} on {socket.gethostname()})"
    assert gone(run) == ControllerGone(True, f"{who} is gone: killed, or its machine stopped")
    later_boot = tmp_path / "boot_id"
    later_boot.write_text("00000000-1111-2222-3333-444444444444\n", encoding="utf-8")
    monkeypatch.setattr(controller, "BOOT_ID_FILE", later_boot)
    assert gone(run) == ControllerGone(True, f"{who} is gone: its machine restarted since")
    monkeypatch.setattr(controller, "MACHINE_ID_FILES", (tmp_path / "no-machine-id",))
    assert gone(run) is None


def test_a_run_folder_the_controller_made_holds_its_lock_and_goes_when_nothing_else_is_in_it(tmp_path: Path) -> None:
    """A run started from a server's UI or a deployment has no run folder yet: its controller made no record and
    held no lock. It makes the folder; a run refused as bad input leaves nothing; one that wrote its plan keeps it."""
    run = tmp_path / "results" / "new"
    with pytest.raises(ConfigError), controller_record(run, run / SUMMARY_JSON):
        assert held_by(run / CONTROLLER_FILE) is not None
        raise ConfigError("suite.yaml", "cases", "bad input")
    assert not (tmp_path / "results").exists()
    with pytest.raises(ConfigError), controller_record(run, run / SUMMARY_JSON):
        (run / "plan.json").write_text("{}", encoding="utf-8")
        raise ConfigError("suite.yaml", "cases", "bad input")
    assert sorted(path.name for path in run.iterdir()) == [CONTROLLER_FILE, "plan.json"]
    assert json.loads((run / CONTROLLER_FILE).read_text(encoding="utf-8"))["how"] == "ConfigError"


def test_without_open_file_description_locks_a_run_goes_on_and_readers_say_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """macOS has no F_OFD_*, nor has Python built against glibc before 2.20: readers raised AttributeError (compare,
    diagnose, the site, --retry) and the flow failed with a traceback. Python without the names takes the kernel's
    numbers on Linux; without the locks, a run goes on with one note, an earlier killed attempt's record emptied (it
    would say this running one was killed), and readers say nothing."""
    script = ("import fcntl, sys\ndel fcntl.F_OFD_GETLK, fcntl.F_OFD_SETLK\nfrom pathlib import Path\n"
              "from flagperf.results.controller import CONTROLLER_FILE, controller_record, held_by\n"
              "run = Path(sys.argv[1])\nwith controller_record(run, run / 'summary.json'):\n"
              "    print(held_by(run / CONTROLLER_FILE) is not None)\n")
    run = planned_run(tmp_path)
    out = subprocess.run([sys.executable, "-c", script, str(run)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}).stdout
    assert out == "True\n"
    (run / CONTROLLER_FILE).write_text(json.dumps({**this_machine(), "pid": NO_PID, "started": "then"}),
                                       encoding="utf-8")
    assert gone(run) is not None and gone(run).killed  # type: ignore[union-attr]
    monkeypatch.setattr(controller, "F_OFD_SETLK", None)
    with caplog.at_level(logging.INFO, logger=controller.__name__), controller_record(run, run / SUMMARY_JSON):
        assert gone(run) is None and held_by(run / CONTROLLER_FILE) is None
    assert "could not be locked" in caplog.text
    monkeypatch.setattr(controller, "F_OFD_GETLK", None)
    (run / CONTROLLER_FILE).write_text(json.dumps({**this_machine(), "pid": NO_PID, "started": "then"}),
                                       encoding="utf-8")
    assert gone(run) is None and held_by(run / CONTROLLER_FILE) is None


def test_a_record_that_cannot_be_read_is_none(tmp_path: Path) -> None:
    """A read error (here: a file open for writing only) was raised out of read_record: the refused controller went
    on unlocked, and readers raised."""
    with (tmp_path / CONTROLLER_FILE).open("wb") as handle:
        assert read_record(handle) is None


def test_an_interrupt_while_the_record_is_written_leaves_no_lock_held(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the record is written (before the run): the lock was kept by a file left open."""
    run = planned_run(tmp_path)

    def interrupted(*args: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(controller.os, "pwrite", interrupted)
    with pytest.raises(KeyboardInterrupt), controller_record(run, run / SUMMARY_JSON):
        pass
    monkeypatch.undo()
    lock = (run / CONTROLLER_FILE).stat()
    opened = [os.stat(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd") if fd.isdigit()
              and os.path.exists(f"/proc/self/fd/{fd}")]
    assert (lock.st_dev, lock.st_ino) not in {(info.st_dev, info.st_ino) for info in opened}
    assert not controller._held


def test_a_run_folder_holding_only_a_controllers_record_is_taken_as_empty(tmp_path: Path) -> None:
    """A controller stopped between its record and its plan left a folder a retry of the flow run refused as
    "already exists"; only the record (and an earlier version's temporary file of it) there: nothing to
    overwrite."""
    from flagperf.config.plan import plan_run
    from flagperf.errors import ConfigError

    run = tmp_path / "run-a"
    run.mkdir()
    (run / CONTROLLER_FILE).write_text("{}", encoding="utf-8")
    (run / f".{CONTROLLER_FILE}.0123456789ab.tmp").write_text("", encoding="utf-8")
    plan = plan_run(cases=["computation-FP32"], results_dir=tmp_path, run_id="run-a", flow_run_id="f-1")
    assert plan.run_id == "run-a"
    (run / "controller.log").write_text("", encoding="utf-8")
    with pytest.raises(ConfigError, match="already exists"):
        plan_run(cases=["computation-FP32"], results_dir=tmp_path, run_id="run-a", flow_run_id="f-1")
