"""Reading an evaluation back through the Prefect API, for the integration tests."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterParentFlowRunId,
    LogFilter,
    LogFilterFlowRunId,
    LogFilterTaskRunId,
)
from prefect.client.schemas.objects import TaskRun
from prefect.client.schemas.sorting import LogSort

PAGE = 200  # the server's largest page (PREFECT_API_DEFAULT_LIMIT)
T = TypeVar("T")


def _all_pages(read: Callable[[int], list[T]]) -> list[T]:
    found: list[T] = []
    while True:
        page = read(len(found))
        found.extend(page)
        if len(page) < PAGE:
            return found


def run_evaluate(results: Path, **params: object) -> tuple[object, Path]:
    from flows.evaluate import evaluate

    run_id = params.pop("run_id", None) or f"run-test-{time.time_ns()}"
    state = evaluate(results_dir=str(results), run_id=run_id, return_state=True, **params)
    return state, results / run_id


def flow_run_tree(flow_run_id: UUID) -> list[UUID]:
    """The flow run and every subflow run under it (host-round runs nest under the evaluation)."""
    found, frontier = [flow_run_id], [flow_run_id]
    with get_client(sync_client=True) as client:
        while frontier:
            children = _all_pages(lambda offset, parents=frontier: client.read_flow_runs(  # type: ignore[misc]
                flow_run_filter=FlowRunFilter(
                    parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=parents)), limit=PAGE, offset=offset))
            frontier = [child.id for child in children if child.id not in found]
            found.extend(frontier)
    return found


def all_task_runs(flow_run_id: UUID) -> list[TaskRun]:
    """Task runs of the evaluation and of its subflows, without the subflows' own placeholder task runs."""
    with get_client(sync_client=True) as client:
        tree = flow_run_tree(flow_run_id)
        runs = _all_pages(lambda offset: client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=tree)), limit=PAGE, offset=offset))
    return [run for run in runs if not run.name.startswith(("host-round-", "host-healthcheck-"))]


def task_runs(flow_run_id: UUID) -> dict[str, TaskRun]:
    return {run.name: run for run in all_task_runs(flow_run_id)}


def flow_run_logs(flow_run_id: UUID) -> list[tuple[int, str]]:
    """(level, message) of each line in the flow run's own log (its task runs' too, not its subflows'), oldest
    first, once the lines this process still holds have reached the server."""
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=60)
    with get_client(sync_client=True) as client:
        logs = _all_pages(lambda offset: client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=PAGE, offset=offset,
            sort=LogSort.TIMESTAMP_ASC))
    return [(log.level, log.message) for log in logs]


def error_lines(flow_run_id: UUID) -> list[str]:
    """The flow run's ERROR (and worse) lines; asserts that none of its lines carries a traceback."""
    logs = flow_run_logs(flow_run_id)
    assert not [m for _, m in logs if "Traceback (most recent call last)" in m], logs
    return [m for level, m in logs if level >= 40]


def task_logs(task_run_id: UUID) -> list[str]:
    return [message for _, message in task_log_records(task_run_id)]


def task_log_records(task_run_id: UUID) -> list[tuple[int, str]]:
    """(level, message) of each line in the task run's log."""
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=[task_run_id])))
    return [(log.level, log.message) for log in logs]




def nightly_schedule() -> dict[str, str]:
    """The nightly deployment's schedule as `prefect deploy` makes it from prefect.yaml on this machine: its time
    zone is what the build step (flows/schedule.py) prints."""
    import yaml

    from flows.schedule import machine_timezone

    project = yaml.safe_load((Path(__file__).resolve().parents[2] / "prefect.yaml").read_text())
    (nightly,) = [d for d in project["deployments"] if d["name"] == "nightly"]
    (schedule,) = nightly["schedules"]
    (step,) = [s["prefect.deployments.steps.run_shell_script"] for s in nightly["build"]]
    assert step["script"] == "python3 -m flows.schedule" and schedule["timezone"] == f"{{{{ {step['id']}.stdout }}}}"
    return {"cron": schedule["cron"], "timezone": machine_timezone()}


def assert_schedule_gets_runs(api: str, timeout_s: float = 180, headers: dict[str, str] | None = None) -> list[dict]:
    """Deploy a flow with the nightly's schedule on the server at ``api`` and wait for its scheduler to create
    the upcoming runs. A deployment that shows "Active" and never gets a run (prefect 3.8's scheduler on
    SQLAlchemy 2.1) fails here. ``headers``: the server's sign-in, if it has one. Returns the scheduled runs."""
    import httpx

    schedule = nightly_schedule()
    with httpx.Client(base_url=api, headers=headers, timeout=30) as http:
        flow = http.post("/flows/", json={"name": f"schedule-check-{time.time_ns()}"})
        flow.raise_for_status()
        created = http.post("/deployments/", json={
            "name": "nightly", "flow_id": flow.json()["id"],
            "schedules": [{"schedule": schedule, "active": True}]})
        created.raise_for_status()
        deployment = created.json()
        try:
            assert deployment["schedules"] and deployment["schedules"][0]["active"], deployment
            runs: list[dict] = []
            deadline = time.time() + timeout_s
            while time.time() < deadline and not runs:
                found = http.post("/flow_runs/filter", json={
                    "deployments": {"id": {"any_": [deployment["id"]]}},
                    "flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}}})
                found.raise_for_status()
                runs = found.json()
                if not runs:
                    time.sleep(2)
        finally:  # a shared database keeps no second "nightly" for later tests to mistake for the real one
            with contextlib.suppress(httpx.HTTPError):  # never in place of what the check found
                http.delete(f"/flows/{flow.json()['id']}")
    assert runs, f"no run scheduled {timeout_s:.0f} s after deploying a schedule ({schedule})"
    return runs
