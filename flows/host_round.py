"""One host's part of one case round, as its own flow:

    start monitors -> run case (retried on infrastructure failures) -> stop monitors (always) -> collect

The evaluation calls it as a subflow for hosts it drives over SSH (or locally), and dispatches it with
run_deployment to the `host-round` deployment on the host's own work queue for hosts that run a worker:
the same tasks either way, nested under the evaluation in the UI.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from prefect import Flow, flow, get_run_logger
from prefect.exceptions import MissingContextError
from prefect.states import Completed, Failed, State
from prefect.utilities.callables import parameter_schema

from flagperf.config.job import JOB_FILE, Job
from flagperf.config.plan import CasePlan, RunPlan, read_plan
from flagperf.config.vendors import Vendor
from flagperf.errors import InfrastructureFailure, RoundUserFailure
from flagperf.hosts.fleet import open_host, runtime_for
from flagperf.hosts.health import HealthReport, round_probe
from flagperf.hosts.inventory import HostSpec, host_spec
from flagperf.hosts.local import Host
from flagperf.hosts.threads import RoundsStopped, stop_requested
from flagperf.results.prompt_positions import (
    CONTROLLER_ENDED_FILE,
    RUN_POSITIONS_DIR,
    WORKED_OUT,
    Reservation,
    SeenReach,
    close,
    close_passed,
    keep_reach,
    merged,
    positions_taken,
    recover,
    reservations,
    reserve,
    taken_end,
)
from flagperf.results.provenance import library_versions
from flagperf.results.schema import (
    RESULT_FILE,
    RESULTS_UNWRITABLE,
    Failure,
    RoundResult,
    round_dir,
    write_result,
)
from flagperf.results.summary import RETRIES_DIR
from flows.logs import route_core_logs
from tasks.collect import collect_logs, leftover_result, remove_ended_markers, stage_folder
from tasks.container import THEN, AttemptRecords, attempt_records, host_disk_full, run_case, stopped_state
from tasks.healthcheck import healthcheck
from tasks.image import build_image
from tasks.monitor import start_monitors, stop_monitors

route_core_logs()

CONTROLLER_LIBRARIES = ("prefect", "pandas")
# A monitor outlives the round's worst case by this much at most, whatever happens to the controller.
MONITOR_SLACK_S = 300
HIDDEN_PARAMETERS = ("probe",)  # taken from runs made before it was dropped, offered to no one


class RoundFlow(Flow[Any, State[dict[str, Any]]]):
    """host-round's flow. Its ``probe`` parameter is gone (the round reads the probe from the run folder), but a
    run made before keeps it among its stored parameters, and Prefect refuses a parameter the flow lacks
    (SignatureMismatchError) when the UI retries that run: the flow still takes it, and ignores it. Nothing else
    shows it: the deployment's form and schema are made without it (the signature Prefect reads for them leaves
    it out; the parameters are still checked against the function's own), and a run made now stores no ``probe``
    (None is left out), so the Parameters tab never shows it. A copy made by ``with_options`` is one too (Prefect's
    makes a plain Flow, which would offer ``probe`` again)."""

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        super().__init__(fn, *args, **kwargs)
        self._hide_parameters()

    def _hide_parameters(self) -> None:
        # eval_str: this module's annotations are strings (from __future__ import annotations), and the schema
        # Prefect makes from a signature of strings leaves those it cannot read untyped (host, image)
        signature = inspect.signature(self.fn, eval_str=True)
        # inspect.signature(flow) and so `prefect deploy`'s schema read this, not fn's (it stops the unwrapping)
        self.__signature__ = signature.replace(parameters=[
            p for name, p in signature.parameters.items() if name not in HIDDEN_PARAMETERS])
        self.parameters = parameter_schema(self)

    def with_options(self, *args: Any, **kwargs: Any) -> RoundFlow:
        made = super().with_options(*args, **kwargs)
        made.__class__ = type(self)  # Prefect's copy is a plain Flow: the same fields, this class's behaviour
        made._hide_parameters()
        return made

    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        serialized = super().serialize_parameters(parameters)
        if serialized.get("probe") is None:
            serialized.pop("probe", None)
        return serialized


@partial(RoundFlow, name="host-round", flow_run_name="{case}/round{round_no}@{host[name]}", log_prints=True,
         validate_parameters=True)
def host_round(run_dir: str, case: str, round_no: int, host: dict[str, Any], node_rank: int = 0,
               nnodes: int = 1, master_addr: str = "127.0.0.1", master_port: int | None = None,
               image: dict[str, Any] | None = None, monitor_interval_s: float = 1.0, command: str | None = None,
               on_host: bool = False, probe: Any = None) -> State[dict[str, Any]]:
    """Run node ``node_rank`` of ``case`` round ``round_no`` on ``host`` and collect it into ``run_dir``.

    on_host: this flow runs on the host itself (dispatched to its worker), so the host is local here and
    run_dir must be the shared results folder. Ends Failed when the round failed (so it shows red in the UI,
    and a retry of the evaluation runs it again), Cancelled when the evaluation's stop ended it, Completed
    otherwise; the round's result is the state's data and is in its result.json either way. What the
    healthcheck found on the host (its probe, which a failed round records) is read from the run folder, not
    passed: see round_probe.

    probe: deprecated and ignored (a run made before it was dropped still passes it when retried: RoundFlow).
    """
    spec = host_spec(host)  # the real values, when this process loaded them
    plan = read_plan(Path(run_dir))
    case_plan = next(c for c in plan.cases if c.name == case)
    try:
        target = open_host(spec, on_host=on_host)
        if image is None or on_host:  # dispatched: make sure the image exists on this host's engine
            image = build_image(target, spec, plan.vendor, plan.run_id, framework=(image or {}).get("framework"))
        host_probe = round_probe(Path(run_dir), spec.name, image.get("framework"))
        result = node_round(target, spec, plan, Path(run_dir), case_plan, round_no, image, host_probe,
                            monitor_interval_s, command, node_rank=node_rank, nnodes=nnodes, master_addr=master_addr,
                            master_port=master_port)
    except Exception as exc:  # the evaluation's stop: Cancelled (grey in the UI), not Failed (red)
        if isinstance(exc, RoundsStopped) or stop_requested():
            return stopped_state(exc, round_label(case, round_no, spec.name))
        raise
    return round_state(result)


def round_label(case: str, round_no: int, host: str) -> str:
    return f"{case} round {round_no} on {host}"


def round_outcome(result: RoundResult) -> str:
    """"CASE round N on HOST: why", one line, the label said once (the failure messages of the case task
    already start with it)."""
    label = round_label(result.case, result.round, result.host)
    why = " ".join((result.failure.message if result.failure else result.status).split())
    return f"{label}: {why.removeprefix(label).removeprefix(':').strip() or result.status}"


def round_state(result: RoundResult) -> State[dict[str, Any]]:
    """The final state of a host-round: Failed for a failed round (an unsupported one is a result)."""
    data = result.model_dump(mode="json")
    if result.status == "failed":
        return Failed(message=round_outcome(result), data=data)
    return Completed(message=result.status, data=data)


@flow(name="host-healthcheck", flow_run_name="healthcheck@{host[name]}", log_prints=True)
def host_healthcheck(host: dict[str, Any], vendor: dict[str, Any], run_dir: str, on_host: bool = False,
                     cases: list[str] | None = None) -> bool:
    """The healthcheck of one host, run on the host's worker; the report lands in the (shared) run folder.
    ``cases``: the run's case folders."""
    spec = host_spec(host)  # the real values, when this process loaded them
    report: HealthReport = healthcheck(open_host(spec, on_host=on_host), spec, Vendor.model_validate(vendor),
                                       Path(run_dir), cases or [])
    return report.ok


