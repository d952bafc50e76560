"""One evaluation, as the DAG it is:

healthcheck (every host, concurrently) -> build images -> probe in each docker host's image (accelerators
where the cases run) -> per case, per round, on every host at once:
    host-round: start monitors -> run case -> stop monitors (always) -> collect logs
-> analyze

Hosts come from an inventory (native, or FlagPerf's host.yaml); without one, the controller machine
itself runs the cases as plain processes. A host that runs a Prefect worker gets its rounds through the
host-round deployment on its own work queue; the others are driven from here, over SSH or locally.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from contextvars import copy_context
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, TypeVar
from uuid import UUID

from prefect import flow, get_run_logger
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.runtime import deployment, flow_run
from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings
from prefect.states import Cancelling, Completed, Failed, State
from pydantic import Field

from flagperf.config.cases import available_cases
from flagperf.config.plan import (
    DEFAULT_SUITE,
    PLAN_FILE,
    CasePlan,
    RunPlan,
    available_suites,
    plan_run,
    read_plan,
    run_id_for_flow_run,
)
from flagperf.config.vendors import available_vendors
from flagperf.errors import ConfigError, FlagperfError, InfrastructureFailure, error_line, redact_userinfo
from flagperf.hosts.capacity import check_capacity
from flagperf.hosts.docker import owner_labels
from flagperf.hosts.flagperf_training import open_inventory
from flagperf.hosts.fleet import close_hosts, master_address, open_host, stop_runs
from flagperf.hosts.health import check_results_disk, health_file, round_probe, with_image_probe
from flagperf.hosts.inventory import HostSpec, Inventory
from flagperf.hosts.local import Host
from flagperf.hosts.slurm import cancel_jobs
from flagperf.hosts.threads import HOST_THREADS, HostThreads, RoundsStopped, Unstopped, stop_requested
from flagperf.paths import RESULTS_DIR_ENV, RESULTS_ROOT_ENV
from flagperf.results.bounded import read_json_file
from flagperf.results.controller import controller_record
from flagperf.results.limits import MAX_MONITOR_INTERVAL_S, MIN_MONITOR_INTERVAL_S
from flagperf.results.prompt_positions import reservations
from flagperf.results.schema import (
    KEPT_ON_HOST,
    RESULT_FILE,
    RESULTS_UNWRITABLE,
    Failure,
    RoundResult,
    node_groups,
    read_result,
    round_dir,
    write_json_atomic,
    write_result,
)
from flagperf.results.summary import INTERRUPTED_FILE, RETRIES_DIR, SUMMARY_JSON
from flagperf.stopping import signals_noted
from flows.host_round import (
    at_endpoint,
    host_healthcheck,
    host_round,
    round_logger,
    round_outcome,
    secure_half_round,
)
from flows.logs import route_core_logs
from tasks.analyze import analyze
from tasks.collect import STORE_ERRNOS, holds_result, leftover_result, stage_folder
from tasks.container import HOST_DISK_FULL, THEN
from tasks.healthcheck import healthcheck
from tasks.image import build_image, probe_image

route_core_logs()
MAX_PARALLEL_HOSTS = 64  # threads that drive hosts at once (each mostly waits on its host)
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


BAD_INPUT = "bad input: "  # a failed state's message starting so means nothing ran: the CLI exits 2
# The final state of a run in which nothing failed but some rounds were unsupported (the CLI exits 3): a
# Completed state with its own name, so the UI shows it apart from a plain success, with the reason.
UNSUPPORTED_STATE, PARTLY_UNSUPPORTED_STATE = "Unsupported", "Partly unsupported"
LISTED_ROUNDS = 5  # rounds named in the final line; the report lists all
MAX_REASON = 200  # characters of one round's reason in that line (its result.json and the report have all)
# `flagperf server` sets this (the folder its results site serves) for its worker and deployments: a run
# started from the server writes there unless its form says otherwise.
# The names the core's errors give the inputs (the CLI's options), and the form's fields that hold them.
FORM_FIELDS = {"--set": "overrides", "--cases": "cases", "--suite": "suite", "--vendor": "vendor",
               "--rounds": "rounds", "--results": "results_dir", "--inventory": "inventory",
               "monitor_interval_s": "monitor_interval_s"}


class EvaluationFailed(FlagperfError):
    """Raised at the end of a run in which some round failed (after the summary is written)."""


def default_results_dir() -> str:
    """The results folder of a run whose form leaves it empty: the one the server serves (``FLAGPERF_RESULTS_DIR``;
    ``FLAGPERF_RESULTS_ROOT`` from a server that predates it), else `results` in the worker's folder."""
    return os.environ.get(RESULTS_DIR_ENV) or os.environ.get(RESULTS_ROOT_ENV) or "results"


def rounds_line(rounds: list[RoundResult]) -> str:
    """Each round's label and why, once, "; "-separated: at most LISTED_ROUNDS of them."""
    listed = [round_outcome(r)[:MAX_REASON] for r in rounds[:LISTED_ROUNDS]]
    if len(rounds) > LISTED_ROUNDS:
        listed.append(f"and {len(rounds) - LISTED_ROUNDS} more (report.md)")
    return "; ".join(listed)


def unsupported_state(results: list[RoundResult], data: dict[str, Any]) -> State | None:
    """The final state of a run with unsupported rounds and no failed one, None for a plain success."""
    unsupported = [r for r in results if r.status == "unsupported"]
    if not unsupported:
        return None
    if len(unsupported) == len(results):
        name, head = UNSUPPORTED_STATE, f"nothing measured: all {len(results)} rounds were unsupported"
    else:
        name, head = PARTLY_UNSUPPORTED_STATE, (f"{len(unsupported)} of {len(results)} rounds were unsupported "
                                                "(the others measured)")
    return Completed(name=name, message=f"{head}: {rounds_line(unsupported)}", data=data)


def form_message(exc: ConfigError, inventory: str | None) -> str:
    """A bad-input line that names the form's field: the CLI's option names become the fields' names, and an
    error in the inventory file says it is the inventory's."""
    if exc.source in FORM_FIELDS:
        return str(ConfigError(FORM_FIELDS[exc.source], exc.key, exc.message))
    if inventory and same_file(exc.source, inventory):
        return f"inventory: {exc}"
    return str(exc)


def same_file(a: str, b: str) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except (OSError, ValueError):  # not a path at all (a NUL, a loop of links): not the same file
        return False


def in_form_terms(message: str) -> str:
    """An evaluation's bad-input message (which names the CLI's option) as a form's: naming the field."""
    body = message.removeprefix(BAD_INPUT)
    for option, field in FORM_FIELDS.items():
        if body.startswith(f"{option}:"):
            return f"{message[:len(message) - len(body)]}{field}{body[len(option):]}"
    return message


@flow(name="evaluate", log_prints=True, validate_parameters=True)
def evaluate(
    suite: str | None = None,
    cases: list[str] | None = None,
    vendor: str | None = None,
    rounds: int | None = None,
    overrides: list[str] | None = None,
    inventory: str | None = None,
    results_dir: str = "results",
    run_id: str | None = None,
    monitor_interval_s: float = 1.0,
    command: str | None = None,
    resume: bool = False,
    cluster_conf: str | None = None,
) -> dict[str, Any] | State:
    """Evaluate cases (a suite, or a list) on the inventory's hosts, `rounds` times each, and summarise.

    inventory: a native inventory, FlagPerf's host.yaml or FlagPerf training's test_conf.py (path on the
        controller); none: this machine.
    cluster_conf: FlagPerf training's cluster_conf.py for a test_conf.py; none: the one beside it.
    vendor: the inventory's VENDOR when not given, else cpu.
    overrides: "KEY=VALUE" or "CASE.KEY=VALUE" strings, as `flagperf run --set`.
    resume: continue the run folder ``run_id`` that another flow run left (`flagperf run --retry`).
    """
    return evaluation_state(suite, cases, vendor, rounds, overrides, inventory, results_dir, run_id,
                            monitor_interval_s, command, resume, form=False, cluster_conf=cluster_conf)


