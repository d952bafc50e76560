"""The in-host (later in-container) entry for one case round: base spec, training, inference, generate or
operation.

    python -m flagperf.entry --job DIR/job.json

Writes DIR/result.json and exits 0 (success), 3 (unsupported) or 2 (user error). A crash exits
otherwise and writes no result: the controller records it as an infrastructure failure and retries.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import psutil
import torch
from pydantic import ValidationError

from flagperf.config.adaptation import load_hooks, read_adaptation
from flagperf.config.cases import CaseDef, load_case
from flagperf.config.job import JOB_FILE, Job
from flagperf.config.models import CASE_FOLDER, pydantic_error_to_config_error
from flagperf.config.vendors import Vendor, load_vendor
from flagperf.errors import (
    EXIT_OK,
    EXIT_UNSUPPORTED,
    EXIT_USER_ERROR,
    CaseUserError,
    ConfigError,
    Unsupported,
    missing_extra,
)
from flagperf.hosts.adaptation import Applied, apply_adaptation, cache_root
from flagperf.hosts.local import PARENT_PID_ENV, default_work_root
from flagperf.inference.config import InferenceConfig
from flagperf.measure.casekit import CaseConfig, CaseContext, EveryDevice, TimedCaseConfig
from flagperf.measure.fanout import DeviceSlot, device_spread, enter_device, host_devices, narrow_environment
from flagperf.measure.hostmemory import host_allocator, keep_freed_host_memory
from flagperf.measure.perflog import parse_file
from flagperf.measure.timing import TimingPlan
from flagperf.results.prompt_positions import Reservation
from flagperf.results.provenance import engine_info, host_info, library_versions
from flagperf.results.schema import (
    RESULT_FILE,
    CaseLogFormatter,
    Convergence,
    DeviceRun,
    DeviceSpread,
    Failure,
    InferenceReport,
    Metric,
    OperationReport,
    Provenance,
    RoundResult,
    SpecTable,
    write_result,
)
from flagperf.training.driver import TrainingConfig
from flagperf.training.launch import (
    EXIT_WORKER_FAILED,
    launch,
    rank_log,
    training_result,
    user_error,
    with_teardown_note,
)

if TYPE_CHECKING:  # a run-time import would need transformers (the generate extra) for every round
    from flagperf.generate.config import GenerateConfig

log = logging.getLogger("flagperf.case")

EXIT_ORPHANED = 75  # the controller went away mid-round (an infrastructure failure)
EXIT_OVERRAN = 76  # the case outlived its own timeout with nobody stopping it (an infrastructure failure)


@dataclass
class Outcome:
    """What one family's runner measured; status and failure are decided by run_job."""

    metrics: list[Metric] = field(default_factory=list)
    measured: float = 0.0
    convergence: Convergence | None = None
    failure: Failure | None = None  # an incomplete run that still has something to say
    exit_code: int = EXIT_OK
    inference: InferenceReport | None = None
    operation: OperationReport | None = None
    devices: list[DeviceRun] = field(default_factory=list)
    spread: list[DeviceSpread] = field(default_factory=list)
    device: str | None = None


def run_base(case: CaseDef, config: CaseConfig, vendor: Vendor, spec: SpecTable, job: Job, out_dir: Path
             ) -> Outcome:
    timing = config.timing if isinstance(config, TimedCaseConfig) else TimingPlan(0, 1.0, 1)
    ctx = CaseContext(vendor.manifest.torch_device, spec, timing, log,
                      shares_host_memory=vendor.manifest.shares_host_memory, job=job, out_dir=out_dir,
                      vendor_folder=vendor.folder)
    try:
        metrics = case.module.run(config, ctx)
    except RuntimeError as exc:
        classified = classify_runtime_error(exc)
        if classified is exc:
            raise
        raise classified from exc
    if not metrics:
        raise CaseUserError(f"case {case.name} returned no metrics")
    return Outcome(metrics=metrics, measured=ctx.measured_seconds)


