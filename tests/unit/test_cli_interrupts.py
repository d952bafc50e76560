"""Ctrl-C and SIGTERM in every `flagperf` command, delivered in this process at a known point of the command (to
the main thread, where the command's handler takes it at once): exit 128 + the signal, one error line saying what
was stopped and what was kept, no traceback, never typer's silent exit 130; a file being written is whole or not
there; the process's signal handlers are put back afterwards. `run` and `nightly` at their header:
tests/unit/test_cli.py; stopped while they measure: tests/integration/test_interrupt_retry.py."""

from __future__ import annotations

import functools
import json
import os
import signal
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from flagperf.config import plan
from flagperf.paths import PROJECT_ROOT, SERVER_LOGS
from flagperf.results import schema
from flows import cli
from flows.cli import NOTHING_WRITTEN, app
from tests.unit.test_report import make_run

pytestmark = pytest.mark.usefixtures("restored_process_state")
SIGNALS = [signal.SIGINT, signal.SIGTERM]


def deliver(sig: int) -> None:
    """The signal to this thread (the main one): its handler has run when this returns."""
    assert threading.current_thread() is threading.main_thread()
    signal.pthread_kill(threading.get_ident(), sig)


def signal_at(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, sig: int = signal.SIGINT, *,
              when: Callable[..., bool] = lambda *args, **kwargs: True, after: bool = False) -> list[int]:
    """``owner.name`` delivers ``sig`` on its first call for which ``when(*args)`` holds: before the real one
    runs, or ``after`` it returned. Returns the signals delivered."""
    real = getattr(owner, name)
    sent: list[int] = []

    @functools.wraps(real)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        due = not sent and when(*args, **kwargs)
        if due and not after:
            sent.append(sig)
            deliver(sig)
        result = real(*args, **kwargs)
        if due and after:
            sent.append(sig)
            deliver(sig)
        return result

    monkeypatch.setattr(owner, name, wrapper)
    return sent


def invoke(*args: str) -> Any:
    handlers = {sig: signal.getsignal(sig) for sig in SIGNALS}
    result = CliRunner().invoke(app, list(args))
    assert {sig: signal.getsignal(sig) for sig in SIGNALS} == handlers, "the command left its handlers installed"
    return result


def told(result: Any, sig: int, line: str) -> None:
    """Exit 128 + sig and exactly this one error line, no traceback."""
    assert result.exit_code == 128 + sig, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output and "KeyboardInterrupt" not in result.output, result.output
    errors = [" ".join(x.split()) for x in result.output.split("error: ")[1:]]  # a long line may be wrapped
    assert errors == [line], result.output


def no_partial_files(folder: Path) -> None:
    """Nothing half-written: no temporary name of an atomic write is left."""
    assert [p for p in folder.rglob(".*")] == [], list(folder.rglob(".*"))


def leaf_commands(typer_app: typer.Typer, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for info in typer_app.registered_commands:
        yield (*prefix, info.name or info.callback.__name__.replace("_", "-")), info
    for group in typer_app.registered_groups:
        yield from leaf_commands(group.typer_instance, (*prefix, group.name))


COMMANDS = dict(leaf_commands(app))
REQUIRED_ARGUMENTS = {("report",): ["RUN"], ("compare",): ["A", "B"], ("diagnose",): ["RUN"],
                      ("validate",): ["FILE"], ("vendor", "check"): ["FOLDER"], ("vendor", "new"): ["acme"]}


def test_every_command_is_below() -> None:
    assert sorted(COMMANDS) == sorted([("run",), ("report",), ("compare",), ("diagnose",), ("nightly",),
                                       ("server",), ("validate",), ("list",), ("vendor", "check"),
                                       ("vendor", "new")])


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
@pytest.mark.parametrize("command", sorted(COMMANDS), ids=" ".join)
def test_every_command_stopped_as_it_starts_says_so_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                command: tuple[str, ...], sig: int) -> None:
    """The app's one handler: a signal the moment a command begins (before any step of its own) ends it in one
    line, exit 128 + the signal; SIGTERM too, which would otherwise end the process with no clean-up at all."""
    info = COMMANDS[command]
    signal_at(monkeypatch, info, "callback", sig)
    monkeypatch.chdir(tmp_path)
    arguments = [str(tmp_path / a) if a.isupper() else a for a in REQUIRED_ARGUMENTS.get(command, [])]
    told(invoke(*command, *arguments), sig, NOTHING_WRITTEN)
    assert list(tmp_path.iterdir()) == []


