"""What the UI shows of a run, in its parts: the one line a failed or unsupported run ends with (each round's
label said once), bad input named by the form's field, the results folder a form run defaults to, Prefect's
run loggers kept to one line for a failure the project said itself, and the nightly schedule's time zone.
The same behaviour through a real server and worker: tests/integration/test_evaluate_flow.py,
test_deployments.py and test_nightly.py."""

from __future__ import annotations

import logging
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from prefect.exceptions import FailedRun
from prefect.states import State

from flagperf.errors import ConfigError, InfrastructureFailure
from flagperf.results.schema import Failure, RoundResult
from flows.evaluate import (
    BAD_INPUT,
    LISTED_ROUNDS,
    PARTLY_UNSUPPORTED_STATE,
    RESULTS_DIR_ENV,
    UNSUPPORTED_STATE,
    default_results_dir,
    form_message,
    in_form_terms,
    rounds_line,
    unsupported_state,
)
from flows.host_round import round_outcome, round_state
from flows.logs import ENGINE_EXIT_LINE, OneLineFailures
from flows.schedule import TIMEZONE_ENV, machine_timezone


def result(case: str, status: str, message: str | None = None, round_no: int = 1) -> RoundResult:
    now = datetime.now(timezone.utc)
    kind = {"failed": "infrastructure", "unsupported": "unsupported"}.get(status)
    return RoundResult(run_id="run-a", case=case, family="base", round=round_no, host="localhost", node_rank=0,
                       vendor="cpu", status=status, started_at=now, finished_at=now, duration_s=1.0,
                       measured_seconds=1.0, config={},
                       failure=Failure(kind=kind, message=message) if kind and message else None)


def test_a_failed_round_is_named_once_with_its_reason() -> None:
    # The case task's message starts with the round's label already: it is not said twice.
    killed = result("computation-FP64", "failed", "computation-FP64 round 1 on localhost: killed by signal 9")
    assert round_outcome(killed) == "computation-FP64 round 1 on localhost: killed by signal 9"
    assert round_state(killed).message == "computation-FP64 round 1 on localhost: killed by signal 9"
    bare = result("sleepy", "failed", "a reason\nover two lines", round_no=2)
    assert round_outcome(bare) == "sleepy round 2 on localhost: a reason over two lines"
    rounds = [killed, *(result("c", "failed", f"c round {n} on localhost: x" + "y" * 500, n) for n in range(1, 9))]
    line = rounds_line(rounds)
    assert "\n" not in line and line.count("killed by signal 9") == 1
    assert line.count("; ") == LISTED_ROUNDS and line.endswith(f"and {len(rounds) - LISTED_ROUNDS} more (report.md)")


def test_unsupported_rounds_end_in_a_named_completed_state() -> None:
    data = {"run_id": "run-a"}
    assert unsupported_state([result("a", "success")], data) is None
    only = unsupported_state([result("no-such-dtype", "unsupported", "tf32: the cpu has no TF32")], data)
    assert only is not None and only.is_completed() and only.name == UNSUPPORTED_STATE
    assert only.message == ("nothing measured: all 1 rounds were unsupported: no-such-dtype round 1 on localhost: "
                            "tf32: the cpu has no TF32")
    partly = unsupported_state([result("a", "success"), result("b", "unsupported", "no FP8")], data)
    assert partly is not None and partly.is_completed() and partly.name == PARTLY_UNSUPPORTED_STATE
    assert partly.message.startswith("1 of 2 rounds were unsupported (the others measured): b round 1")


def test_bad_input_names_the_forms_field(tmp_path: Path) -> None:
    assert form_message(ConfigError("--set", "m", "must be > 16"), None) == "overrides: m: must be > 16"
    assert form_message(ConfigError("--rounds", None, "must be between 1 and 100"), None) == \
        "rounds: must be between 1 and 100"
    inventory = tmp_path / "inventory.yaml"
    assert form_message(ConfigError(inventory, "hosts.0.port", "not a port"), str(inventory)) == \
        f"inventory: {inventory}: hosts.0.port: not a port"
    other = ConfigError("cases/base/x/case.yaml", "m", "bad")  # a project file: named as it is
    assert form_message(other, str(inventory)) == str(other)
    assert in_form_terms(f"{BAD_INPUT}--set: m: bad") == f"{BAD_INPUT}overrides: m: bad"
    assert in_form_terms(f"{BAD_INPUT}suite.yaml: cases: bad") == f"{BAD_INPUT}suite.yaml: cases: bad"


