"""Nightly regression: evaluate a suite, record it in the history, judge each figure against its baseline.

evaluate (subflow) -> record_history -> judge_regressions -> (event per regression) -> fail if any
A regression emits the Prefect event `flagperf.regression.detected`; the automation in
deployments/automations/ turns it into an alert.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NONE
from prefect.events import emit_event
from prefect.states import Completed, Failed, State
from pydantic import Field

from flagperf.config.plan import new_run_id, read_plan
from flagperf.errors import ConfigError, FlagperfError
from flagperf.results.history import Verdict, check_run, history_engine, record_run
from flows.evaluate import (
    BAD_INPUT,
    PARTLY_UNSUPPORTED_STATE,
    UNSUPPORTED_STATE,
    SuiteName,
    VendorName,
    default_results_dir,
    evaluate,
    in_form_terms,
)
from tasks.analyze import replace_earlier_artifacts

REGRESSION_EVENT = "flagperf.regression.detected"
VERDICTS_ARTIFACT = "flagperf-regression-verdicts"


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
    for verdict in verdicts:  # the run's one ERROR line names every regression; here each is a warning
        (logger.warning if verdict.status == "regression" else logger.info)(verdict.line())
    artifact = create_table_artifact(
        key=VERDICTS_ARTIFACT, description=f"{run_id}: each figure against its baseline",
        table=[{"case": v.case, "metric": v.metric, "value": f"{v.value:.4g} {v.unit}",
                "baseline": f"{v.baseline:.4g}" if v.baseline is not None else "-",
                "change": f"{v.change:+.1%}" if v.change is not None else "-",
                "threshold": f"±{v.threshold:.1%}" if v.threshold is not None else "-",
                "history": v.history, "verdict": v.status} for v in verdicts])
    replace_earlier_artifacts([VERDICTS_ARTIFACT], [artifact])
    return verdicts


def failed(message: str) -> State:
    """The nightly's end when it could not judge or found a regression: one ERROR line, no traceback."""
    get_run_logger().error("%s", message)
    return Failed(message=message)


@flow(name="nightly-regression", log_prints=True, validate_parameters=True)
def nightly_regression(
    suite: SuiteName = "smoke",
    vendor: VendorName = "auto",
    rounds: Annotated[int, Field(ge=1, le=100)] = 3,
    overrides: list[str] = [],  # noqa: B006 - Prefect's form needs a plain default; it is never changed
    inventory: str = "",
    results_dir: str = "",
    history_url: str = "",
    baseline_runs: Annotated[int, Field(ge=1, le=1000)] = 5,
    sigma: Annotated[float, Field(gt=0, le=100)] = 3.0,
) -> dict[str, Any] | State:
    """Run the suite, add it to the history and fail (with an event) on a regression.

    The nightly deployment's form. It ends Completed when every figure held its baseline; Failed with one line
    naming each regression (and the event flagperf.regression.detected per figure), or saying why nothing was
    judged; Unsupported or Partly unsupported as the evaluation did.

    Args:
        suite: The suite to evaluate each night (deployments/suites/).
        vendor: The vendor folder under vendor_images/; auto: the inventory's VENDOR, else cpu.
        rounds: Rounds per case; the baseline compares each figure's median over them.
        overrides: Case configuration values, as KEY=VALUE or CASE.KEY=VALUE (flagperf run --set).
        inventory: An inventory or FlagPerf host.yaml, as a path on the worker's machine; empty: that machine.
        results_dir: The results folder on the worker's machine. Empty: the folder the server's results site
            serves (FLAGPERF_RESULTS_DIR, set by `flagperf server`), else `results` in the worker's folder.
        history_url: The history database (sqlite:///path or postgresql+psycopg://user@host/db, no password in
            it). Empty: FLAGPERF_HISTORY_URL, else history.sqlite in the results folder.
        baseline_runs: How many earlier runs of the same figure, vendor and device make its baseline.
        sigma: A figure regresses when it is worse than its baseline (the median of those runs) by more than
            this many times their spread (and by at least 1 %).
    """
    results_dir = results_dir or default_results_dir()
    history = history_url or None
    try:
        history_engine(history, results_dir)  # a bad URL is said before a night of measuring, not after
    except ConfigError as exc:
        return failed(f"{BAD_INPUT}{exc}")
    run_id = new_run_id()
    state = evaluate(suite=suite, vendor=None if vendor == "auto" else vendor, rounds=rounds,
                     overrides=list(overrides) or None, inventory=inventory or None, results_dir=results_dir,
                     run_id=run_id, return_state=True)
    run_dir = Path(results_dir) / run_id
    if state.is_failed() and (state.message or "").startswith(BAD_INPUT):
        return failed(in_form_terms(state.message or ""))
    if not (run_dir / "summary.json").is_file():
        return failed(f"the evaluation produced no summary: {state.message}")
    try:
        vendor_name = read_plan(run_dir).vendor.name
    except ConfigError as exc:
        return failed(f"the run's plan cannot be read: {exc}")
    if state.is_failed():  # a partial run is neither a baseline nor judged against one
        return failed(f"the evaluation failed, nothing recorded in the history: {state.message}")
    try:
        record_history(run_dir, history, results_dir)
        verdicts = judge_regressions(run_id, history, results_dir, baseline_runs, sigma)
    except FlagperfError as exc:
        return failed(f"the history could not be used: {exc}")
    regressions = [v for v in verdicts if v.status == "regression"]
    for v in regressions:
        emit_event(
            event=REGRESSION_EVENT,
            resource={"prefect.resource.id": f"flagperf.figure.{vendor_name}.{v.case}.{v.metric}",
                      "prefect.resource.name": f"{v.case} {v.metric} on {vendor_name}"},
            payload={"run_id": run_id, "case": v.case, "metric": v.metric, "value": v.value, "unit": v.unit,
                     "baseline": v.baseline, "change": v.change, "threshold": v.threshold},
        )
    if regressions:
        return failed(f"{len(regressions)} regression(s) in {run_id}: " + "; ".join(v.line() for v in regressions))
    outcome = {"run_id": run_id, "verdicts": {f"{v.case}/{v.metric}": v.status for v in verdicts}}
    if state.name in (UNSUPPORTED_STATE, PARTLY_UNSUPPORTED_STATE):
        return Completed(name=state.name, message=state.message, data=outcome)
    return outcome