def test_list_stopped_while_it_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    signal_at(monkeypatch, cli.console, "print")
    told(invoke("list"), signal.SIGINT, NOTHING_WRITTEN)


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_report_stopped_as_a_file_is_written_leaves_each_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    sig: int) -> None:
    """Caught between writing report.html and putting it in place: report.html is not there (not half of it),
    the files written before it are whole, and the command says how to write it again."""
    run = make_run(tmp_path, "run-a", [1.0, 1.01])
    records = {p: p.read_bytes() for p in run.rglob("result.json")}
    signal_at(monkeypatch, os, "replace", sig, when=lambda _src, dst: Path(dst).name == "report.html")
    told(invoke("report", str(run)), sig,
         f"interrupted while the report of {run} was written: its rounds' records are untouched and each report "
         f"file is whole (some may be the earlier ones); `flagperf report {run}` writes them all again")
    assert not (run / "report.html").exists()
    json.loads((run / "summary.json").read_text())
    assert (run / "report.md").read_text().startswith("#")
    no_partial_files(run)
    assert {p: p.read_bytes() for p in run.rglob("result.json")} == records
    assert invoke("report", str(run)).exit_code == 0 and (run / "report.html").is_file()


def test_report_stopped_once_written_says_it_is_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped while the summary is printed, after the report was written: not "nothing was written"."""
    run = make_run(tmp_path, "run-a", [1.0, 1.01])
    signal_at(monkeypatch, cli, "_print_summary")
    told(invoke("report", str(run)), signal.SIGINT,
         f"interrupted; the report of {run} was written whole ({run / 'report.html'})")
    assert (run / "report.html").is_file()


def test_compare_stopped_as_it_writes_out_leaves_no_half_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = make_run(tmp_path, "run-a", [1.0, 1.01]), make_run(tmp_path, "run-b", [0.9, 0.91])
    out = tmp_path / "compared" / "a-b.md"
    out.parent.mkdir()
    signal_at(monkeypatch, os, "replace", when=lambda _src, dst: Path(dst) == out)
    told(invoke("compare", str(a), str(b), "--out", str(out)), signal.SIGINT,
         f"interrupted; --out {out} was not written (one there before is as it was)")
    assert list(out.parent.iterdir()) == []
    # The folder is the user's to make, as before: one line, nothing made.
    missing = tmp_path / "nowhere" / "a-b.md"
    result = invoke("compare", str(a), str(b), "--out", str(missing))
    assert result.exit_code == 2 and f"--out {missing}: folder {missing.parent} does not exist" in result.output
    assert not missing.parent.exists()


def test_diagnose_stopped_as_it_writes_leaves_each_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(tmp_path, "run-a", [1.0, 1.01])
    signal_at(monkeypatch, os, "replace", when=lambda _src, dst: Path(dst).name == "diagnosis.md")
    told(invoke("diagnose", str(run)), signal.SIGINT,
         f"interrupted while the diagnosis of {run} was written: diagnosis.json and diagnosis.md are each whole "
         "(either may be the earlier one); run the command again")
    json.loads((run / "diagnosis.json").read_text())
    assert not (run / "diagnosis.md").exists()
    no_partial_files(run)


def test_validate_stopped_says_how_far_it_got(monkeypatch: pytest.MonkeyPatch) -> None:
    files = [PROJECT_ROOT / "deployments" / "suites" / "smoke.yaml", PROJECT_ROOT / "vendor_images" / "cpu" /
             "vendor.yaml"]
    signal_at(monkeypatch, cli, "_validate_file", when=lambda path: path == files[1])
    result = invoke("validate", *map(str, files))
    told(result, signal.SIGINT, "interrupted after checking 1 of 2 files; nothing was written")
    assert f"ok    {files[0]}" in result.output


def test_validate_stopped_while_it_tries_a_results_folder_removes_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A host.yaml's results folder (FLAGPERF_LOG_PATH) is checked by making it and writing there, then removed:
    a signal meanwhile waits for the removal (a short step), then stops the command."""
    results = tmp_path / "made" / "results"
    inventory = tmp_path / "host.yaml"
    inventory.write_text(f'FLAGPERF_LOG_PATH: "{results}"\nVENDOR: "cpu"\nHOSTS: ["127.0.0.1"]\n'
                         'CASES: {"computation-FP32": "pytorch"}\n', encoding="utf-8")
    sent = signal_at(monkeypatch, schema, "folder_problem", after=True)
    told(invoke("validate", str(inventory)), signal.SIGINT, "interrupted after checking 0 of 1 files; nothing was "
                                                            "written")
    assert sent and not (tmp_path / "made").exists()


