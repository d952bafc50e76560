"""Metric arithmetic, defined once: work counting conventions and statistics over timed chunks."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

COPY_CONVENTION = (
    "bytes counted read + write: a copy of N bytes moves 2N bytes through memory "
    "(CUDA bandwidthTest convention; nvbandwidth counts N)"
)
TRANSFER_CONVENTION = "bytes counted once: a transfer of N bytes moves N bytes across the link"
GEMM_CONVENTION = "2*M*N*K operations per multiply of an MxK by a KxN matrix (one multiply-add = 2)"


# How a metric's value is formed from what was timed: one id per metric (Metric.statistic), the same in every
# family; the report shows it beside the figure and docs/results.md ("Conventions") explains each.
STATISTICS: dict[str, str] = {
    "rate": "total work / total timed seconds over every timed chunk (batch, level or point); p10/p50/p90 are "
            "percentiles of the chunks' own rates",
    "rate@median": "one call's work / the median of the single calls' latencies (operator benchmarks' "
                   "convention); p10 and p90 are the rates at the p90 and p10 latencies",
    "mean": "the mean over events (batches, requests or token gaps: the note says which); p10/p50/p90/p95/p99 are "
            "percentiles of the same events (a rate per event, as tokens/s per user, gives p10, its slow tail, "
            "and no p99)",
    "single": "one measurement (a duration, a size, a score or a count), no statistic over repeats",
    "loadgen": "MLPerf LoadGen's own figure for its scenario",
}


def gemm_ops(m: int, n: int, k: int) -> int:
    return 2 * m * n * k


def copy_bytes(nbytes: int) -> int:
    return 2 * nbytes


@dataclass(frozen=True)
class Chunk:
    """One timed window: ``iterations`` steps between two device synchronisations."""

    iterations: int
    seconds: float
    start: float = 0.0  # the timing clock's reading when the chunk began (places it in the run)


@dataclass(frozen=True)
class RateStats:
    value: float  # total work / total time: the headline, as FlagPerf reports it
    p50: float
    p10: float
    p90: float
    cv: float | None
    chunks: int
    iterations: int
    seconds: float


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default 'linear' method), q in [0, 100]."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def coefficient_of_variation(values: Sequence[float]) -> float | None:
    """Sample standard deviation / mean; None with fewer than two values or a zero mean."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    if mean == 0:
        return None
    return statistics.stdev(values) / mean


def rate_stats(chunks: Sequence[Chunk], work_per_iteration: float, scale: float = 1.0) -> RateStats:
    """Rates in ``work / second / scale`` (scale 1e12 gives TFLOPS for FLOPs)."""
    timed = [c for c in chunks if c.iterations > 0]
    if not timed:
        raise ValueError("no timed chunks")
    if any(c.seconds <= 0 for c in timed):
        raise ValueError("a timed chunk has a non-positive duration; the clock is too coarse for this step")
    rates = [work_per_iteration * c.iterations / c.seconds / scale for c in timed]
    total_iters = sum(c.iterations for c in timed)
    total_seconds = sum(c.seconds for c in timed)
    return RateStats(
        value=work_per_iteration * total_iters / total_seconds / scale,
        p50=percentile(rates, 50),
        p10=percentile(rates, 10),
        p90=percentile(rates, 90),
        cv=coefficient_of_variation(rates),
        chunks=len(timed),
        iterations=total_iters,
        seconds=total_seconds,
    )


@dataclass(frozen=True)
class LatencyStats:
    """Per-request (per-batch) latencies in seconds: the mean and the tail."""

    mean: float
    p50: float
    p90: float
    p99: float
    count: int
    p95: float = 0.0
    std: float = 0.0  # sample standard deviation; 0 for a single value


# The tail every mean-latency metric records (inference in ms, generate and serving in s): one set, so a p95 or a
# spread is never missing from one family's latency and present in another's. Operation's latencies are medians
# with p10/p90 (its own statistic), not this.
LATENCY_PERCENTILES = ("p50/p90/p95/p99 linear-interpolated between closest ranks (numpy's default); std the sample "
                       "standard deviation")


def latency_tail(stats: LatencyStats, scale: float = 1.0) -> dict[str, float]:
    """The percentiles and spread of a latency metric (Metric fields), in seconds times ``scale``."""
    return {"p50": stats.p50 * scale, "p90": stats.p90 * scale, "p95": stats.p95 * scale,
            "p99": stats.p99 * scale, "std": stats.std * scale}


