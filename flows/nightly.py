"""Nightly regression: evaluate a suite, record it in the history, judge each figure against its baseline.

evaluate (subflow) -> record_history -> judge_regressions -> (event per regression) -> fail if any
A regression emits the Prefect event `flagperf.regression.detected`; the automation in
deployments/automations/ turns it into an alert.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NONE
from prefect.events import emit_event

from flagperf.config.plan import PLAN_FILE, RunPlan, new_run_id
from flagperf.errors import FlagperfError
from flagperf.results.history import Verdict, check_run, history_engine, record_run
from flows.evaluate import evaluate

REGRESSION_EVENT = "flagperf.regression.detected"


class RegressionDetected(FlagperfError):
    """Raised at the end of a nightly run in which some figure fell below its baseline."""


@task(name="record_history", cache_policy=NONE)
def record_history(run_dir: Path, history_url: str | None, results_dir: str) -> int:
    count = record_run(history_engine(history_url, results_dir), run_dir)
    get_run_logger().info("recorded %d figures of %s in the history", count, run_dir.name)
    return count


@task(name="judge_regressions", cache_policy=NONE)
def judge_regressions(run_id: str, history_url: str | None, results_dir: str, baseline_runs: int,
                      sigma: float) -> list[Verdict]:
    logger = get_run_logger()
    verdicts = check_run(history_engine(history_url, results_dir), run_id, baseline_runs=baseline_runs, sigma=sigma)
    for verdict in verdicts:
        (logger.error if verdict.status == "regression" else logger.info)(verdict.line())
    create_table_artifact(
        key="flagperf-regression-verdicts", description=f"{run_id}: each figure against its baseline",
        table=[{"case": v.case, "metric": v.metric, "value": f"{v.value:.4g} {v.unit}",
                "baseline": f"{v.baseline:.4g}" if v.baseline is not None else "-",
                "change": f"{v.change:+.1%}" if v.change is not None else "-",
                "threshold": f"±{v.threshold:.1%}" if v.threshold is not None else "-",
                "history": v.history, "verdict": v.status} for v in verdicts])
    return verdicts


@flow(name="nightly-regression", log_prints=True)
def nightly_regression(suite: str = "smoke", vendor: str | None = None, rounds: int = 3,
                       overrides: list[str] | None = None, inventory: str | None = None, results_dir: str = "results",
                       history_url: str | None = None, baseline_runs: int = 5, sigma: float = 3.0) -> dict[str, Any]:
    """Run the suite, add it to the history and fail (with an event) on a regression."""
    run_id = new_run_id()
    state = evaluate(suite=suite, vendor=vendor, rounds=rounds, overrides=overrides, inventory=inventory,
                     results_dir=results_dir, run_id=run_id, return_state=True)
    run_dir = Path(results_dir) / run_id
    if not (run_dir / "summary.json").is_file():
        raise FlagperfError(f"the evaluation produced no summary: {state.message}")
    vendor = RunPlan.model_validate_json((run_dir / PLAN_FILE).read_text(encoding="utf-8")).vendor.name
    if state.is_failed():  # a partial run is neither a baseline nor judged against one
        raise FlagperfError(f"the evaluation failed, nothing recorded in the history: {state.message}")
    record_history(run_dir, history_url, results_dir)
    verdicts = judge_regressions(run_id, history_url, results_dir, baseline_runs, sigma)
    regressions = [v for v in verdicts if v.status == "regression"]
    for v in regressions:
        emit_event(
            event=REGRESSION_EVENT,
            resource={"prefect.resource.id": f"flagperf.figure.{vendor}.{v.case}.{v.metric}",
                      "prefect.resource.name": f"{v.case} {v.metric} on {vendor}"},
            payload={"run_id": run_id, "case": v.case, "metric": v.metric, "value": v.value, "unit": v.unit,
                     "baseline": v.baseline, "change": v.change, "threshold": v.threshold},
        )
    if regressions:
        raise RegressionDetected(f"{len(regressions)} regression(s) in {run_id}: "
                                 + "; ".join(v.line() for v in regressions))
    return {"run_id": run_id, "verdicts": {f"{v.case}/{v.metric}": v.status for v in verdicts}}