def evaluation_state(suite: str | None, cases: list[str] | None, vendor: str | None, rounds: int | None,
                     overrides: list[str] | None, inventory: str | None, results_dir: str, run_id: str | None,
                     monitor_interval_s: float, command: str | None, resume: bool, *, form: bool,
                     cluster_conf: str | None = None) -> dict[str, Any] | State:
    """Run the evaluation and end it the way the UI and the CLI read it: a failure ends in a Failed state whose
    message is the one ERROR line of the run (no traceback: returned, not raised), bad input naming the
    option (form: the form's field) that is wrong; unsupported rounds end in a named Completed state."""
    logger = get_run_logger()
    try:
        return run_evaluation(suite, cases, vendor, rounds, overrides, inventory, results_dir, run_id,
                              monitor_interval_s, command, resume, cluster_conf=cluster_conf)
    except ConfigError as exc:  # bad input, found before any round ran: one line, no traceback
        message = form_message(exc, inventory) if form else str(exc)
        logger.error("%s", message)
        return Failed(message=f"{BAD_INPUT}{message}")
    except FlagperfError as exc:  # said in full by the message (a failed round, a host, a full disk)
        logger.error("%s", exc)
        return Failed(message=str(exc), data=exc)  # state.result() raises it, as when it was raised
    except OSError as exc:  # the results disk (or a host's) refused a file outside any round: one line
        if exc.errno not in STORE_ERRNOS:
            raise
        message = f"cannot write {exc.filename or results_dir}: {exc.strerror}"
        logger.error("%s", message)
        return Failed(message=message)


def run_evaluation(suite: str | None, cases: list[str] | None, vendor: str | None, rounds: int | None,
                   overrides: list[str] | None, inventory: str | None, results_dir: str, run_id: str | None,
                   monitor_interval_s: float, command: str | None, resume: bool = False,
                   cluster_conf: str | None = None) -> dict[str, Any] | State:
    logger = get_run_logger()
    # a FLAGPERF_CONTAINER_OWNER (the worker's) no container can carry: bad input now, before the run folder and
    # the hosts' probes, not at the first round's start
    owner_labels()
    if not MIN_MONITOR_INTERVAL_S <= monitor_interval_s <= MAX_MONITOR_INTERVAL_S:
        raise ConfigError("monitor_interval_s", None, f"must be between {MIN_MONITOR_INTERVAL_S:g} and "
                                                      f"{MAX_MONITOR_INTERVAL_S:g} seconds, got {monitor_interval_s}")
    command = command or describe_invocation()
    inv = open_inventory(inventory, cluster_conf)
    for note in inv.notes:
        logger.info("%s", note)
    vendor = inv.resolve_vendor(vendor)
    rounds = rounds if rounds is not None else inv.rounds
    if not suite and not cases and inv.cases:
        cases = list(inv.cases)
    flow_run_id = flow_run.get_id()
    if run_id is None and flow_run_id:
        run_id = run_id_for_flow_run(results_dir, flow_run_id)
    plan = plan_run(suite=suite, cases=cases, vendor=vendor, rounds=rounds, sets=overrides,
                    results_dir=results_dir, run_id=run_id, flow_run_id=flow_run_id,
                    hosts=[spec.model_dump(mode="json") for spec in inv.hosts],
                    inventory_overrides=inv.case_overrides, inventory_source=inv.source,
                    inventory_endpoints=inv.endpoints, resume=resume)
    run_dir = plan.run_dir.resolve()
    # Held while the run runs: a reader tells a run still going from one whose controller was killed, or ended
    # before its summary (a failed check, Ctrl-C during an image build: the record says so)
    with controller_record(run_dir, run_dir / SUMMARY_JSON, flow_run_id):
        return run_planned(plan, inv, run_dir, flow_run_id, monitor_interval_s, command)


def run_planned(plan: RunPlan, inv: Inventory, run_dir: Path, flow_run_id: str | None, monitor_interval_s: float,
                command: str) -> dict[str, Any] | State:
    """The planned run in ``run_dir``: its checks, its rounds, its report."""
    logger = get_run_logger()
    if (run_dir / PLAN_FILE).exists():
        logger.info("retry of flow run %s: continuing %s; rounds that completed are kept", flow_run_id, run_dir)
    write_json_atomic(run_dir / PLAN_FILE, plan.model_dump(mode="json"))
    logger.info("run %s: %d cases x %d rounds on vendor %s, %d host(s) from %s -> %s", plan.run_id,
                len(plan.cases), plan.rounds, plan.vendor.name, len(inv.hosts), inv.source, run_dir)
    check_results_disk(run_dir)
    specs = {spec.name: spec for spec in inv.hosts}
    hosts = {spec.name: open_host(spec) for spec in inv.hosts}

    # Set before the checks: an interrupt then stops their threads too (a healthcheck dispatched to a host's worker
    # is cancelled by the thread waiting on it, a local probe ends)
    threads = HostThreads()
    threads_token = HOST_THREADS.set(threads)

    def checks() -> dict[tuple[str, str | None], dict[str, Any]]:
        probes = check_hosts(hosts, specs, plan, run_dir)
        check_capacity(plan, list(hosts), probes)
        images = build_images(hosts, specs, plan, inv.frameworks)
        probes = check_images(hosts, specs, plan, run_dir, images, probes)
        check_capacity(plan, list(hosts), probes)  # again, with the devices the images see
        return images

    try:
        images = stopped_on_failure(threads, checks)
    except BaseException:
        HOST_THREADS.reset(threads_token)
        raise

    results: list[RoundResult] = []
    running: list[Any] | None = None  # the case round in flight, for the report of an interrupted run
    interruption: dict[str, Any] | None = None
    clean_up = ExitStack()  # after an interrupt: further signals only noted until the report is written
    try:
        # An earlier attempt's interruption, kept beside its set-aside rounds once this attempt runs rounds (not
        # before: a retry stopped by its checks leaves the run as it was): the report then says how this attempt
        # ended, and a retry that completes the run is not "interrupted". Inside the try: if it fails (a full
        # disk) or is interrupted, the hosts are still closed and the threads' context reset.
        set_aside(run_dir, run_dir / INTERRUPTED_FILE)
        for case in plan.cases:
            framework = inv.frameworks.get(case.name)
            for round_no in range(1, plan.rounds + 1):
                running = [case.name, round_no]
                calls: list[Callable[[], list[RoundResult]]] = []
                groups = node_groups(case.config, list(specs))
                for group in groups:
                    calls.append(partial(group_round, group, specs, plan, run_dir, case.name, round_no,
                                         {name: images[(name, framework)] for name in group},
                                         monitor_interval_s, command, inv.master_port))
                for group_results in run_concurrently(calls, groups):
                    results.extend(group_results)
                stop_if_results_unwritable(results, run_dir, command)
    except BaseException as exc:
        if not isinstance(exc, Exception):  # Ctrl-C, SIGTERM, a cancelled flow run: the report must say so
            clean_up.enter_context(signals_noted(f"the cases' containers or work folders on the hosts and the "
                                                 f"report of {run_dir} may be left"))
            signum = getattr(exc, "signal", None)  # Prefect's TerminationSignal carries the signal
            reason = signal.Signals(signum).name if signum else (str(exc) or type(exc).__name__)
            interruption = {"reason": reason, "at": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "running": running}
            write_json_atomic(run_dir / INTERRUPTED_FILE, interruption)
            logger.warning("interrupted (%s): stopping the cases and monitors, then writing the report", reason)
        raise
    finally:
        with clean_up:
            cancel_jobs()  # Slurm jobs still running (an interrupt) stop before their folders are cleaned
            HOST_THREADS.reset(threads_token)
            if interruption is not None or threads.busy():  # rounds may still run in other threads
                hosts = stopped_hosts(threads, specs, plan.run_id)
            say_uncancelled(threads.take_unstopped())  # where no thread was waited for (stopped_hosts says them)
            measured = clean_work_roots(hosts, specs, plan, results)
            if interruption is not None and measured:  # finished on a host, not yet collected: not lost, say so
                try:
                    write_json_atomic(run_dir / INTERRUPTED_FILE, {**interruption, "measured_on_host": measured,
                                                                   "retry": how_to_retry(command, run_dir)})
                except OSError as exc:  # a full disk: the first record stands, and the interrupt goes on
                    logger.warning("the rounds measured on their hosts could not be added to %s: %s",
                                   INTERRUPTED_FILE, exc)
            close_hosts()
            summary = analyze(run_dir)  # also after an interruption: what was measured is reported
    failed = [r for r in results if r.status == "failed"]
    if failed:
        raise EvaluationFailed(failed_line(failed, len(results), command, run_dir))
    data = {"run_id": plan.run_id, "run_dir": str(run_dir), "counts": summary.counts if summary else None}
    state = unsupported_state(results, data)
    if state is not None:
        logger.warning("%s", state.message)
        return state
    return data


