"""controller.log on a results disk that is full or fills: one warning line on stderr, then the run goes on
without the file; never a traceback per record, never an empty or cut-off file left to look like a log."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from mounts import fill_to_the_last_block, mounted_tmpfs

from flagperf.config.plan import PLAN_FILE
from flows.progress import CONTROLLER_LOG, RunFolderLog


@pytest.fixture
def run_log(tmp_path: Path) -> Iterator[tuple[Path, logging.Logger, RunFolderLog]]:
    """A run folder on a 1 MiB tmpfs, and a logger whose only handler is the run's log."""
    with mounted_tmpfs(tmp_path / "disk", "size=1m") as disk:
        run_dir = disk / "run"
        run_dir.mkdir()
        (run_dir / PLAN_FILE).write_text("{}", encoding="utf-8")  # the evaluation's plan: the run has begun
        handler = RunFolderLog(run_dir)
        logger = logging.getLogger(f"flagperf-test-run-log.{tmp_path.name}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        try:
            yield run_dir, logger, handler
        finally:
            logger.removeHandler(handler)
            handler.close()


def test_a_full_disk_costs_one_warning_line_and_leaves_no_empty_log(
        run_log: tuple[Path, logging.Logger, RunFolderLog], capfd: pytest.CaptureFixture[str]) -> None:
    run_dir, logger, handler = run_log
    fill_to_the_last_block(run_dir.parent)
    for number in range(200):
        logger.info("record %d", number)
    handler.close()  # nothing buffered: closing cannot fail either
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert str(run_dir / CONTROLLER_LOG) in err and "No space left on device" in err
    assert not (run_dir / CONTROLLER_LOG).exists()  # no 0-byte controller.log


def test_a_disk_that_fills_keeps_the_lines_written_and_a_retry_appends_on_a_new_line(
        run_log: tuple[Path, logging.Logger, RunFolderLog], capfd: pytest.CaptureFixture[str]) -> None:
    run_dir, logger, handler = run_log
    for number in range(10):
        logger.info("before %d", number)
    ballast = fill_to_the_last_block(run_dir.parent)
    for number in range(10_000):  # fills what the log file's last block had left, then fails
        logger.info("after %d %s", number, "x" * 100)
    handler.close()
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err, err
    kept = (run_dir / CONTROLLER_LOG).read_text(encoding="utf-8").splitlines()
    assert [line.rpartition(" - ")[2] for line in kept[:10]] == [f"before {n}" for n in range(10)]
    assert len(kept) < 10_010  # it did stop

    ballast.unlink()  # space is back: a retry's log continues the file, each record on its own line
    again = RunFolderLog(run_dir)
    logger.addHandler(again)
    logger.info("retry")
    again.close()
    lines = (run_dir / CONTROLLER_LOG).read_text(encoding="utf-8").splitlines()
    assert lines[:len(kept)] == kept and lines[-1].endswith(" - retry")
    assert capfd.readouterr().err == ""


def test_lines_logged_before_the_run_is_planned_are_written_once_it_is(tmp_path: Path) -> None:
    """The run folder is claimed (made empty) before the evaluation, which accepts it only while it holds nothing:
    the log waits for the evaluation's plan.json, not for the folder."""
    run_dir = tmp_path / "run"
    handler = RunFolderLog(run_dir)
    record = logging.LogRecord("flagperf", logging.INFO, __file__, 1, "planning %s", ("x",), None)
    handler.handle(record)
    run_dir.mkdir()
    handler.handle(logging.LogRecord("flagperf", logging.INFO, __file__, 1, "claimed", None, None))
    assert list(run_dir.iterdir()) == []
    (run_dir / PLAN_FILE).write_text("{}", encoding="utf-8")
    handler.handle(logging.LogRecord("flagperf", logging.INFO, __file__, 1, "running", None, None))
    handler.close()
    lines = (run_dir / CONTROLLER_LOG).read_text(encoding="utf-8").splitlines()
    assert [line.rpartition(" - ")[2] for line in lines] == ["planning x", "claimed", "running"]
