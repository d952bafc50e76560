"""Timing one operator call the way operator benchmarks do (Triton's do_bench, TritonBench): warm-up by time,
then each iteration timed on its own with the device's clock (flagperf.measure.device: events on an
accelerator, the host clock on the CPU), the cache emptied before each (option), the call replayed from a
device graph (option, where the device has graphs); median and p10/p90 over the iterations, their spread
(p90 - p10) / (2 x median), the median's 95% confidence interval (order statistics), and the clock's floor: what
it measures for an empty interval, beside which a call too short to time shows (time_iterations). The last timed
iteration's output (a graph's replay where graphs are on) is handed back for the caller to check before anything
else runs: the call that was timed is the call that was checked, not only the first one.

Then, a phase of its own (time_host), the host's time per call: the same number of calls back to back, with no
flush and one synchronisation at the end, on the host clock (FlagPerf's ``cputime``), which includes what the
device clock leaves out: the Python wrapper and dispatch before each kernel (a flush queued before each timed
call hides them on an accelerator). That loop's window holds the calls and nothing else (no flush, no rewarm),
but lasts rep_s at most (capped by max_iters), under one monitor interval: where the case asks for it
(energy_intervals), a third phase (time_energy) calls back to back for a given number of seconds, several monitor
intervals, whatever max_iters says, and the point's energy per call is taken over that loop, which has the
monitors' samples inside it."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

# MEMORY_SIDE_CACHE: the spec-table key of a cache on the memory side of the L2 (AMD's Infinity Cache: 256 MiB on an
# MI300X), which torch does not report: where a vendor declares it, it is the last level the flush is twice of
from flagperf.config.memory import MEMORY_SIDE_CACHE
from flagperf.measure.device import device_clock, device_module, synchronize
from flagperf.operation.config import ACCELERATOR_FLUSH_FLOOR
from flagperf.results.metrics import percentile

FALLBACK_CACHE_BYTES = 64 * 2**20  # when the device does not say how large its last-level cache is
CLOCK_FLOOR_SAMPLES = 64  # empty intervals whose median is the clock's floor
NEAR_FLOOR_SHARE = 0.1  # a floor over 10% of the median: the timer's own cost is a tenth of the figure or more
MEDIAN_CONFIDENCE = 0.95  # of the median's interval (order statistics)
# A call this many times its flush is timed without the rewarm: what the rewarm brings back (the call's code and
# state, ~0.1 ms on a CPU) is lost in it, and the rewarm would double every iteration of a slow point.
REWARM_SLOW_CALL = 10.0


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
    host_latency: float | None = None  # host wall time per call of host_calls back-to-back calls
    host_calls: int = 0
    host_window: tuple[float, float] | None = None  # epoch seconds of the host loop: the calls and nothing else
    energy_calls: int = 0
    energy_window: tuple[float, float] | None = None  # epoch seconds of the energy loop (time_energy)
    rewarm_dropped: bool = False  # a rewarm was given and left out: the call is over REWARM_SLOW_CALL x the flush

    @property
    def median_interval(self) -> tuple[float, float] | None:
        """The median's MEDIAN_CONFIDENCE confidence interval over the iterations (order statistics); None
        with too few iterations for one."""
        return median_interval(self.latencies)

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


def median_ranks(n: int, confidence: float = MEDIAN_CONFIDENCE) -> int:
    """The 1-based rank j such that the j-th and (n + 1 - j)-th smallest of n values bound the median with at
    least ``confidence``: the interval misses it with probability 2 P(Binomial(n, 1/2) <= j - 1), whatever the
    distribution (iterations independent). Under 6 values no pair reaches 95%: 1, the smallest and the largest
    (coverage 1 - 2^(1-n), which median_interval does not call a 95% interval)."""
    tail = (1 - confidence) / 2
    below = 0.0  # P(Binomial(n, 1/2) <= k)
    j = 1
    for k in range((n + 1) // 2):
        below += math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + n * math.log(0.5))
        if below > tail:
            break
        j = k + 1
    return j


def median_interval(values: list[float], confidence: float = MEDIAN_CONFIDENCE) -> tuple[float, float] | None:
    """The median's confidence interval: the order statistics of median_ranks (deterministic, no resampling).
    None where even the smallest and largest value cover the median less than ``confidence`` (under 6 values
    at 95%: 2 cover 50%, 1 nothing): an interval labelled 95% must be one, and the reports then fall back to
    the iterations' spread."""
    if 1 - 2 * 0.5 ** len(values) < confidence:
        return None
    ordered = sorted(values)
    j = median_ranks(len(ordered), confidence)
    return ordered[j - 1], ordered[len(ordered) - j]


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


def shares_host_caches(device: torch.device) -> bool:
    """The device's caches are the host's (a device without a torch device module: the CPU), so a flush of them
    empties the host's too: the call's code, the interpreter's and the libraries' state, and a thread pool left
    idle by the flush's length."""
    return device_module(device) is None