def failed_line(failed: list[RoundResult], total: int, command: str | None, run_dir: Path) -> str:
    """The final line of a run with failed rounds; when some were measured but not collected (the link to their
    host dropped), it says how to get them: a retry collects them instead of running them again."""
    line = f"{len(failed)} of {total} rounds failed: {rounds_line(failed)}"
    if any(r.failure and KEPT_ON_HOST in r.failure.message for r in failed):
        line += (f"; to collect the rounds kept on their hosts (and run only the failed others again): "
                 f"{how_to_retry(command, run_dir)}")
    # the rounds' own reasons may be cut short above (or not listed): where one lies is said whole, once
    halves = [where for where in half_rounds_kept(failed) if f"{where} " not in line]
    if halves:
        line += (f"; kept on the host{'s' if len(halves) > 1 else ''}, for you to look at and remove before a retry "
                 f"(their prompt positions could not all be read): {', '.join(halves)}")
    return line


def half_rounds_kept(results: list[RoundResult]) -> list[str]:
    """Where the half rounds that ``results`` kept on their hosts lie (HOST:FOLDER; flows.host_round.HalfRoundKept)."""
    return [r.failure.kept_at for r in results if r.failure and r.failure.kept_at]


RUN_STOPPED = "; stopped after "  # the message of a run that stopped before its last round, and why


class ResultsUnwritable(FlagperfError):
    """The results folder, or a host's work folder, stopped taking files (full, read-only): the run stops;
    nothing measured is lost."""


def stop_if_results_unwritable(results: list[RoundResult], run_dir: Path, command: str | None = None) -> None:
    """Once the results folder refuses a round, every later round would be measured for nothing: stop, and
    say how to get back what was measured (a retry collects it from the hosts). A host whose work folder is full
    would fail every later round the same way: stop too, saying where to free space."""
    full = [r.failure.message for r in results if r.failure and HOST_DISK_FULL in r.failure.message]
    if full:
        raise ResultsUnwritable(
            f"{full[0].split(THEN)[0]}{RUN_STOPPED}{len(results)} round(s). Free space there, then "
            f"{how_to_retry(command, run_dir)}: completed rounds are kept, the rest run")
    refused = [r for r in results if r.failure and RESULTS_UNWRITABLE in r.failure.message]
    if refused:
        raise ResultsUnwritable(
            f"{refused[0].failure.message if refused[0].failure else ''}{RUN_STOPPED}{len(results)} round(s). "
            f"Free space, then {how_to_retry(command, run_dir)}: rounds kept on the hosts are collected, not run "
            f"again, completed ones kept, the rest run (`flagperf report {run_dir}` rebuilds the report alone)")


def how_to_retry(command: str | None, run_dir: Path) -> str:
    """The command that continues this run: the `flagperf run` it was started with, plus --retry; a run
    started from the server is retried there."""
    words = shlex.split(command) if command else []
    if words[:2] != ["flagperf", "run"]:
        return "retry this flow run (`prefect flow-run retry` or the UI)"
    if "--retry" not in words and not any(w.startswith("--retry=") for w in words):
        words += ["--retry", str(run_dir)]
    return f"`{shlex.join(words)}`"


def clean_work_roots(hosts: dict[str, Host], specs: dict[str, HostSpec], plan: RunPlan,
                     results: list[RoundResult]) -> list[list[Any]]:
    """Remove the run's folder on every host the controller drives, except where a round's files were not
    stored here: a collection that failed said so, and a round folder that still holds a result was never
    read back (collecting removes it), whatever stopped it (a crashed subflow, an interrupt). Those stay
    until a retry collects them. Returns the kept rounds that a retry collects rather than runs again
    (measured: [case, round, host, node rank]), for the report of an interrupted run.

    A half round at an endpoint (interrupted before it was collected) has its records kept in the run folder before
    its folder goes (flows.host_round.secure_half_round); where they cannot be, the folder stays, said in one line,
    and so does one kept for the lab to look at (HalfRoundKept)."""
    logger = round_logger()
    failed_collections = {r.host for r in results if r.failure and KEPT_ON_HOST in r.failure.message}
    looked_at = half_rounds_kept(results)
    measured: list[list[Any]] = []
    for name, host in hosts.items():
        if specs[name].agent is not None:
            continue
        run_root = host.work_root / plan.run_id
        try:
            unstored = uncollected_rounds(host, name, plan, list(specs))
            measured += [[case.name, round_no, name, rank] for case, round_no, rank, stage in unstored
                         if leftover_result(host, stage, case.max_retries + 1) is not None]
            kept = [stage for *_, stage in unstored]
            if name in failed_collections or kept:
                logger.warning("kept %s on %s: it holds rounds not yet collected%s", run_root, name,
                               f" ({', '.join(str(k.relative_to(run_root)) for k in kept)})" if kept else "")
                continue
            halves = [where for where in looked_at if where.startswith(f"{name}:")]
            for case, round_no, rank, stage in half_rounds(host, name, plan, list(specs)):
                if f"{name}:{stage}" in halves:  # kept already, said by its round
                    continue
                why = secure_half_round(host, stage, plan.run_dir, case.name, round_no, rank)
                if why is not None:
                    logger.warning("kept the half round %s:%s: %s; look at it, remove it, then retry the run", name,
                                   stage, why)
                    halves.append(f"{name}:{stage}")
            if halves:
                logger.warning("kept %s on %s: it holds half round(s) to look at (%s)", run_root, name,
                               ", ".join(halves))
                continue
            host.remove_tree(run_root)
            if (markers := host.ended_path(run_root)) is not None:  # the controller's records of its attempts' ends
                host.remove_tree(markers)
                host.remove_if_empty(markers.parent)  # the markers' folder, once no other run's are in it
        except Exception as exc:  # a host gone mid-run: clean-up must not hide why the run ended
            logger.warning("could not clean %s on %s: %s", run_root, name, exc)
    return measured


