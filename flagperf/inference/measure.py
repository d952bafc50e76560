"""The timed loops of inference (validation and engine inference both use them), so cases write no timers.

FlagPerf's definitions, per pass (``repeat`` times over the data loader):
  whole = items / (wall time of all batches - non-inference time): data loading, host-device copies,
          the forward and the evaluation are all inside.
  core  = items / sum over batches of (synchronised forward time - non-inference time): the device is
          synchronised before and after each batch, the copy of the inputs to the device is inside (as
          in FlagPerf), loading and evaluation are outside.
And one of ours:
  compute = items / time of back-to-back forwards on inputs already resident on the device, timed with the
          device's own events (host clock on the CPU): what the chip does, with no copy and no host wait.
Per-batch times give the latency percentiles (p50/p90/p95/p99, std); the raw lists are kept. A case whose
forward yields (a decoding loop yields after every generated token) also gets its time to the first yield.

Python's garbage collector is paused inside every timed region (collected just before, as timeit does): a
collection of the model's set-up garbage costs tens of milliseconds and lands on whichever batch triggers
it, which on a small model is hundreds of batches' worth of time in one sample.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import torch

from flagperf.inference.config import InferenceConfig
from flagperf.measure.casekit import CaseContext
from flagperf.measure.device import Clock, HostClock
from flagperf.results.metrics import Chunk, latency_stats, latency_tail, mean_median_disagreement, percentile
from flagperf.results.schema import Metric

Batch = tuple[Any, Any]  # (inputs: a tensor or a list of tensors, labels for the evaluator)
# One batch through the model or engine: (outputs, or a generator whose last value is the outputs;
# seconds of the call that were not inference). A generator's non-inference time is only known once it is
# consumed, so it may come as a callable that is read afterwards.
NonInference = float | Callable[[], float]
Forward = Callable[[list[torch.Tensor]], tuple[Any, NonInference]]
Evaluator = Callable[[list[torch.Tensor], Any], float]


@dataclass
class PassStats:
    """What one timed pass (validation or inference) measured."""

    name: str
    items_per_batch: int
    batches: int = 0
    wall_seconds: float = 0.0
    non_inference_seconds: float = 0.0
    core_seconds: list[float] = field(default_factory=list)
    first_item_seconds: list[float] = field(default_factory=list)
    score_weighted: float = 0.0
    scored_items: int = 0
    window: tuple[float, float] = (0.0, 0.0)
    cold_start_seconds: float | None = None  # the first warm-up batch: a fresh model's or engine's first call
    cold_start_non_inference: float = 0.0

    @property
    def items(self) -> int:
        return self.batches * self.items_per_batch

    @property
    def whole_seconds(self) -> float:
        return self.wall_seconds - self.non_inference_seconds

    @property
    def accuracy(self) -> float | None:
        return self.score_weighted / self.scored_items if self.scored_items else None


def as_inputs(inputs: Any) -> list[torch.Tensor]:
    if isinstance(inputs, torch.Tensor):
        return [inputs]
    if isinstance(inputs, list | tuple) and all(isinstance(x, torch.Tensor) for x in inputs):
        return list(inputs)
    raise TypeError(f"a batch's inputs must be a tensor or a list of tensors, got {type(inputs).__name__}")


def outputs_to_cpu(outputs: Any) -> list[torch.Tensor]:
    return [o.detach().cpu() if isinstance(o, torch.Tensor) else o for o in as_inputs(outputs)]


def _consume(result: Any, sync: Callable[[], None], started: float,
             now: Callable[[], float] = time.perf_counter) -> tuple[Any, float | None]:
    """The outputs of a forward, and for a generator the time to its first value (synchronised)."""
    if not isinstance(result, Iterator):
        return result, None
    first: float | None = None
    last: Any = None
    for value in result:
        if first is None:
            sync()
            first = now() - started
        last = value
    return last, first


def timed_pass(name: str, loader: Iterable[Batch], forward: Forward, evaluator: Evaluator | None,
               sync: Callable[[], None], config: InferenceConfig, log: logging.Logger,
               to_device: Callable[[list[torch.Tensor]], list[torch.Tensor]] = lambda x: x,
               now: Callable[[], float] = time.perf_counter, min_warmup: int = 0) -> PassStats:
    """Warm-up batches (untimed; the first one is the cold start), then ``config.repeat`` timed passes over
    the loader. The warm-up is ``config.warmup_batches``, or ``min_warmup`` if more: the batches a loader
    holds at once (flagperf.inference.data.in_flight_batches), whose first making is start-up work. ``now``
    is the host clock (a test gives a fake one)."""
    cold: tuple[float, float] | None = None
    warmup = max(config.warmup_batches, min_warmup)
    with torch.inference_mode():
        for warm, (inputs, _labels) in enumerate(loader):
            if warm >= warmup:
                break
            x = to_device(as_inputs(inputs))
            sync()
            t0 = now()
            result, non_inference = forward(x)
            _consume(result, sync, t0, now)
            sync()
            if cold is None:
                cold = (now() - t0, non_inference() if callable(non_inference) else non_inference)
        sync()
        # The first timed epoch's iterator is made before the clock starts: a persistent-worker loader that the
        # warm-up left mid-epoch drains (and discards) the batches its workers prefetched when it restarts, and
        # that leftover of the warm-up is not the pass's data loading.
        first_epoch = iter(loader)
        with _gc_paused():
            start_epoch, start = time.time(), now()
            stats = _timed_batches(name, loader, first_epoch, forward, evaluator, sync, config, log, to_device, now)
            sync()
            stats.wall_seconds = now() - start
    stats.window = (start_epoch, start_epoch + stats.wall_seconds)
    if cold is not None:
        stats.cold_start_seconds, stats.cold_start_non_inference = cold
    return stats


def _timed_batches(name: str, loader: Iterable[Batch], first_epoch: Iterator[Batch], forward: Forward,
                   evaluator: Evaluator | None, sync: Callable[[], None], config: InferenceConfig,
                   log: logging.Logger, to_device: Callable[[list[torch.Tensor]], list[torch.Tensor]],
                   now: Callable[[], float]) -> PassStats:
    stats: PassStats | None = None
    for rep in range(config.repeat):
        for inputs, labels in first_epoch if rep == 0 else loader:
            x = as_inputs(inputs)
            if stats is None:
                stats = PassStats(name, items_per_batch=x[0].shape[0] * config.items_per_sample())
            elif x[0].shape[0] * config.items_per_sample() != stats.items_per_batch:
                raise ValueError(f"{name}: batches differ in size; the data loader must drop the last "
                                 "partial batch (drop_last=True), as FlagPerf's do")
            sync()
            t0 = now()
            result, non_inference = forward(to_device(x))
            outputs, first = _consume(result, sync, t0, now)
            sync()
            foo = non_inference() if callable(non_inference) else non_inference
            core = now() - t0 - foo
            stats.core_seconds.append(core)
            stats.non_inference_seconds += foo
            if first is not None:
                stats.first_item_seconds.append(first)
            stats.batches += 1
            if evaluator is not None:
                stats.score_weighted += float(evaluator(outputs_to_cpu(outputs), labels)) * x[0].shape[0]
                stats.scored_items += x[0].shape[0]
            if stats.batches % config.log_freq == 0:
                log.info("%s: repeat %d/%d, batch %d, %.2f ms core", name, rep + 1, config.repeat,
                         stats.batches, core * 1e3)
    if stats is None:
        raise ValueError(f"{name}: the data loader yielded no batches")
    return stats


@contextmanager
def _gc_paused() -> Iterator[None]:
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass
class ComputeStats:
    """Back-to-back forwards on device-resident inputs: one duration per forward, by the device's clock."""

    name: str
    items_per_batch: int
    seconds: list[float]
    clock: str
    resident_batches: int
    window: tuple[float, float] = (0.0, 0.0)
    non_inference_seconds: float = 0.0
    issue_seconds: float | None = None  # the host's time to issue one forward onto an idle device queue

    def host_bound(self) -> str | None:
        """Why the figure may be the host's, not the device's: issuing one forward costs the host about as
        long as the device takes to run it, so back to back the device waits for work between kernels and its
        events time that idling too. (Issue time is measured on an empty queue: once the queue is full, the
        host waits for the device, and the two can no longer be told apart.)"""
        if self.issue_seconds is None or not self.seconds:
            return None
        device = sorted(self.seconds)[len(self.seconds) // 2]
        if self.issue_seconds < HOST_BOUND_SHARE * device:
            return None
        return (f"host-bound: issuing one forward takes the host {self.issue_seconds * 1e3:.3g} ms, running it "
                f"takes the device {device * 1e3:.3g} ms (median), so the device waits for the host between kernels or "
                "forwards (launch overhead, or an engine that synchronises in each call); not the chip's rate "
                "(CUDA graphs, e.g. inductor_mode: reduce-overhead, cut the host's share)")


# The host's issue time at this share of the device's time or more: the device is starved of work.
HOST_BOUND_SHARE = 0.9


def resident_batches(loader: Iterable[Batch], to_device: Callable[[list[torch.Tensor]], list[torch.Tensor]],
                     count: int) -> list[list[torch.Tensor]]:
    """Up to ``count`` batches from the loader, already on the device in the dtype the forward takes."""
    batches: list[list[torch.Tensor]] = []
    with torch.inference_mode():
        for inputs, _labels in loader:
            batches.append(to_device(as_inputs(inputs)))
            if len(batches) >= count:
                break
    if not batches:
        raise ValueError("the data loader yielded no batches")
    return batches


def drain(result: Any) -> Any:
    """A forward's outputs; a generator (a decoding loop) is run to its end and its last value is the output."""
    if isinstance(result, Iterator):
        last = None
        for last in result:  # noqa: B007 - a decoding loop's last value is its output
            pass
        return last
    return result


def compute_pass(name: str, batches: Sequence[list[torch.Tensor]], forward: Forward, clock: Clock,
                 sync: Callable[[], None], iterations: int, warmup: int, items_per_sample: int = 1,
                 now: Callable[[], float] = time.perf_counter) -> ComputeStats:
    """``iterations`` forwards over ``batches`` (cycled), with a clock mark between consecutive forwards and no
    synchronisation inside: forward i took mark[i+1] - mark[i] of the device's time. Outputs stay where the
    forward left them (never copied back). With a device clock, the host's time (``now``) to issue one forward
    onto an idle device is kept too, to tell a host-bound figure from the device's."""
    if iterations < 1:
        raise ValueError(f"{name}: compute needs at least one iteration")
    non_inference = 0.0
    with torch.inference_mode():
        for i in range(warmup):
            drain(forward(batches[i % len(batches)])[0])
        sync()
        with _gc_paused():
            issue = None if isinstance(clock, HostClock) else _issue_seconds(batches[0], forward, sync, now)
            start_epoch, start = time.time(), now()
            marks = [clock.mark()]
            for i in range(iterations):
                result, foo = forward(batches[i % len(batches)])
                drain(result)
                non_inference += foo() if callable(foo) else foo
                marks.append(clock.mark())
            sync()
            wall = now() - start
    seconds = [clock.seconds(a, b) for a, b in pairwise(marks)]
    # A host clock times the host itself: there is no separate device time to compare with.
    return ComputeStats(name=name, items_per_batch=batches[0][0].shape[0] * items_per_sample, seconds=seconds,
                        clock=clock.name, resident_batches=len(batches), window=(start_epoch, start_epoch + wall),
                        non_inference_seconds=non_inference, issue_seconds=issue)


ISSUE_SAMPLES = 3  # forwards issued onto an idle device; the fastest is kept (one sample may catch a hiccup)


def _issue_seconds(batch: list[torch.Tensor], forward: Forward, sync: Callable[[], None],
                   now: Callable[[], float]) -> float | None:
    """The host's time to issue one forward onto an idle device (synchronised before each), the least of
    ISSUE_SAMPLES; None for a forward that yields (a decoding loop waits for its tokens: not judged)."""
    fastest: float | None = None
    for _ in range(ISSUE_SAMPLES):
        sync()
        issued_at = now()
        result, foo = forward(batch)
        if isinstance(result, Iterator):
            drain(result)
            return None
        seconds = now() - issued_at - (foo() if callable(foo) else foo)
        fastest = seconds if fastest is None else min(fastest, seconds)
    sync()
    return fastest


def pass_metrics(stats: PassStats, config: InferenceConfig, ctx: CaseContext, *, synthetic: bool,
                 accuracy_name: str | None, flops_per_item: float | None = None,
                 precision: str | None = None) -> list[Metric]:
    """FlagPerf's whole and core throughput (MFU on core), latency percentiles, time to first item, the cold
    start, and the evaluator's accuracy (never on synthetic inputs). ``flops_per_item``: MFU's numerator
    (the configured ``flops`` when not given); ``precision``: the spec-table key of what the pass ran in (the
    case's when not given)."""
    item = config.item_name
    flops = config.flops if flops_per_item is None else flops_per_item
    precision = precision or config.precision
    ctx.windows.append(stats.window)
    attention = config.attention_statement()
    whole = ctx.throughput_metric(
        f"{stats.name}_whole", [Chunk(stats.batches, stats.whole_seconds)], stats.items_per_batch, item,
        note=f"FlagPerf's whole: data loading, copies, forward and evaluation, minus engine non-inference time; "
             f"{attention}")
    # Only core and compute carry MFU: they are the compute rates FlagPerf divides by the peak.
    core = _checked(ctx.throughput_metric(
        f"{stats.name}_core", [Chunk(1, s) for s in stats.core_seconds], stats.items_per_batch, item,
        flops_per_item=flops, precision=precision, flops_scope=config.flops_scope(),
        note=f"FlagPerf's core: synchronised input copy + forward per batch; {attention}"))
    per_batch = f"one batch of {config.batch_size}"
    whole = with_convention(whole, f"FlagPerf's whole: {item} / wall time of the {config.repeat} pass(es) over the "
                                   "data, data loading, copy to the device, forward and evaluation inside, the "
                                   f"engine's non-inference time (a JIT compile) taken out; {attention}")
    core = with_convention(core, f"FlagPerf's core: {item} / sum over batches of (copy to the device + forward), "
                                 f"synchronised before and after each; loading and evaluation outside; {attention}")
    latency = with_convention(
        _latency_metric(f"{stats.name}_latency", stats.core_seconds, stats.window,
                        f"per batch of {config.batch_size}, synchronised, input copy inside"),
        f"{per_batch}: copy to the device + forward, synchronised (core's per-batch time); mean over batches, "
        "percentiles of the same batches; loading and evaluation outside")
    metrics = [whole, core, latency]
    if stats.first_item_seconds:
        metrics.append(with_convention(
            _latency_metric(f"{stats.name}_time_to_first_token", stats.first_item_seconds, stats.window,
                            "prefill to the first generated token, per batch"),
            f"{per_batch}: copy to the device, prefill and the first generated token, synchronised; mean over "
            "batches"))
    if stats.cold_start_seconds is not None:
        extra = (f"; {stats.cold_start_non_inference:.3g} s of it the engine's non-inference work (a JIT compile)"
                 if stats.cold_start_non_inference else "")
        metrics.append(Metric(name=f"{stats.name}_cold_start_latency", value=stats.cold_start_seconds * 1e3,
                              unit="ms", iterations=1, chunks=1, statistic="single",
                              convention=f"the first {per_batch} through the freshly built model or engine, "
                                         "synchronised, before warm-up: one-time work (allocation, a JIT compile) "
                                         "inside",
                              note=f"the first batch of {config.batch_size} through the freshly built model or "
                                   f"engine, synchronised, before warm-up (one-time work inside){extra}"))
    if stats.accuracy is not None and not synthetic and accuracy_name:
        metrics.append(Metric(name=f"{stats.name}_{accuracy_name}", value=stats.accuracy, unit="fraction",
                              statistic="single",
                              iterations=stats.scored_items, window=list(stats.window),
                              convention=f"{accuracy_name}: the case's evaluator on the CPU, outputs against the "
                                         f"data's labels, over {stats.scored_items} {item}",
                              note=f"the case's evaluator on the CPU, over {stats.scored_items} items"))
    return metrics


def compute_metrics(stats: ComputeStats, config: InferenceConfig, ctx: CaseContext,
                    flops_per_item: float | None = None, precision: str | None = None) -> list[Metric]:
    """``<pass>_compute`` throughput (with MFU) and its per-forward latency, from a compute pass."""
    flops = config.flops if flops_per_item is None else flops_per_item
    precision = precision or config.precision
    ctx.windows.append(stats.window)
    what = (f"inputs resident on the device ({stats.resident_batches} batches cycled), forwards back to back, "
            f"timed by {stats.clock}")
    if stats.issue_seconds is not None:
        what += f"; issuing one forward takes the host {stats.issue_seconds * 1e3:.3g} ms"
    throughput = _checked(ctx.throughput_metric(
        f"{stats.name}_compute", [Chunk(1, s) for s in stats.seconds], stats.items_per_batch, config.item_name,
        flops_per_item=flops, precision=precision, flops_scope=config.flops_scope(),
        note=f"compute: {what}; {config.attention_statement()}"), stats.host_bound())
    throughput = with_convention(throughput, f"{config.item_name} / time of forwards back to back on inputs resident "
                                             f"on the device, by {stats.clock}: no copy, no host wait; "
                                             f"{config.attention_statement()}")
    latency = with_convention(
        _latency_metric(f"{stats.name}_compute_latency", stats.seconds, stats.window,
                        f"per batch of {config.batch_size}; {what}"),
        f"one forward of a batch of {config.batch_size} on resident inputs, by {stats.clock}; mean over forwards")
    return [throughput, latency]


def with_convention(metric: Metric, convention: str) -> Metric:
    """What the figure counts, for the report (which shows conventions, not notes), before any MFU convention
    the figure already has."""
    joined = f"{convention}; {metric.convention}" if metric.convention else convention
    return metric.model_copy(update={"convention": joined})


def _checked(metric: Metric, *known: str | None) -> Metric:
    """A headline far from its median, or an MFU above 100 %, carries a warning the report shows (after any
    ``known`` one)."""
    warnings = [w for w in known if w]
    if metric.p10 is not None and metric.p50 is not None and metric.p90 is not None:
        disagreement = mean_median_disagreement(metric.value, metric.p10, metric.p50, metric.p90)
        if disagreement:
            warnings.append(disagreement)
    if metric.mfu is not None and metric.mfu > 1.0:
        warnings.append(f"MFU {metric.mfu:.1%} is above 100 %: the FLOPs per item or the peak is wrong")
    return metric.model_copy(update={"warning": "; ".join(warnings)}) if warnings else metric


def _latency_metric(name: str, seconds: Sequence[float], window: tuple[float, float], note: str) -> Metric:
    """The mean latency (the headline), its percentiles, and a warning when the mean is far from the median
    (a few slow batches, as for a throughput headline)."""
    lat = latency_stats(seconds)
    warning = mean_median_disagreement(lat.mean * 1e3, percentile(seconds, 10) * 1e3, lat.p50 * 1e3, lat.p90 * 1e3)
    return Metric(name=name, value=lat.mean * 1e3, unit="ms", **latency_tail(lat, 1e3), iterations=lat.count,
                  chunks=lat.count, measured_seconds=sum(seconds), window=list(window), note=f"mean; {note}",
                  statistic="mean",
                  warning=warning.replace("headline", "mean (ms)", 1) if warning else None)
