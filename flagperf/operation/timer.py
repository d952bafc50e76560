"""Timing one operator call the way operator benchmarks do (Triton's do_bench, TritonBench): warm-up by time,
then each iteration timed on its own with the device's clock (flagperf.measure.device: events on an
accelerator, the host clock on the CPU), the cache emptied before each (option), the call replayed from a
device graph (option, where the device has graphs); median and p10/p90 over the iterations, their spread
(p90 - p10) / (2 x median), and the clock's floor: what it measures for an empty interval, beside which a call
too short to time shows."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from flagperf.measure.device import device_clock, device_module, synchronize
from flagperf.results.metrics import percentile

FALLBACK_CACHE_BYTES = 64 * 2**20  # when the device does not say how large its last-level cache is
CLOCK_FLOOR_SAMPLES = 64  # empty intervals whose median is the clock's floor
NEAR_FLOOR_SHARE = 0.1  # a floor over 10% of the median: the timer's own cost is a tenth of the figure or more


@dataclass(frozen=True)
class TimingOptions:
    warmup_s: float
    rep_s: float
    min_iters: int
    max_iters: int
    flush_cache: bool
    graphs: bool


@dataclass(frozen=True)
class Timed:
    latencies: list[float]
    window: tuple[float, float]  # epoch seconds of the timed iterations
    graphs: bool
    warmup_calls: int = 0
    clock_floor: float = 0.0  # the median the clock measures between two marks with nothing between them

    @property
    def median(self) -> float:
        return percentile(self.latencies, 50)

    @property
    def p10(self) -> float:
        return percentile(self.latencies, 10)

    @property
    def p90(self) -> float:
        return percentile(self.latencies, 90)

    @property
    def spread(self) -> float:
        """(p90 - p10) / (2 x median): the +- noise of one timed iteration around the median, which a few
        outliers (a preempted iteration) do not inflate as they do a standard deviation."""
        return iteration_spread(self.median, self.p10, self.p90)

    @property
    def near_clock_floor(self) -> bool:
        """The clock's own floor is over NEAR_FLOOR_SHARE of the median: the timer's cost is in the figure."""
        return self.clock_floor > NEAR_FLOOR_SHARE * self.median


def iteration_spread(median: float, p10: float, p90: float) -> float:
    return (p90 - p10) / (2 * median)


def clock_floor(clock: Any, device: torch.device) -> float:
    """The median time ``clock`` measures for nothing between its two marks (its resolution and the cost of
    marking): a call that takes about as long cannot be told from the timer."""
    synchronize(device)
    marks = [(clock.mark(), clock.mark()) for _ in range(CLOCK_FLOOR_SAMPLES)]
    synchronize(device)
    return max(0.0, percentile([clock.seconds(begin, end) for begin, end in marks], 50))


def last_level_cache_bytes(device: torch.device) -> tuple[int | None, str]:
    """The device's last-level cache, and where the figure came from."""
    module = device_module(device)
    if module is not None:
        props = module.get_device_properties(device) if hasattr(module, "get_device_properties") else None
        size = getattr(props, "L2_cache_size", None)
        return (int(size), "L2_cache_size of the device properties") if size else (None, "not reported")
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    return (best, "the largest cache of /sys/devices/system/cpu/cpu0/cache") if best else (None, "not reported")


class CacheFlush:
    """A buffer twice the last-level cache, written between timed iterations so that no iteration finds its
    inputs cached by the one before (outside the timed region)."""

    def __init__(self, device: torch.device) -> None:
        size, source = last_level_cache_bytes(device)
        nbytes = 2 * (size or FALLBACK_CACHE_BYTES)
        self.buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self.description = (f"a {nbytes / 2**20:.0f} MiB buffer written between iterations (twice the last-level "
                            f"cache: {source}" + (f", {size / 2**20:.1f} MiB)" if size else
                                                  f"; {FALLBACK_CACHE_BYTES / 2**20:.0f} MiB assumed)"))

    def __call__(self) -> None:
        self.buffer.zero_()


def graph_support(device: torch.device) -> str | None:
    """Why graphs cannot be used on ``device``, or None."""
    module = device_module(device)
    if module is None:
        return "the CPU has no device graphs (calls are timed as they are)"
    if not (hasattr(module, "CUDAGraph") and hasattr(module, "graph")):
        return f"torch.{device.type} has no graph capture"
    return None


def _graphed(call: Callable[[], Any], device: torch.device) -> Callable[[], Any]:
    module = device_module(device)
    assert module is not None
    stream = module.Stream()
    stream.wait_stream(module.current_stream())
    with module.stream(stream):  # the warm-up a capture needs, on a side stream
        call()
    module.current_stream().wait_stream(stream)
    graph = module.CUDAGraph()
    with module.graph(graph):
        call()
    synchronize(device)
    return graph.replay


def time_call(call: Callable[[], Any], device: torch.device, options: TimingOptions,
              flush: Callable[[], None] | None) -> Timed:
    """Warm ``call`` up for options.warmup_s (each call waited for, so the estimate is the device's time), then
    time rep_s worth of iterations (between min_iters and max_iters), each between two clock marks. With a
    flush, the warm-up flushes before each call too (as Triton's do_bench estimates), so that the estimate is
    of an iteration as timed and rep_s bounds the timed loop's wall time: a flush far longer than the call
    would otherwise multiply it by up to max_iters."""
    started = time.perf_counter()
    calls = 0
    while calls == 0 or time.perf_counter() - started < options.warmup_s:
        if flush is not None:
            flush()
        call()
        synchronize(device)
        calls += 1
    one = max((time.perf_counter() - started) / calls, 1e-9)
    graphs = options.graphs and graph_support(device) is None
    step = _graphed(call, device) if graphs else call
    iterations = min(options.max_iters, max(options.min_iters, math.ceil(options.rep_s / one)))
    clock = device_clock(device)
    marks: list[tuple[Any, Any]] = []
    synchronize(device)
    epoch_start = time.time()
    for _ in range(iterations):
        if flush is not None:
            flush()
        begin = clock.mark()
        step()
        marks.append((begin, clock.mark()))
    synchronize(device)
    epoch_end = time.time()
    latencies = [clock.seconds(begin, end) for begin, end in marks]
    if any(t <= 0 for t in latencies):
        raise RuntimeError(f"{clock.name} measured a non-positive time for a call: too coarse for this operator")
    return Timed(latencies=latencies, window=(epoch_start, epoch_end), graphs=graphs, warmup_calls=calls,
                 clock_floor=clock_floor(clock, device))
