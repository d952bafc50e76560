"""flagperf.results.metrics: counting conventions and statistics over timed chunks."""

from __future__ import annotations

import random
import statistics

import numpy as np
import pytest

from flagperf.results.metrics import (
    Chunk,
    coefficient_of_variation,
    copy_bytes,
    gemm_ops,
    percentile,
    rate_stats,
    ratio,
)


def test_gemm_ops() -> None:
    assert gemm_ops(1, 1, 1) == 2
    assert gemm_ops(2, 3, 4) == 48
    assert gemm_ops(4096, 4096, 4096) == 2 * 4096**3
    assert isinstance(gemm_ops(4096, 4096, 4096), int)


def test_copy_bytes_counts_read_and_write() -> None:
    assert copy_bytes(0) == 0
    assert copy_bytes(512 * 2**20) == 2**30


@pytest.mark.parametrize("seed", range(5))
def test_percentile_matches_numpy(seed: int) -> None:
    rng = random.Random(seed)
    values = [rng.uniform(-100, 100) for _ in range(rng.randint(1, 50))]
    for q in (0, 1, 10, 25, 33.3, 50, 75, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12, abs=1e-12)


def test_percentile_small_cases() -> None:
    assert percentile([5.0], 90) == 5.0
    assert percentile([1.0, 2.0], 50) == 1.5
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # order of the input does not matter
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 10) == pytest.approx(1.4)
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 100) == 5.0


def test_percentile_does_not_sort_in_place() -> None:
    values = [3.0, 1.0, 2.0]
    percentile(values, 50)
    assert values == [3.0, 1.0, 2.0]


@pytest.mark.parametrize(("values", "q"), [([], 50), ([1.0], -1), ([1.0], 100.1)])
def test_percentile_errors(values: list[float], q: float) -> None:
    with pytest.raises(ValueError):
        percentile(values, q)


def test_cv_matches_statistics() -> None:
    rng = random.Random(1)
    values = [rng.uniform(10, 20) for _ in range(30)]
    assert coefficient_of_variation(values) == pytest.approx(statistics.stdev(values) / statistics.mean(values))
    assert coefficient_of_variation([2.0, 4.0]) == pytest.approx(statistics.stdev([2, 4]) / 3)


@pytest.mark.parametrize("values", [[], [5.0], [-1.0, 1.0], [0.0, 0.0]])
def test_cv_none(values: list[float]) -> None:
    assert coefficient_of_variation(values) is None


def test_cv_of_constant_values_is_zero() -> None:
    assert coefficient_of_variation([3.0, 3.0, 3.0]) == 0.0


def test_rate_stats_value_is_total_work_over_total_time() -> None:
    # 10 iterations in 1 s (rate 10), 10 in 4 s (rate 2.5): the headline is 20/5 = 4, not the mean 6.25.
    chunks = [Chunk(10, 1.0), Chunk(10, 4.0)]
    stats = rate_stats(chunks, work_per_iteration=1.0)
    assert stats.value == pytest.approx(4.0)
    assert stats.value != pytest.approx((10 + 2.5) / 2)
    assert stats.p50 == pytest.approx(6.25)  # median of the chunk rates [10, 2.5]
    assert stats.p10 == pytest.approx(2.5 + 0.1 * 7.5)
    assert stats.p90 == pytest.approx(2.5 + 0.9 * 7.5)
    assert stats.cv == pytest.approx(statistics.stdev([10, 2.5]) / statistics.mean([10, 2.5]))
    assert (stats.chunks, stats.iterations, stats.seconds) == (2, 20, 5.0)


def test_rate_stats_work_and_scale() -> None:
    # A 1024^3 GEMM (2^31 FLOP) 100 times in 2 s is 107.37 GFLOP/s = 0.10737 TFLOPS.
    stats = rate_stats([Chunk(50, 1.0), Chunk(50, 1.0)], gemm_ops(1024, 1024, 1024), scale=1e12)
    assert stats.value == pytest.approx(100 * 2 * 1024**3 / 2.0 / 1e12)
    assert stats.p50 == pytest.approx(stats.value)
    assert stats.cv == 0.0


