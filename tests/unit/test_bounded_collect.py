"""The controller reads what a round left bounded: a host's result and log files, a training rank's log, a
server's log, monitor files and Prometheus scrapes. A huge or endless file costs a bounded amount of memory
(measured with tracemalloc, against the file's own size) and the cut is said in one line."""

from __future__ import annotations

import json
import os
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flagperf.generate.server import log_tail
from flagperf.hosts.local import LocalHost
from flagperf.measure.perflog import format_line
from flagperf.results import analysis
from flagperf.results.analysis import read_monitor, window_stats
from flagperf.results.serving import server_figures
from tasks.collect import training_progress

HUGE = 256 * 1024 * 1024  # sparse: no disk and no time to make, far more than a bounded reader holds


def peak_bytes(call: Callable[[], Any]) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        value = call()
        return value, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def huge_file_ending_with(path: Path, end: str) -> Path:
    with path.open("wb") as out:
        out.truncate(HUGE)
        out.seek(HUGE)
        out.write(("\n" + end).encode())
    return path


def test_a_hosts_file_larger_than_the_limit_is_refused_in_one_line_unread(tmp_path: Path) -> None:
    host = LocalHost(work_root=tmp_path / "work")
    big = huge_file_ending_with(tmp_path / "result.json", "{}")
    with pytest.raises(ValueError, match=rf"{big}: more than 1024 bytes; not read$"):
        host.read_text(big, max_bytes=1024)
    assert host.read_text(big, max_bytes=HUGE + 10).endswith("{}")


def test_a_hosts_log_tail_reads_its_end_only(tmp_path: Path) -> None:
    host = LocalHost(work_root=tmp_path / "work")
    log = huge_file_ending_with(tmp_path / "case.log", "last words\n")
    lines, peak = peak_bytes(lambda: host.tail(log, 1))
    assert lines == ["last words"]
    assert peak < HUGE / 16, f"{peak} bytes held to tail a {HUGE}-byte log"
    os.mkfifo(tmp_path / "fifo.log")
    assert host.tail(tmp_path / "fifo.log", 1) == []  # not waited on


def test_a_training_ranks_log_is_read_from_its_end_and_the_line_says_so(tmp_path: Path) -> None:
    with (tmp_path / "rank0.out.log").open("w", encoding="utf-8") as log:
        log.write(format_line("EPOCH_BEGIN", {"epoch": 1}, file="x", lineno=1, time_ms=0, rank=0) + "\n")
        for step in range(1, 2001):
            log.write(format_line("STEP_END", {"step": step, "epoch": 1}, file="x", lineno=1, time_ms=step,
                                  rank=0) + "\n")
    size = (tmp_path / "rank0.out.log").stat().st_size
    said = training_progress(tmp_path, max_bytes=4096)
    assert said is not None and said.startswith("rank0.out.log: last PerfLog event STEP_END (epoch 1, step 2000")
    assert said.endswith(f"(from its last 4096 of {size} bytes)") and "\n" not in said
    assert "from its last" not in (training_progress(tmp_path) or "")  # a normal log is read whole


def test_a_servers_huge_log_gives_its_last_lines_from_its_end(tmp_path: Path) -> None:
    log = huge_file_ending_with(tmp_path / "server.log", "ValueError: no such model\n")
    tail, peak = peak_bytes(lambda: log_tail(log, 1))
    assert tail == "ValueError: no such model"
    assert peak < HUGE / 16, f"{peak} bytes held to tail a {HUGE}-byte server log"


def test_a_huge_scrape_gives_no_figures_and_is_not_read(tmp_path: Path) -> None:
    huge_file_ending_with(tmp_path / "p1.before.prom", "")
    (tmp_path / "p1.after.prom").write_text("x_total 1\n", encoding="utf-8")
    figures, peak = peak_bytes(lambda: server_figures(tmp_path, "p1"))
    assert figures == {}
    assert peak < HUGE / 16, f"{peak} bytes held for a {HUGE}-byte scrape"