def node_round(host: Host, spec: HostSpec, plan: RunPlan, run_dir: Path, case: CasePlan, round_no: int,
               image: dict[str, Any], probe: dict[str, Any] | None, monitor_interval_s: float, command: str | None,
               *, node_rank: int = 0, nnodes: int = 1, master_addr: str = "127.0.0.1", master_port: int | None = None
               ) -> RoundResult:
    """Whatever goes wrong in one round (a monitor that will not start, a host error, a failed collection)
    becomes that round's failed result; the other rounds and the analysis still run."""
    stage_dir = stage_folder(host.work_root, plan.run_id, case.name, round_no, host.name, node_rank)
    job = round_job(plan, run_dir, case, round_no, host.name, spec, image, command, node_rank=node_rank,
                    nnodes=nnodes, master_addr=master_addr, master_port=master_port,
                    monitor_interval_s=monitor_interval_s if plan.vendor.manifest.monitors else None)
    monitor_budget = case.timeout_s * (case.max_retries + 1) + MONITOR_SLACK_S
    label = f"{case.name}/round{round_no}@{host.name}" + (f"#node{node_rank}" if nnodes > 1 else "")
    monitors: list[Any] = []
    failure: Failure | None = None
    # The reservation of an earlier flow run's attempt at this round whose folder is still on the host: that folder's
    # records stand for it once they are in the run folder.
    earlier = own_reservation(job, host.name, node_rank)
    reserved: Reservation | None = None
    try:
        if host.exists(stage_dir):
            leftover = leftover_result(host, stage_dir, case.max_retries + 1)
            if leftover is not None:  # measured by an earlier attempt of this flow run, never stored: collect it
                round_logger().info("%s: collecting the round an earlier attempt measured (%s) from %s", label,
                                    leftover.status, stage_dir)
                keep_round_reach(host, stage_dir, run_dir, earlier, label)
                result, collected = _collect(host, stage_dir, run_dir, case, round_no, node_rank, job, None, probe,
                                             label)
                if collected:
                    after_collection(host, stage_dir, run_dir, case, round_no, node_rank, earlier, label)
                return result
            job = cleared_stage(host, stage_dir, job, run_dir, earlier)
        if at_endpoint(case):  # written before the round is sent, so that a retry knows of it whatever happens
            try:
                reserved = reserve(run_dir, round_reservation(job, case.max_retries + 1))
            except OSError as exc:
                raise RunFolderRefused(exc) from exc
    except RunFolderRefused as refused:  # nothing is sent that a retry could not know of
        failure = Failure(kind="infrastructure", message=(
            f"{round_label(case.name, round_no, host.name)}: {RESULTS_UNWRITABLE} ({run_dir / RUN_POSITIONS_DIR}: "
            f"{refused}): the round's prompt positions at its endpoint could not be recorded, so it was not run"))
        round_logger().error("%s", failure.message)
        return _stored(job.failed_result(failure, probe), round_dir(run_dir, case.name, round_no, host.name,
                                                                     node_rank), label)
    except HalfRoundKept as kept:
        failure = Failure(kind="infrastructure", message=f"{round_label(case.name, round_no, host.name)}: {kept}",
                          kept_at=kept.where)
        round_logger().error("%s", failure.message)
        return _stored(job.failed_result(failure, probe), round_dir(run_dir, case.name, round_no, host.name,
                                                                     node_rank), label)
    try:
        runtime = runtime_for(host, spec, plan.vendor, image, plan.run_id, plan.case_folders)
        monitors = start_monitors(host, plan.vendor, stage_dir, monitor_interval_s, monitor_budget, label)
        state = run_case.with_options(retries=case.max_retries)(
            host, runtime, job, stage_dir, case.timeout_s, return_state=True)
        outcome = state.result(raise_on_failure=False)
        if isinstance(outcome, RoundsStopped):  # interrupted, not failed: no result, the report says stopped
            raise outcome
        failure = failure_of(outcome)
        if failure is not None and stop_requested():  # an SSH channel the interrupt closed: stopped, not failed
            raise RoundsStopped(f"{label}: stopped ({failure.message})") from outcome
    except RoundsStopped:
        raise
    except Exception as exc:
        if stop_requested():  # what the interrupt broke under it (a closed channel) is no failure of the round
            raise RoundsStopped(f"{label}: stopped ({type(exc).__name__}: {exc})") from exc
        failure = Failure(kind="infrastructure", message=f"{round_label(case.name, round_no, host.name)}: "
                                                         f"{type(exc).__name__}: {exc}")
        get_run_logger().error("%s", failure.message)
    finally:
        if monitors:
            stop_monitors(host, monitors, stage_dir, label, return_state=True)
        # Also when interrupted: what its attempts recorded before they sent says where its prompts lie, which a later
        # round whose host lacks this one's files could not work out. What an attempt took counts only where its
        # runtime saw its case process end (the controller's ended marker); else its bound does (it may still be
        # sending).
        keep_round_reach(host, stage_dir, run_dir, reserved, label)
    if failure is not None and failure.kind == "infrastructure":
        full = host_disk_full(host, stage_dir)
        if full:  # the cause, before what the case could still say of it (often a traceback's end)
            failure = failure.model_copy(update={
                "message": f"{round_label(case.name, round_no, host.name)}: {full}{THEN}{failure.message}"})
            get_run_logger().error("%s: %s", label, full)
    result, collected = _collect(host, stage_dir, run_dir, case, round_no, node_rank, job, failure, probe, label)
    if collected:
        after_collection(host, stage_dir, run_dir, case, round_no, node_rank, reserved, label)
    return result


