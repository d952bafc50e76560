"""One round of an operation case: every operator x dtype x shape of the case, for each implementation checked
against a higher-precision reference first (a wrong result is a failed point with the error, never a figure),
then timed (flagperf.operation.timer). A figure is TFLOPS for compute-bound operators and GB/s for
memory-bound ones at the median latency, with its counting formula, its share of the vendor's peak and of
the roofline (max of FLOPs / peak FLOP/s and bytes / peak bandwidth).

Cases (cases/operation/<group>/case.yaml) name this module as their entry; ``Config`` is their config model.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from flagperf.config.memory import USABLE_SHARE
from flagperf.errors import CaseUserError
from flagperf.measure.casekit import comparable_ratio
from flagperf.measure.device import device_clock, device_module, synchronize
from flagperf.operation.check import (
    REFERENCE_CPU,
    Reference,
    Verdict,
    compare,
    compute_reference,
    point_atol,
    reference_dtype,
)
from flagperf.operation.config import OperationConfig, PlannedPoint, plan_points
from flagperf.operation.impls import (
    ImplEnv,
    OperatorImplementation,
    load_implementation,
    vendor_implementations,
)
from flagperf.operation.manifest import INDUCTOR_MODE
from flagperf.operation.operators import (
    ELEMENT_BYTES,
    FP8,
    OPERATORS,
    Operator,
    counted,
    fp8_dtype,
    make_inputs,
    native_for,
    reference_for,
    shape_label,
)
from flagperf.operation.precision import PinnedArithmetic, ieee_matmuls
from flagperf.operation.precision import describe as describe_arithmetic
from flagperf.operation.sampled import NoSample, Sample, host_sample
from flagperf.operation.timer import (
    MEMORY_SIDE_CACHE,
    NEAR_FLOOR_SHARE,
    CacheFlush,
    Timed,
    TimingOptions,
    flush_bytes,
    graph_support,
    iteration_spread,
    last_level_cache_bytes,
    shares_host_caches,
    time_energy,
    time_host,
    time_iterations,
)
from flagperf.results.metrics import coefficient_of_variation
from flagperf.results.schema import (
    HOST_FAILED,
    NO_SAMPLE_SEPARATOR,
    Metric,
    OperationReport,
    OperatorPoint,
    Peak,
    SpecTable,
)

Config = OperationConfig
SCALE = {"TFLOPS": 1e12, "GB/s": 1e9}

log = logging.getLogger("flagperf.case.operation")


@dataclass
class OperationOutcome:
    metrics: list[Metric]
    report: OperationReport
    measured_seconds: float
    failure: str | None = None  # nothing passed: why


@dataclass(frozen=True)
class HostSample:
    """A large point's float64 host reference of a sample of its output, or why there is none."""

    sample: Sample | None
    reference: Reference | None
    statement: str  # the point's reference_sample: which elements, or "none: why"


@dataclass
class Implementations:
    ready: dict[str, OperatorImplementation] = field(default_factory=dict)
    absent: dict[str, str] = field(default_factory=dict)  # name -> why its points are skipped
    described: dict[str, str] = field(default_factory=dict)


def load_implementations(config: OperationConfig, vendor: str, device: torch.device) -> Implementations:
    """The implementations to compare; one whose packages are missing on this host is absent, saying why."""
    found = Implementations()
    env = ImplEnv(device=device, log=log, inductor_mode=config.inductor_mode)
    for name in config.implementations or vendor_implementations(vendor):
        definition = load_implementation(vendor, name)
        try:
            cls = definition.implementation_class()
        except CaseUserError as exc:  # its library is not installed here (MissingExtra included)
            found.absent[name] = str(exc)
            found.described[name] = f"not available: {exc}"
            continue
        warning = ""
        if cls.reads_inductor_mode != (INDUCTOR_MODE in definition.manifest.options):
            # the plan read the manifest, the host the class: where they differ, the plan's check meant nothing
            listed = "does not list" if cls.reads_inductor_mode else "lists"
            disagreement = (f"{definition.source}: options: {listed} {INDUCTOR_MODE}, and its class sets "
                            f"reads_inductor_mode = {cls.reads_inductor_mode}: make the two agree")
            if config.inductor_mode != "default":
                raise CaseUserError(disagreement)
            # in the default mode the plan's check has nothing to refuse: an implementation written before
            # engine.yaml declared options still runs, told what to fix in the task log and the round's record
            log.warning("%s", disagreement)
            warning = f"; warning: {disagreement}"
        found.ready[name] = cls(env)
        found.described[name] = f"{found.ready[name].describe()} ({definition.source}){warning}"
    if not found.ready:
        raise CaseUserError("no implementation can run here: " + "; ".join(found.absent.values()))
    # a backstop of the plan's check (OperationConfig.check_for_vendor), on the classes loaded here
    if config.inductor_mode != "default" and not any(impl.reads_inductor_mode for impl in found.ready.values()):
        raise CaseUserError(f"inductor_mode: {config.inductor_mode} is torch.compile's mode, and none of the "
                            f"implementations loaded here ({', '.join(found.ready)}) compiles with it: it would "
                            "change nothing (set inductor_mode: default, or list one that compiles, such as compile)")
    return found


