"""Inference through a real Prefect server: the seven steps as subflows, nested under the flow that ran them,
each with its own logs; and the toggle matrix, read back through the API (which step subflows ran).

All on the digits-infer case (real data, real accuracy, seconds on a CPU).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterParentTaskRunId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import FlowRun

from flagperf.config.job import Job
from flagperf.config.plan import plan_run
from flagperf.entry import run_job
from flagperf.inference.subflows import portable_context
from flagperf.results.schema import read_result

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]

ALL_STEPS = ["init", "dataset_model", "validation", "export", "compile", "inference", "summary"]


def child_flow_runs(flow_run_id: UUID) -> list[FlowRun]:
    """Flow runs nested under ``flow_run_id``: their parent task run belongs to it."""
    with get_client(sync_client=True) as client:
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        if not tasks:
            return []
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_task_run_id=FlowRunFilterParentTaskRunId(any_=[t.id for t in tasks])))


def descendant_flow_runs(flow_run_id: UUID) -> list[FlowRun]:
    """Every flow run nested under ``flow_run_id``, at any depth (the evaluation's host-round subflows hold
    the run_case task the case flow nests under)."""
    found: list[FlowRun] = []
    frontier = [flow_run_id]
    while frontier:
        children = [run for parent in frontier for run in child_flow_runs(parent)]
        found.extend(children)
        frontier = [run.id for run in children]
    return found


def step_flow_runs(outer_flow_run_id: UUID) -> tuple[FlowRun, dict[str, FlowRun]]:
    """The case flow under ``outer_flow_run_id`` (at any depth) and its step subflows by step name."""
    nested = descendant_flow_runs(outer_flow_run_id)
    cases = [r for r in nested if r.name.startswith("inference[")]
    assert len(cases) == 1, [r.name for r in nested]
    steps = {}
    with get_client(sync_client=True) as client:
        for run in child_flow_runs(cases[0].id):
            name = client.read_flow(run.flow_id).name
            steps[name.removeprefix("inference-").replace("-", "_")] = run
    return cases[0], steps


def flow_logs(flow_run_id: UUID) -> list[str]:
    with get_client(sync_client=True) as client:
        return [log.message for log in client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))]


def test_steps_are_subflows_of_the_evaluation_with_their_own_logs(flagperf_env: Path) -> None:
    """The real path: evaluate -> run_case task -> `python -m flagperf.entry` in a new process -> subflows."""
    from flows.evaluate import evaluate

    run_id = f"run-inference-{time.time_ns()}"
    state = evaluate(cases=["digits-infer"], overrides=["repeat=1"], results_dir=str(flagperf_env), run_id=run_id,
                     return_state=True)
    assert state.is_completed(), state.message
    result = read_result(flagperf_env / run_id / "digits-infer" / "round1" / "localhost_noderank0" / "result.json")
    assert result.status == "success" and result.inference is not None
    assert result.inference.runner == "prefect subflows"

    case_run, steps = step_flow_runs(state.state_details.flow_run_id)
    assert case_run.state_name == "Completed"
    assert sorted(steps) == sorted(ALL_STEPS)
    assert all(run.state_name == "Completed" for run in steps.values())
    # Each step's own logs sit on its own flow run.
    assert sum("exported" in line for line in flow_logs(steps["export"].id)) == 1  # once: not duplicated
    assert any("inference: " in line and "batches" in line for line in flow_logs(steps["inference"].id))
    assert not any("exported" in line for line in flow_logs(steps["inference"].id))
    assert any("Finish Info" in line for line in flow_logs(steps["summary"].id))


@task
def run_round(job: Job, out: Path) -> int:
    return run_job(job.model_copy(update={"prefect_context": portable_context()}), out)


@flow
def one_round(job: Job, out: Path) -> int:
    return run_round(job, out)


def _job(tmp_path: Path, *sets: str) -> Job:
    plan = plan_run(cases=["digits-infer"], sets=["repeat=1", *sets], results_dir=tmp_path / "results")
    cp = plan.cases[0]
    return Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, host="localhost", vendor="cpu",
               config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})


def _run(tmp_path: Path, name: str, *sets: str) -> tuple[Any, dict[str, FlowRun], Path]:
    out = tmp_path / name
    out.mkdir()
    state = one_round(_job(tmp_path, *sets), out, return_state=True)
    assert state.is_completed(), state.message
    assert state.result() == 0
    _, steps = step_flow_runs(state.state_details.flow_run_id)
    return read_result(out / "result.json"), steps, out


def test_toggle_matrix_through_the_api(tmp_path: Path) -> None:
    """Every valid combination of FlagPerf's four toggles; the step subflows that ran are read from the API."""
    # Kept for the runs below (by default a round's ONNX and engine files are removed when it ends).
    standard, steps, _ = _run(tmp_path, "standard", "keep_artifacts=true")
    assert sorted(steps) == sorted(ALL_STEPS) and str(standard.inference.artifacts).startswith("kept in")
    onnx = Path(str(standard.inference.onnx_path))
    engine = Path(str(standard.inference.engine_file))
    assert onnx.is_file() and engine.is_file()

    matrix: list[tuple[str, list[str], list[str]]] = [
        ("no-compiler", ["compiler=null"], ["init", "dataset_model", "validation", "summary"]),
        ("exist-onnx", [f"exist_onnx_path={onnx}"],
         ["init", "dataset_model", "validation", "compile", "inference", "summary"]),
        ("no-validation", ["no_validation=true", f"exist_onnx_path={onnx}"],
         ["init", "dataset_model", "compile", "inference", "summary"]),
        ("exist-engine", [f"exist_compiler_path={engine}"],
         ["init", "dataset_model", "validation", "export", "inference", "summary"]),
        ("exist-onnx-and-engine", [f"exist_onnx_path={onnx}", f"exist_compiler_path={engine}"],
         ["init", "dataset_model", "validation", "inference", "summary"]),
        ("engine-only", ["no_validation=true", "exist_onnx_path=foo", f"exist_compiler_path={engine}"],
         ["init", "dataset_model", "inference", "summary"]),
    ]
    for name, sets, expected in matrix:
        result, steps, _ = _run(tmp_path, name, *sets)
        assert sorted(steps) == sorted(expected), name
        assert all(run.state_name == "Completed" for run in steps.values()), name
        recorded = {step: how for step, how in result.inference.steps.items() if how == "ran"}
        assert sorted(recorded) == sorted(expected), name
        metrics = {m.name for m in result.metrics}
        assert ("validation_core" in metrics) == ("validation" in expected), name
        assert ("inference_core" in metrics) == ("inference" in expected), name
        if "inference" in expected:  # the same trained weights, whichever way the engine was reached
            top1 = {m.name: m.value for m in result.metrics}
            assert top1["inference_top1"] == pytest.approx(
                next(m.value for m in standard.metrics if m.name == "inference_top1")), name