def half_rounds(host: Host, name: str, plan: RunPlan, names: list[str]) -> list[tuple[CasePlan, int, int, Path]]:
    """The folders on ``host`` of rounds at endpoints that were dispatched and neither stored nor measured (an
    interrupted attempt's), each with its case, round and node rank: the prompts they sent are known from their
    records only. One whose round still has an open reservation is one whatever the run folder holds for it: a
    failed result the controller wrote itself (a crashed subflow's, a refused reservation's) holds none of its records.
    The host's folders are listed, a level at a time, not asked after one by one (one call each on an SSH host)."""
    endpoint_cases = [case for case in plan.cases if at_endpoint(case)]
    if not endpoint_cases:
        return []
    run_root = host.work_root / plan.run_id
    present = listing(host, run_root)
    if not present:
        return []
    open_rounds = {(r.case, r.round, r.host, r.node_rank) for r in reservations(plan.run_dir) if r.open}
    found = []
    for case in endpoint_cases:
        if case.name not in present:
            continue
        ranks = [group.index(name) for group in node_groups(case.config, names) if name in group]
        rounds = listing(host, run_root / case.name)
        for round_no in range(1, plan.rounds + 1):
            if f"round{round_no}" not in rounds:
                continue
            here = listing(host, run_root / case.name / f"round{round_no}")
            for rank in ranks:
                stage = stage_folder(host.work_root, plan.run_id, case.name, round_no, name, rank)
                stored = round_dir(plan.run_dir, case.name, round_no, name, rank) / RESULT_FILE
                if stage.name in here and ((case.name, round_no, name, rank) in open_rounds or not stored.is_file()):
                    found.append((case, round_no, rank, stage))
    return found


def listing(host: Host, folder: Path) -> set[str]:
    """The names in ``folder`` on the host; none where it does not exist."""
    try:
        return set(host.list_folder(folder))
    except FileNotFoundError:
        return set()


def uncollected_rounds(host: Host, name: str, plan: RunPlan, names: list[str]
                       ) -> list[tuple[CasePlan, int, int, Path]]:
    """The round folders on ``host`` that hold a result the controller has not stored, each with its case, round
    and node rank. A round stored whole (its folder is renamed into place only once complete) is not one, though
    its host's copy is still there: an interrupt between the rename and the removal leaves both, and the stored
    one is the record."""
    found = []
    for case in plan.cases:
        ranks = [group.index(name) for group in node_groups(case.config, names) if name in group]
        for round_no in range(1, plan.rounds + 1):
            for rank in ranks:
                stage = stage_folder(host.work_root, plan.run_id, case.name, round_no, name, rank)
                stored = round_dir(plan.run_dir, case.name, round_no, name, rank) / RESULT_FILE
                if holds_result(host, stage, case.max_retries + 1) and not stored.is_file():
                    found.append((case, round_no, rank, stage))
    return found


def _choices(names: list[str]) -> Any:
    """A text parameter whose form field offers these names (a select), while the Python API still takes
    any string (a suite may also be a YAML file)."""
    return Field(json_schema_extra={"enum": sorted(names)})


# The form's choices are the plug-in folders found when the deployment is made (`prefect deploy`).
SuiteName = Annotated[str, _choices(list(available_suites()))]
CaseName = Annotated[str, _choices(list(available_cases()))]
VendorName = Annotated[str, _choices(["auto", *available_vendors()])]


def limits_in_doc(fn: F) -> F:
    """``fn`` with its docstring's {min_interval_s} and {max_interval_s} filled in from the limits the code checks:
    Prefect's form shows each parameter's line of it."""
    fn.__doc__ = (fn.__doc__ or "").format(min_interval_s=f"{MIN_MONITOR_INTERVAL_S:g}",
                                           max_interval_s=f"{MAX_MONITOR_INTERVAL_S:g}")
    return fn


@flow(name="evaluate", log_prints=True, validate_parameters=True)
@limits_in_doc
def evaluate_form(
    suite: SuiteName = DEFAULT_SUITE,
    cases: list[CaseName] = [],  # noqa: B006 - Prefect's form needs a plain default; it is never changed
    vendor: VendorName = "auto",
    rounds: Annotated[int, Field(ge=0)] = 0,
    overrides: list[str] = [],  # noqa: B006
    inventory: str = "",
    results_dir: str = "",
    monitor_interval_s: Annotated[float, Field(ge=MIN_MONITOR_INTERVAL_S, le=MAX_MONITOR_INTERVAL_S)] = 1.0,
) -> dict[str, Any] | State:
    """Evaluate a suite (or chosen cases) on the inventory's hosts, N rounds each, and publish the report.

    The same evaluation as `flagperf run`, started from the server: the evaluate deployment's form. A retry
    of a failed run re-runs only its failed rounds. It ends Completed; Unsupported (nothing measured) or
    Partly unsupported when rounds were unsupported; Failed with one line naming the failed rounds and why,
    or the form field that is wrong.

    Args:
        suite: The suite to run (deployments/suites/); ignored when cases are chosen.
        cases: Run these cases instead of a suite.
        vendor: The vendor folder under vendor_images/; auto: the inventory's VENDOR, else cpu.
        rounds: Rounds per case; 0: the suite's own number (1 for chosen cases).
        overrides: Case configuration values for this run, as KEY=VALUE or CASE.KEY=VALUE (flagperf run --set).
        inventory: An inventory, FlagPerf host.yaml or FlagPerf training test_conf.py (its cluster_conf.py
            beside it), as a path on the worker's machine; empty: that machine.
        results_dir: The results folder on the worker's machine; the run is written to a folder inside it.
            Empty: the folder the server's results site serves (FLAGPERF_RESULTS_DIR, set by `flagperf server`),
            else `results` in the worker's folder.
        monitor_interval_s: Seconds between monitor samples ({min_interval_s} to {max_interval_s}).
    """
    return evaluation_state(None if cases else suite, list(cases) or None, None if vendor == "auto" else vendor,
                            rounds or None, list(overrides) or None, inventory or None,
                            results_dir or default_results_dir(), None, monitor_interval_s, None, False, form=True)


def run_concurrently(calls: list[Callable[[], T]], hosts: list[list[str]] | None = None) -> list[T]:
    """Run the calls at once, each in its own copy of the flow's context (so their tasks and subflows
    belong to this flow run), and return their results in order. ``hosts``: the hosts each call drives; inside
    an evaluation's rounds (HOST_THREADS) each live call is counted against them, for the clean-up.

    If this thread is interrupted (Ctrl-C, a cancelled flow run), it stops waiting at once, after telling the
    threads to stop (nothing new starts on a host, a local command ends): the caller's clean-up then closes the
    hosts' connections, which ends the remote commands, and waits for the threads (stop_host_threads)."""
    threads = HOST_THREADS.get()
    if threads is not None and hosts is not None:
        calls = [partial(threads.run, names, call) for names, call in zip(hosts, calls, strict=True)]
    if len(calls) <= 1:
        return [call() for call in calls]
    pool = ThreadPoolExecutor(max_workers=min(len(calls), MAX_PARALLEL_HOSTS), thread_name_prefix="host")
    try:
        futures = [pool.submit(copy_context().run, call) for call in calls]
        results = [future.result() for future in futures]
    except BaseException as exc:
        if threads is not None and not isinstance(exc, Exception):
            threads.stop()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return results


HOST_THREADS_GRACE_S = 120.0  # how long an interrupted run waits for its hosts' threads to end before cleaning
CHECKS_GRACE_S = 30.0  # how long a run whose checks failed waits for the other hosts' checks it stopped


def stopped_on_failure(threads: HostThreads, call: Callable[[], T]) -> T:
    """``call`` (the run's checks, each host's in its thread); if it raises (a host failed its build, Ctrl-C), the
    other hosts' threads are stopped and their connections closed (an SSH image build or healthcheck still running
    ends), and waited for, at most CHECKS_GRACE_S: else the process would wait for them at its exit, up to their
    own timeouts."""
    try:
        return call()
    except BaseException:
        stop_host_threads(threads, grace_s=CHECKS_GRACE_S, phase="checks")
        raise