def round_logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    """The flow run's logger; the module's where there is no run (a round's steps called alone)."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


class RunFolderRefused(Exception):
    """The run folder refused a record of prompt positions (full, read-only): the round is not sent."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error.strerror or str(error) or type(error).__name__)


class HalfRoundKept(Exception):
    """A half round on the host whose attempts' prompt positions could not all be read, and that no open reservation
    bounds: kept there, and the round not run (it could resend their prompts). ``where``: HOST:FOLDER (its round's
    Failure.kept_at)."""

    def __init__(self, message: str, where: str) -> None:
        super().__init__(message)
        self.where = where


def at_endpoint(case: CasePlan) -> bool:
    """A case that loads a running endpoint (its prompts must never reach the endpoint twice in the run)."""
    return case.family == "generate" and isinstance(case.config.get("endpoint"), dict)


def round_reservation(job: Job, attempts: int) -> Reservation:
    """The reservation of the round ``job`` runs (its ``attempts`` at most): its case and configuration, and what
    decides where it starts (the job's prompt positions, and the open reservations it starts after)."""
    after = [r for r in job.prompt_reservations if r.open]
    return Reservation(case=job.case, round=job.round, host=job.host, node_rank=job.node_rank, attempts=attempts,
                       config=job.config, positions=job.prompt_positions, after=[r.id for r in after],
                       seen={r.id: SeenReach(stream=r.reach.stream, upto=r.reach.upto) if r.reach is not None
                             else WORKED_OUT for r in after})


