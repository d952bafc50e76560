"""Host-side readers of files a case or a Slurm job left: a training rank's PerfLog (the round's result is read
from it), and the Slurm host's job records and logs. Each holds a bounded amount of memory however large the
file grew (measured with tracemalloc against the file's size) and never waits on a FIFO."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flagperf.hosts import slurm
from flagperf.measure.perflog import format_line, parse_file
from flagperf.training.launch import training_result, user_error, where_it_stopped
from tests.unit.test_bounded_collect import HUGE, huge_file_ending_with, peak_bytes


def returns(call: Callable[[], Any]) -> Any:
    """call's value, or the test fails when it never returns (it waits on a FIFO's writer): the thread is
    a daemon, so a hung read cannot keep the test session alive."""
    box: list[Any] = []
    worker = threading.Thread(target=lambda: box.append(call()), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert box, "the reader waited on a FIFO"
    return box[0]


def finished_line(rank: int = 0) -> str:
    return format_line("FINISHED", {"e2e_time": 2.0, "training_throughput": 10.0, "throughput_unit": "samples/s",
                                    "raw_train_time": 1.0, "init_time": 0.5, "final_metric": None,
                                    "target_metric": "acc", "target": 0.9, "converged": False, "epochs": 1, "steps": 2},
                       file="x", lineno=1, time_ms=9, rank=rank)


def test_a_huge_rank_log_is_parsed_from_its_end_and_its_result_found(tmp_path: Path) -> None:
    log = huge_file_ending_with(tmp_path / "rank0.out.log", finished_line() + "\n")
    parsed, peak = peak_bytes(lambda: parse_file(log))
    assert parsed.finished()[0]["training_throughput"] == 10.0
    assert HUGE - 16 * 1024 * 1024 <= parsed.skipped_bytes < log.stat().st_size
    assert peak < HUGE / 4, f"{peak} bytes held to parse a {HUGE}-byte log"
    metrics, _, problem = training_result(tmp_path, 0)
    assert problem is None and metrics[0].value == 10.0


def test_a_rank_log_read_from_its_end_says_so_where_it_stopped(tmp_path: Path) -> None:
    path = tmp_path / "rank0.out.log"
    with path.open("w", encoding="utf-8") as log:
        for step in range(1, 501):
            log.write(format_line("STEP_END", {"step": step, "epoch": 1}, file="x", lineno=1, time_ms=step,
                                  rank=0) + "\n")
    parsed = parse_file(path, max_bytes=2048)
    assert parsed.events["event"].tolist()[-1] == "STEP_END" and len(parsed.events) < 500
    assert parsed.malformed == 0  # the line cut at the start of the part read is dropped, not counted
    said = where_it_stopped(parsed)
    assert "step 500" in said and said.endswith(f"(from the log's end only: its first {parsed.skipped_bytes} bytes "
                                                "were not read)")
    assert parse_file(path).skipped_bytes == 0 and "log's end" not in where_it_stopped(parse_file(path))


def test_a_rank_log_that_is_a_fifo_is_never_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "rank0.out.log"
    os.mkfifo(fifo)

    def parse_error() -> str:
        try:
            parse_file(fifo)
        except ValueError as exc:
            return str(exc)
        return "parsed"

    assert returns(parse_error) == f"{fifo}: not a regular file; not read"
    metrics, _, problem = returns(lambda: training_result(tmp_path, 0))
    assert metrics == [] and problem is not None and "\n" not in problem
    assert returns(lambda: user_error(tmp_path)) is None


def test_a_user_error_is_found_at_the_end_of_a_huge_rank_log(tmp_path: Path) -> None:
    huge_file_ending_with(tmp_path / "rank0.out.log", "flagperf user error: no such dataset\n")
    found, peak = peak_bytes(lambda: user_error(tmp_path))
    assert found == "no such dataset"
    assert peak < HUGE / 16, f"{peak} bytes held for a {HUGE}-byte log"


def test_slurm_job_records_are_read_bounded_and_never_from_a_fifo(tmp_path: Path) -> None:
    (tmp_path / "exit.json").write_text('{"exit_code": 3}\n', encoding="utf-8")
    assert slurm.read_record(tmp_path / "exit.json") == {"exit_code": 3}
    huge = huge_file_ending_with(tmp_path / "huge.json", "{}")
    record, peak = peak_bytes(lambda: slurm.read_record(huge))
    assert record is None and peak < HUGE / 16
    os.mkfifo(tmp_path / "fifo.json")
    assert returns(lambda: slurm.read_record(tmp_path / "fifo.json")) is None
    assert returns(lambda: slurm.tail(tmp_path / "fifo.json", 3)) == []
    assert returns(lambda: slurm.follow(tmp_path / "fifo.json", print, {})) is None


def test_slurm_tail_reads_a_huge_logs_end_only(tmp_path: Path) -> None:
    log = huge_file_ending_with(tmp_path / "output.log", "srun: error: node lost\n")
    lines, peak = peak_bytes(lambda: slurm.tail(log, 1))
    assert lines == ["srun: error: node lost"] and peak < HUGE / 16


def test_slurm_follow_hands_a_huge_log_on_a_chunk_at_a_time(tmp_path: Path) -> None:
    log = huge_file_ending_with(tmp_path / "output.log", "done")  # one line of HUGE NULs, then "done", no newline
    pieces: list[int] = []
    readers: dict[Path, int] = {}
    _, peak = peak_bytes(lambda: slurm.follow(log, lambda line: pieces.append(len(line)), readers))
    assert sum(pieces) == HUGE and max(pieces) <= slurm.FOLLOW_CHUNK_BYTES  # "done" waits for its newline
    assert peak < HUGE / 16, f"{peak} bytes held to follow a {HUGE}-byte log"
    last: list[str] = []
    slurm.follow(log, last.append, readers, final=True)  # the writer has ended: its last line is whole
    assert last == ["done"] and readers[log] == log.stat().st_size


def test_slurm_follow_hands_on_whole_lines_as_they_come(tmp_path: Path) -> None:
    log = tmp_path / "case.log"
    log.write_text("one\ntwo\nthr", encoding="utf-8")
    seen: list[str] = []
    readers: dict[Path, int] = {}
    slurm.follow(log, seen.append, readers, prefix="> ")
    assert seen == ["> one", "> two"]
    with log.open("a", encoding="utf-8") as out:
        out.write("ee\n")
    slurm.follow(log, seen.append, readers, prefix="> ")
    slurm.follow(log, seen.append, readers, prefix="> ", final=True)  # nothing new: nothing handed on
    assert seen == ["> one", "> two", "> three"]
