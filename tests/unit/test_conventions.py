"""One figure per family rebuilt by hand from a real CPU round's raw records, with the formulas of the docs'
Conventions (docs/results.md) written out here, not called from the code that made the figure; and every
metric of every family states its statistic, with a `rate` equal to its work / its timed seconds."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest
from rounds import run_local_round

from flagperf.config.vendors import load_vendor
from flagperf.measure.perflog import parse_file
from flagperf.results.metrics import STATISTICS, model_flops_utilisation
from flagperf.results.schema import Metric, RoundResult, read_result


@pytest.fixture(autouse=True)
def _work_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAGPERF_WORK_ROOT", str(tmp_path / "work"))


def fp32_peak_flops() -> float:
    peak = load_vendor("cpu").spec_table().peaks["fp32"]
    assert peak.unit == "TFLOPS" and peak.value
    return peak.value * 1e12


def round_of(tmp_path: Path, case: str, *sets: str) -> tuple[RoundResult, Path]:
    code, out = run_local_round(tmp_path, case, *sets)
    result = read_result(out / "result.json")
    assert code == 0 and result.status == "success", result.failure
    return result, out


def stated(result: RoundResult) -> dict[str, Metric]:
    """Every metric states a known statistic; a rate with its work is exactly that work over its timed seconds."""
    for m in result.metrics:
        assert m.statistic in STATISTICS, (m.name, m.statistic)
        if m.statistic == "rate" and m.work is not None:
            assert m.value == pytest.approx(m.work / m.measured_seconds, rel=1e-9), m.name
    return {m.name: m for m in result.metrics}


def test_base_gemm_is_two_m_n_k_per_multiply_over_the_timed_seconds(tmp_path: Path) -> None:
    result, _ = round_of(tmp_path, "computation-FP32", "m=96", "n=64", "k=80", "warmup_iters=1",
                         "min_duration_s=0.2", "min_iters=3", "devices=one")
    gemm = stated(result)["gemm_fp32"]
    assert gemm.statistic == "rate" and gemm.unit == "TFLOPS"
    assert gemm.value == pytest.approx(2 * 96 * 64 * 80 * gemm.iterations / gemm.measured_seconds / 1e12, rel=1e-12)


def test_inference_core_latency_and_mfu_from_latencies_json(tmp_path: Path) -> None:
    result, out = round_of(tmp_path, "digits-infer")
    metrics = stated(result)
    raw = json.loads((out / "latencies.json").read_text())["inference"]
    core_s, items = raw["core_s"], raw["batch_items"]
    items = items * len(core_s) if isinstance(items, int) else sum(items)
    core = metrics["inference_core"]
    assert core.value == pytest.approx(items / sum(core_s), rel=1e-12)  # items / summed per-batch seconds
    assert core.mfu == pytest.approx(result.inference.flops_per_item * core.value / fp32_peak_flops(), rel=1e-12)
    latency = metrics["inference_latency"]
    assert (latency.statistic, latency.unit) == ("mean", "ms")
    assert latency.value == pytest.approx(statistics.fmean(core_s) * 1e3, rel=1e-12)


def test_training_tokens_and_mfu_from_the_perflog(tmp_path: Path) -> None:
    result, out = round_of(tmp_path, "llama-pretrain", "synthetic_sequences=16", "max_epochs=1", "batch_size=8",
                           "cpu_threads=1")
    metrics = stated(result)
    finished = parse_file(out / "rank0.out.log").finished()[0]
    extra = finished["extra"]
    throughput = metrics["training_throughput"]
    assert throughput.value == pytest.approx(extra["timed_samples"] / finished["raw_train_time"], rel=1e-12)
    tokens = metrics["tokens_per_s"]
    # The tiny preset: 2 layers, hidden 128, sequence 64; N read from the convention the result states.
    n = int(re.search(r"here N = (\d+), layers = 2, hidden = 128", tokens.convention).group(1))
    per_token = 6 * n + 12 * 2 * 128 * 64
    assert tokens.value == pytest.approx(extra["timed_samples"] * 64 / finished["raw_train_time"], rel=1e-12)
    assert tokens.mfu == pytest.approx(per_token * tokens.value / fp32_peak_flops(), rel=1e-12)  # one process


def test_generate_level_tokens_and_mfu_from_the_config(tmp_path: Path) -> None:
    prompt, output, requests = 8, 4, 4
    result, _ = round_of(tmp_path, "tiny-llama-generate", f"input_len={prompt}", f"max_new_tokens={output}",
                         "concurrency=[2]", f"requests={requests}")
    metrics = stated(result)
    tokens = metrics["output_tokens_per_s@c2"]
    assert tokens.work == requests * output  # every request decodes exactly max_new_tokens
    match = re.search(r"here N = (\d+), layers = (\d+), hidden = (\d+)", tokens.convention)
    n, layers, hidden = (int(g) for g in match.groups())
    # The prefill: every prompt token over the whole prompt; then output - 1 decode steps, step i over the
    # prompt and i tokens (the tokens up to and including the one decoded).
    per_request = prompt * (2 * n + 4 * layers * hidden * prompt) + sum(
        2 * n + 4 * layers * hidden * (prompt + i) for i in range(1, output))
    flops_per_s = requests * per_request / tokens.measured_seconds
    assert tokens.mfu == pytest.approx(flops_per_s / fp32_peak_flops(), rel=1e-9)
    assert metrics["ttft_s@c2"].statistic == "mean" and metrics["ttft_s@c2"].unit == "s"


def test_operation_figure_is_one_calls_work_at_the_median_latency(tmp_path: Path) -> None:
    result, _ = round_of(tmp_path, "op-gemm", "operators=[mm]", "dtypes=[fp32]", "implementations=[native]")
    metrics = stated(result)
    points = [p for p in result.operation.points if p.status == "passed"]
    assert points
    for point in points:
        d = point.shape
        figure = metrics[point.metric]
        assert figure.statistic == "rate@median"
        assert figure.value == pytest.approx(2 * d["M"] * d["N"] * d["K"] / point.latency_s / 1e12, rel=1e-12)


def test_no_mfu_against_a_sparse_peak() -> None:
    """A sparse (2:4) datasheet figure is twice the dense one: MFU, like the ratio, is never taken against it."""
    assert model_flops_utilisation(10.0, 1e12, 100.0, "TFLOPS") == pytest.approx(0.1)
    assert model_flops_utilisation(10.0, 1e12, 200.0, "TFLOPS", dense=False) is None


def test_a_statistic_outside_the_glossary_is_refused() -> None:
    with pytest.raises(ValueError, match="statistic 'median-ish' is none of rate"):
        Metric(name="x", value=1.0, unit="s", statistic="median-ish")