def latency_stats(seconds: Sequence[float]) -> LatencyStats:
    if not seconds:
        raise ValueError("no latencies")
    return LatencyStats(mean=statistics.fmean(seconds), p50=percentile(seconds, 50), p90=percentile(seconds, 90),
                        p99=percentile(seconds, 99), count=len(seconds), p95=percentile(seconds, 95),
                        std=statistics.stdev(seconds) if len(seconds) > 1 else 0.0)


def mean_median_disagreement(value: float, p10: float, p50: float, p90: float, floor: float = 0.05) -> str | None:
    """Why a headline (total work / total time) is not what a typical chunk did, or None when it is.

    The robust spread is half the p10-p90 range relative to the median (a few outliers cannot widen it, as
    they widen the coefficient of variation); a headline further from the median than that spread, or than
    ``floor``, says a few slow or fast chunks dominate the total."""
    if p50 <= 0:
        return None
    spread = max((p90 - p10) / 2 / p50, floor)
    gap = abs(value - p50) / p50
    if gap <= spread:
        return None
    return (f"headline {value:.4g} and median {p50:.4g} differ by {gap:.0%}, beyond the chunks' spread "
            f"(±{spread:.0%} of the median, from p10-p90): a few outlying chunks dominate the total")


PEAK_SCALE = {"TFLOPS": 1e12, "TOPS": 1e12}

# One FLOPs convention for transformer models in every family (training, inference, generate): stated in each
# result that uses it, so an MFU reads the same wherever it is shown.
TRANSFORMER_FLOPS_CONVENTION = (
    "per token processed (prefill and decode alike): 2 x N for the forward pass (N: parameters in matrix "
    "products; input embedding tables, which are looked up, excluded unless tied to the output head) + "
    "4 x layers x hidden x context for attention (QK^T and AV; context: the whole sequence for a prompt or a "
    "training sequence (PaLM's count, full not causal), the tokens up to and including it for a decoded "
    "token); training "
    "is 3 x forward: 6 x N + 12 x layers x hidden x seq_len")
NO_ATTENTION_NOTE = "; attention not counted here (the model's layers and hidden size were not given)"


@dataclass(frozen=True)
class TransformerFlops:
    """A transformer's FLOPs under TRANSFORMER_FLOPS_CONVENTION. Without layers and hidden size the
    attention term is 0, and the convention says so."""

    matmul_parameters: int
    layers: int | None = None
    hidden: int | None = None

    @property
    def convention(self) -> str:
        """The rule and the counts it was applied to, so the FLOPs rebuild by hand from the result alone."""
        counts = f"; here N = {self.matmul_parameters}" + (f", layers = {self.layers}, hidden = {self.hidden}"
                                                             if self.layers and self.hidden else "")
        return TRANSFORMER_FLOPS_CONVENTION + ("" if self.layers and self.hidden else NO_ATTENTION_NOTE) + counts

    def _attention(self, context: float) -> float:
        return 4.0 * self.layers * self.hidden * context if self.layers and self.hidden else 0.0

    def forward_per_token(self, context: float) -> float:
        return 2.0 * self.matmul_parameters + self._attention(context)

    def training_per_token(self, seq_len: int) -> float:
        """Forward and backward (twice the forward) of one token of a seq_len-long training sequence."""
        return 3.0 * self.forward_per_token(seq_len)

    def generation(self, prompt_tokens: int, output_tokens: int) -> float:
        """One request: the prefill of its prompt (every prompt token over the whole prompt, which also yields
        the first output token), then output_tokens - 1 decode steps, step i over prompt + i tokens."""
        prefill = prompt_tokens * self.forward_per_token(prompt_tokens)
        steps = max(output_tokens - 1, 0)
        contexts = steps * prompt_tokens + steps * (steps + 1) / 2
        return prefill + steps * 2.0 * self.matmul_parameters + self._attention(contexts)


def model_flops_utilisation(items_per_s: float, flops_per_item: float, peak: float | None, peak_unit: str,
                            dense: bool = True) -> float | None:
    """MFU = flops per item x items per second / peak FLOP/s (FlagPerf's definition, computed once here). The peak
    is one device's dense figure: a sparse (2:4) one is twice it, so there is no MFU against it, as no ratio."""
    if peak is None or peak <= 0 or peak_unit not in PEAK_SCALE or not dense:
        return None
    return flops_per_item * items_per_s / (peak * PEAK_SCALE[peak_unit])


def ratio(measured: float, peak: float | None) -> float | None:
    if peak is None or peak <= 0:
        return None
    return measured / peak