def run_training(job: Job, config: TrainingConfig, out_dir: Path) -> Outcome:
    node = launch(job, out_dir, config.nnodes, config.nproc_per_node, job.master_port or config.master_port)
    code = node.code
    if code == EXIT_USER_ERROR:
        message = user_error(out_dir) or "a training process rejected its input"
        return Outcome(failure=Failure(kind="user", message=message), exit_code=EXIT_USER_ERROR)
    metrics, convergence, problem = training_result(out_dir, first_rank=job.node_rank * config.nproc_per_node)
    if code != EXIT_OK or problem:
        # Crashed or incomplete: the result says where it stopped, and the controller retries.
        message = node.failure or problem or f"a training process exited {code}"
        return Outcome(failure=Failure(kind="infrastructure", message=message),
                       exit_code=code if code != EXIT_OK else EXIT_WORKER_FAILED)
    metrics[0] = with_teardown_note(metrics[0], node.teardown_faults)  # training_throughput
    measured = next((m.measured_seconds for m in metrics if m.name == "training_throughput"), 0.0)
    return Outcome(metrics=metrics, measured=measured, convergence=convergence)


def hooks_called(out_dir: Path, first_rank: int) -> list[str]:
    """The extern hooks the node's first training process called (its FINISHED event says)."""
    path = rank_log(out_dir, first_rank)
    finished = parse_file(path).finished().get(first_rank, {}) if path.is_file() else {}
    return list((finished.get("extra") or {}).get("vendor_hooks") or [])


def run_inference(job: Job, case: CaseDef, config: InferenceConfig, vendor: Vendor, spec: SpecTable,
                  out_dir: Path, hooks_called: list[str] | None = None) -> Outcome:
    """The seven steps (flagperf.inference), as Prefect subflows when the job carries a Prefect context;
    hooks_called collects the vendor's extern hooks as they are first called."""
    from flagperf.inference.pipeline import InferenceRun
    from flagperf.inference.subflows import run_inference_steps

    device = torch.device(vendor.manifest.torch_device)
    # Exported models and engines stay on this host, outside the round folder that is copied into the
    # results (a Llama-7B ONNX file is 27 GB); result.json records where they are, for exist_*_path reuse.
    artifacts = default_work_root() / "inference-artifacts" / job.run_id / job.case / f"round{job.round}"
    hooks = load_hooks(read_adaptation(case.folder, case.name, case.family, vendor.name, vendor.folder))
    run = InferenceRun(case_name=case.name, module=hooked_module(case.module, hooks, hooks_called), config=config,
                       vendor=vendor.name, spec=spec, device=device,
                       shares_host_memory=vendor.manifest.shares_host_memory, out_dir=out_dir,
                       artifact_dir=artifacts / f"attempt{job.attempt}", origins=job.config_origins)
    try:
        run_inference_steps(run, job.prefect_context)
    except RuntimeError as exc:
        classified = classify_runtime_error(exc)
        if classified is exc:
            raise
        raise classified from exc
    measured = sum(m.measured_seconds for m in run.metrics if m.name.endswith("_core"))
    return Outcome(metrics=run.metrics, measured=measured, inference=run.report)


def hooked_module(module: ModuleType, hooks: dict[str, Any], called: list[str] | None = None) -> ModuleType:
    """The case's module with the vendor's extern hooks around its forward functions (each hook gets the
    standard function first); the module itself when there are none. ``called`` collects each hook's name at
    its first call, so the round's record says which hooks ran, not only which the file defines."""
    if not hooks:
        return module
    hooked = ModuleType(module.__name__, module.__doc__)
    hooked.__dict__.update({k: v for k, v in module.__dict__.items() if k not in ("__name__", "__doc__")})
    for name, hook in hooks.items():
        setattr(hooked, name, _counted(name, functools.partial(hook, getattr(module, name)), called))
    return hooked


def _counted(name: str, function: Callable[..., Any], called: list[str] | None) -> Callable[..., Any]:
    if called is None:
        return function

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        if name not in called:
            called.append(name)
        return function(*args, **kwargs)

    return call