def test_vendor_new_stopped_midway_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped after two of its files: no half folder, no staging folder, not even the --into folder it made."""
    written: list[Path] = []
    signal_at(monkeypatch, Path, "write_text", when=lambda path, *_a, **_k: bool(written.append(path))
              or len(written) == 3)
    into = tmp_path / "vendors"
    told(invoke("vendor", "new", "acme", "--into", str(into)), signal.SIGINT, NOTHING_WRITTEN)
    assert len(written) == 3 and list(tmp_path.iterdir()) == []


def test_vendor_check_stopped_at_a_monitor(monkeypatch: pytest.MonkeyPatch) -> None:
    from flagperf.hosts import vendorcheck

    sent = signal_at(monkeypatch, vendorcheck, "_check_monitor")
    told(invoke("vendor", "check", str(PROJECT_ROOT / "vendor_images" / "cpu")), signal.SIGINT, NOTHING_WRITTEN)
    assert sent


def test_server_stopped_while_its_input_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from flows import server

    signal_at(monkeypatch, server, "check_database_url", signal.SIGTERM)
    told(invoke("server", "--database-url", "postgresql+asyncpg://lab@127.0.0.1:5432/prefect"), signal.SIGTERM,
         "interrupted before the server started; nothing was started")


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_run_stopped_while_its_input_is_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: int) -> None:
    """SIGTERM is told as itself (143), not as a Ctrl-C."""
    monkeypatch.setenv("FLAGPERF_SUITE_PATH", str(PROJECT_ROOT / "tests" / "fixtures" / "suites"))
    signal_at(monkeypatch, plan, "plan_run", sig)
    told(invoke("run", "--suite", "tiny", "--results", str(tmp_path / "results")), sig,
         "interrupted before anything started")
    assert list(tmp_path.iterdir()) == []


def test_nightly_stopped_while_its_history_opens_leaves_nothing(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The history's check (a database slow to answer) can be interrupted: the results folder it made goes, and no
    history is made (a SQLite history is made when a night records)."""
    from flows import nightly_cli

    monkeypatch.setenv("FLAGPERF_SUITE_PATH", str(PROJECT_ROOT / "tests" / "fixtures" / "suites"))
    monkeypatch.delenv("FLAGPERF_HISTORY_URL", raising=False)
    sent = signal_at(monkeypatch, nightly_cli, "check_history", after=True)
    told(invoke("nightly", "--suite", "tiny", "--rounds", "1", "--results", str(tmp_path / "results")),
         signal.SIGINT, "interrupted before anything started")
    assert sent and list(tmp_path.iterdir()) == []


def python_child(code: str) -> Any:
    """``code`` run by this Python in a process of its own (a signal's default action ends it, not pytest)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=PROJECT_ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_third_signal_stops_a_clean_up_that_hangs_saying_what_may_be_left(sig: int) -> None:
    """The first signal stops the command, the second is ignored while it cleans up, and the third (a history
    write that does not end) stops the process at once by that signal after one line: what may be left."""
    child = python_child(f"""
        import signal
        from flows.cli import _interrupt_handler
        with _interrupt_handler() as interrupt:
            interrupt.left = "the night's record may be missing"
            try:
                signal.raise_signal({sig})
            except KeyboardInterrupt:
                signal.raise_signal({sig})
                print("cleaning up after the second", flush=True)
                signal.raise_signal({sig})
                print("went on after the third", flush=True)
        """)
    assert child.returncode == -sig, (child.stdout, child.stderr)
    assert child.stdout == "cleaning up after the second\n"
    assert child.stderr == "stopping now: the night's record may be missing\n"


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_the_third_signal_stops_also_when_the_second_landed_in_an_earlier_clean_up_step(sig: int) -> None:
    """The count is the command's, not each clean-up step's: the first stops the command, the second is noted while
    the run's report is written, and the third, while the night is recorded (a history that does not answer), stops
    the process at once; each step used to count afresh, so a fourth or fifth was needed."""
    child = python_child(f"""
        import signal
        from flows.cli import _interrupt_handler
        from flagperf.stopping import signals_noted
        with _interrupt_handler():
            try:
                signal.raise_signal({sig})
            except KeyboardInterrupt:
                with signals_noted("the report may be missing"):
                    signal.raise_signal({sig})
                    print("the report written", flush=True)
                with signals_noted("the night's record may be missing"):
                    signal.raise_signal({sig})
                    print("went on after the third", flush=True)
        """)
    assert child.returncode == -sig, (child.stdout, child.stderr)
    assert child.stdout == "the report written\n"
    assert child.stderr == "stopping now: the night's record may be missing\n"


def test_a_command_called_as_a_function_leaves_no_handler_behind(tmp_path: Path) -> None:
    """`cli.nightly(...)` called outside the app (a library, a test) runs under a handler of its own, and the
    process's signal handlers of before are back afterwards, with no stale handler left for the next call."""
    handlers = {sig: signal.getsignal(sig) for sig in SIGNALS}
    with pytest.raises(typer.Exit) as refused:
        cli.nightly(suite="no-such-suite", rounds=3, set_=None, results=tmp_path / "results", history_url=None,
                    baseline_runs=5, sigma=3.0, vendor=None, inventory=None, verbose=False)
    assert refused.value.exit_code == 2
    assert {sig: signal.getsignal(sig) for sig in SIGNALS} == handlers
    assert cli._COMMAND_INTERRUPT.get() is None