def stop_host_threads(threads: HostThreads, grace_s: float = HOST_THREADS_GRACE_S,
                      stop_idle: Callable[[set[str]], dict[str, str]] | None = None, hosts: Sequence[str] = (),
                      phase: Literal["rounds", "checks"] = "rounds") -> set[str]:
    """After an interrupt (or a round that raised while others ran): stop the hosts' threads, close the hosts'
    connections (ending the commands they wait on; a closed SshHost never reconnects), and wait for them, at most
    ``grace_s``. ``stop_idle``: given the hosts of ``hosts`` that no thread drives any more, ends what their rounds
    left running there (fleet.stop_runs) and returns where something may still run, with why. Returns the hosts a
    thread still drives or something may still run on, named in one warning line: in the rounds' ``phase`` those
    are not cleaned; in the checks' (healthchecks, image builds and probes: nothing of them is cleaned after) their
    checks may run on."""
    threads.stop()
    close_hosts()
    busy = threads.wait(grace_s)
    say_uncancelled(threads.take_unstopped())  # the runs its threads dispatched and could not cancel, in one line
    idle = set(hosts) - set(busy)
    running = stop_idle(idle) if stop_idle is not None else {}
    if busy or running:
        names = ", ".join(sorted({*busy, *running}))
        doing = "a round's" if phase == "rounds" else "a check's"
        why = "; ".join([f"{host}: {doing} thread still drives it after {grace_s:.0f} s ({', '.join(threads_of)})"
                         for host, threads_of in sorted(busy.items())]
                        + [f"{host}: {said}" for host, said in sorted(running.items())])
        if phase == "rounds":
            round_logger().warning("left the run's folder on %s as it is (%s)", names, why)
        else:
            round_logger().warning("stopped waiting for the checks on %s (%s): a healthcheck, image build or probe "
                                   "there may go on until its own timeout", names, why)
    return {*busy, *running}


def stopped_hosts(threads: HostThreads, specs: dict[str, HostSpec], run_id: str) -> dict[str, Host]:
    """The rounds stopped (stop_host_threads), the hosts whose run folder may be cleaned, each on a fresh connection
    (the closed ones refuse): none a thread still drives (not touched), nor one whose runtime could not end what the
    run left running there (Runtime.stop_run: a container over SSH that its round lost with the closed connection,
    which would go on writing into the folder)."""
    fresh: dict[str, Host] = {}

    def stop_idle(idle: set[str]) -> dict[str, str]:
        fresh.update({name: open_host(specs[name]) for name in specs if name in idle})
        return stop_runs(fresh, specs, run_id)

    left = stop_host_threads(threads, stop_idle=stop_idle, hosts=list(specs))
    return {name: host for name, host in fresh.items() if name not in left}


def check_hosts(hosts: dict[str, Host], specs: dict[str, HostSpec], plan: RunPlan, run_dir: Path
                ) -> dict[str, dict[str, Any] | None]:
    """Every host at once; if any fails, the run stops here naming each failed host and check."""
    def check(name: str) -> tuple[str, dict[str, Any] | None, str | None]:
        spec = specs[name]
        try:
            if spec.agent is not None:
                state = dispatch(spec, host_healthcheck, "host-healthcheck/host-healthcheck",
                                 {"host": spec.model_dump(mode="json"), "vendor": plan.vendor.model_dump(mode="json"),
                                  "run_dir": str(run_dir), "cases": plan.case_folders})
                if not state.is_completed():
                    raise InfrastructureFailure(f"host {spec.name}: host-healthcheck ended {state.name}: "
                                                f"{redact_userinfo(state.message or '')}")
            else:
                healthcheck(hosts[name], spec, plan.vendor, run_dir, plan.case_folders)
        except Exception as exc:  # a client's error names its URL: a password of PREFECT_API_URL masked
            return name, None, redact_userinfo(str(exc)) or type(exc).__name__
        report = read_json_file(health_file(run_dir, name), what="a host's health report")  # bounded
        return name, report["probe"], None

    outcomes = run_concurrently([partial(check, name) for name in hosts], [[name] for name in hosts])
    problems = [problem for _, _, problem in outcomes if problem]
    if problems:
        raise InfrastructureFailure(f"healthcheck failed, nothing was run: {'; '.join(problems)}")
    return {name: probe for name, probe, _ in outcomes}


def build_images(hosts: dict[str, Host], specs: dict[str, HostSpec], plan: RunPlan, frameworks: dict[str, str]
                 ) -> dict[tuple[str, str | None], dict[str, Any]]:
    """One image per host and framework the cases use; hosts that share an engine build it once."""
    wanted = sorted({frameworks.get(case.name) for case in plan.cases}, key=lambda f: f or "")
    engines: dict[tuple[Any, ...], list[tuple[str, str | None]]] = {}
    for name, spec in specs.items():
        for framework in wanted:
            if spec.agent is not None:
                engine: tuple[Any, ...] = ("agent", name, framework)  # built by its own host-round
            elif spec.runtime == "process":
                engine = ("process", name, framework)
            elif spec.docker.engine == "local":
                engine = ("local", spec.docker.base_url, tuple(sorted(spec.docker.build_args.items())), framework)
            else:
                engine = ("ssh", spec.address, spec.port, tuple(sorted(spec.docker.build_args.items())), framework)
            engines.setdefault(engine, []).append((name, framework))

    def build(members: list[tuple[str, str | None]]) -> list[tuple[tuple[str, str | None], dict[str, Any]]]:
        name, framework = members[0]
        if specs[name].agent is not None:
            return [(member, {"framework": framework, "status": "on host"}) for member in members]
        record = build_image(hosts[name], specs[name], plan.vendor, plan.run_id, framework=framework)
        return [(member, record) for member in members]

    built = run_concurrently([partial(build, members) for members in engines.values()],
                             [sorted({name for name, _ in members}) for members in engines.values()])
    return {key: record for group in built for key, record in group}


def check_images(hosts: dict[str, Host], specs: dict[str, HostSpec], plan: RunPlan, run_dir: Path,
                 images: dict[tuple[str, str | None], dict[str, Any]], probes: dict[str, dict[str, Any] | None]
                 ) -> dict[str, dict[str, Any] | None]:
    """Docker hosts: the probe again, inside each host's image (every host at once), so the accelerators are
    checked where the cases run and a host needs no torch outside its images. Agent hosts build and run
    their images themselves; process hosts were probed as they run."""
    wanted = [(key[0], key) for key, record in images.items()
              if specs[key[0]].runtime == "docker" and specs[key[0]].agent is None and record.get("tag")]

    def probe(name: str, key: tuple[str, str | None]) -> tuple[str, dict[str, Any] | None, str | None]:
        try:
            return name, probe_image(hosts[name], specs[name], plan.vendor, plan.run_id, images[key], run_dir,
                                     plan.case_folders), None
        except Exception as exc:
            return name, None, str(exc) or type(exc).__name__

    outcomes = run_concurrently([partial(probe, name, key) for name, key in wanted], [[name] for name, _ in wanted])
    problems = [problem for _, _, problem in outcomes if problem]
    if problems:
        raise InfrastructureFailure(f"healthcheck failed, nothing was run: {'; '.join(problems)}")
    merged = dict(probes)
    for name, image_probe, _ in outcomes:
        assert image_probe is not None
        merged[name] = with_image_probe(probes.get(name), image_probe)  # as the rounds read it: round_probe
    return merged