@flow
def capture_context() -> dict[str, Any]:
    return portable_context()


def test_an_unreachable_api_runs_the_steps_as_plain_functions_and_says_why(tmp_path: Path) -> None:
    context = capture_context()
    context["settings_context"]["settings"]["api"]["url"] = "http://127.0.0.1:9/api"  # nothing listens there
    job = _job(tmp_path).model_copy(update={"prefect_context": context})
    out = tmp_path / "out"
    out.mkdir()
    assert run_job(job, out) == 0
    result = read_result(out / "result.json")
    assert result.inference.runner.startswith("plain functions (")
    assert "the Prefect API at http://127.0.0.1:9/api is unreachable" in result.inference.runner
    assert set(result.inference.steps.values()) == {"ran"}


def test_step_logs_reach_their_flow_runs_without_extra_loggers_configured(tmp_path: Path) -> None:
    """A host whose environment does not route flagperf's loggers to Prefect: the steps forward them."""
    import os
    import subprocess
    import sys

    from flagperf.paths import PROJECT_ROOT

    @flow
    def launch() -> int:
        job = _job(tmp_path).model_copy(update={"prefect_context": portable_context()})
        out = tmp_path / "out"
        out.mkdir()
        (out / "job.json").write_text(job.model_dump_json())
        env = {k: v for k, v in os.environ.items() if k != "PREFECT_LOGGING_EXTRA_LOGGERS"}
        return subprocess.run([sys.executable, "-m", "flagperf.entry", "--job", str(out / "job.json")],
                              cwd=PROJECT_ROOT, env=env, timeout=300, check=False).returncode

    state = launch(return_state=True)
    assert state.result() == 0
    _, steps = step_flow_runs(state.state_details.flow_run_id)
    assert sorted(steps) == sorted(ALL_STEPS)
    assert sum("exported" in line for line in flow_logs(steps["export"].id)) == 1
    assert any("Finish Info" in line for line in flow_logs(steps["summary"].id))