class _AtenRecorder(TorchDispatchMode):
    """The aten operators a call dispatches, in order (``mm``, ``add.Tensor``, ``_softmax``)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        schema = func._schema
        name = schema.name.removeprefix("aten::") + (f".{schema.overload_name}" if schema.overload_name else "")
        if name not in self.names:
            self.names.append(name)
        return func(*args, **(kwargs or {}))


def aten_ops(fn: Callable[..., Any], inputs: list[Any]) -> list[str]:
    recorder = _AtenRecorder()
    with recorder:
        fn(*inputs)
    return recorder.names


def _peak(spec: SpecTable, key: str) -> Peak | None:
    peak = spec.peaks.get(key)
    return peak if peak is not None and peak.supported and peak.value and peak.dense else None


def roofline(spec: SpecTable, op: Operator, dtype: str, flops: int | None, nbytes: int, latency: float
             ) -> tuple[float | None, str]:
    """Roofline time / measured time, and the basis: the roofline time is the larger of FLOPs / the dtype's
    peak and bytes / the peak bandwidth, of those the spec table knows (the operator's own bound must be one)."""
    compute = _peak(spec, dtype) if flops else None
    memory = _peak(spec, "memory_bandwidth")
    if (op.bound == "compute" and compute is None) or (op.bound == "memory" and memory is None):
        missing = dtype if op.bound == "compute" else "memory_bandwidth"
        known = spec.peaks.get(missing)
        why = f" ({known.source})" if known is not None and known.source else ""  # what would give it a value
        return None, f"no {missing} peak in the spec table of {spec.device}{why}"
    terms: list[float] = []
    basis: list[str] = []
    if compute is not None and compute.unit in ("TFLOPS", "TOPS"):
        terms.append(flops / (compute.value * 1e12))  # type: ignore[operator]
        basis.append(f"{dtype} {compute.value:g} {compute.unit}")
    if memory is not None and memory.unit == "GB/s":
        terms.append(nbytes / (memory.value * 1e9))  # type: ignore[operator]
        basis.append(f"memory {memory.value:g} GB/s")
    if not terms:
        return None, "no peak in a unit the roofline takes"
    return max(terms) / latency, "max over " + ", ".join(basis)


def roofline_is_estimate(spec: SpecTable, dtype: str, flops: int | None) -> bool:
    """The roofline takes a peak that is only a lower bound of the real one: its share is an upper estimate."""
    used = [_peak(spec, dtype) if flops else None, _peak(spec, "memory_bandwidth")]
    return any(peak is not None and peak.estimated for peak in used)


@dataclass(frozen=True)
class EnergyLoop:
    """The loop a point's energy per work is taken over: its epoch window, its calls and what it was."""

    window: tuple[float, float]
    calls: int
    what: str  # "the host loop", "the energy loop (... s: energy_intervals ...)"
    energy_loop: bool = False  # the energy loop (the case's energy_intervals), not the host loop


def point_metric(name: str, point: PlannedPoint, spec: SpecTable, latencies: list[float], median: float,
                 p10: float, p90: float, window: tuple[float, float], warmup_calls: int | None = None,
                 host_latency: float | None = None, energy: EnergyLoop | None = None,
                 energy_absent: str | None = None, note: str | None = None, energy_intervals: int = 0
                 ) -> tuple[Metric, float, str]:
    """``window``: the timed iterations' (the metric's ``window``, with their work in ``work``: what the figure,
    the chip's state and the timeline are of). ``energy``: the loop energy per work is taken over (the energy loop
    or the host loop: the calls and nothing else), which becomes the metric's ``energy_window`` and
    ``energy_work``; the timed loop's flushes (and the CPU's rewarm calls) would be charged to the calls. Without
    one, ``energy_absent`` says why (energy_per_work_absent). ``energy_intervals``: the case's, carried with
    whether its loop ran for this figure, so that a figure over the host loop instead is not told to set it."""
    flops, nbytes = counted(point.op, point.dims, point.dtype)
    compute = point.op.bound == "compute"
    work, unit = (float(flops or 0), "TFLOPS") if compute else (float(nbytes), "GB/s")
    scale = SCALE[unit]
    peak = spec.peaks.get(point.dtype if compute else "memory_bandwidth")
    value = work / median / scale
    metric = Metric(
        name=name, value=value, unit=unit, p50=value, p10=work / p90 / scale, p90=work / p10 / scale,
        cv=coefficient_of_variation(latencies), chunks=len(latencies), iterations=len(latencies),
        measured_seconds=sum(latencies), peak=peak, ratio=comparable_ratio(value, unit, peak),
        convention=f"{point.op.name}: {point.op.formula()}; {unit} = "
                   f"{'FLOPs / 1e12' if compute else 'bytes / 1e9'} / median latency in seconds",
        note=f"latency median {median * 1e3:.4g} ms (p10 {p10 * 1e3:.4g}, p90 {p90 * 1e3:.4g}; "
             f"±{iteration_spread(median, p10, p90):.1%}) over {len(latencies)} iterations"
             + (f" after {warmup_calls} warm-up calls" if warmup_calls is not None else "")
             + (f"; host {host_latency * 1e3:.4g} ms per call back to back" if host_latency is not None else "")
             + (f"; window and work: the {len(latencies)} timed iterations (cache flushes between them); energy "
                f"per work over energy_window, the {energy.calls} calls of {energy.what} (back to back, no flush), / "
                "their work" if energy else "")
             + (f"; {note}" if note else "")
             + f"; shape {shape_label(point.dims)} ({point.source})",
        window=list(window), work=work * len(latencies) / scale,
        energy_window=list(energy.window) if energy else None,
        energy_work=work * energy.calls / scale if energy else None,
        energy_intervals=energy_intervals or None,
        energy_loop_ran=bool(energy and energy.energy_loop) if energy_intervals else None,
        energy_per_work_absent=None if energy else energy_absent,
        statistic="rate@median")
    return metric, work, unit


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else ""
    line = f"{type(exc).__name__}: {line}" if line else type(exc).__name__
    return line if len(line) <= 400 else line[:397] + "..."


def _larger(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _is_oom(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text or "can't allocate memory" in text


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # an integer type per element size


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (NaN equals itself; fp8, whose == some devices lack, compared as bytes)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        a, b = a.view(_BITS[a.element_size()]), b.view(_BITS[b.element_size()])
    return torch.equal(a, b)


def rewarm_fits(point: PlannedPoint, available: int) -> bool:
    """The rewarm's copy of the inputs and the output it holds over the timed call (one more set of the
    point's inputs and output) fit in USABLE_SHARE of the memory still available with the point's own set
    allocated. memory_need counts one set, so a point the plan let through may have no room for a second."""
    return point.op.allocated_bytes(point.dims, ELEMENT_BYTES[point.dtype]) <= USABLE_SHARE * available


def _free(device: torch.device) -> None:
    module = device_module(device)  # None: the host's own memory, which has no cache of its own to empty
    if module is not None and hasattr(module, "empty_cache"):
        module.empty_cache()


def cache_flush(device: torch.device, spec: SpecTable) -> CacheFlush:
    """The round's cache flush, twice a memory-side cache the vendor's spec table declares; one line where the
    device has no room for its buffer."""
    declared = spec.peaks.get(MEMORY_SIDE_CACHE)
    memory_side = (int(declared.value * 2**20), declared.source) if declared and declared.value else None
    try:
        return CacheFlush(device, memory_side)
    except RuntimeError as exc:  # out of memory: the buffer is allocated once, before any point
        if not _is_oom(exc):
            raise
        needed = flush_bytes(last_level_cache_bytes(device)[0], not shares_host_caches(device),
                             memory_side[0] if memory_side else None)
        raise CaseUserError(f"the cache flush's {needed / 2**20:.0f} MiB buffer does not fit in the "
                            f"device's memory ({_first_line(exc)}): flush_cache: false times without a flush") \
            from None


class PointRunner:
    """Runs the points of a round, one point's inputs and reference at a time."""

    def __init__(self, config: OperationConfig, spec: SpecTable, device: torch.device, impls: Implementations,
                 device_is_host: bool | None = None, monitor_interval_s: float | None = None,
                 arithmetic: PinnedArithmetic | None = None) -> None:
        """``device_is_host``: the device is the host's own processor, so every reference is float64 on the host
        and no point needs a host sample of its output; None asks the device (no torch device module: the CPU).
        ``monitor_interval_s``: the monitors' sampling interval in this round (the Job's), which the energy loop
        lasts config.energy_intervals of; None: not known here, no energy loop (energy_loop says so).
        ``arithmetic``: the round's pinned fp32 matrix-product arithmetic, checked after each implementation's calls
        of a point (flagperf.operation.precision); None: not checked."""
        self.config = config
        self.arithmetic = arithmetic
        self.energy_s = (config.energy_intervals * monitor_interval_s
                         if config.energy_intervals and monitor_interval_s else None)
        self.energy_loop = energy_description(config, monitor_interval_s)
        self.device_is_host = device_module(device) is None if device_is_host is None else device_is_host
        self.spec = spec
        self.device = device
        self.impls = impls
        self.options = TimingOptions(config.warmup_s, config.rep_s, config.min_iters, config.max_iters,
                                     config.flush_cache, config.cuda_graphs)
        self.flush = cache_flush(device, spec) if config.flush_cache else None
        fp64 = spec.peaks.get("fp64")
        self.device_has_fp64 = fp64 is None or fp64.supported
        self.points: list[OperatorPoint] = []
        self.metrics: list[Metric] = []
        self.measured = 0.0

    def _record(self, point: PlannedPoint, impl: str, status: str, error: str | None = None, **extra: Any) -> None:
        self.points.append(OperatorPoint(operator=point.op.name, group=point.op.group, dtype=point.dtype,
                                         shape=point.dims, source=point.source, implementation=impl,
                                         status=status, error=error, **extra))  # type: ignore[arg-type]
        if status != "passed":
            log.log(logging.WARNING if status == "failed" else logging.INFO, "%s %s %s @%s: %s: %s", point.op.name,
                    point.dtype, shape_label(point.dims), impl, status, error)

    def _skip_all(self, point: PlannedPoint, why: str) -> None:
        for name in [*self.impls.ready, *self.impls.absent]:
            self._record(point, name, "skipped", why)

    def fp8_problem(self) -> str | None:
        if fp8_dtype() is None:
            return f"torch {torch.__version__} has no float8_e4m3fn"
        peak = self.spec.peaks.get(FP8)
        if peak is not None and not peak.supported:
            return f"fp8 on {self.spec.device}: {peak.source}"
        return None

    def run(self, point: PlannedPoint) -> None:
        if point.dtype == FP8 and (problem := self.fp8_problem()):
            self._skip_all(point, problem)
            return
        try:
            inputs = make_inputs(point.op, point.dims, point.dtype, self.device, self.config.seed)
            native = native_for(point.op, point.dtype)
            with torch.no_grad():
                recorded = aten_ops(native, inputs)
            small = sum(t.numel() for t in inputs) <= self.config.reference_cpu_max_elements
            ref_device = REFERENCE_CPU if small else self.device
            # the host's own processor computes the whole reference in float64, as the host does a small point's:
            # a sample of it on the host again would check nothing more
            on_host = small or self.device_is_host
            ref_dtype = reference_dtype(point.dtype, on_host, self.device_has_fp64)
            reference = compute_reference(reference_for(point.op, point.dtype), inputs, ref_dtype, ref_device)
            sampled = None if on_host else self._host_sample(point, inputs)
        except RuntimeError as exc:  # out of memory included: said, and the round goes on
            _free(self.device)
            self._skip_all(point, ("does not fit in memory: " if _is_oom(exc) else "cannot be set up: ")
                           + _first_line(exc))
            return
        tolerance = self.config.tolerance(point.dtype)
        tolerance["atol"] = point_atol(tolerance["atol"], point.op.error_scale(point.dims), point.dtype)
        for name, impl in self.impls.ready.items():
            self._run_one(point, name, impl, inputs, native, recorded, reference, tolerance, sampled)
        for name, why in self.impls.absent.items():
            self._record(point, name, "skipped", why)
        del inputs, reference, sampled
        for impl in self.impls.ready.values():
            impl.point_done()
        _free(self.device)

    def _host_sample(self, point: PlannedPoint, inputs: list[Any]) -> HostSample:
        """A large point's float64 reference on the host for a sample of its output (flagperf.operation.sampled):
        its device reference is the device's own kernels. Where there is none, the point says why."""
        try:
            sample = host_sample(point.op, point.dtype, inputs, self.config.seed)
            reference = sample.reference()
            return HostSample(sample, reference, reference.description)
        except NoSample as exc:
            return HostSample(None, None, f"none: {exc}")
        except RuntimeError as exc:  # no host memory for it, a dtype the host cannot copy: said, the point goes on
            log.warning("%s %s %s: no float64 host sample (%s)", point.op.name, point.dtype,
                        shape_label(point.dims), _first_line(exc))
            return HostSample(None, None, f"none: {HOST_FAILED}{NO_SAMPLE_SEPARATOR}{_first_line(exc)}")

    def _run_one(self, point: PlannedPoint, name: str, impl: OperatorImplementation, inputs: list[Any],
                 native: Callable[..., Any], recorded: list[str], reference: Reference, tolerance: dict[str, float],
                 sampled: HostSample | None = None) -> None:
        common: dict[str, Any] = {"reference": reference.description, "tolerance": tolerance, "aten_ops": recorded,
                                  "reference_sample": sampled.statement if sampled else None}
        rtol, atol = tolerance["rtol"], tolerance["atol"]

        def verify(output: Any) -> Verdict:
            """Against the reference, then (a large point) against the host's float64 sample of it."""
            verdict = compare(output, reference, rtol, atol)
            if verdict.error or sampled is None or sampled.sample is None or sampled.reference is None:
                return verdict
            on_host = compare(sampled.sample.pick(output), sampled.reference, rtol, atol, sampled.sample.locate)
            errors = [e for e in (verdict.max_abs_error, on_host.max_abs_error) if e is not None]
            relative = [e for e in (verdict.max_rel_error, on_host.max_rel_error) if e is not None]
            return Verdict(on_host.error, max(errors) if errors else None, max(relative) if relative else None)

        why = impl.unavailable(point.op, point.dtype, recorded)
        if why:
            self._record(point, name, "skipped", why, **common)
            return
        status: str | None = None  # None: passed, timed
        error: str | None = None
        timed: Timed | None = None
        timed_error: str | None = None  # what the last timed iteration's output has wrong
        last: list[Any] = []  # the last timed iteration's output, handed back by the timer
        try:
            with torch.no_grad():
                fn = impl.prepare(point.op, point.dtype, native)

                def call() -> Any:
                    return fn(*inputs)

                with impl.scope():
                    output = call()
                    synchronize(self.device)
                verdict = verify(output)
                del output
                common.update(max_abs_error=verdict.max_abs_error, max_rel_error=verdict.max_rel_error)
                if verdict.error:
                    status, error = "failed", verdict.error
                else:
                    timed = self._time_iterations(point, name, impl, fn, call, common, last)
                    # the call that was timed is the call that is checked: before the host loop calls again (an
                    # output buffer reused, a CUDA graph tree's output overwritten by the next run), and outside the
                    # scope as the first was (a library patching torch's operators must not compute its own
                    # comparison)
                    checked = verify(last.pop()) if last else None
                    last.clear()
                    if checked is not None:  # the point's errors: the larger over the two outputs checked
                        common.update(max_abs_error=_larger(verdict.max_abs_error, checked.max_abs_error),
                                      max_rel_error=_larger(verdict.max_rel_error, checked.max_rel_error))
                    if checked is not None and checked.error:
                        timed_error = checked.error
                        replay = " (a device graph's replay)" if timed.graphs else ""
                        status, error = "failed", (f"the last timed iteration's output{replay} is wrong though the "
                                                   f"first call's was right: {timed_error}")
                    else:
                        timed = self._host_phases(point, name, impl, call, timed, common)
        except Exception as exc:  # an implementation's error fails its point, not the round
            last.clear()
            _free(self.device)
            status = "skipped" if _is_oom(exc) else "failed"
            error = ("does not fit in memory: " if _is_oom(exc) else "") + _first_line(exc)
        wrote = self._restore_inputs(point, inputs)
        switched = self.arithmetic.changed() if self.arithmetic is not None else None
        if switched:  # the cause of whatever else went wrong: its calls ran in another arithmetic than native's
            timed = None
            cause = (f"changed torch's fp32 matrix-product arithmetic to {switched} (IEEE fp32 is pinned for the "
                     "round; put back for the points after): its calls did not run in the arithmetic the others ran "
                     "in")
            status, error = "failed", cause + (f"; and {error}" if error else "")
        # a write into the inputs is also why its timed output is wrong: the write is said, the cause
        if wrote and not switched and (status is None or timed_error):
            status, error = "failed", f"{wrote}: its timed calls ran on other data than the call that was checked"
        elif wrote:
            error = f"{error}; and it {wrote}"
        if status is not None or timed is None:
            self._record(point, name, status or "failed", error, **common)
            return
        self.record_timed(point, name, timed, common)

    def _host_phases(self, point: PlannedPoint, name: str, impl: OperatorImplementation, call: Callable[[], Any],
                     timed: Timed, common: dict[str, Any]) -> Timed:
        """The host loop, then the energy loop where there is one, in the implementation's scope. Out of memory in
        either keeps the point, which passed its checks and was timed: its figure stands, without what the loop
        would have given (said in common["note"], the log and the metric)."""
        failed: str | None = None
        try:
            with impl.scope():
                timed = time_host(call, self.device, self.options, timed)
                if self.energy_s is not None:
                    timed = time_energy(call, self.device, self.energy_s, timed)
        except Exception as exc:
            if not _is_oom(exc):
                raise
            failed = _first_line(exc)
        if failed is None:
            return timed
        _free(self.device)  # past the except block: its traceback held the loop's outputs
        if timed.host_latency is None:
            common["note"] = (f"the host loop ran out of memory ({failed}): no host latency, and no energy per work "
                              "(no loop of the calls alone ran)")
        else:
            common["note"] = (f"the energy loop ran out of memory ({failed}): energy per work over the host loop "
                              "instead")
        log.warning("%s %s %s @%s: %s", point.op.name, point.dtype, shape_label(point.dims), name, common["note"])
        return timed

    def _time_iterations(self, point: PlannedPoint, name: str, impl: OperatorImplementation,
                         fn: Callable[..., Any], call: Callable[[], Any], common: dict[str, Any], last: list[Any]
                         ) -> Timed:
        """The timed phase in the implementation's scope, the CPU's rewarm where it fits; an out-of-memory error
        with the rewarm is retried without it (said on the point and in the log) rather than skipped."""
        copies = self._rewarm_inputs(point)
        if copies is not None:
            common["rewarmed"] = True
        elif self.flush is not None and self.flush.rewarm:
            common["rewarmed"] = False

        def rewarm() -> Any:
            return fn(*copies)  # type: ignore[misc]

        failed: str | None = None
        try:
            with impl.scope():
                timed = time_iterations(call, self.device, self.options, self.flush,
                                        rewarm if copies is not None else None, last)
        except Exception as exc:
            if copies is None or not _is_oom(exc):
                raise
            failed = _first_line(exc)
        if failed is not None:
            # retried here, past the except block: its exception's traceback held the timer's frame, and with it
            # the output and the rewarm's output that did not fit, through the retry
            copies = None
            last.clear()
            _free(self.device)
            log.warning("%s %s %s @%s: timed without the call that rewarms the host's caches after each flush (%s)",
                        point.op.name, point.dtype, shape_label(point.dims), name, failed)
            common["rewarmed"] = False
            with impl.scope():
                timed = time_iterations(call, self.device, self.options, self.flush, None, last)
        if timed.rewarm_dropped:  # a call far longer than its flush: nothing for the rewarm to change
            common["rewarmed"] = None
        return timed

    def _rewarm_inputs(self, point: PlannedPoint) -> list[Any] | None:
        """A copy of the point's inputs (made again, seeded: the same values elsewhere in memory) for the call
        after each flush where the flush empties the host's caches too (CacheFlush.rewarm); None where there is
        none to make, or no memory for it and its output (rewarm_fits; timed without, said in the log and on the
        point)."""
        if self.flush is None or not self.flush.rewarm:
            return None
        available = psutil.virtual_memory().available  # the rewarm is only where the device's memory is the host's
        if not rewarm_fits(point, available):
            log.warning("%s %s %s: timed without the call that rewarms the host's caches after each flush (a copy "
                        "of its inputs and output would take over %.0f%% of the %.2f GiB available)", point.op.name,
                        point.dtype, shape_label(point.dims), 100 * USABLE_SHARE, available / 2**30)
            return None
        try:
            return make_inputs(point.op, point.dims, point.dtype, self.device, self.config.seed)
        except RuntimeError as exc:
            _free(self.device)
            log.warning("%s %s %s: timed without the call that rewarms the host's caches after each flush (%s)",
                        point.op.name, point.dtype, shape_label(point.dims), _first_line(exc))
            return None

    def _restore_inputs(self, point: PlannedPoint, inputs: list[Any]) -> str | None:
        """What an implementation wrote into the point's inputs, or None: they are made again (seeded, so the
        same) and compared exactly. Written ones are replaced in ``inputs``, so that the implementations after
        it are checked and timed on the data the reference was computed from."""
        try:
            fresh = make_inputs(point.op, point.dims, point.dtype, self.device, self.config.seed)
        except RuntimeError as exc:  # no memory for a second set: unchecked, said
            _free(self.device)
            log.warning("%s %s %s: inputs not checked for writes (%s)", point.op.name, point.dtype,
                        shape_label(point.dims), _first_line(exc))
            return None
        try:
            changed = [i for i, (had, made) in enumerate(zip(inputs, fresh, strict=True)) if not _same_bits(had, made)]
        except RuntimeError as exc:  # no memory for the comparison: unchecked, said
            _free(self.device)
            log.warning("%s %s %s: inputs not checked for writes (%s)", point.op.name, point.dtype,
                        shape_label(point.dims), _first_line(exc))
            return None
        if changed:
            inputs[:] = fresh
        del fresh
        if not changed:
            return None
        which = ", ".join(str(i) for i in changed)
        return (f"wrote into its input{'s' if len(changed) > 1 else ''} {which} (of {len(inputs)}, in the order "
                f"{point.op.native_name} takes them)")

    def record_timed(self, point: PlannedPoint, name: str, timed: Timed, common: dict[str, Any]) -> None:
        """A passed point from its timing: the figure at the median, its spread, roofline and clock floor."""
        metric_name = f"{point.op.name}:{point.dtype}:{shape_label(point.dims)}@{name}"
        median, p10, p90 = timed.median, timed.p10, timed.p90
        energy = None
        if timed.energy_window is not None:
            energy = EnergyLoop(timed.energy_window, timed.energy_calls, f"the energy loop ({self.energy_loop})",
                                energy_loop=True)
        elif timed.host_window is not None:
            energy = EnergyLoop(timed.host_window, timed.host_calls, "the host loop")
        note = common.get("note")
        metric, _, unit = point_metric(metric_name, point, self.spec, timed.latencies, median, p10, p90,
                                       timed.window, timed.warmup_calls, timed.host_latency, energy,
                                       "operation: its host loop ran out of memory, so no loop of its calls alone "
                                       "ran (the timed iterations' window holds the cache flushes)", note,
                                       self.config.energy_intervals)
        low, high = timed.median_interval or (None, None)
        flops, nbytes = counted(point.op, point.dims, point.dtype)
        share, basis = roofline(self.spec, point.op, point.dtype, flops, nbytes, median)
        self.metrics.append(metric)
        self.measured += metric.measured_seconds
        self._record(point, name, "passed", metric=metric_name, latency_s=median, latency_p10_s=p10,
                     latency_p90_s=p90, latency_spread=timed.spread, latency_ci_low_s=low, latency_ci_high_s=high,
                     host_latency_s=timed.host_latency, iterations=len(timed.latencies),
                     warmup_calls=timed.warmup_calls, clock_floor_s=timed.clock_floor,
                     near_clock_floor=timed.near_clock_floor, flops=flops, bytes=nbytes,
                     value=metric.value, unit=unit, roofline=share, roofline_basis=basis,
                     roofline_estimated=share is not None and roofline_is_estimate(self.spec, point.dtype, flops),
                     **common)
        log.info("%s %s %s @%s: %.4g ms ±%.1f%% (p10 %.4g, p90 %.4g; %d iterations after %d warm-up calls)%s, "
                 "%.4g %s%s", point.op.name, point.dtype, shape_label(point.dims), name, median * 1e3,
                 100 * timed.spread, p10 * 1e3, p90 * 1e3, len(timed.latencies), timed.warmup_calls,
                 f", host {timed.host_latency * 1e3:.4g} ms per call" if timed.host_latency is not None else "",
                 metric.value, unit, f", {share:.1%} of roofline" if share is not None else "")
        if timed.near_clock_floor:
            log.warning("%s %s %s @%s: the clock measures %.3g us for an empty interval, over %.0f%% of the median "
                        "latency: the figure includes up to that much of the timer's own cost (a larger shape "
                        "would measure the operator)", point.op.name, point.dtype, shape_label(point.dims), name,
                        timed.clock_floor * 1e6, 100 * NEAR_FLOOR_SHARE)


def energy_description(config: OperationConfig, monitor_interval_s: float | None) -> str:
    """The energy loop of a round in words (OperationReport.energy), or why there is none."""
    if not config.energy_intervals:
        return ("off (energy_intervals: 0): energy per work over the host loop, which lasts rep_s at most and so "
                "rarely holds the 2 monitor samples a figure needs")
    if not monitor_interval_s:
        return (f"not run: energy_intervals {config.energy_intervals} is in monitor intervals, and this round was not "
                "told the monitors' interval (a round of flagperf run is; no monitors, no energy); energy per work "
                "over the host loop")
    return (f"{config.energy_intervals * monitor_interval_s:.3g} s: energy_intervals {config.energy_intervals} x "
            f"the monitors' {monitor_interval_s:g} s interval")


def check_energy_loop(config: OperationConfig, monitor_interval_s: float | None, origin: str | None = None) -> None:
    """A point's warm-up, timed and host loops and energy loop must stay well below timeout_s, as the config holds
    the first three (OperationConfig._consistent): the energy loop's length is known only with the interval."""
    if not config.energy_intervals or not monitor_interval_s:
        return
    energy_s = config.energy_intervals * monitor_interval_s
    if config.warmup_s + 2 * config.rep_s + energy_s >= config.timeout_s:
        where = f"{origin}: " if origin else ""
        raise CaseUserError(f"{where}energy_intervals: {config.energy_intervals} x the monitors' "
                            f"{monitor_interval_s:g} s interval = {energy_s:g} s per point, with warmup_s + 2 x rep_s, "
                            f"must be well below timeout_s ({config.timeout_s:g}): fewer intervals, a shorter "
                            "--monitor-interval or a longer timeout_s")


def host_threads() -> str:
    """The threads a CPU's figures ran on: torch's intra-op pool, which its CPU kernels and torch.compile's split a
    call over (torch.utils.benchmark's Timer pins it, to 1 by default, for the same reason: a CPU figure is a
    figure at a thread count)."""
    logical = psutil.cpu_count(logical=True) or os.cpu_count()  # None where the platform cannot tell
    of = f" (of {logical} logical CPUs;" if logical else " (the CPUs' count unknown here;"
    return f"torch's intra-op threads: {torch.get_num_threads()}{of} the CPU's figures are at this count)"


def run_operation(config: OperationConfig, vendor: str, spec: SpecTable, device: torch.device,
                  monitor_interval_s: float | None = None, energy_origin: str | None = None) -> OperationOutcome:
    """``monitor_interval_s``: the monitors' sampling interval in this round (the Job's), the energy loop's unit;
    ``energy_origin``: the file energy_intervals came from, for an error about it."""
    check_energy_loop(config, monitor_interval_s, energy_origin)
    impls = load_implementations(config, vendor, device)
    planned = plan_points(config)
    log.info("%d points (operators x dtypes x shapes) x implementations %s", len(planned), ", ".join(impls.ready))
    with ieee_matmuls() as arithmetic:
        runner = PointRunner(config, spec, device, impls, monitor_interval_s=monitor_interval_s,
                             arithmetic=arithmetic)
        if config.energy_intervals and not monitor_interval_s:
            log.warning("energy loop %s", runner.energy_loop)
        if arithmetic.before != arithmetic.pinned:
            log.info("fp32 matrix products pinned to IEEE fp32 for the round (the process had %s%s)",
                     describe_arithmetic(arithmetic.before), arithmetic.started_by)
        for point in planned:
            runner.run(point)
    arithmetic_statement = arithmetic.statement()  # after the setting is given back: it says where it could not be
    graphs = ("off (cuda_graphs: false)" if not config.cuda_graphs
              else graph_support(device) or "each timed call replayed from a device graph captured once; the "
              "last replay's output is checked as the first call's was")
    report = OperationReport(
        timing=(f"{device_clock(device).name}: warm-up "
                f"{config.warmup_s:g} s by time (each call waited for"
                f"{', after a cache flush' if config.flush_cache else ''}), then rep_s {config.rep_s:g} s worth "
                f"of iterations ({config.min_iters} to {config.max_iters}; one iteration as estimated in the "
                "warm-up), each call timed alone; the figure is at the median latency, p10 and p90 over the "
                "iterations; a point's spread (±) is (p90 - p10) / (2 x median) of its iterations, the median's "
                "95% confidence interval the order statistics of its iterations (ranks from Binomial(n, 1/2)); "
                "the last timed iteration's output (a graph's replay where graphs are on) is checked as the first "
                "call's was, before any other call; then its host latency is the host clock's wall time per call "
                "of as many calls back to back (at most rep_s worth by the median; the call itself, no flush, no "
                "graph, one synchronisation at the end: FlagPerf's cputime, dispatch included); the metric's "
                "window and work are the timed iterations', its energy_window and energy_work the energy loop's "
                "where one ran (energy), else the host loop's, the calls and nothing else, which energy per work "
                "is taken over; its clock "
                f"floor is the median the clock measures for an empty interval, and a point whose floor is over "
                f"{NEAR_FLOOR_SHARE:.0%} of its median latency is marked (its figure includes up to that much of the "
                f"timer's own cost); {arithmetic_statement}"
                + (f"; {host_threads()}" if device_module(device) is None else "")),
        flush=runner.flush.description if runner.flush else "off (flush_cache: false)",
        graphs=graphs,
        energy=runner.energy_loop,
        counting={name: OPERATORS[name].formula() for name in config.operators},
        tolerances={dtype: config.tolerance(dtype) for dtype in config.dtypes},
        implementations=impls.described,
        points=runner.points)
    passed = sum(p.status == "passed" for p in runner.points)
    failed = [p for p in runner.points if p.status == "failed"]
    log.info("%d points passed, %d failed, %d skipped", passed, len(failed),
             len(runner.points) - passed - len(failed))
    failure = None
    if not passed and failed:
        failure = f"no point passed; {len(failed)} failed, first: {failed[0].operator} {failed[0].dtype} " \
                  f"@{failed[0].implementation}: {failed[0].error}"
    return OperationOutcome(metrics=runner.metrics, report=report, measured_seconds=runner.measured, failure=failure)