def test_rate_stats_ignores_empty_chunks() -> None:
    stats = rate_stats([Chunk(0, 0.0), Chunk(4, 2.0), Chunk(0, 3.0)], 1.0)
    assert (stats.value, stats.chunks, stats.iterations, stats.seconds) == (2.0, 1, 4, 2.0)
    assert stats.cv is None  # one chunk has no spread


def test_rate_stats_single_chunk_percentiles() -> None:
    stats = rate_stats([Chunk(3, 1.5)], 2.0)
    assert stats.value == stats.p10 == stats.p50 == stats.p90 == pytest.approx(4.0)


@pytest.mark.parametrize("seconds", [0.0, -1e-6])
def test_rate_stats_non_positive_duration(seconds: float) -> None:
    with pytest.raises(ValueError, match="non-positive duration"):
        rate_stats([Chunk(1, 1.0), Chunk(5, seconds)], 1.0)


@pytest.mark.parametrize("chunks", [[], [Chunk(0, 1.0)]])
def test_rate_stats_no_timed_chunks(chunks: list[Chunk]) -> None:
    with pytest.raises(ValueError, match="no timed chunks"):
        rate_stats(chunks, 1.0)


def test_ratio() -> None:
    assert ratio(50.0, 100.0) == 0.5
    assert ratio(150.0, 100.0) == 1.5
    assert ratio(1.0, None) is None
    assert ratio(1.0, 0.0) is None
    assert ratio(1.0, -3.0) is None


def test_mfu_reproduces_flagperfs_resnet50_figure() -> None:
    from flagperf.results.metrics import model_flops_utilisation

    # FlagPerf's resnet50 README: 4.12e9 FLOP per image, 12698.7 images/s on an A100 (312 TFLOPS fp16): 16.8 %.
    assert model_flops_utilisation(12698.7, 4.12e9, 312, "TFLOPS") == pytest.approx(0.1677, abs=1e-4)
    assert model_flops_utilisation(1.0, 1.0, None, "TFLOPS") is None
    assert model_flops_utilisation(1.0, 1.0, 10.0, "GB/s") is None


def test_throughput_metric_carries_mfu_against_the_precision_peak() -> None:
    import logging

    from flagperf.measure.casekit import CaseContext
    from flagperf.measure.timing import TimingPlan
    from flagperf.results.metrics import Chunk
    from flagperf.results.schema import SpecTable

    spec = SpecTable(device="X", peaks={"fp16": {"value": 2.0, "unit": "TFLOPS", "source": "test"}})
    ctx = CaseContext("cpu", spec, TimingPlan(0, 0.1, 1), logging.getLogger("t"), shares_host_memory=True)
    chunks = [Chunk(iterations=10, seconds=1.0), Chunk(iterations=10, seconds=1.0)]  # 64 items per iteration
    metric = ctx.throughput_metric("inference_core", chunks, 64, "samples", flops_per_item=1e9, precision="fp16")
    assert metric.value == pytest.approx(640.0) and metric.unit == "samples/s"  # 20 x 64 items in 2 s
    assert metric.mfu == pytest.approx(640.0 * 1e9 / 2e12)
    assert metric.mfu_peak_key == "fp16" and "MFU" in metric.convention
    assert ctx.throughput_metric("x", chunks, 64, "samples").mfu is None


def test_one_transformer_flops_convention_for_training_and_generation() -> None:
    from flagperf.results.metrics import TransformerFlops

    llama = TransformerFlops(matmul_parameters=1_000, layers=2, hidden=16)
    # Training: 6N + 12 x layers x hidden x seq_len per token (PaLM's count), i.e. 3 x the forward.
    assert llama.training_per_token(128) == 6 * 1_000 + 12 * 2 * 16 * 128
    assert llama.training_per_token(128) == 3 * llama.forward_per_token(128)
    # Generation: a 3-token prompt (3 tokens over 3) then 2 decode steps over 4 and 5 tokens.
    assert llama.generation(3, 3) == 3 * (2_000 + 4 * 2 * 16 * 3) + 2 * 2_000 + 4 * 2 * 16 * (4 + 5)
    assert llama.generation(3, 1) == 3 * llama.forward_per_token(3)  # the first output token is the prefill's
    assert "not counted" not in llama.convention
    bare = TransformerFlops(matmul_parameters=1_000)
    assert bare.training_per_token(128) == 6_000 and "attention not counted" in bare.convention
