"""The result schema's file formats: case.log's lines as the controller relays them; atomic writes."""

from __future__ import annotations

import json
import logging
import os

import pytest

from flagperf.paths import PROJECT_ROOT
from flagperf.results import schema


@pytest.mark.parametrize("level", [logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL])
def test_a_case_log_line_is_relayed_at_the_level_the_case_logged_it(level: int) -> None:
    """What the case process writes with CaseLogFormatter reads back as its level, and its message with the case's
    own time (the host's) but not its level (the relay shows it); every line of a multi-line message (a failure,
    a traceback) keeps the record's level; a line printed by a library stays as printed, at INFO."""
    record = logging.LogRecord("flagperf.case", level, __file__, 1, "out of memory: %s\n  tried %s", ("x", "2 GiB"),
                               None)
    lines = schema.CaseLogFormatter().format(record).split("\n")
    made = lines[0][:23]
    assert [schema.case_log_line(line) for line in lines] == [(level, f"{made} out of memory: x"),
                                                              (level, f"{made}   tried 2 GiB")]
    # a device process's line, as a round that measures every device marks it
    assert schema.case_log_line(f"[device 3] {lines[0]}") == (level, f"[device 3] {made} out of memory: x")
    printed = "2026-11-25 16:15:23 WARNING not the logging format (no milliseconds)"
    assert schema.case_log_line(printed) == (logging.INFO, printed)
    assert schema.case_log_line("sleeping") == (logging.INFO, "sleeping")


def test_a_case_s_debug_line_stays_in_the_run_s_log() -> None:
    """The run's log keeps INFO and above: a case's own DEBUG line is relayed at INFO, not dropped."""
    record = logging.LogRecord("flagperf.case", logging.DEBUG, __file__, 1, "shape search: %d", (81,), None)
    (line,) = schema.CaseLogFormatter().format(record).split("\n")
    assert schema.case_log_line(line) == (logging.INFO, f"{line[:23]} shape search: 81")


@pytest.mark.parametrize("at", ["mkdir", "close"])
def test_an_interrupt_as_an_atomic_write_begins_leaves_nothing_of_it(tmp_path, monkeypatch, at: str) -> None:
    """Ctrl-C just after the write's folder is made, or its temporary file: neither is left behind."""
    import os
    import signal
    import threading
    from pathlib import Path

    real = {"mkdir": Path.mkdir, "close": os.close}[at]
    sent: list[int] = []

    def then_ctrl_c(*args, **kwargs):
        result = real(*args, **kwargs)
        if not sent:
            sent.append(signal.SIGINT)
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # the handler runs before this returns
        return result

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    monkeypatch.setattr(*((Path, "mkdir") if at == "mkdir" else (os, "close")), then_ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt), schema.atomic_path(tmp_path / "made" / "deeper" / "x.json") as tmp:
            tmp.write_text("never")
    finally:
        monkeypatch.undo()
        signal.signal(signal.SIGINT, before)
    assert sent and list(tmp_path.iterdir()) == []


def test_a_failed_atomic_write_leaves_a_folder_another_writer_made_meanwhile(tmp_path, monkeypatch) -> None:
    """The round folder is missing when the write looks, and another writer (a thread collecting the next file)
    makes it before this one does: when this write fails, that folder is theirs and stays."""
    from pathlib import Path

    real_mkdir = Path.mkdir

    def made_by_another_first(self, *args, **kwargs):
        real_mkdir(self)  # the other writer's
        raise FileExistsError(17, "File exists", str(self))

    monkeypatch.setattr(Path, "mkdir", made_by_another_first)
    with pytest.raises(OSError, match="No space left"), schema.atomic_path(tmp_path / "round1" / "x.json") as tmp:
        raise OSError(28, "No space left on device", str(tmp))
    monkeypatch.undo()
    assert (tmp_path / "round1").is_dir() and list((tmp_path / "round1").iterdir()) == []


def test_an_atomic_write_flushes_its_folder_after_the_rename(tmp_path, monkeypatch) -> None:
    """Whole or not at all, and still there after a power cut (what `flagperf server` saves of the schedules users
    set is only worth that): the data is flushed before the rename, and after it the folder that holds the new
    name, and each folder made for it in its parent. Until then the rename may be lost though the data is not."""
    import os
    import stat

    real = os.fsync
    synced: list[tuple[int, bool]] = []
    target = tmp_path / "made" / "deeper" / "x.json"

    def noted(fd: int) -> None:
        status = os.fstat(fd)
        if stat.S_ISDIR(status.st_mode):
            synced.append((status.st_ino, target.exists()))
        real(fd)

    monkeypatch.setattr(os, "fsync", noted)
    schema.write_json_atomic(target, {"a": 1})
    folders = [target.parent, target.parent.parent, tmp_path]
    assert [(folder.stat().st_ino, True) for folder in folders] == synced


def test_the_input_limits_are_defined_once() -> None:
    """MAX_ROUNDS and MAX_NNODES (flagperf.results.limits) bound every place that takes rounds or nnodes: the
    nightly's rounds (its form and `flagperf nightly --help`), a FlagPerf test_conf.py's nnodes, the collective
    case's nnodes; MAX_BASELINE_RUNS the nightly's --baseline-runs (its check and its help), the monitor interval
    limits `flagperf run --monitor-interval` (its help and its error) and the evaluate form's (its bounds and its
    text). In a fresh Python whose limits are changed before anything reads them, each follows (a copy of the
    number would not)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import json
        import flagperf.results.limits as limits
        limits.MAX_ROUNDS, limits.MAX_NNODES, limits.MAX_BASELINE_RUNS = 7, 3, 9
        limits.MIN_MONITOR_INTERVAL_S, limits.MAX_MONITOR_INTERVAL_S = 0.5, 30.0
        from pydantic import ValidationError
        from typer.testing import CliRunner
        from flagperf.basespec.collective import Config
        from flagperf.config.night import BASELINE_RUNS, ROUNDS
        from flagperf.hosts import flagperf_training
        from flows.cli import app
        try:
            Config(operation="all_reduce", size_mib=1, nnodes=4)
            collective = "accepted"
        except ValidationError:
            collective = "refused"
        def said(*args):
            return " ".join(CliRunner().invoke(app, list(args)).output.replace("│", " ").split())
        helped, run_help = said("nightly", "--help"), said("run", "--help")
        refused = said("run", "--monitor-interval", "40")
        from prefect.utilities.callables import parameter_schema
        from flows.evaluate import evaluate_form
        form = parameter_schema(evaluate_form.fn).model_dump()["properties"]["monitor_interval_s"]
        print(json.dumps([ROUNDS.high, flagperf_training.MAX_NNODES, collective, "rounds per case (1-7)" in helped,
                          BASELINE_RUNS.problem(9), BASELINE_RUNS.problem(10) is not None,
                          "baseline (1-9)" in helped, "samples (0.5-30)" in run_help,
                          "must be between 0.5 and 30 seconds, got 40" in refused,
                          [form["minimum"], form["maximum"], form["description"]]]))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    said = json.loads(done.stdout.splitlines()[-1])
    assert said == [7, 3, "refused", True, None, True, True, True, True,
                    [0.5, 30, "Seconds between monitor samples (0.5 to 30)."]], done.stdout