def group_round(group: list[str], specs: dict[str, HostSpec], plan: RunPlan, run_dir: Path, case: str,
                round_no: int, images: dict[str, dict[str, Any]], monitor_interval_s: float, command: str,
                master_port: int) -> list[RoundResult]:
    """One round of one case on a group of hosts (one host, or the nnodes of a multi-node case), all at once.
    A multi-node round is kept from an earlier attempt only if every node completed it."""
    logger = get_run_logger()
    kept = [completed_round(run_dir, case, round_no, name, rank) for rank, name in enumerate(group)]
    if all(k is not None for k in kept):
        for result in kept:
            assert result is not None
            logger.info("%s round %d on %s: kept (%s) from an earlier attempt of this flow run",
                        case, round_no, result.host, result.status)
        return [k for k in kept if k is not None]
    for rank, name in enumerate(group):  # a multi-node round reruns whole: set aside what its nodes left
        folder = round_dir(run_dir, case, round_no, name, rank)
        earlier = earlier_outcome(folder)
        aside = set_aside(run_dir, folder)
        if aside is not None:  # a retry: the log says which rounds it runs again, beside the kept ones
            logger.info("%s round %d on %s: runs again (the earlier attempt: %s; kept in %s)", case, round_no, name,
                        earlier, aside.relative_to(run_dir))
    nnodes = len(group)
    master = specs[group[0]]
    calls = []
    for rank, name in enumerate(group):
        parameters = {"run_dir": str(run_dir), "case": case, "round_no": round_no,
                      "host": specs[name].model_dump(mode="json"), "node_rank": rank, "nnodes": nnodes,
                      "master_addr": master_address(master), "master_port": master_port if nnodes > 1 else None,
                      "image": images[name], "monitor_interval_s": monitor_interval_s, "command": command}
        calls.append(partial(run_node, specs[name], parameters))
    return run_concurrently(calls, [[name] for name in group])


def run_node(spec: HostSpec, parameters: dict[str, Any]) -> RoundResult:
    """host-round for one node: as a subflow here, or on the host's worker; the result is read from the
    round's folder either way (the folder, not a return value, is the record)."""
    dest = round_dir(Path(parameters["run_dir"]), parameters["case"], parameters["round_no"], spec.name,
                     parameters["node_rank"])
    label = f"{parameters['case']} round {parameters['round_no']} on {spec.name}"
    problem: str | None = None
    returned: Any = None
    try:
        # A round that failed ends its host-round Failed (red in the UI); its result.json says why, so that
        # alone is no problem here. A host-round that left no result is.
        state = dispatch(spec, host_round, "host-round/host-round", parameters)
        returned = state_data(state)
        if not state.is_completed():
            # the worker's message names its client's errors whole: a URL's password masked
            said = redact_userinfo((state.message or "").partition("\n")[0]).removeprefix(f"{label}: ")
            problem = f"{label}: host-round ended {state.name}: {said}"
    except RoundsStopped:  # the evaluation is stopping: the round was stopped while running, not failed
        raise
    except Exception as exc:  # the subflow or the deployment run failed outright
        problem = f"{label}: host-round failed: {error_line(exc)}"
    try:
        return read_result(dest / RESULT_FILE)
    except (OSError, ValueError):
        if isinstance(returned, RoundsStopped) or stop_requested():  # stopped while running: no result is written
            raise RoundsStopped(f"the run is stopping: {label} was stopped while running") from None
        if isinstance(returned, dict) and returned.get("failure"):  # a subflow's failed result it could not store
            return RoundResult.model_validate(returned)
        if problem:
            get_run_logger().error("%s", problem)
        failure = Failure(kind="infrastructure", message=problem or f"{label}: the round left no {RESULT_FILE}")
        plan = read_plan(Path(parameters["run_dir"]))
        case = next(c for c in plan.cases if c.name == parameters["case"])
        from flagperf.config.job import Job

        job = Job(run_id=plan.run_id, case=case.name, family=case.family, round=parameters["round_no"],
                  host=spec.name, node_rank=parameters["node_rank"], vendor=plan.vendor.name, config=case.config,
                  config_origins=case.origins, run_overrides=case.run_overrides, command=parameters["command"],
                  image=parameters["image"] or {}, run_cases=plan.case_folders)
        result = job.failed_result(failure, round_probe(Path(parameters["run_dir"]), spec.name,
                                                        (parameters["image"] or {}).get("framework")))
        try:
            write_result(dest / RESULT_FILE, result)
        except OSError as exc:
            get_run_logger().error("%s: cannot write %s: %s", label, dest / RESULT_FILE, exc.strerror or exc)
        return result


def state_data(state: State[Any]) -> Any:
    """What a finished host-round returned (its result as a dict), failed or not; None if unreadable."""
    try:
        return state.result(raise_on_failure=False)
    except Exception:  # a result that was not persisted, a crash: the round's folder is the record anyway
        return None


def dispatch(spec: HostSpec, subflow: Any, deployment_name: str, parameters: dict[str, Any]) -> State[Any]:
    """Call a per-host flow: on the host's worker through its deployment (when the inventory says the host
    runs one), else right here as a subflow. Either way it is nested under this evaluation; returns its
    final state."""
    if spec.agent is None:
        return subflow(**parameters, return_state=True)
    run = run_deployment(spec.agent.deployment if subflow is host_round else deployment_name,
                         parameters={**parameters, "on_host": True}, work_queue_name=spec.queue,
                         timeout=0, as_subflow=True)
    run = wait_for_agent(spec, run.id, deployment_name)
    if run.state is None:
        raise InfrastructureFailure(f"host {spec.name}: {deployment_name} run {run.name} has no state")
    return run.state


AGENT_POLL_S = 1.0
# One look at a dispatched run: one request (no retries of Prefect's client nor of its connection pool), its answer
# waited for this long at most (answered_within); the wait's own loop looks again, never with two looks in flight.
POLL_TIMEOUT_S = 5.0
SILENCE_SAID_S = 60.0  # a Prefect server silent this long while the controller waits on a dispatched run is said
STOP_LOOK_S = 0.5  # how often a look the server holds looks at the evaluation's stop
SERVER_ERRORS_WAITED = 3  # 500 answers in a row a wait takes for an overloaded server before it gives up


@contextmanager
def one_try_client(timeout_s: float) -> Iterator[SyncPrefectClient]:
    """A Prefect client whose every call is one request of at most ``timeout_s`` a phase (connect, read, write): its
    own retries are off, and its connection pool's (it tries a refused connection 3 times), and a busy answer
    (BUSY_STATUSES) is raised as it comes (raise_busy): Prefect's client slept its Retry-After even with its retries
    off, and resent one marked Prefect-Maintenance every second without end. Its caller decides what to do when the
    server does not answer; one that must not wait calls it through answered_within (a phase's timeout bounds no
    request)."""
    with temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 0}), \
            get_client(httpx_settings={"timeout": timeout_s, "event_hooks": {"response": [raise_busy]}},
                       sync_client=True) as client:
        no_connect_retries(client)
        yield client


def raise_busy(response: Any) -> None:
    """An httpx response hook: a busy answer (BUSY_STATUSES) raised at once, before Prefect's client reads it as one
    to sleep on and send again (its PrefectHttpxSyncClient._send_with_retry)."""
    import httpx
    from prefect.exceptions import PrefectHTTPStatusError

    if response.status_code in BUSY_STATUSES:
        try:
            response.raise_for_status()
        except httpx.HTTPStatusError as exc:
            raise PrefectHTTPStatusError.from_httpx_error(exc) from None