def test_validate_stopped_between_files_says_how_far_it_got(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the first file's ok line is printed, before the second is read: not the app's 'nothing was written'."""
    files = [PROJECT_ROOT / "deployments" / "suites" / "smoke.yaml", PROJECT_ROOT / "vendor_images" / "cpu" /
             "vendor.yaml"]
    sent = signal_at(monkeypatch, cli.console, "print", when=lambda line, *_a, **_k: str(line).startswith(
        "[green]ok"), after=True)
    told(invoke("validate", *map(str, files)), signal.SIGINT,
         "interrupted after checking 1 of 2 files; nothing was written")
    assert sent


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_server_stopped_once_its_logs_folder_is_made_removes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 sig: int) -> None:
    """Before serve installs its own handler, once it made the logs folder: 'nothing was started' is true, the
    folder it made goes."""
    log_dir = tmp_path / "made" / "logs"
    sent = signal_at(monkeypatch, Path, "mkdir", sig, when=lambda path, *_a, **_k: path == log_dir, after=True)
    told(invoke("server", "--database-url", "postgresql+asyncpg://lab@127.0.0.1:5432/prefect", "--log-dir",
                str(log_dir)), sig, "interrupted before the server started; nothing was started")
    assert sent and list(tmp_path.iterdir()) == []
    # Without --log-dir, the logs go to the --results folder's server/ (paths.SERVER_LOGS, which no run may take and
    # the site never serves), wherever --results is: the folder made first is that, and it goes too.
    monkeypatch.undo()
    made: list[Path] = []
    sent = signal_at(monkeypatch, Path, "mkdir", sig, when=lambda path, *_a, **_k: made.append(path) is None,
                     after=True)
    told(invoke("server", "--database-url", "postgresql+asyncpg://lab@127.0.0.1:5432/prefect", "--results",
                str(tmp_path / "lab-results")), sig, "interrupted before the server started; nothing was started")
    assert sent and made[:1] == [tmp_path / "lab-results" / SERVER_LOGS] and list(tmp_path.iterdir()) == [], made


@pytest.mark.parametrize("code", [0, 5, 130])
def test_an_outcome_that_stands_after_an_interrupt_is_an_error_only_where_it_exits_non_zero(
        code: int, capsys: pytest.CaptureFixture[str]) -> None:
    """A night that held (exit 0) and was interrupted as it ended says so plainly; a regression (5) or a night
    stopped (128 + N) is an error line."""
    with pytest.raises(typer.Exit) as ended:
        raise cli._stood(f"interrupted as the night ended; its outcome above (exit {code}) stands", code)
    assert ended.value.exit_code == code
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and f"(exit {code}) stands" in said, said
    assert said.startswith("error: ") == (code != 0), said


def test_a_handler_installed_outside_python_is_put_back_as_the_default_action() -> None:
    """signal.getsignal gives None for a handler installed outside Python; putting that back used to raise
    TypeError (in a finally, hiding the command's exit) or leave the clean-up's handler installed for good."""
    from flagperf.stopping import put_back

    before = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, lambda *_: None)
        put_back({signal.SIGTERM: None})
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_command_in_another_thread_has_its_own_handler_and_count() -> None:
    """Two commands in one process, one called as a function in a worker thread while the main thread runs the
    other: each has its own handler. The worker's step that only notes signals (as `validate` trying a results
    folder) leaves the main thread's command armed, and a signal (delivered to the main thread, where the handlers
    are) counts for the main thread's command only."""
    in_step, release = threading.Event(), threading.Event()
    seen: dict[str, cli.Interrupt] = {}

    @cli._own_handler
    def worker_command() -> None:
        seen["worker"] = cli._interrupt()
        with cli._noted_only():
            in_step.set()
            release.wait(timeout=60)

    with cli._interrupt_handler() as main_interrupt:
        thread = threading.Thread(target=worker_command)
        thread.start()
        try:
            assert in_step.wait(timeout=60)
            assert cli._interrupt() is main_interrupt
            with pytest.raises(KeyboardInterrupt, match="SIGINT"):  # at once: not disarmed by the worker's step
                deliver(signal.SIGINT)
        finally:
            release.set()
            thread.join(timeout=60)
    assert main_interrupt.signals == [signal.SIGINT]
    assert seen["worker"] is not main_interrupt and seen["worker"].signals == []
    assert seen["worker"].armed  # its own step ended: armed again, as a command is
    assert cli._COMMAND_INTERRUPT.get() is None