def flush_bytes(cache_bytes: int | None, accelerator: bool, memory_side_bytes: int | None = None) -> int:
    """The flush buffer: twice the last-level cache (the larger of the reported one and a declared memory-side
    one; FALLBACK_CACHE_BYTES where neither), and on an accelerator at least ACCELERATOR_FLUSH_FLOOR."""
    size = 2 * (max(cache_bytes or 0, memory_side_bytes or 0) or FALLBACK_CACHE_BYTES)
    return max(size, ACCELERATOR_FLUSH_FLOOR) if accelerator else size


def flush_description(cache_bytes: int | None, source: str, accelerator: bool,
                      memory_side: tuple[int, str] | None = None) -> str:
    """The round's ``flush`` line for a flush of flush_bytes: its size and why (``memory_side``: the memory-side
    cache's bytes and where the figure came from)."""
    side_bytes, side_source = memory_side or (None, "")
    nbytes = flush_bytes(cache_bytes, accelerator, side_bytes)
    if side_bytes and side_bytes >= (cache_bytes or 0):
        last: int | None = side_bytes
        cache = f"the memory-side cache behind the L2: {MEMORY_SIDE_CACHE} of the vendor's spec table ({side_source})"
    else:
        last, cache = cache_bytes, source
    floored = nbytes > 2 * (last or FALLBACK_CACHE_BYTES)
    return (f"a {nbytes / 2**20:.0f} MiB buffer written between iterations ("
            + (f"Triton's do_bench {ACCELERATOR_FLUSH_FLOOR / 2**20:.0f} MiB, more than " if floored else "")
            + f"twice the last-level cache: {cache}"
            + (f", {last / 2**20:.1f} MiB)" if last else f"; {FALLBACK_CACHE_BYTES / 2**20:.0f} MiB assumed)")
            + ("" if accelerator else "; the device's caches are the host's, so each flush is followed by one "
               "untimed call on a copy of the inputs, which brings back the call's code, state and threads and "
               "leaves its inputs and output cold"))


class CacheFlush:
    """A buffer twice the last-level cache, written between timed iterations so that no iteration finds its
    inputs cached by the one before (outside the timed region). Where the device's caches are the host's
    (``rewarm``), the timer then makes one call on a copy of the inputs (time_call's ``rewarm``): it brings back
    all the call touches but its inputs, so the timed call finds only its inputs (and output) cold, as a
    device's flush leaves the host's caches alone. Without it the CPU's timed call paid for its whole path
    coming back from memory: a 3 us native embedding read 130 us, a 30 us compiled one 340 us."""

    def __init__(self, device: torch.device, memory_side: tuple[int, str] | None = None) -> None:
        """``memory_side``: a cache behind the L2 the vendor's spec table declares (bytes, where from)."""
        size, source = last_level_cache_bytes(device)
        self.rewarm = shares_host_caches(device)
        self.nbytes = flush_bytes(size, not self.rewarm, memory_side[0] if memory_side else None)
        self.description = flush_description(size, source, not self.rewarm, memory_side)
        self.buffer = torch.empty(self.nbytes, dtype=torch.uint8, device=device)

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
    """A replay of ``call`` captured once, returning the output the capture allocated (each replay writes its
    result there), so that what a replay computed is what gets checked."""
    module = device_module(device)
    assert module is not None
    stream = module.Stream()
    stream.wait_stream(module.current_stream())
    with module.stream(stream):  # the warm-up a capture needs, on a side stream
        call()
    module.current_stream().wait_stream(stream)
    graph = module.CUDAGraph()
    with module.graph(graph):
        static = call()
    synchronize(device)

    def replay() -> Any:
        graph.replay()
        return static

    return replay


def _flushed(flush: Callable[[], None] | None, rewarm: Callable[[], Any] | None) -> Any:
    """Flush, then the rewarm call; its result, for the caller to hold over the timed call."""
    if flush is None:
        return None
    flush()
    return rewarm() if rewarm is not None else None