def run_generate(config: GenerateConfig, vendor: Vendor, spec: SpecTable, out_dir: Path, round_number: int = 1,
                 attempt: int = 1, positions: dict[str, int] | None = None, earlier_attempts: int = 0,
                 reservations: Sequence[Reservation] = ()) -> Outcome:
    """LLM serving (flagperf.generate): every point of the case (a batch engine's concurrency levels, or a
    server's concurrency levels and request rates), timed per token; at an endpoint the prompts start at
    ``positions`` (the Job's prompt_positions), after every prompt the run's earlier rounds and attempts sent there,
    and after what the ``reservations`` (the Job's prompt_reservations) of rounds never collected may have sent."""
    from flagperf.generate.driver import run_generate as drive

    device = torch.device(vendor.manifest.torch_device)
    try:
        result = drive(config, vendor.name, spec, device, out_dir, round_number, attempt, positions, earlier_attempts,
                       reservations)
    except RuntimeError as exc:
        classified = classify_runtime_error(exc)
        if classified is exc:
            raise
        raise classified from exc
    if result.failure is not None:  # the finished points are kept either way
        from flagperf.generate.server import EXIT_SERVER_FAILED

        # A server that died under load is retried; a point whose every request failed while the server stayed
        # up (refused fields, a timeout too short for the load) would fail the same way again: not retried.
        return Outcome(metrics=result.metrics, measured=result.measured_seconds, failure=result.failure,
                       exit_code=EXIT_USER_ERROR if result.failure.kind == "user" else EXIT_SERVER_FAILED)
    return Outcome(metrics=result.metrics, measured=result.measured_seconds)


def run_operation(config: CaseConfig, vendor: Vendor, spec: SpecTable, job: Job) -> Outcome:
    """Operators x dtypes x shapes (flagperf.operation), each implementation checked before it is timed; the job's
    monitor interval is the unit of the case's energy loop (energy_intervals)."""
    from flagperf.operation.driver import run_operation as drive

    result = drive(config, vendor.name, spec, torch.device(vendor.manifest.torch_device),  # type: ignore[arg-type]
                   job.monitor_interval_s, job.config_origins.get("energy_intervals", job.case))
    failure = Failure(kind="user", message=result.failure) if result.failure else None
    return Outcome(metrics=result.metrics, measured=result.measured_seconds, operation=result.report,
                   failure=failure, exit_code=EXIT_USER_ERROR if failure else EXIT_OK)


def every_device(config: object, vendor: Vendor, job: Job) -> list[DeviceSlot] | None:
    """The devices a base-spec round measures one process each; None: this process measures its one device."""
    if not isinstance(config, EveryDevice) or config.devices == "one" or job.nnodes > 1:
        return None
    slots = host_devices(vendor.manifest)
    return slots if len(slots) > 1 else None


DEVICE_DIR = "device{index}"  # a device's own folder in the round's: its result.json and files