def test_the_flows_planning_refuses_a_bad_container_owner_first(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    """A deployment's, the UI's or the team server's run never checked FLAGPERF_CONTAINER_OWNER (the worker's) before
    its first round: the probes and builds ran, then every round failed at its start. Now the planning step ends in
    bad input naming the variable, before the inventory is read or the results folder made."""
    from flows import evaluate

    monkeypatch.setattr(evaluate, "get_run_logger", lambda: logging.getLogger("test"))  # no flow run around it
    monkeypatch.setenv("FLAGPERF_CONTAINER_OWNER", "a=b")
    results = tmp_path / "results"
    state = evaluate.evaluation_state(None, ["computation-FP32"], None, None, None, str(tmp_path / "no-inventory"),
                                      str(results), None, 1.0, None, False, form=True)
    assert isinstance(state, State) and state.is_failed()
    assert state.message is not None and state.message.startswith(f"{BAD_INPUT}FLAGPERF_CONTAINER_OWNER: 'a=b' ")
    assert not results.exists()


def test_a_form_run_writes_where_the_server_serves(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(RESULTS_DIR_ENV, raising=False)
    monkeypatch.delenv("FLAGPERF_RESULTS_ROOT", raising=False)
    assert default_results_dir() == "results"
    monkeypatch.setenv("FLAGPERF_RESULTS_ROOT", str(tmp_path / "older"))  # a server that predates the variable
    assert default_results_dir() == str(tmp_path / "older")
    monkeypatch.setenv(RESULTS_DIR_ENV, str(tmp_path / "served"))
    assert default_results_dir() == str(tmp_path / "served")


def record(msg: str, exc: BaseException | None, level: int = logging.ERROR) -> logging.LogRecord:
    try:
        if exc is not None:
            raise exc
    except BaseException:
        exc_info = sys.exc_info()
    else:
        exc_info = None
    return logging.LogRecord("prefect.flow_runs", level, __file__, 1, msg, None, exc_info)


def test_a_failure_the_project_said_is_one_line_in_the_runs_log() -> None:
    keep_one_line = OneLineFailures()
    # The engine's closing line for a run that ended in a Failed state it was given: it only repeats the state.
    assert not keep_one_line.filter(record(ENGINE_EXIT_LINE, FailedRun("2 of 6 rounds failed: ...")))
    # A task that raised one of the project's errors: its line stays, its traceback goes.
    task = record("Task run failed with exception: %r", InfrastructureFailure("host h1: disk: full"))
    assert keep_one_line.filter(task) and task.exc_info is None
    # Anything else is a bug: its traceback stays.
    bug = record("Encountered exception during execution: %r", KeyError("x"))
    assert keep_one_line.filter(bug) and bug.exc_info is not None
    assert keep_one_line.filter(record("Finished in state Completed()", None, logging.INFO))


def test_the_nightly_schedule_is_in_the_machines_time_zone(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    assert machine_timezone({}, etc) == "UTC"  # nothing to go by
    (etc / "localtime").symlink_to("/usr/share/zoneinfo/Europe/Berlin")
    assert machine_timezone({}, etc) == "Europe/Berlin"
    (etc / "timezone").write_text("Asia/Shanghai\n")
    assert machine_timezone({}, etc) == "Asia/Shanghai"
    assert machine_timezone({"TZ": ":America/New_York"}, etc) == "America/New_York"
    assert machine_timezone({"TZ": "CST-8"}, etc) == "Asia/Shanghai"  # a POSIX rule is no zone name
    assert machine_timezone({TIMEZONE_ENV: "Europe/Paris", "TZ": "UTC"}, etc) == "Europe/Paris"
    with pytest.raises(ValueError, match=f"{TIMEZONE_ENV}: 'Mars/Olympus' is not an IANA time zone name"):
        machine_timezone({TIMEZONE_ENV: "Mars/Olympus"}, etc)