def time_iterations(call: Callable[[], Any], device: torch.device, options: TimingOptions,
                    flush: Callable[[], None] | None, rewarm: Callable[[], Any] | None = None,
                    last_output: list[Any] | None = None) -> Timed:
    """Warm ``call`` up for options.warmup_s (each call waited for, so the estimate is the device's time), then
    time rep_s worth of iterations (between min_iters and max_iters), each between two clock marks. With a
    flush, the warm-up flushes before each call too (as Triton's do_bench estimates), so that the estimate is
    of an iteration as timed and rep_s bounds the timed loop's wall time: a flush far longer than the call
    would otherwise multiply it by up to max_iters. ``rewarm`` (with a flush): a call on a copy of the inputs
    after each flush (CacheFlush.rewarm), its result held until the timed call is done, so that the timed call's
    output is not written where the rewarm's just was.

    A call over REWARM_SLOW_CALL x its flush (the first warm-up call's) drops the rewarm: it would double each
    iteration for a difference lost in the call (Timed.rewarm_dropped).

    ``last_output``: the last timed iteration's output (a graph's replay: the output its capture allocated) is
    appended to it once the device is done, and no call of ``call`` follows here, so that the caller checks it
    before the host phase (time_host) calls again: an implementation that reuses its output buffer (a cached
    ``out``; torch.compile's CUDA graph trees, whose next replay overwrites the last one's output in place: torch
    2.13 hands back the same cached tensor, so a stale read does not raise but silently reads the newer values,
    and this call order is the protection) must be checked on the call that was timed. The call that was checked
    first is not always the one timed: a graph replays what it
    captured, a library may cache or switch kernels. The Timed has no host figures: time_host adds them."""
    started = time.perf_counter()
    calls = 0
    dropped = False
    if flush is not None and rewarm is not None:  # the first warm-up call: the flush's time against the call's
        begin = time.perf_counter()
        flush()
        flushed = time.perf_counter()
        held = rewarm()
        synchronize(device)
        ready = time.perf_counter()
        call()
        synchronize(device)
        del held
        calls = 1
        if time.perf_counter() - ready > REWARM_SLOW_CALL * (flushed - begin):
            rewarm, dropped = None, True
    while calls == 0 or time.perf_counter() - started < options.warmup_s:
        held = _flushed(flush, rewarm)
        call()
        synchronize(device)
        del held
        calls += 1
    one = max((time.perf_counter() - started) / calls, 1e-9)
    graphs = options.graphs and graph_support(device) is None
    step = _graphed(call, device) if graphs else call
    iterations = min(options.max_iters, max(options.min_iters, math.ceil(options.rep_s / one)))
    clock = device_clock(device)
    marks: list[tuple[Any, Any]] = []
    synchronize(device)
    epoch_start = time.time()
    output: Any = None
    for _ in range(iterations):
        output = None  # the last iteration's output is freed before the flush, as before the next call
        held = _flushed(flush, rewarm)
        begin = clock.mark()
        output = step()
        marks.append((begin, clock.mark()))
        del held  # freed only now: the timed call's output went elsewhere than the rewarm's
    synchronize(device)
    epoch_end = time.time()
    if last_output is not None:
        last_output.append(output)
    del output
    latencies = [clock.seconds(begin, end) for begin, end in marks]
    if any(t <= 0 for t in latencies):
        raise RuntimeError(f"{clock.name} measured a non-positive time for a call: too coarse for this operator")
    return Timed(latencies=latencies, window=(epoch_start, epoch_end), graphs=graphs, warmup_calls=calls,
                 clock_floor=clock_floor(clock, device), rewarm_dropped=dropped)


def time_host(call: Callable[[], Any], device: torch.device, options: TimingOptions, timed: Timed) -> Timed:
    """The host's time per call, added to ``timed``: as many calls of ``call`` itself (never a graph's replay,
    which skips the host's work) back to back as were timed, at most rep_s worth by the timed median (at least
    one), no flush, one synchronisation at the end; the wall time over the count. On an accelerator the larger of
    the host's cost per call and the device's time (the host queues ahead); on the CPU, where the device's clock
    is the host's, the same calls with their caches warm. That loop's epoch window (Timed.host_window) holds the
    calls and nothing else: the energy per call is taken over it."""
    # rep_s worth by the timed median: a slow point's host loop must not take as long again as its timed one
    host_calls = min(len(timed.latencies), max(1, math.ceil(options.rep_s / timed.median)))
    synchronize(device)
    host_epoch = time.time()
    host_started = time.perf_counter()
    for _ in range(host_calls):
        call()
    synchronize(device)
    host_elapsed = time.perf_counter() - host_started
    return replace(timed, host_latency=host_elapsed / host_calls, host_calls=host_calls,
                   host_window=(host_epoch, host_epoch + host_elapsed))


def time_energy(call: Callable[[], Any], device: torch.device, seconds: float, timed: Timed) -> Timed:
    """The energy loop, added to ``timed``: calls of ``call`` back to back until ``seconds`` have passed on the host
    clock (at least one; no count cap: it must outlast several monitor intervals whatever the call takes), then one
    synchronisation, so the device's last queued calls end inside the window too. A clock read per call (tens of ns)
    rather than a count from the host latency: a count would miss the length where the rate changes (a clock that
    boosts or throttles under sustained load, which is what this loop is there to see)."""
    synchronize(device)
    epoch = time.time()
    started = time.perf_counter()
    calls = 0
    while calls == 0 or time.perf_counter() - started < seconds:
        call()
        calls += 1
    synchronize(device)
    elapsed = time.perf_counter() - started
    return replace(timed, energy_calls=calls, energy_window=(epoch, epoch + elapsed))


def time_call(call: Callable[[], Any], device: torch.device, options: TimingOptions,
              flush: Callable[[], None] | None, rewarm: Callable[[], Any] | None = None) -> Timed:
    """Both phases, with no output to check between them (the driver runs them apart: it checks the last timed
    output in between)."""
    return time_host(call, device, options, time_iterations(call, device, options, flush, rewarm))
