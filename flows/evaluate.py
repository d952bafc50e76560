"""One evaluation, as the DAG it is:

healthcheck -> build image -> per case, per round, per host:
    start monitors -> run case -> stop monitors (always) -> collect logs
-> analyze
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import deployment, flow_run

from flagperf.errors import ConfigError, FlagperfError, InfrastructureFailure, RoundUserFailure
from flagperf.hosts import Host, LocalHost
from flagperf.job import Job
from flagperf.plan import PLAN_FILE, CasePlan, RunPlan, plan_run, run_id_for_flow_run
from flagperf.provenance import library_versions
from flagperf.results import (
    RESULT_FILE,
    Failure,
    RoundResult,
    read_result,
    round_dir,
    write_json_atomic,
    write_result,
)
from flagperf.runtime import ProcessRuntime, Runtime
from flagperf.vendors import load_vendor
from tasks.analyze import analyze
from tasks.collect import collect_logs
from tasks.container import run_case
from tasks.healthcheck import healthcheck
from tasks.image import build_image
from tasks.monitor import start_monitors, stop_monitors

CONTROLLER_LIBRARIES = ("prefect", "pandas")
# The core logs at INFO (hosts, config rules); Prefect attaches its handlers to it through
# PREFECT_LOGGING_EXTRA_LOGGERS=flagperf, but the level is ours to set.
logging.getLogger("flagperf").setLevel(logging.INFO)
# A monitor outlives the round's worst case by this much at most, whatever happens to the controller.
MONITOR_SLACK_S = 300
RETRIES_DIR = "retries"  # failed rounds of earlier attempts of the same flow run, kept for inspection
MIN_MONITOR_INTERVAL_S, MAX_MONITOR_INTERVAL_S = 0.1, 60.0  # 10 Hz at most: the monitor's own limit


class EvaluationFailed(FlagperfError):
    """Raised at the end of a run in which some round failed (after the summary is written)."""


@flow(name="evaluate", log_prints=True, validate_parameters=True)
def evaluate(
    suite: str | None = None,
    cases: list[str] | None = None,
    vendor: str = "cpu",
    rounds: int | None = None,
    overrides: list[str] | None = None,
    results_dir: str = "results",
    run_id: str | None = None,
    monitor_interval_s: float = 1.0,
    command: str | None = None,
) -> dict[str, Any]:
    """Evaluate cases (a suite, or a list) on the hosts, `rounds` times each, and summarise the run.

    overrides: "KEY=VALUE" or "CASE.KEY=VALUE" strings, as `flagperf run --set`.
    """
    logger = get_run_logger()
    if not MIN_MONITOR_INTERVAL_S <= monitor_interval_s <= MAX_MONITOR_INTERVAL_S:
        raise ConfigError("monitor_interval_s", None, f"must be between {MIN_MONITOR_INTERVAL_S} and "
                                                      f"{MAX_MONITOR_INTERVAL_S} seconds, got {monitor_interval_s}")
    command = command or describe_invocation()
    flow_run_id = flow_run.get_id()
    if run_id is None and flow_run_id:
        run_id = run_id_for_flow_run(results_dir, flow_run_id)
    plan = plan_run(suite=suite, cases=cases, vendor=vendor, rounds=rounds, sets=overrides,
                    results_dir=results_dir, run_id=run_id, flow_run_id=flow_run_id)
    run_dir = plan.run_dir
    if (run_dir / PLAN_FILE).exists():
        logger.info("retry of flow run %s: continuing %s; rounds that completed are kept", flow_run_id, run_dir)
    write_json_atomic(run_dir / PLAN_FILE, plan.model_dump(mode="json"))
    logger.info("run %s: %d cases x %d rounds on vendor %s -> %s", plan.run_id, len(plan.cases), plan.rounds,
                plan.vendor, run_dir)
    hosts: list[Host] = [LocalHost()]
    runtime: Runtime = ProcessRuntime()

    probes = {host.name: healthcheck(host, plan.vendor, run_dir, plan.run_id).probe for host in hosts}
    check_scale(plan, hosts, probes)
    images = {host.name: build_image(host, plan.vendor, runtime) for host in hosts}

    results: list[RoundResult] = []
    try:
        for case in plan.cases:
            for round_no in range(1, plan.rounds + 1):
                for host in hosts:
                    kept = completed_round(plan, case.name, round_no, host.name)
                    if kept is not None:
                        logger.info("%s round %d on %s: kept (%s) from an earlier attempt of this flow run",
                                    case.name, round_no, host.name, kept.status)
                        results.append(kept)
                        continue
                    results.append(case_round(host, runtime, plan, case, round_no, images[host.name],
                                              probes[host.name], monitor_interval_s, command))
    finally:
        for host in hosts:
            host.remove_tree(host.work_root / plan.run_id)
        summary = analyze(run_dir)  # also after an interruption: what was measured is reported
    failed = [r for r in results if r.status == "failed"]
    if failed:
        raise EvaluationFailed(f"{len(failed)} of {len(results)} rounds failed: " + "; ".join(
            f"{r.case} round {r.round} on {r.host} ({r.failure.kind if r.failure else '?'})" for r in failed))
    return {"run_id": plan.run_id, "run_dir": str(run_dir), "counts": summary.counts}


def completed_round(plan: RunPlan, case: str, round_no: int, host: str) -> RoundResult | None:
    """A round an earlier attempt of this flow run finished (success or unsupported), else None.

    A failed round's folder is moved aside to retries/attempt<K>/ (kept, not overwritten), so that the
    round can run again in FlagPerf's layout.
    """
    folder = round_dir(plan.run_dir, case, round_no, host)
    if not folder.exists():
        return None
    try:
        result = read_result(folder / RESULT_FILE)
    except (OSError, ValueError):
        result = None
    if result is not None and result.status in ("success", "unsupported"):
        return result
    attempt = 1
    while (aside := plan.run_dir / RETRIES_DIR / f"attempt{attempt}" / folder.relative_to(plan.run_dir)).exists():
        attempt += 1
    aside.parent.mkdir(parents=True, exist_ok=True)
    folder.replace(aside)
    return None


def check_scale(plan: RunPlan, hosts: list[Host], probes: dict[str, dict[str, Any] | None]) -> None:
    """Before any round: a case may not ask for more nodes than hosts, or more processes per node than a
    host has devices (cores, where the device is the host's CPU)."""
    shares_host = load_vendor(plan.vendor).manifest.shares_host_memory
    for case in plan.cases:
        nnodes, nproc = int(case.config.get("nnodes", 1)), int(case.config.get("nproc_per_node", 1))
        if nnodes > len(hosts):
            raise ConfigError(case.origins.get("nnodes", case.name), "nnodes",
                              f"{case.name} asks for {nnodes} nodes; the inventory has {len(hosts)} host(s)")
        for host in hosts:
            probe = probes.get(host.name) or {}
            capacity = (probe.get("host") or {}).get("usable_cpus") if shares_host else probe.get("device_count")
            if capacity is not None and nproc > capacity:
                what = "usable CPU cores" if shares_host else "visible devices"
                raise ConfigError(case.origins.get("nproc_per_node", case.name), "nproc_per_node",
                                  f"{case.name} asks for {nproc} processes per node; host {host.name} has "
                                  f"{capacity} {what}")


def describe_invocation() -> str:
    """How this run was started, for provenance: the deployment and flow run, or the command line."""
    if deployment.get_id():
        return (f"deployment {deployment.get_name() or deployment.get_id()}, flow run {flow_run.get_name()} "
                f"({flow_run.get_id()}), parameters {json.dumps(flow_run.get_parameters(), default=str)}")
    return shlex.join(sys.argv)


def case_round(host: Host, runtime: Runtime, plan: RunPlan, case: CasePlan, round_no: int, image: dict[str, Any],
               probe: dict[str, Any] | None, monitor_interval_s: float, command: str) -> RoundResult:
    """start monitors -> run case (retried on infrastructure failures) -> stop monitors -> collect.

    Whatever goes wrong in one round (a monitor that will not start, a host error, a failed collection)
    becomes that round's failed result; the other rounds and the analysis still run.
    """
    stage_dir = host.work_root / plan.run_id / case.name / f"round{round_no}" / f"{host.name}_noderank0"
    job = Job(run_id=plan.run_id, case=case.name, family=case.family, round=round_no, host=host.name,
              vendor=plan.vendor, config=case.config, config_origins=case.origins, run_overrides=case.run_overrides,
              command=command, image=image, controller_libraries=library_versions(CONTROLLER_LIBRARIES))
    monitor_budget = case.timeout_s * (case.max_retries + 1) + MONITOR_SLACK_S
    label = f"{case.name}/round{round_no}@{host.name}"
    monitors: list[Any] = []
    failure: Failure | None = None
    try:
        monitors = start_monitors(host, plan.vendor, stage_dir, monitor_interval_s, monitor_budget, label)
        state = run_case.with_options(retries=case.max_retries)(
            host, runtime, job, stage_dir, case.timeout_s, return_state=True)
        failure = failure_of(state.result(raise_on_failure=False))
    except Exception as exc:
        failure = Failure(kind="infrastructure", message=f"{label}: {type(exc).__name__}: {exc}")
    finally:
        if monitors:
            stop_monitors(host, monitors, stage_dir, label, return_state=True)
    dest = round_dir(Path(plan.results_dir) / plan.run_id, case.name, round_no, host.name)
    collected = collect_logs(host, stage_dir, dest, job, failure, probe, return_state=True)
    if collected.is_completed():
        return collected.result()
    # Even the collection failed: the round still gets a result saying so.
    message = f"{label}: collecting the round's files failed: {collected.message}"
    result = job.failed_result(Failure(kind="infrastructure", message=message), probe)
    if not (dest / RESULT_FILE).exists():
        write_result(dest / RESULT_FILE, result)
    return result


def failure_of(outcome: object) -> Failure | None:
    if not isinstance(outcome, BaseException):
        return None
    kind = "user" if isinstance(outcome, RoundUserFailure) else "infrastructure"
    if isinstance(outcome, (RoundUserFailure, InfrastructureFailure)):
        return Failure(kind=kind, message=str(outcome))
    return Failure(kind=kind, message=f"{type(outcome).__name__}: {outcome}")
