"""A file a run folder holds is read bounded and never waited on: plan.json by the host-round, the nightly flow,
the evaluation's fallback, the summary, the faults and the history; a monitor's samples file by its stop. A file
too large, not regular (a FIFO) or not valid JSON is one line naming the file, or is passed over where the reader
has a fallback; it is never read whole, and a FIFO never blocks the reader."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from flagperf.config.plan import PLAN_FILE, plan_run
from flagperf.errors import ConfigError
from flagperf.hosts.local import LocalHost
from flagperf.results.bounded import MAX_RECORD_BYTES, read_end, read_start
from flagperf.results.faults import expected_monitors
from flagperf.results.history import history_engine, record_run
from flagperf.results.summary import run_progress
from flows.host_round import read_plan
from tasks.monitor import _footer

FP32 = "computation-FP32"


@contextmanager
def fifo_offering(path: Path, text: str) -> Iterator[None]:
    """A FIFO at ``path`` whose writer gives ``text`` to whoever opens it to read: a reader that opens it gets the
    text (and would otherwise block); one that refuses it leaves the writer waiting, released at the end."""
    os.mkfifo(path)

    def offer() -> None:
        try:
            with open(path, "w", encoding="utf-8") as pipe:
                pipe.write(text)
        except OSError:  # the reader opened the pipe, saw it is no file and closed it: nothing to give
            pass

    writer = threading.Thread(target=offer, daemon=True)
    writer.start()
    try:
        yield
    finally:
        release = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # lets a writer still waiting in open() go on
        writer.join()
        os.close(release)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "results" / "run-a"
    folder.mkdir(parents=True)
    return folder


def a_plan(results: Path) -> str:
    return plan_run(cases=[FP32], rounds=1, results_dir=results, run_id="run-planned").model_dump_json()


def test_a_plan_that_is_a_fifo_is_refused_in_one_line_not_read(run_dir: Path) -> None:
    with fifo_offering(run_dir / PLAN_FILE, a_plan(run_dir.parent)):
        with pytest.raises(ConfigError, match="named pipe") as info:
            read_plan(run_dir)
        assert f"run-a/{PLAN_FILE}" in str(info.value) and "\n" not in str(info.value)
        assert run_progress(run_dir, []) == {}  # the report's progress: no plan, counts alone
        assert expected_monitors(run_dir) == set()
        engine = history_engine(f"sqlite:///{run_dir.parent / 'history.sqlite'}")
        with pytest.raises(ConfigError, match="named pipe"):
            record_run(engine, run_dir)


def test_a_plan_too_large_is_refused_before_it_is_read(run_dir: Path) -> None:
    with open(run_dir / PLAN_FILE, "wb") as plan:  # sparse: no disk, and it would be read whole
        plan.truncate(MAX_RECORD_BYTES + 1)
    with pytest.raises(ConfigError, match=f"a run's plan is at most {MAX_RECORD_BYTES} bytes") as info:
        read_plan(run_dir)
    assert f"run-a/{PLAN_FILE}" in str(info.value)


@pytest.mark.parametrize("text", ['{"run_id": "run-a", ', '{"run_id": "run-a"}', "[]"])
def test_a_plan_that_is_not_one_is_one_line_naming_the_file(run_dir: Path, text: str) -> None:
    (run_dir / PLAN_FILE).write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match="not a run's plan") as info:
        read_plan(run_dir)
    assert f"run-a/{PLAN_FILE}" in str(info.value) and "\n" not in str(info.value)


def test_a_plan_is_read_as_written(run_dir: Path) -> None:
    (run_dir / PLAN_FILE).write_text(a_plan(run_dir.parent), encoding="utf-8")
    assert [c.name for c in read_plan(run_dir).cases] == [FP32]


def test_a_monitor_file_is_read_from_its_end_and_never_waited_on(tmp_path: Path) -> None:
    footer = '{"type": "footer", "samples": 3, "stopped_at": 1.0, "reason": "signal"}\n'
    samples = tmp_path / "monitor_system.jsonl"
    samples.write_text('{"type": "sample", "t": 0.0, "cpu": 1.0}\n' * 50_000 + footer, encoding="utf-8")
    host = LocalHost(work_root=tmp_path)
    assert _footer(host, samples) == json.loads(footer)
    with fifo_offering(tmp_path / "monitor_fifo.jsonl", footer):
        assert _footer(host, tmp_path / "monitor_fifo.jsonl") is None


def test_the_ends_of_a_file_are_read_alone(tmp_path: Path) -> None:
    log = tmp_path / "case.log"
    with open(log, "wb") as out:  # 2 GiB, sparse: only its last line is wanted
        out.seek(2 << 30)
        out.write(b"\nlast line\n")
    assert read_end(log, 4096).splitlines()[-1] == "last line"
    assert read_start(log, 16) == "\0" * 16
    with fifo_offering(tmp_path / "pipe", "x"):
        assert read_end(tmp_path / "pipe", 16) is None and read_start(tmp_path / "pipe", 16) is None
    assert read_end(tmp_path / "missing", 16) is None


def test_a_round_result_that_is_a_fifo_or_too_large_is_no_result(tmp_path: Path) -> None:
    """result.json is read by the summary, the faults, the report, the progress and the collection: a FIFO there
    is refused unread (ValueError, as any result that is not one), a missing file stays an OSError."""
    from flagperf.results.faults import rerun_faults
    from flagperf.results.schema import RESULT_FILE, read_result

    rerun = tmp_path / "run-a" / "retries" / "attempt1" / FP32 / "round1" / "h1_noderank0"
    rerun.mkdir(parents=True)
    with fifo_offering(rerun / RESULT_FILE, "{}"):
        with pytest.raises(ValueError, match="named pipe"):
            read_result(rerun / RESULT_FILE)
        assert rerun_faults(tmp_path / "run-a") == []
    large = tmp_path / RESULT_FILE
    with open(large, "wb") as out:
        out.truncate(MAX_RECORD_BYTES + 1)
    with pytest.raises(ValueError, match=f"more than {MAX_RECORD_BYTES} bytes"):
        read_result(large)
    with pytest.raises(FileNotFoundError):
        read_result(tmp_path / "missing" / RESULT_FILE)
