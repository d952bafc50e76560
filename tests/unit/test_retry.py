"""Going on after a run stopped on a full results disk: `flagperf run --retry RUN` continues that run folder
(only for the same work, from the same code), the stop line names the command, and the end-of-run clean-up
never deletes a host's round that holds a result the controller has not stored."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flagperf.config.plan import PLAN_FILE, plan_run
from flagperf.errors import ConfigError
from flagperf.hosts.local import LocalHost
from flagperf.results.schema import round_dir
from flows.evaluate import how_to_retry, uncollected_rounds
from tasks.collect import stage_folder

FP32 = "computation-FP32"


def test_a_retry_continues_a_run_folder_of_another_flow_run_only_for_the_same_work(tmp_path: Path) -> None:
    first = plan_run(cases=[FP32], rounds=2, results_dir=tmp_path, run_id="run-a", flow_run_id="f-1")
    (tmp_path / "run-a").mkdir()
    (tmp_path / "run-a" / PLAN_FILE).write_text(first.model_dump_json())
    with pytest.raises(ConfigError, match="already exists"):  # without --retry: never overwritten
        plan_run(cases=[FP32], rounds=2, results_dir=tmp_path, run_id="run-a")
    again = plan_run(cases=[FP32], rounds=2, results_dir=tmp_path, run_id="run-a", resume=True)
    assert again.run_id == "run-a" and again.cases == first.cases
    with pytest.raises(ConfigError, match="planned other work") as info:
        plan_run(cases=[FP32], rounds=3, results_dir=tmp_path, run_id="run-a", resume=True)
    assert info.value.source == str(tmp_path / "run-a" / PLAN_FILE)
    with pytest.raises(ConfigError, match="planned other work"):
        plan_run(cases=[FP32], rounds=2, sets=["m=1024"], results_dir=tmp_path, run_id="run-a", resume=True)


def test_a_retry_never_reads_a_plan_that_is_not_a_regular_file(tmp_path: Path) -> None:
    """A FIFO where the run folder's plan.json was would block the retry forever: refused in one line."""
    (tmp_path / "run-a").mkdir()
    os.mkfifo(tmp_path / "run-a" / PLAN_FILE)
    with pytest.raises(ConfigError, match="named pipe") as info:
        plan_run(cases=[FP32], rounds=2, results_dir=tmp_path, run_id="run-a", resume=True)
    assert f"run-a/{PLAN_FILE}" in str(info.value)


def test_the_stop_line_gives_the_command_that_continues_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "results" / "run-a"
    assert how_to_retry("flagperf run --cases a --results 'my results'", run_dir) == \
        f"`flagperf run --cases a --results 'my results' --retry {run_dir}`"
    again = f"flagperf run --cases a --retry {run_dir}"
    assert how_to_retry(again, run_dir) == f"`{again}`"  # a retry that stopped too: the same command again
    assert how_to_retry("deployment evaluate, flow run x (...)", run_dir).startswith("retry this flow run")
    assert how_to_retry(None, run_dir).startswith("retry this flow run")


def test_only_rounds_that_hold_an_unstored_result_keep_the_hosts_run_folder(tmp_path: Path) -> None:
    plan = plan_run(cases=[FP32], rounds=3, results_dir=tmp_path / "results", run_id="run-a")
    host = LocalHost(name="h1", work_root=tmp_path / "work")
    measured = stage_folder(host.work_root, "run-a", FP32, 1, "h1")  # measured, its collection failed
    (measured / "attempt1").mkdir(parents=True)
    (measured / "attempt1" / "result.json").write_text("{}")
    stopped = stage_folder(host.work_root, "run-a", FP32, 2, "h1")  # interrupted while running: no result
    (stopped / "attempt1").mkdir(parents=True)
    (stopped / "attempt1" / "case.log").write_text("starting\n")
    assert [(case.name, n, rank, stage) for case, n, rank, stage in uncollected_rounds(
        host, "h1", plan, ["h1", "h2"])] == [(FP32, 1, 0, measured)]
    assert uncollected_rounds(LocalHost(name="h2", work_root=tmp_path / "work"), "h2", plan, ["h1", "h2"]) == []


def test_a_round_stored_whole_does_not_keep_its_hosts_copy(tmp_path: Path) -> None:
    """Interrupted after the collected folder was renamed into place, before the host's copy was removed: the
    stored round is the record, so the host's copy does not keep the run folder on the host for ever."""
    plan = plan_run(cases=[FP32], rounds=1, results_dir=tmp_path / "results", run_id="run-a")
    host = LocalHost(name="h1", work_root=tmp_path / "work")
    stage = stage_folder(host.work_root, "run-a", FP32, 1, "h1")
    (stage / "attempt1").mkdir(parents=True)
    (stage / "attempt1" / "result.json").write_text("{}")
    assert [found for *_, found in uncollected_rounds(host, "h1", plan, ["h1"])] == [stage]
    stored = round_dir(plan.run_dir, FP32, 1, "h1", 0)
    stored.mkdir(parents=True)
    (stored / "result.json").write_text("{}")
    assert uncollected_rounds(host, "h1", plan, ["h1"]) == []
