"""The one timed loop of inference (validation and engine inference both use it), so cases write no timers.

FlagPerf's definitions, per pass (``repeat`` times over the data loader):
  whole = items / (wall time of all batches - non-inference time): data loading, host-device copies,
          the forward and the evaluation are all inside.
  core  = items / sum over batches of (synchronised forward time - non-inference time): the device is
          synchronised before and after each batch, the copy of the inputs to the device is inside (as
          in FlagPerf), loading and evaluation are outside.
Per-batch core times give the latency percentiles. A case whose forward yields (a decoding loop yields
after every generated token) also gets its time to the first yield: the time to first token.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from flagperf.inference.config import InferenceConfig
from flagperf.measure.casekit import CaseContext
from flagperf.results.metrics import Chunk, latency_stats
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


def _consume(result: Any, sync: Callable[[], None], started: float) -> tuple[Any, float | None]:
    """The outputs of a forward, and for a generator the time to its first value (synchronised)."""
    if not isinstance(result, Iterator):
        return result, None
    first: float | None = None
    last: Any = None
    for value in result:
        if first is None:
            sync()
            first = time.perf_counter() - started
        last = value
    return last, first


def timed_pass(name: str, loader: Iterable[Batch], forward: Forward, evaluator: Evaluator | None,
               sync: Callable[[], None], config: InferenceConfig, log: logging.Logger,
               to_device: Callable[[list[torch.Tensor]], list[torch.Tensor]] = lambda x: x) -> PassStats:
    """Warm-up batches (untimed), then ``config.repeat`` timed passes over the loader."""
    stats: PassStats | None = None
    with torch.inference_mode():
        for warm, (inputs, _labels) in enumerate(loader):
            if warm >= config.warmup_batches:
                break
            result, _ = forward(to_device(as_inputs(inputs)))
            _consume(result, sync, time.perf_counter())
        sync()
        start_epoch, start = time.time(), time.perf_counter()
        for rep in range(config.repeat):
            for inputs, labels in loader:
                x = as_inputs(inputs)
                if stats is None:
                    stats = PassStats(name, items_per_batch=x[0].shape[0] * config.items_per_sample())
                elif x[0].shape[0] * config.items_per_sample() != stats.items_per_batch:
                    raise ValueError(f"{name}: batches differ in size; the data loader must drop the last "
                                     "partial batch (drop_last=True), as FlagPerf's do")
                sync()
                t0 = time.perf_counter()
                result, non_inference = forward(to_device(x))
                outputs, first = _consume(result, sync, t0)
                sync()
                foo = non_inference() if callable(non_inference) else non_inference
                core = time.perf_counter() - t0 - foo
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
        sync()
        if stats is None:
            raise ValueError(f"{name}: the data loader yielded no batches")
        stats.wall_seconds = time.perf_counter() - start
        stats.window = (start_epoch, start_epoch + stats.wall_seconds)
    return stats


def pass_metrics(stats: PassStats, config: InferenceConfig, ctx: CaseContext, *, synthetic: bool,
                 accuracy_name: str | None) -> list[Metric]:
    """FlagPerf's whole and core throughput (MFU on core), latency percentiles, time to first item,
    and the evaluator's accuracy (never on synthetic inputs)."""
    item = config.item_name
    ctx.windows.append(stats.window)
    whole = ctx.throughput_metric(
        f"{stats.name}_whole", [Chunk(stats.batches, stats.whole_seconds)], stats.items_per_batch, item,
        note="FlagPerf's whole: data loading, copies, forward and evaluation, minus engine non-inference time")
    # Only core carries MFU: it is the compute rate FlagPerf divides by the peak.
    core = ctx.throughput_metric(
        f"{stats.name}_core", [Chunk(1, s) for s in stats.core_seconds], stats.items_per_batch, item,
        flops_per_item=config.flops, precision=config.precision,
        note="FlagPerf's core: synchronised input copy + forward per batch")
    metrics = [whole, core, _latency_metric(f"{stats.name}_latency", stats.core_seconds, stats.window,
                                            f"per batch of {config.batch_size}, synchronised")]
    if stats.first_item_seconds:
        metrics.append(_latency_metric(f"{stats.name}_time_to_first_token", stats.first_item_seconds, stats.window,
                                       "prefill to the first generated token, per batch"))
    if stats.accuracy is not None and not synthetic and accuracy_name:
        metrics.append(Metric(name=f"{stats.name}_{accuracy_name}", value=stats.accuracy, unit="fraction",
                              iterations=stats.scored_items, window=list(stats.window),
                              note=f"the case's evaluator on the CPU, over {stats.scored_items} items"))
    return metrics


def _latency_metric(name: str, seconds: Sequence[float], window: tuple[float, float], note: str) -> Metric:
    lat = latency_stats(seconds)
    return Metric(name=name, value=lat.mean * 1e3, unit="ms", p50=lat.p50 * 1e3, p90=lat.p90 * 1e3,
                  p99=lat.p99 * 1e3, iterations=lat.count, chunks=lat.count, measured_seconds=sum(seconds),
                  window=list(window), note=f"mean; {note}")