def run_every_device(job: Job, job_file: Path, vendor: Vendor, slots: list[DeviceSlot], sequential: bool,
                     out_dir: Path) -> Outcome:
    """One process per device (this entry again, with --device-slot), all at once or one after another; each
    writes its result to its own folder; their figures are merged into this round's, device by device."""
    log.info("every device of the host: %d devices, %s (%s)", len(slots), "one after another" if sequential
             else "all at once", "; ".join(f"{s.index}: {s.label}" for s in slots))
    env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}
    running: list[tuple[DeviceSlot, subprocess.Popen[str], threading.Thread]] = []
    codes: dict[int, int] = {}

    def start(slot: DeviceSlot) -> None:
        folder = out_dir / DEVICE_DIR.format(index=slot.index)
        folder.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "flagperf.entry", "--job", str(job_file), "--out", str(folder),
                "--device-slot", json.dumps({"index": slot.index, "visible": slot.visible,
                                             "cpus": list(slot.cpus) if slot.cpus is not None else None})]
        proc = subprocess.Popen(argv, env=narrow_environment(vendor.manifest, slot, env), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace")

        def forward() -> None:  # the device's lines in this round's log, each saying which device
            assert proc.stdout is not None
            for line in proc.stdout:
                print(f"[device {slot.index}] {line.rstrip()}", flush=True)

        thread = threading.Thread(target=forward, name=f"device-{slot.index}", daemon=True)
        thread.start()
        running.append((slot, proc, thread))

    def wait(slot: DeviceSlot, proc: subprocess.Popen[str], thread: threading.Thread) -> None:
        codes[slot.index] = proc.wait()
        thread.join()

    for slot in slots:
        start(slot)
        if sequential:
            wait(*running[-1])
    if not sequential:
        for item in running:
            wait(*item)
    return merge_devices(slots, codes, out_dir)


def crash_code(code: int | None) -> int:
    """The round's exit code for a device process that crashed: its own, unless that would read as a result
    (0, unsupported, user error) or is a signal; then the worker-failed code (retried as a crash)."""
    return code if code is not None and code > 0 and code not in (EXIT_UNSUPPORTED, EXIT_USER_ERROR) \
        else EXIT_WORKER_FAILED


def merge_devices(slots: list[DeviceSlot], codes: dict[int, int], out_dir: Path) -> Outcome:
    """The round's outcome from its devices' results: every device's figures (tagged with its index), the
    host's min/median/max per metric, and a failure naming each device that did not measure."""
    outcome = Outcome()
    problems: list[tuple[int, Failure, int]] = []
    statuses = []
    for slot in slots:
        code = codes.get(slot.index)
        try:
            result = RoundResult.model_validate_json(
                (out_dir / DEVICE_DIR.format(index=slot.index) / RESULT_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            failure = Failure(kind="infrastructure", message=f"device {slot.index} ({slot.label}): exited {code} "
                                                             f"and left no {RESULT_FILE}")
            outcome.devices.append(DeviceRun(index=slot.index, visible=slot.visible or slot.label, status="failed",
                                             failure=failure, duration_s=0.0, measured_seconds=0.0))
            problems.append((slot.index, failure, crash_code(code)))
            statuses.append("failed")
            continue
        outcome.device = outcome.device or result.device
        outcome.metrics += [m.model_copy(update={"device": slot.index}) for m in result.metrics]
        outcome.measured += result.measured_seconds
        outcome.devices.append(DeviceRun(index=slot.index, visible=slot.visible or slot.label, device=result.device,
                                         status=result.status, failure=result.failure,
                                         duration_s=result.duration_s, measured_seconds=result.measured_seconds))
        statuses.append(result.status)
        if result.status == "failed" and result.failure:
            problems.append((slot.index, result.failure, crash_code(code)))
    outcome.spread = device_spread(outcome.metrics)
    for spread in outcome.spread:
        log.info("%s over %d devices: min %.6g (device %d), median %.6g, max %.6g %s", spread.metric,
                 spread.devices, spread.min, spread.min_device, spread.median, spread.max, spread.unit)
    if all(status == "unsupported" for status in statuses):
        first = next((d.failure for d in outcome.devices if d.failure), None)
        outcome.failure = first or Failure(kind="unsupported", message="unsupported on every device")
        outcome.exit_code = EXIT_UNSUPPORTED
    elif problems or any(status != "success" for status in statuses):
        odd = [d for d in outcome.devices if d.status != "success"]
        kind = "user" if problems and all(f.kind == "user" for _, f, _ in problems) else "infrastructure"
        message = f"{len(odd)} of {len(slots)} devices did not measure: " + "; ".join(
            f"device {d.index} {d.status}: {d.failure.message if d.failure else '?'}" for d in odd)
        outcome.failure = Failure(kind=kind, message=message)
        infra_codes = [c for _, f, c in problems if f.kind != "user"]
        outcome.exit_code = EXIT_USER_ERROR if kind == "user" else (infra_codes[0] if infra_codes
                                                                     else EXIT_WORKER_FAILED)
    return outcome


def run_job(job: Job, out_dir: Path, slot: DeviceSlot | None = None, job_file: Path | None = None) -> int:
    """slot: this process measures that one device of the host (started by a round that measures every
    device); job_file: where the job is, for those processes."""
    started = datetime.now(timezone.utc)
    startup_s = max(0.0, started.timestamp() - psutil.Process().create_time())
    outcome = Outcome()
    adapted: dict[str, Any] | None = None
    device: str | None = None
    status = "failed"
    allocator = host_allocator()  # set by main (a case process), not by a test session that calls run_job
    settings: dict[str, Any] = {}  # the spec settings the vendor's spec module read, and where each came from
    settings_origins: dict[str, str] = {}
    try:
        case = load_case(job.case)
        vendor = job.host_vendor()
        settings, settings_origins = vendor.spec_settings()
        config = case.config_model.model_validate(job.config, context={CASE_FOLDER: case.folder})
        slots = every_device(config, vendor, job) if slot is None else None
        if slots is not None:  # this process only starts and waits: the device processes measure
            assert isinstance(config, EveryDevice)
            log.info("case %s round %d on %s, attempt %d", job.case, job.round, job.host, job.attempt)
            job_file = job_file or out_dir / JOB_FILE
            if not job_file.exists():  # run_job called in-process (tests): the device processes read it there
                job_file.write_text(job.model_dump_json(), encoding="utf-8")
            outcome = run_every_device(job, job_file, vendor, slots, config.device_order == "sequential", out_dir)
            device = outcome.device
        else:
            spec = vendor.spec_table()
            device = spec.device
            on = f"{device}, device {slot.index}: {slot.label}" if slot is not None else device
            log.info("case %s round %d on %s (%s), attempt %d", job.case, job.round, job.host, on, job.attempt)
            log.info("host allocator: %s", allocator)
            adaptation = read_adaptation(case.folder, case.name, case.family, vendor.name, vendor.folder)
            if adaptation is not None:  # the vendor guide's adaptation points, applied before the case starts
                applied = Applied(adaptation)
                try:
                    apply_adaptation(adaptation, out_dir, cache_root(out_dir), image_id=job.image.get("image_id"),
                                     applied=applied)
                finally:  # recorded also when applying it fails: what was applied by then (secrets masked)
                    adapted = applied.record()
                log.info("vendor adaptation %s: env %s, installs %s, hooks %s", adapted["folder"],
                         sorted(applied.env) or "-", {k: v["status"] for k, v in applied.installs.items()} or "-",
                         list(adaptation.hooks) or "-")
                if case.family == "training":  # imported here first: a hook file that cannot load is the input's
                    load_hooks(adaptation)
            if isinstance(config, TrainingConfig):
                outcome = run_training(job, config, out_dir)
                if adapted is not None:
                    adapted["hooks_called"] = hooks_called(out_dir, job.node_rank * config.nproc_per_node)
            elif isinstance(config, InferenceConfig):
                called: list[str] = []
                if adapted is not None:  # kept in the record also when a later step fails
                    adapted["hooks_called"] = called
                outcome = run_inference(job, case, config, vendor, spec, out_dir, called)
            elif case.family == "generate":  # its modules need transformers (the generate extra): imported there
                outcome = run_generate(config, vendor, spec, out_dir, job.round, job.attempt, job.prompt_positions,
                                       job.earlier_attempts, job.prompt_reservations)
            elif case.family == "operation":
                outcome = run_operation(config, vendor, spec, job)
            else:
                outcome = run_base(case, config, vendor, spec, job, out_dir)
            if slot is not None:
                outcome.metrics = [m.model_copy(update={"device": slot.index}) for m in outcome.metrics]
        status = "unsupported" if outcome.exit_code == EXIT_UNSUPPORTED else (
            "failed" if outcome.failure else "success")
    except Unsupported as exc:
        outcome = Outcome(failure=Failure(kind="unsupported", message=str(exc)), exit_code=EXIT_UNSUPPORTED)
        status = "unsupported"
    except (CaseUserError, ConfigError, ValidationError) as exc:
        message = str(exc) if not isinstance(exc, ValidationError) else pydantic_error_to_config_error(
            exc, "job config").message
        outcome = Outcome(failure=Failure(kind="user", message=message), exit_code=EXIT_USER_ERROR)
    except ModuleNotFoundError as exc:  # an optional package this case needs: name the extra, do not retry
        missing = missing_extra(exc, job.family, f"case {job.case}")
        if missing is None:
            raise
        outcome = Outcome(failure=Failure(kind="user", message=str(missing)), exit_code=EXIT_USER_ERROR)
    finished = datetime.now(timezone.utc)
    for metric in outcome.metrics:
        ratio = f" = {metric.ratio:.1%} of peak" if metric.ratio is not None else ""
        log.info("%s: %.6g %s (p50 %s, cv %s)%s", metric.name, metric.value, metric.unit,
                 f"{metric.p50:.6g}" if metric.p50 is not None else "-",
                 f"{metric.cv:.2%}" if metric.cv is not None else "-", ratio)
    if outcome.convergence:
        c = outcome.convergence
        log.info("converged: %s (%s %s, target %s, %d epochs)", c.converged, c.metric, c.reached, c.target, c.epochs)
    if outcome.failure:
        log.warning("%s: %s", status, outcome.failure.message)
    result = RoundResult(
        run_id=job.run_id, case=job.case, family=job.family, round=job.round, host=job.host,
        node_rank=job.node_rank, vendor=job.vendor, status=status, failure=outcome.failure,
        started_at=started, finished_at=finished, duration_s=(finished - started).total_seconds(),
        measured_seconds=outcome.measured, startup_s=startup_s, device=device, metrics=outcome.metrics,
        convergence=outcome.convergence, inference=outcome.inference, operation=outcome.operation,
        config=job.config, devices=outcome.devices, device_spread=outcome.spread,
        provenance=Provenance(
            **engine_info(job.vendor, job.digest_cases()), command=job.command, python=sys.version.split()[0],
            libraries={**job.controller_libraries, **library_versions()},
            host={**host_info(), "allocator": allocator}, image=job.image,
            config_origins=job.config_origins, run_overrides=job.run_overrides, attempt=job.attempt,
            adaptation=adapted, spec_settings=settings, spec_settings_origins=settings_origins,
        ),
    )
    write_result(out_dir / RESULT_FILE, result)
    return outcome.exit_code


def watch_parent(poll_s: float = 1.0) -> None:
    """Exit when the process that started us (the controller or its agent) is gone: a case never runs on
    unobserved. Its own session is not signalled by the controller's Ctrl-C, so this is the backstop."""
    parent = os.getppid()
    started_by = os.environ.get(PARENT_PID_ENV, "")
    if started_by.isdigit() and int(started_by) != parent:
        print(f"flagperf.entry: the process that started this case ({started_by}) is gone; exiting",
              file=sys.stderr, flush=True)
        os._exit(EXIT_ORPHANED)

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(EXIT_ORPHANED)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def deadline_grace_s(timeout_s: float) -> float:
    """How long past its timeout a case may go before it stops itself: the controller's own timeout fires
    first whenever the controller is there."""
    return min(60.0, max(5.0, 0.1 * timeout_s))


def watch_deadline(timeout_s: float) -> None:
    """Exit when the round's timeout (plus grace) has passed. In a container the parent watch sees only the
    container's init, so a controller that vanished would otherwise leave the case running with no limit."""
    limit = timeout_s + deadline_grace_s(timeout_s)

    def watch() -> None:
        time.sleep(limit)
        print(f"flagperf.entry: still running {limit:.0f} s after start (timeout_s {timeout_s:g}) and nobody "
              "stopped it; exiting", file=sys.stderr, flush=True)
        os._exit(EXIT_OVERRAN)

    threading.Thread(target=watch, name="deadline-watch", daemon=True).start()


def classify_runtime_error(exc: RuntimeError) -> Exception:
    """A backend's RuntimeError, sorted: out of memory is the config's fault (retrying cannot help), an
    unsupported operation is a result; anything else is a crash and propagates (retried)."""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    text = str(exc).lower().replace("_", " ")
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text or "can't allocate memory" in text:
        return CaseUserError(f"does not fit in device memory: {first}")
    if "not supported" in text or "not implemented" in text:
        return Unsupported(first)
    return exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flagperf.entry", description=__doc__)
    parser.add_argument("--job", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=None, help="the folder to write to (default: the job's)")
    parser.add_argument("--device-slot", default=None, help="JSON {index, visible, cpus}: measure this one device "
                                                            "of the host (a round that measures every device)")
    args = parser.parse_args(argv)
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(CaseLogFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[console])
    # case.log (and the run_case task's log, which repeats it) holds the case's output, not the transport's:
    # no line per HTTP request to the Prefect API, no colour codes from Prefect's console handler.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
    os.environ.setdefault("PREFECT_LOGGING_COLORS", "false")
    # The core's lines outside the step subflows are case output (case.log), not a warning about a missing run.
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    try:
        job = Job.model_validate_json(args.job.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"{args.job}: cannot read the job file: {str(exc).splitlines()[0]}", file=sys.stderr)
        return EXIT_USER_ERROR
    watch_parent()
    watch_deadline(float(job.config.get("timeout_s", 86400.0)))
    slot: DeviceSlot | None = None
    if args.device_slot is not None:
        given = json.loads(args.device_slot)
        slot = DeviceSlot(int(given["index"]), given.get("visible"),
                          tuple(given["cpus"]) if given.get("cpus") is not None else None)
        enter_device(load_vendor(job.vendor).manifest, slot)
    keep_freed_host_memory()  # before anything is measured: forwards reuse freed pages
    return run_job(job, args.out or args.job.parent, slot=slot, job_file=args.job)


if __name__ == "__main__":
    raise SystemExit(main())