def no_connect_retries(client: SyncPrefectClient) -> None:
    """Set the client's connection pool to try each connection once, as guarded as Prefect sets it to 3 tries (its
    SyncPrefectClient.__init__): the transport it made for the API's URL, only where it is httpx's and httpcore's."""
    import httpcore
    import httpx

    transport_for_url = getattr(getattr(client, "_client", None), "_transport_for_url", None)
    if callable(transport_for_url):
        transport = transport_for_url(httpx.URL(str(client.api_url)))
        pool = getattr(transport, "_pool", None)
        if isinstance(transport, httpx.HTTPTransport) and isinstance(pool, httpcore.ConnectionPool):
            pool._retries = 0


class NoAnswer(Exception):
    """A call to the Prefect server that did not end within its deadline (answered_within); it may go on alone."""


class InFlight(Generic[T]):
    """A call to the Prefect server on a thread of its own (a daemon: one never answered is left to itself), so that
    its caller can wait for its answer a while at a time (answer) and choose what to do meanwhile."""

    def __init__(self, call: Callable[[], T]) -> None:
        self.answers: list[T] = []
        self.failures: list[BaseException] = []
        self.done = threading.Event()

        def run() -> None:
            try:
                self.answers.append(call())
            except BaseException as exc:
                self.failures.append(exc)
            finally:
                self.done.set()

        threading.Thread(target=copy_context().run, args=(run,), daemon=True, name="prefect-call").start()

    def answer(self, deadline_s: float, stoppable: bool = False) -> T:
        """The call's answer (or its exception), waited for ``deadline_s`` at most, else NoAnswer (the call goes on,
        and may be waited on again). ``stoppable``: the evaluation's stop ends the wait too (NoAnswer), looked at
        every STOP_LOOK_S, so that the caller sees the stop at once."""
        # slices of the deadline, not the clock: a wait that reads no clock holds whatever the clock does
        slices = max(1, int(deadline_s / STOP_LOOK_S)) if stoppable else 1
        for _ in range(slices):
            if self.done.wait(deadline_s / slices):
                break
            if stoppable and stop_requested():
                raise NoAnswer("the evaluation is stopping")
        else:
            raise NoAnswer(f"no answer within {deadline_s:.0f} s")
        if self.failures:
            raise self.failures[0]
        return self.answers[0]


def answered_within(call: Callable[[], T], deadline_s: float, stoppable: bool = False) -> T:
    """``call``'s answer (or its exception), from a thread of its own, waited for ``deadline_s`` at most, else
    NoAnswer (InFlight.answer): a client's timeouts bound each phase of a request, not the request, so only a thread
    bounds a call whatever the client does. A call not answered goes on alone, its answer dropped."""
    return InFlight(call).answer(deadline_s, stoppable)


def wait_for_agent(spec: HostSpec, flow_run_id: UUID, deployment_name: str) -> FlowRun:
    """Wait for a dispatched run: first for the host's worker to pick it up (``agent.start_timeout_s``: a
    worker that is down fails the host in minutes, not after the round's whole budget, and the run is
    cancelled so it cannot start later), then for it to end (``agent.timeout_s``, counted from dispatch). Each
    look is one request, waited for POLL_TIMEOUT_S at most, so the stop and the timeouts hold while the Prefect server
    does not answer."""
    assert spec.agent is not None
    with one_try_client(POLL_TIMEOUT_S) as client:
        try:
            return _wait_for_agent(client, spec, flow_run_id, deployment_name)
        except BaseException as exc:  # Ctrl-C, a cancelled evaluation, its stop: the dispatched run must not go on
            if isinstance(exc, Exception) and not isinstance(exc, RoundsStopped):
                raise
            cancel_at_interrupt(spec, flow_run_id, deployment_name)
            raise


CANCEL_TIMEOUT_S = 5.0  # at an interrupt, each call that cancels a dispatched run: one attempt, this long at most
CANCEL_DEADLINE_S = 15.0  # and all the calls for one run together (a timeout's cancel too)


def cancel_at_interrupt(spec: HostSpec, flow_run_id: UUID, deployment_name: str,
                        deadline_s: float | None = None) -> None:
    """Cancel a run dispatched to a host's worker, the evaluation being interrupted (settle_dispatched), and say so;
    bounded: one attempt per call (the client's retries hold a Ctrl-C about a minute per call when the server is
    down), each at most CANCEL_TIMEOUT_S a phase, all within ``deadline_s`` (CANCEL_DEADLINE_S) whatever the client
    does. A run it could not cancel is noted for the evaluation's one warning line (say_uncancelled, once its hosts'
    threads have ended), or said alone outside one: it may still run, or start later, on its host. A cancel answered
    past its deadline is not said (the run was said uncancelled)."""

    def cancel() -> FlowRun | None:
        with one_try_client(CANCEL_TIMEOUT_S) as client:
            return settle_dispatched(client, flow_run_id, "the evaluation that dispatched it was interrupted")

    try:
        ended = answered_within(cancel, CANCEL_DEADLINE_S if deadline_s is None else deadline_s)
    except Exception as exc:
        unstopped = Unstopped(spec.name, f"{deployment_name} run {flow_run_id}", str(flow_run_id), no_answer(exc))
        threads = HOST_THREADS.get()
        if threads is None or not threads.note_unstopped(unstopped):
            say_uncancelled([unstopped])
        return
    if ended is None:
        round_logger().warning("cancelling %s run %s on host %s: the evaluation was interrupted", deployment_name,
                               flow_run_id, spec.name)


def no_answer(exc: BaseException) -> str:
    """Why a call to the Prefect server failed, in a few words."""
    return str(exc) if isinstance(exc, NoAnswer) else error_line(exc)


def say_uncancelled(runs: list[Unstopped]) -> None:
    """The dispatched runs an interrupt could not cancel, in one warning line: they may still run, or start later, on
    their hosts."""
    if not runs:
        return
    if len(runs) == 1:
        host, what, ref, why = runs[0]
        round_logger().warning("could not cancel %s on host %s (%s): it may still run or start there; cancel it with "
                               "prefect flow-run cancel %s", what, host, why, ref)
        return
    hosts = ", ".join(sorted({run.host for run in runs}))
    whys = list(dict.fromkeys(run.why for run in runs))
    round_logger().warning(
        "could not cancel %d dispatched runs, on hosts %s (%s%s): they may still run or start there; cancel each with "
        "prefect flow-run cancel ID (%s)", len(runs), hosts, whys[0],
        f"; and {len(whys) - 1} other reason(s)" if len(whys) > 1 else "",
        "; ".join(f"{run.host}: {run.what}" for run in sorted(runs)))


class NotCancelled(Exception):
    """The Prefect server refused to cancel a dispatched run that has not ended (settle_dispatched)."""


def settle_dispatched(client: SyncPrefectClient, flow_run_id: UUID, why: str) -> FlowRun | None:
    """Cancel a dispatched run as `prefect flow-run cancel` does: Cancelling, unforced, on which the server makes one
    that no worker took (no process) Cancelled at once, refuses the run's own move to Running, and a worker ends a
    process it started (a forced Cancelled let a run a worker had taken go on Running, unseen). Read first (the
    caller's last look may be old): a run that has ended, or ends before the proposal (the server refuses it then),
    is left as it ended and returned; None once it is cancelled (or cancelling); NotCancelled where the server
    refuses a run that has not ended."""
    from prefect.client.schemas.responses import SetStateStatus

    run = client.read_flow_run(flow_run_id)
    if run.state is not None and run.state.is_final():  # ended already: left as it ended
        return run
    result = client.set_flow_run_state(flow_run_id, Cancelling(message=why))
    if result.status == SetStateStatus.ACCEPT or (result.state is not None and result.state.is_cancelled()):
        return None  # Cancelling, or Cancelled where no process was started (the server's own choice)
    run = client.read_flow_run(flow_run_id)
    if run.state is not None and run.state.is_final():  # it ended between the read and the proposal
        return run
    raise NotCancelled(f"the Prefect server refused: {result.details.reason or result.status.value}")