def sample(t: float) -> str:
    return json.dumps({"type": "sample", "t": t, "power_w": 100.0}) + "\n"


def test_a_monitor_file_past_the_cap_is_cut_and_the_report_says_so(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "monitor_system.jsonl"
    path.write_text("".join(sample(t) for t in range(100)), encoding="utf-8")
    cap = len(sample(0)) * 10
    monkeypatch.setattr(analysis, "MAX_MONITOR_BYTES", cap)
    series = read_monitor(path)
    assert len(series.samples) == 10
    assert series.cut == f"{path.stat().st_size} bytes; only its first {cap} bytes were read"
    assert f"{path.name}: {series.cut}" in window_stats([series], None).notes


def test_a_monitor_line_without_end_is_skipped_unheld(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "monitor_system.jsonl"
    with path.open("w", encoding="utf-8") as out:
        out.write(sample(0))
        out.write("x" * 200_000 + "\n")  # a line no sample can be: skipped in pieces, never held whole
        out.write(sample(1))
    monkeypatch.setattr(analysis, "MAX_MONITOR_LINE_BYTES", 4096)
    series, peak = peak_bytes(lambda: read_monitor(path))
    assert list(series.samples["t"]) == [0, 1] and series.malformed == 1 and series.cut is None
    assert peak < 100_000, f"{peak} bytes held for a 200000-byte line"


def test_a_run_whose_round_stayed_on_its_host_says_how_to_collect_it(tmp_path: Path) -> None:
    """The link to a host dropped while its round was collected: the round is kept there, and the run's final
    line says the command that collects it (a retry), not only that it failed."""
    from flagperf.results.schema import KEPT_ON_HOST, Failure, RoundResult
    from flows.evaluate import failed_line

    def failed(message: str) -> RoundResult:
        return RoundResult.model_validate({
            "run_id": "r", "case": "c", "family": "f", "round": 1, "host": "h1", "node_rank": 0, "vendor": "cpu",
            "status": "failed", "failure": Failure(kind="infrastructure", message=message).model_dump(),
            "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:01Z", "duration_s": 1,
            "measured_seconds": 0, "config": {}})

    kept = failed(f"the round's files could not be collected (x: host h1: connection lost); {KEPT_ON_HOST} h1:/w")
    line = failed_line([kept], 2, "flagperf run --cases c", tmp_path)
    assert line.startswith("1 of 2 rounds failed: c round 1 on h1: the round's files could not be collected")
    assert line.endswith(f"to collect the rounds kept on their hosts (and run only the failed others again): "
                         f"`flagperf run --cases c --retry {tmp_path}`") and "\n" not in line
    assert "--retry" not in failed_line([failed("the case crashed")], 2, "flagperf run --cases c", tmp_path)


def test_an_end_seen_as_a_command_was_interrupted_is_said_once_and_never_for_a_later_command(tmp_path: Path) -> None:
    """LocalHost.ended_when_interrupted: the end of a command that run() saw end as it was interrupted is said once,
    and a later command at the same log path (a rerun) starts with none: an old end must not make a later attempt's
    record count as final (ended.json) while it may still be sending."""
    import sys

    from flagperf.hosts.local import LocalHost

    host = LocalHost(work_root=tmp_path)
    log = tmp_path / "attempt1" / "case.log"
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(FileNotFoundError):  # its pid file cannot be written: run() stops the command and raises
        host.run(sleeper, timeout=60, log_path=log, pid_file=tmp_path / "missing" / "pid")
    assert host.ended_when_interrupted(log) is not None and host.ended_when_interrupted(log) is None
    with pytest.raises(FileNotFoundError):
        host.run(sleeper, timeout=60, log_path=log, pid_file=tmp_path / "missing" / "pid")
    assert host.run([sys.executable, "-c", "pass"], timeout=60, log_path=log).exit_code == 0
    assert host.ended_when_interrupted(log) is None