def own_reservation(job: Job, host: str, node_rank: int) -> Reservation | None:
    """The newest open reservation of this very round among the job's: the one its folder on the host, if any,
    belongs to (the flow run that made a newer one would have cleared or collected that folder before making it)."""
    own = [r for r in job.prompt_reservations if r.open and r.same_round(job.case, job.round, host, node_rank)]
    return own[-1] if own else None


def _close_if_stored(host: Host, stage_dir: Path, run_dir: Path, case: str, round_no: int, node_rank: int,
                     reservation: Reservation | None) -> None:
    """The round's reservation is closed once its folder, with its records of prompt positions, is stored in the run
    folder and gone from the host, and every attempt in it has the controller's CONTROLLER_ENDED_FILE (collection brings
    it in; one a case wrote is removed); called only where its collection
    completed (a collection that failed, or found no folder on a lost host, keeps the reservation open: the round's
    records are not in the run folder). An attempt whose end its runtime did not see may still be sending past what its
    stored record says: the reservation stays open (its kept reach holds later rounds back) until the run's records
    pass its bound (close_passed)."""
    if reservation is None:
        return
    dest = round_dir(run_dir, case, round_no, host.name, node_rank)
    try:  # the host's folder (its job file with it), not only a result the controller wrote for a round it lost
        stored = (dest / RESULT_FILE).is_file() and (dest / JOB_FILE).is_file() and not host.exists(stage_dir)
        ended = (dest / CONTROLLER_ENDED_FILE).is_file() and all((earlier / CONTROLLER_ENDED_FILE).is_file()
                                                                  for earlier in dest.glob("attempts/attempt*"))
    except Exception:  # a host that cannot say: the reservation stays (later rounds only start further on)
        return
    if stored and ended:
        with contextlib.suppress(OSError):
            close(run_dir, reservation)


def after_collection(host: Host, stage_dir: Path, run_dir: Path, case: CasePlan, round_no: int, node_rank: int,
                     reservation: Reservation | None, label: str) -> None:
    """Once a round's collection completed: its reservation is closed (where its folder is stored), and so is every
    open reservation whose reach, kept by the controller beside it, lies within what the run folder's records now say
    was taken on its stream (``close_passed``; never on a reach the round's case wrote in its serving.json)."""
    _close_if_stored(host, stage_dir, run_dir, case.name, round_no, node_rank, reservation)
    if not at_endpoint(case):
        return
    try:
        closed = close_passed(run_dir)
    except OSError as exc:  # they stay open: later rounds only work them out again
        round_logger().warning("%s: the open reservations of prompt positions were not looked at: %s", label,
                               exc.strerror or exc)
        return
    if closed:
        round_logger().info("%s: closed %d reservation(s) of rounds never collected, which the run's records now "
                            "pass: %s", label, len(closed), ", ".join(r.where for r in closed))