def server_unreachable() -> tuple[type[BaseException], ...]:
    """What a read raises when the Prefect server does not answer it (down, restarting, a dropped connection, a read
    past POLL_TIMEOUT_S), as opposed to its own answer about the run, or a request this side could not make."""
    import httpx

    return httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError, NoAnswer


# Answers that are no word on the run: the server (or a proxy before it) is restarting or overloaded, as Prefect's
# client reads them (it retries these). A 500 is the server's own failure, often an overload too (its database's
# connection pool timing out): SERVER_ERRORS_WAITED of them in a row are waited on.
BUSY_STATUSES = (408, 429, 502, 503, 504)


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of a server's error answer, else None."""
    import httpx

    return exc.response.status_code if isinstance(exc, httpx.HTTPStatusError) else None


def _wait_for_agent(client: SyncPrefectClient, spec: HostSpec, flow_run_id: UUID, deployment_name: str) -> FlowRun:
    assert spec.agent is not None
    started = time.monotonic()
    run: FlowRun | None = None  # as last read
    look: InFlight[FlowRun] | None = None  # the look not answered yet: waited on again rather than sending another
    silent: str | None = None  # why the last look got no word on the run; None once one did
    busy = False  # the server answered that last look, but busy: it is no silence
    server_errors = 0  # 500 answers since the last word on the run
    silent_since = started
    said_silent = False  # the silence was said (SILENCE_SAID_S): its end is said too
    what = f"{deployment_name} run {flow_run_id}"
    while True:
        try:
            if look is None:
                look = InFlight(partial(client.read_flow_run, flow_run_id))
            answer = look.answer(POLL_TIMEOUT_S, stoppable=True)
            look = None
            run = answer
        except Exception as exc:
            if not isinstance(exc, NoAnswer):
                look = None  # answered: the next look is a new request
            status = status_of(exc)
            server_errors += status == 500
            if not isinstance(exc, server_unreachable()) and status not in BUSY_STATUSES and not (
                    status == 500 and server_errors < SERVER_ERRORS_WAITED):  # its answer: no run to follow
                ended, not_cancelled = give_up(client, flow_run_id, f"the controller could not read it: "
                                                                     f"{error_line(exc)}")
                if ended is not None:
                    return ended
                raise InfrastructureFailure(f"host {spec.name}: the Prefect server's answer to a look at {what} was "
                                            f"{error_line(exc)}{not_cancelled}") from None
            if silent is None:
                silent_since = time.monotonic()
            silent, busy = no_answer(exc), status is not None
        else:
            if said_silent:
                round_logger().info("host %s: the Prefect server answers again after %.0f s; %s is %s", spec.name,
                                    time.monotonic() - silent_since, what,
                                    run.state.name if run.state is not None else "without a state")
            silent, said_silent, server_errors = None, False, 0
        waiting = run is None or run.state is None or run.state.is_scheduled() or run.state.is_pending()
        if run is not None and run.state is not None and run.state.is_final():  # read by the last look
            return run
        if stop_requested():
            raise RoundsStopped(f"the run is stopping: host {spec.name}'s {deployment_name} run is cancelled")
        now = time.monotonic()
        silence = "has answered only busy" if busy else "has not answered"
        if silent is not None and not said_silent and now - silent_since >= SILENCE_SAID_S:
            round_logger().warning("host %s: the Prefect server %s for %.0f s (%s); the controller looks at %s again, "
                                   "one request at a time, each waited for %.0f s at most and %.0f s after the last, "
                                   "until agent.%s = %.0f s", spec.name, silence, now - silent_since, silent, what,
                                   POLL_TIMEOUT_S, AGENT_POLL_S,
                                   *(("start_timeout_s", spec.agent.start_timeout_s) if waiting
                                     else ("timeout_s", spec.agent.timeout_s)))
            said_silent = True
        unanswered = (f"; the Prefect server {silence} for {now - silent_since:.0f} s ({silent})"
                      if silent is not None else "")
        if waiting and now - started > spec.agent.start_timeout_s:
            ended, not_cancelled = give_up(client, flow_run_id, "no worker picked it up")
            if ended is not None:  # picked up and ended since the last look
                return ended
            raise InfrastructureFailure(
                f"host {spec.name}: no worker on work queue {spec.queue} picked up {deployment_name} within "
                f"{spec.agent.start_timeout_s:.0f} s{unanswered}{not_cancelled} (start one on the host: prefect "
                f"worker start --pool flagperf --work-queue {spec.queue})")
        if now - started > spec.agent.timeout_s:
            ended, not_cancelled = give_up(client, flow_run_id, "agent.timeout_s exceeded")
            if ended is not None:
                return ended
            raise InfrastructureFailure(f"host {spec.name}: {deployment_name} run {run.name if run else flow_run_id} "
                                        f"did not end within agent.timeout_s = {spec.agent.timeout_s:.0f} s"
                                        f"{unanswered}{not_cancelled}")
        time.sleep(AGENT_POLL_S)


def give_up(client: SyncPrefectClient, flow_run_id: UUID, why: str) -> tuple[FlowRun | None, str]:
    """Cancel a dispatched run the wait gives up on, so that it cannot start or go on later (settle_dispatched, within
    CANCEL_DEADLINE_S whatever the client does): the run where it had ended meanwhile (left as it ended), and where the
    server does not take the cancel, what to add to the host's failure line (the run may still start or run there),
    else ''."""
    try:
        return answered_within(partial(settle_dispatched, client, flow_run_id, why), CANCEL_DEADLINE_S), ""
    except Exception as exc:
        return None, (f"; it could not be cancelled ({no_answer(exc)}) and may still start or run there: cancel it "
                      f"with prefect flow-run cancel {flow_run_id}")


def completed_round(run_dir: Path, case: str, round_no: int, host: str, node_rank: int = 0) -> RoundResult | None:
    """A round an earlier attempt of this flow run finished (success or unsupported), else None."""
    folder = round_dir(run_dir, case, round_no, host, node_rank)
    try:
        result = read_result(folder / RESULT_FILE)
    except (OSError, ValueError):
        return None
    return result if result.status in ("success", "unsupported") else None


def earlier_outcome(folder: Path) -> str:
    """What an earlier attempt left of a round, in a few words: its status and why (cut at 200 characters)."""
    try:
        result = read_result(folder / RESULT_FILE)
    except (OSError, ValueError):
        return "no result"
    why = result.failure.message if result.failure is not None else ""
    return f"{result.status}: {why[:200]}" if why else result.status


def set_aside(run_dir: Path, folder: Path) -> Path | None:
    """Move a round's folder to retries/attempt<K>/ (kept, not overwritten), so that the round can run again
    in FlagPerf's layout. Returns where it went, None when there was nothing to move."""
    if not folder.exists():
        return None
    attempt = 1
    while (aside := run_dir / RETRIES_DIR / f"attempt{attempt}" / folder.relative_to(run_dir)).exists():
        attempt += 1
    aside.parent.mkdir(parents=True, exist_ok=True)
    folder.replace(aside)
    return aside


def describe_invocation() -> str:
    """How this run was started, for provenance: the deployment and flow run, or the command line."""
    if deployment.get_id():
        return (f"deployment {deployment.get_name() or deployment.get_id()}, flow run {flow_run.get_name()} "
                f"({flow_run.get_id()}), parameters {json.dumps(flow_run.get_parameters(), default=str)}")
    return shlex.join(sys.argv)