def keep_round_reach(host: Host, stage_dir: Path, run_dir: Path, reservation: Reservation | None, label: str) -> None:
    """Keep the reach of ``reservation``'s round beside it (its attempts' records on the host: their stream and bound,
    and what those whose runtime saw them end took), where every attempt's record there is read; best effort (a host
    gone, a full results folder): without it, later rounds work the reach out from the round's configuration, where
    their host can."""
    if reservation is None:
        return
    try:
        found = attempt_records(host, stage_dir)
        reach = found.reach() if found.complete else None
        if reach is not None:
            keep_reach(run_dir, reservation, reach)
    except Exception as exc:
        round_logger().warning("%s: where its prompts lie is not kept beside its reservation (%s): %s", label,
                               reservation.where, " ".join(str(exc).split())[:200])


def _stored(result: RoundResult, dest: Path, label: str) -> RoundResult:
    """A result written to the round's folder, if the results folder takes it."""
    try:
        if not (dest / RESULT_FILE).exists():
            write_result(dest / RESULT_FILE, result)
    except OSError as exc:
        round_logger().error("%s: cannot write %s: %s", label, dest / RESULT_FILE, exc.strerror or exc)
    return result


def round_job(plan: RunPlan, run_dir: Path, case: CasePlan, round_no: int, host: str, spec: HostSpec,
              image: dict[str, Any], command: str | None, *, node_rank: int = 0, nnodes: int = 1,
              master_addr: str = "127.0.0.1", master_port: int | None = None, monitor_interval_s: float | None = None
              ) -> Job:
    """The round's job, with what the run folder says of the run so far: the attempts earlier flow runs made of this
    round (a retry of the run runs it again), and where the prompt streams at endpoints stand (an endpoint's prefix
    cache keeps every prompt the run's earlier rounds and attempts sent it: flagperf.results.prompt_positions).
    ``monitor_interval_s``: the round's monitors' sampling interval, which a case may size a loop by (operation's
    energy_intervals)."""
    return Job(run_id=plan.run_id, case=case.name, family=case.family, round=round_no, host=host,
               node_rank=node_rank, nnodes=nnodes, master_addr=master_addr, master_port=master_port,
               monitor_interval_s=monitor_interval_s, vendor=plan.vendor.name, config=case.config,
               config_origins=case.origins, run_overrides=case.run_overrides, command=command, image=image,
               controller_libraries=library_versions(CONTROLLER_LIBRARIES), spec_settings=spec.host_spec_settings(),
               run_cases=plan.case_folders, earlier_attempts=earlier_attempts(run_dir, case.name, round_no, host,
                                                                               node_rank),
               prompt_positions=positions_taken(run_dir) if at_endpoint(case) else {},
               prompt_reservations=reservations(run_dir) if at_endpoint(case) else [])


def cleared_stage(host: Host, stage_dir: Path, job: Job, run_dir: Path | None = None,
                  reservation: Reservation | None = None) -> Job:
    """A half round an interrupted attempt of this flow run left on the host (no result to collect), removed (attempt
    folders would mix); returns ``job`` with the prompt positions its attempts (every ``attempt<N>`` folder there)
    took at endpoints (their prompt_positions.json), which the endpoint's prefix cache may hold though the run folder
    never got them. Those records are kept in ``run_dir`` first (prompt_positions/recovered-*.json), durably, with the
    round's reach beside its ``reservation``; the reservation is then closed where every attempt's record was read and
    every attempt's runtime saw it end (the controller's ended marker: its records say what it took). Else it stays open
    (a later round
    starts after the most its round may have taken), and where a record was not read the folder is removed only where
    it bounds every attempt found there; else the folder stays and the round is not run (HalfRoundKept)."""
    found = attempt_records(host, stage_dir)
    job = job.model_copy(update={"prompt_positions": merged(job.prompt_positions, found.records)})
    if run_dir is not None:
        try:
            recover(run_dir, [text for _, text in found.records if taken_end(text) is not None])
            if reservation is not None and found.complete:
                reach = found.reach()
                if reach is not None:
                    keep_reach(run_dir, reservation, reach)
                if found.all_ended:  # else one may still be sending: its kept reach holds later rounds back
                    close(run_dir, reservation)
        except OSError as exc:  # a full results folder: the reservation, and the folder on the host, stay
            raise RunFolderRefused(exc) from exc
        if not found.complete and not bounds_every_attempt(reservation, found):
            raise HalfRoundKept(
                f"the half round an interrupted attempt left in {host.name}:{stage_dir} has attempts whose prompt "
                f"positions could not be read ({', '.join(found.unread)}), and no open reservation bounds them: it "
                "is kept there and the round is not run, so that the endpoint is not sent their prompts again; look "
                "at it, remove it, then retry the run", f"{host.name}:{stage_dir}")
        job = job.model_copy(update={"prompt_reservations": reservations(run_dir)})
    host.remove_tree(stage_dir)
    remove_ended_markers(host, stage_dir)  # its attempts' ends, read above: none is a rerun's
    return job


def secure_half_round(host: Host, stage_dir: Path, run_dir: Path, case: str, round_no: int, node_rank: int
                      ) -> str | None:
    """Before the run's clean-up removes a half round from the host (a round interrupted before it was collected:
    Ctrl-C, a crashed subflow), its records go into the run folder: its attempts' prompt_positions.json
    (prompt_positions/recovered-*.json) and, where none is kept yet, its reach beside its open reservation (what an
    attempt took only where its runtime saw it end, by the controller's ended marker; the attempt that was interrupted
    has none: its case process may still be stopping, so its bound counts). Returns why the folder must stay instead
    (its records could not be kept, or not all read and no open reservation bounds them), None where it may go."""
    found = attempt_records(host, stage_dir)
    if not found.attempts and not found.skipped:  # no attempt began: nothing was sent
        return None
    own = [r for r in reservations(run_dir) if r.open and r.same_round(case, round_no, host.name, node_rank)]
    reservation = own[-1] if own else None
    try:
        recover(run_dir, [text for _, text in found.records if taken_end(text) is not None])
        if reservation is not None and reservation.reach is None and found.complete:
            reach = found.reach()
            if reach is not None:
                keep_reach(run_dir, reservation, reach)
    except OSError as exc:
        return f"its prompt positions could not be kept in {run_dir / RUN_POSITIONS_DIR}: {exc.strerror or exc}"
    if not found.complete and not bounds_every_attempt(reservation, found):
        return (f"its attempts' prompt positions could not all be read ({', '.join(found.unread)}) and no open "
                "reservation bounds them")
    return None


def bounds_every_attempt(reservation: Reservation | None, found: AttemptRecords) -> bool:
    """``reservation`` (open) covers every attempt found in the round's folder: a later round starts after the most
    its attempts may have taken, so the folder may go though a record in it could not be read."""
    return reservation is not None and bool(found.attempts) and max(found.attempts) <= reservation.attempts


def earlier_attempts(run_dir: Path, case: str, round_no: int, host: str, node_rank: int) -> int:
    """The attempts of a round that earlier flow runs of the run made: each one's round folder set aside under
    retries/attempt<K>/ (flows.evaluate.set_aside) holds its last attempt, and its earlier ones under attempts/."""
    own = round_dir(run_dir, case, round_no, host, node_rank).relative_to(run_dir)
    asides = [attempt / own for attempt in (run_dir / RETRIES_DIR).glob("attempt*")]  # names never read as patterns
    return sum(1 + len(list(aside.glob("attempts/attempt*"))) for aside in asides if aside.is_dir())


def _collect(host: Host, stage_dir: Path, run_dir: Path, case: CasePlan, round_no: int, node_rank: int, job: Job,
             failure: Failure | None, probe: dict[str, Any] | None, label: str) -> tuple[RoundResult, bool]:
    """The round's result, and whether its collection completed (a failed one, such as a lost host's folder that
    cannot be found, still gives the round a result saying so)."""
    dest = round_dir(run_dir, case.name, round_no, host.name, node_rank)
    collected = collect_logs(host, stage_dir, dest, job, failure, probe, return_state=True)
    if collected.is_completed():
        return collected.result(), True
    # Even the collection failed: the round still gets a result saying so (on disk if the disk takes it).
    message = f"{round_label(case.name, round_no, host.name)}: collecting the round's files failed: {collected.message}"
    return _stored(job.failed_result(Failure(kind="infrastructure", message=message), probe), dest, label), False


def failure_of(outcome: object) -> Failure | None:
    if not isinstance(outcome, BaseException):
        return None
    kind = "user" if isinstance(outcome, RoundUserFailure) else "infrastructure"
    if isinstance(outcome, (RoundUserFailure, InfrastructureFailure)):
        return Failure(kind=kind, message=str(outcome))
    return Failure(kind=kind, message=f"{type(outcome).__name__}: {outcome}")
