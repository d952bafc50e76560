"""The operation family on this CPU: every operator through native torch and torch.compile (checked against a
float64 reference, then timed), a planted wrong implementation failing its points, the counting formulas with
exact answers, the config's one-line errors, and the report's table and geometric means."""

from __future__ import annotations

import json
import logging
import math
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from flagperf.config.models import pydantic_error_to_config_error
from flagperf.config.vendors import load_vendor
from flagperf.errors import ConfigError
from flagperf.operation.check import compare, compute_reference
from flagperf.operation.config import OperationConfig
from flagperf.operation.driver import (
    Implementations,
    PointRunner,
    load_implementations,
    plan_points,
    rewarm_fits,
    roofline,
    run_operation,
)
from flagperf.operation.impls import load_implementation
from flagperf.operation.operators import ELEMENT_BYTES, OPERATORS, counted, make_inputs, shape_label
from flagperf.operation.timer import CacheFlush, TimingOptions, graph_support, time_call
from flagperf.results.operators import collect_points, geomean_speedups, operation_markdown
from flagperf.results.schema import (
    Metric,
    OperationReport,
    OperatorPoint,
    Peak,
    RoundResult,
    SpecTable,
    round_dir,
    write_result,
)

FIXTURE_VENDORS = Path(__file__).resolve().parents[1] / "fixtures" / "vendors"
CPU = torch.device("cpu")


def config(**changes: Any) -> OperationConfig:
    values: dict[str, Any] = dict(operators=list(OPERATORS), dtypes=["fp32"], models=["tiny"], batch_sizes=[1],
                                  seq_lens=[16], implementations=["native"], warmup_s=0.001, rep_s=0.001,
                                  min_iters=2, max_iters=3, flush_cache=False, cuda_graphs=False,
                                  reference_cpu_max_elements=1 << 22, timeout_s=600, max_retries=0)
    values.update(changes)
    return OperationConfig.model_validate(values)


@pytest.fixture(scope="module")
def cpu_spec() -> SpecTable:
    return load_vendor("cpu").spec_table()


@pytest.fixture(scope="module")
def native_and_compile(cpu_spec: SpecTable) -> Any:
    """Every operator at the tiny model's shapes in fp32, native and torch.compile: one compile per operator,
    shared by the tests that read it (about half a minute on two cores)."""
    return run_operation(config(implementations=["native", "compile"]), "cpu", cpu_spec, CPU)


def test_every_operator_passes_natively_and_through_torch_compile(native_and_compile: Any) -> None:
    points = native_and_compile.report.points
    assert {p.operator for p in points} == set(OPERATORS)
    assert len(OPERATORS) >= 20
    failed = [(p.operator, p.implementation, p.error) for p in points if p.status != "passed"]
    assert not failed
    for impl in ("native", "compile"):
        assert {p.operator for p in points if p.implementation == impl} == set(OPERATORS)
    # Every passed point is a figure with its formula; its reference was float64 on the CPU.
    names = {m.name: m for m in native_and_compile.metrics}
    for p in points:
        metric = names[p.metric]
        assert metric.unit == ("TFLOPS" if OPERATORS[p.operator].bound == "compute" else "GB/s")
        assert p.operator in metric.convention and "bytes =" in metric.convention
        assert p.reference == "float64 on cpu" and p.iterations in (2, 3)
        assert p.latency_p10_s <= p.latency_s <= p.latency_p90_s
    assert native_and_compile.report.implementations["compile"].startswith("torch.compile")
    assert "no device graphs" in native_and_compile.report.graphs or "off" in native_and_compile.report.graphs


def test_native_passes_in_half_precisions_against_the_float64_reference(cpu_spec: SpecTable) -> None:
    outcome = run_operation(config(dtypes=["fp16", "bf16"]), "cpu", cpu_spec, CPU)
    bad = [(p.operator, p.dtype, p.error) for p in outcome.report.points if p.status != "passed"]
    assert not bad
    assert len(outcome.metrics) == 2 * len(OPERATORS)


def test_a_planted_wrong_implementation_fails_correctness_and_is_never_a_figure(
        monkeypatch: pytest.MonkeyPatch, cpu_spec: SpecTable) -> None:
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(FIXTURE_VENDORS))
    outcome = run_operation(config(operators=["mm", "softmax", "rotary"], implementations=["native", "planted-wrong"]),
                            "cpu", cpu_spec, CPU)
    wrong = [p for p in outcome.report.points if p.implementation == "planted-wrong"]
    assert len(wrong) == 3 and all(p.status == "failed" for p in wrong)
    for p in wrong:
        assert p.error.startswith("wrong result: ") and "1 of " in p.error and "expected" in p.error, p.error
        assert p.metric is None and p.latency_s is None and p.max_abs_error == pytest.approx(1.0, abs=1e-3)
    assert not [m for m in outcome.metrics if m.name.endswith("@planted-wrong")]
    assert all(p.status == "passed" for p in outcome.report.points if p.implementation == "native")
    assert outcome.failure is None  # native passed: the round has figures

    only_wrong = run_operation(config(operators=["mm"], implementations=["planted-wrong"]), "cpu", cpu_spec, CPU)
    assert only_wrong.failure and "no point passed" in only_wrong.failure and "wrong result" in only_wrong.failure


def test_a_sum_counted_twice_fails_where_the_outputs_are_small_numbers(
        monkeypatch: pytest.MonkeyPatch, cpu_spec: SpecTable) -> None:
    """softmax's probabilities are about 1/C and a mean about 1/sqrt(C): the dtype's atol, meant for outputs about
    1, let a bf16 softmax of half the right values pass (and a mean of twice them): atol is scaled to the outputs'
    size, as sqrt(K) scales it for a matrix product."""
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(FIXTURE_VENDORS))
    shapes = {"softmax": [{"R": 4, "C": 2048}, {"R": 2, "C": 131072}], "mean": [{"R": 4, "C": 65536}]}
    outcome = run_operation(config(operators=["softmax", "mean"], dtypes=["fp16", "bf16"], models=[], shapes=shapes,
                                   implementations=["native", "planted-double-count"]), "cpu", cpu_spec, CPU)
    points = {(p.operator, p.dtype, shape_label(p.shape), p.implementation): p for p in outcome.report.points}
    wrong = [p for p in outcome.report.points if p.implementation == "planted-double-count"]
    assert len(wrong) == 6
    for p in wrong:
        assert p.status == "failed" and p.error.startswith("wrong result: "), (p.operator, p.dtype, p.shape, p.error)
    # native passes the same tolerances: fp16 rows of 131072, whose probabilities are subnormal, included (atol
    # is not scaled below the spacing of fp16's subnormal numbers)
    assert all(p.status == "passed" for p in outcome.report.points if p.implementation == "native")
    assert points[("softmax", "bf16", "R4xC2048", "native")].tolerance["atol"] == pytest.approx(1e-2 / 2048)
    assert points[("mean", "bf16", "R4xC65536", "native")].tolerance["atol"] == pytest.approx(1e-2 / 256)
    assert points[("softmax", "fp16", "R2xC131072", "native")].tolerance["atol"] == 2.0**-24


def test_an_implementation_that_writes_into_its_inputs_fails_and_leaves_the_next_its_inputs(
        monkeypatch: pytest.MonkeyPatch, cpu_spec: SpecTable) -> None:
    """Its first call is right (the check passes), its timed calls run on data it halved, and the implementation
    after it would be checked against a reference of other inputs: it fails, saying which input it wrote, and the
    next one gets the inputs as they were made."""
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(FIXTURE_VENDORS))
    outcome = run_operation(config(operators=["softmax", "add", "embedding"],
                                   implementations=["planted-in-place", "native"]), "cpu", cpu_spec, CPU)
    writer = {p.operator: p for p in outcome.report.points if p.implementation == "planted-in-place"}
    assert all(p.status == "failed" and p.metric is None for p in writer.values()), writer
    assert writer["softmax"].error == ("wrote into its input 0 (of 1, in the order native_softmax takes them): its "
                                       "timed calls ran on other data than the call that was checked")
    assert writer["embedding"].error.startswith("wrote into its input 1 (of 2, ")  # the table, not the indices
    assert not [m for m in outcome.metrics if m.name.endswith("@planted-in-place")]
    assert all(p.status == "passed" for p in outcome.report.points if p.implementation == "native")


def test_flaggems_without_its_package_skips_its_points_saying_so(cpu_spec: SpecTable) -> None:
    if load_implementation("nvidia", "flaggems").missing_packages() == []:
        pytest.skip("flag_gems is installed here")
    outcome = run_operation(config(operators=["add"], implementations=["native", "flaggems"]), "nvidia", cpu_spec,
                            CPU)
    (skipped,) = [p for p in outcome.report.points if p.implementation == "flaggems"]
    assert skipped.status == "skipped" and "flag-gems" in skipped.error
    assert "not available" in outcome.report.implementations["flaggems"]


def test_flaggems_cross_entropy_gets_the_native_calls_options_where_it_takes_them() -> None:
    """FlagGems' cross_entropy_loss was called with the logits and targets alone, while the native call and the
    host's mean use ignore_index (natives.CROSS_ENTROPY_KWARGS): the options reach it where its signature takes
    them (by name or **kwargs), and nothing it would refuse where it does not."""
    from flagperf.operation.flaggems import DIRECT
    from flagperf.operation.natives import CROSS_ENTROPY_KWARGS

    adapt = DIRECT["cross_entropy"][2]
    calls: list[dict[str, Any]] = []

    # FlagGems 5.0.2's signature, every default other than the native call's: each option is passed, none left to it
    def gems_like(inp: Any, target: Any, weight: Any = None, reduction: str = "sum", ignore_index: int = 7,
                  label_smoothing: float = 0.1) -> str:
        calls.append({"reduction": reduction, "ignore_index": ignore_index, "label_smoothing": label_smoothing})
        return "loss"

    def with_kwargs(input: Any, target: Any, **kwargs: Any) -> str:
        calls.append(kwargs)
        return "loss"

    def bare(input: Any, target: Any) -> str:
        calls.append({})
        return "loss"

    assert [adapt(fn)("logits", "target") for fn in (gems_like, with_kwargs, bare)] == ["loss"] * 3
    assert calls == [CROSS_ENTROPY_KWARGS, CROSS_ENTROPY_KWARGS, {}]
    assert CROSS_ENTROPY_KWARGS == {"reduction": "mean", "ignore_index": -100, "label_smoothing": 0.0}
    import inspect

    import torch.nn.functional as F

    assert set(CROSS_ENTROPY_KWARGS) <= set(inspect.signature(F.cross_entropy).parameters)  # torch's names too


def test_fp8_on_this_cpu_is_skipped_with_the_spec_tables_reason(cpu_spec: SpecTable) -> None:
    outcome = run_operation(config(operators=["mm", "add"], dtypes=["fp32", "fp8"]), "cpu", cpu_spec, CPU)
    fp8 = [p for p in outcome.report.points if p.dtype == "fp8"]
    assert [p.operator for p in fp8] == ["mm"]  # add has no fp8 form: not planned at all
    assert fp8[0].status == "skipped" and "fp8" in fp8[0].error


def test_counting_formulas_have_exact_answers() -> None:
    assert counted(OPERATORS["mm"], {"M": 2, "N": 3, "K": 4}, "fp16") == (48, 2 * (8 + 12) + 2 * 6)
    # bf16 out, and the two fp32 scales read
    assert counted(OPERATORS["mm"], {"M": 2, "N": 3, "K": 4}, "fp8") == (48, 8 + 12 + 2 * 6 + 8)
    assert counted(OPERATORS["bmm"], {"B": 2, "M": 2, "N": 3, "K": 4}, "fp32") == (96, 4 * 2 * (8 + 12 + 6))
    assert counted(OPERATORS["addmm"], {"M": 2, "N": 3, "K": 4}, "bf16") == (48 + 6, 2 * (3 + 8 + 12 + 6))
    assert counted(OPERATORS["linear"], {"M": 2, "N": 3, "K": 4}, "fp32")[0] == 48
    # Causal attention: 4*B*H*D over the S*(S+1)/2 pairs of the triangle.
    assert counted(OPERATORS["scaled_dot_product_attention"], {"B": 1, "H": 2, "S": 3, "D": 4}, "fp16") == (
        4 * 1 * 2 * 4 * 6, 2 * 4 * 1 * 2 * 3 * 4)
    assert counted(OPERATORS["softmax"], {"R": 5, "C": 7}, "fp32") == (None, 4 * 2 * 35)
    assert counted(OPERATORS["layer_norm"], {"R": 5, "C": 7}, "fp16") == (None, 2 * (70 + 14))
    assert counted(OPERATORS["rms_norm"], {"R": 5, "C": 7}, "fp16") == (None, 2 * (70 + 7))
    assert counted(OPERATORS["sum"], {"R": 5, "C": 7}, "fp32") == (None, 4 * 40)
    assert counted(OPERATORS["add"], {"R": 5, "C": 7}, "bf16") == (None, 2 * 105)
    assert counted(OPERATORS["embedding"], {"V": 100, "C": 8, "T": 3}, "fp32") == (None, 8 * 3 + 4 * 2 * 24)
    assert counted(OPERATORS["gather"], {"R": 2, "C": 9, "G": 3}, "fp16") == (None, 8 * 6 + 2 * 2 * 6)
    assert counted(OPERATORS["cat"], {"R": 2, "C": 3}, "fp32") == (None, 4 * 4 * 6)
    assert counted(OPERATORS["cross_entropy"], {"R": 4, "V": 10}, "fp16") == (None, 2 * 40 + 8 * 4 + 2)
    # a cos and a sin row of D/2 per token (at its position), not the whole S-row table
    assert counted(OPERATORS["rotary"], {"T": 3, "H": 2, "KVH": 1, "D": 4, "S": 5}, "bf16") == (
        None, 2 * 2 * 3 * 4 * 3 + 2 * 3 * 4 + 8 * 3)
    # What a point needs in memory: its inputs as allocated, the rows a lookup does not read included.
    assert OPERATORS["embedding"].allocated_bytes({"V": 100, "C": 8, "T": 3}, 4) == 8 * 3 + 4 * (100 + 3) * 8
    assert OPERATORS["index_select"].allocated_bytes({"R": 5, "C": 4, "T": 3}, 4) == 8 * 3 + 4 * (5 + 3) * 4
    assert OPERATORS["gather"].allocated_bytes({"R": 2, "C": 9, "G": 3}, 2) == 8 * 6 + 2 * 2 * (9 + 3)
    assert OPERATORS["mm"].allocated_bytes({"M": 2, "N": 3, "K": 4}, 2) == counted(
        OPERATORS["mm"], {"M": 2, "N": 3, "K": 4}, "fp16")[1]


def test_the_roofline_is_the_slower_of_compute_and_memory() -> None:
    spec = SpecTable(device="test", peaks={
        "bf16": Peak(value=100.0, unit="TFLOPS", source="test"),
        "memory_bandwidth": Peak(value=1000.0, unit="GB/s", source="test")})
    mm = OPERATORS["mm"]
    # 2e12 FLOPs at 100 TFLOPS = 20 ms; 1e9 bytes at 1000 GB/s = 1 ms: compute-bound, 40 ms measured = 50 %.
    share, basis = roofline(spec, mm, "bf16", 2 * 10**12, 10**9, 0.040)
    assert share == pytest.approx(0.5) and "bf16 100 TFLOPS" in basis and "memory 1000 GB/s" in basis
    share, _ = roofline(spec, OPERATORS["add"], "bf16", None, 4 * 10**9, 0.008)  # 4 ms of 8 ms
    assert share == pytest.approx(0.5)
    share, basis = roofline(spec, mm, "fp16", 2 * 10**12, 10**9, 0.040)
    assert share is None and "no fp16 peak" in basis
    # a peak the table lists without a value: its source says how to give it one
    unknown = SpecTable(device="test", peaks={"memory_bandwidth": Peak(
        value=None, unit="GB/s", source="unknown: set spec_settings memory_channels in the inventory")})
    share, basis = roofline(unknown, OPERATORS["add"], "bf16", None, 10**9, 0.01)
    assert share is None and basis == ("no memory_bandwidth peak in the spec table of test (unknown: set "
                                       "spec_settings memory_channels in the inventory)")


def test_the_check_names_the_worst_element_and_catches_nan_and_shape() -> None:
    inputs = make_inputs(OPERATORS["add"], {"R": 4, "C": 5}, "fp32", CPU, seed=0)
    reference = compute_reference(OPERATORS["add"].native, inputs, torch.float64, CPU)
    good = inputs[0] + inputs[1]
    assert compare(good, reference, 1e-5, 1e-5).error is None
    wrong = good.clone()
    wrong[2, 3] += 0.5
    verdict = compare(wrong, reference, 1e-5, 1e-5)
    assert verdict.error.startswith("wrong result: 1 of 20 elements") and "worst at [2, 3]" in verdict.error
    assert verdict.max_abs_error == pytest.approx(0.5, rel=1e-5)
    wrong[0, 0] = float("nan")
    assert "2 of 20" in compare(wrong, reference, 1e-5, 1e-5).error
    assert "shape (5, 4)" in compare(good.t(), reference, 1e-5, 1e-5).error
    # a tolerance of 0 against the float64 reference: the values differ in digits past the sixth, and the line
    # shows them and the difference rather than two equal-looking numbers
    x = torch.tensor([2.98507333], dtype=torch.float32)
    exact = compute_reference(OPERATORS["exp"].native, [x], torch.float64, CPU)
    error = compare(torch.exp(x), exact, 0.0, 0.0).error
    got, expected = float(torch.exp(x)), float(exact.outputs[0])
    assert f"got {got:.9g}, expected {expected:.9g} (|out - ref| {abs(got - expected):.3g}, allowed 0;" in error


def test_shapes_come_from_the_models_grid_and_the_users_list_once_each() -> None:
    cfg = config(operators=["mm", "add"], models=["tiny", "llama-3-8b"], batch_sizes=[1, 2], seq_lens=[8, 16],
                 shapes={"mm": [{"M": 16, "N": 344, "K": 128}, {"M": 3, "N": 5, "K": 7}]})
    planned = plan_points(cfg)
    mm = [(p.dims["M"], p.dims["N"], p.dims["K"], p.source) for p in planned if p.op.name == "mm"]
    # tiny: tokens 8, 16 (b1 s16 and b2 s8 share 16), 32; llama-3-8b: the same tokens at its sizes; the given
    # 16x344x128 is tiny's b1 s16 again and is not measured twice.
    assert mm == [(8, 344, 128, "tiny b1 s8"), (16, 344, 128, "tiny b1 s16"), (32, 344, 128, "tiny b2 s16"),
                  (8, 14336, 4096, "llama-3-8b b1 s8"), (16, 14336, 4096, "llama-3-8b b1 s16"),
                  (32, 14336, 4096, "llama-3-8b b2 s16"), (3, 5, 7, "given")]


def test_a_model_of_the_labs_own_gives_shapes_as_a_preset_does() -> None:
    qwen = {"name": "qwen2-7b", "hidden": 3584, "intermediate": 18944, "heads": 28, "kv_heads": 4, "vocab": 152064}
    cfg = config(operators=["mm", "rotary"], models=["tiny", qwen], batch_sizes=[2], seq_lens=[8])
    planned = [(p.op.name, p.dims, p.source) for p in plan_points(cfg)]
    assert ("mm", {"M": 16, "N": 18944, "K": 3584}, "qwen2-7b b2 s8") in planned
    assert ("rotary", {"T": 16, "H": 28, "KVH": 4, "D": 128, "S": 8}, "qwen2-7b b2 s8") in planned
    assert ("mm", {"M": 16, "N": 344, "K": 128}, "tiny b2 s8") in planned
    # as plan.json and result.json keep it, and as a host reads it back
    assert OperationConfig.model_validate(cfg.model_dump()).models == cfg.models


@pytest.mark.parametrize(("changes", "key", "message"), [
    ({"operators": ["mm", "matmul"]}, "operators", "unknown operator 'matmul'"),
    ({"shapes": {"mm": [{"M": 1, "N": 2}]}}, "shapes", "mm[0]: missing K"),
    ({"shapes": {"mm": [{"M": 1, "N": 2, "K": 0}]}}, "shapes", "K must be a whole number from 1 to"),
    ({"shapes": {"softmax": [{"R": 1, "C": 2}]}}, "shapes", "softmax: not among this case's operators"),
    ({"operators": ["add"], "dtypes": ["fp8"]}, "dtypes",
     "none of the operators (add) has a fp8 form (those that do: mm)"),
    ({"models": ["gpt-5"]}, "models", "unknown model shape 'gpt-5'"),
    ({"models": [{"name": "mine", "hidden": 100, "intermediate": 8, "heads": 3, "vocab": 9}]}, "models",
     "models: [0]: hidden (100) must be a multiple of heads (3): head_dim"),
    ({"models": [{"name": "mine", "hidden": 64, "intermediate": 8, "heads": 4}]}, "models",
     "[0].vocab: Field required (a model's sizes: name, hidden, intermediate, heads, kv_heads, vocab)"),
    ({"max_iters": 1, "min_iters": 2}, None, "max_iters (1) must be at least min_iters (2)"),
    ({"tolerances": {"fp64": {"rtol": 1.0, "atol": 1.0}}}, "tolerances", "unknown dtype 'fp64'"),
    ({"tolerances": {"fp32": {}}}, "tolerances.fp32", "give rtol, atol or both"),
    ({"tolerances": {"fp32": {"rtol": -1.0}}}, "tolerances.fp32.rtol", "greater than or equal to 0"),
])
def test_a_bad_config_is_one_line_naming_the_file_and_key(changes: dict[str, Any], key: str | None,
                                                           message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        config(**{"operators": ["mm"], **changes})
    error = pydantic_error_to_config_error(caught.value, "cases/operation/op-gemm/case.yaml")
    line = str(error)
    assert "\n" not in line and line.startswith("cases/operation/op-gemm/case.yaml") and message in line, line
    if key:
        assert error.key is not None and error.key.startswith(key), line


def test_a_tolerance_override_may_give_rtol_or_atol_alone() -> None:
    cfg = config(operators=["mm"], dtypes=["fp32", "bf16"], tolerances={"bf16": {"atol": 0.05}})
    assert cfg.tolerance("bf16") == {"rtol": 1.6e-2, "atol": 0.05}
    assert cfg.tolerance("fp32") == {"rtol": 1e-5, "atol": 1e-5}


def test_an_implementation_the_vendor_lacks_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as caught:
        config(implementations=["native", "nope"]).check_for_vendor({}, "case.yaml", "cpu", True)
    assert "unknown implementations 'nope' for vendor cpu" in str(caught.value) and "compile" in str(caught.value)


def test_the_timer_times_each_iteration_and_flushes_between(monkeypatch: pytest.MonkeyPatch) -> None:
    flush = CacheFlush(CPU)
    assert flush.buffer.numel() >= 2 * 2**20 and "twice the last-level cache" in flush.description
    writes = []
    real = flush.__call__
    monkeypatch.setattr(CacheFlush, "__call__", lambda self: (writes.append(1), real()))
    x = torch.randn(64, 64)
    timed = time_call(lambda: x @ x, CPU, TimingOptions(0.001, 10.0, 4, 4, True, True), flush)
    # one flush before each timed iteration, and before each warm-up call (at least one)
    assert len(timed.latencies) == 4 and len(writes) >= 5 and all(t > 0 for t in timed.latencies)
    assert not timed.graphs and graph_support(CPU) is not None
    assert timed.p10 <= timed.median <= timed.p90


def test_the_host_time_is_as_many_calls_back_to_back_unflushed_after_the_timed_ones() -> None:
    """FlagPerf's cputime: after the timed iterations (each after a flush), as many calls again back to back,
    no flush, no rewarm, one synchronisation at the end; the wall time per call, so at least each call's own."""
    events: list[str] = []

    class Held:  # the rewarm's result: freed only once the timed call is done
        def __del__(self) -> None:
            events.append("freed")

    def call() -> None:
        events.append("call")
        end = time.perf_counter() + 2e-4
        while time.perf_counter() < end:
            pass

    def flush() -> None:  # 25x the call, however loaded the machine: the rewarm is kept
        events.append("flush")
        end = time.perf_counter() + 5e-3
        while time.perf_counter() < end:
            pass

    timed = time_call(call, CPU, TimingOptions(0.001, 10.0, 6, 6, True, False), flush,
                      lambda: (events.append("rewarm"), Held())[1])
    each = ["flush", "rewarm", "call", "freed"]
    assert events == each * (timed.warmup_calls + 6) + ["call"] * 6 and not timed.rewarm_dropped
    assert timed.host_latency is not None and timed.host_latency >= 2e-4 and timed.host_calls == 6
    bare = time_call(call, CPU, TimingOptions(0.001, 10.0, 3, 3, False, False), None)
    assert bare.host_latency is not None and bare.host_latency >= 2e-4


def test_a_slow_call_drops_the_rewarm_and_its_host_loop_is_rep_s_worth() -> None:
    """A call far longer than its flush (20 ms against a flush of nothing) is timed without the rewarm, which
    would double each iteration for nothing the call could show, and its host loop is rep_s worth of calls by
    the timed median (here 1), not as many as the timed iterations: a slow point took about 3x as long."""
    events: list[str] = []

    def call() -> None:
        events.append("call")
        end = time.perf_counter() + 2e-2
        while time.perf_counter() < end:
            pass

    timed = time_call(call, CPU, TimingOptions(0.001, 0.001, 4, 4, True, False), lambda: events.append("flush"),
                      lambda: events.append("rewarm"))
    assert timed.rewarm_dropped and events.count("rewarm") == 1  # the first warm-up call's, which measured it
    assert len(timed.latencies) == 4 and timed.host_calls == 1
    assert events[-3:] == ["flush", "call", "call"]  # the last timed iteration, then the host loop's one call
    with pytest.raises(ValidationError, match="2 x rep_s"):
        config(warmup_s=1.0, rep_s=300.0, timeout_s=600)


def test_on_the_cpu_each_flush_is_followed_by_a_call_on_a_copy_of_the_inputs(cpu_spec: SpecTable) -> None:
    """The CPU's caches are the host's: its flush empties the call's code and state too (a 3 us native embedding
    read 130 us after it). So each flush is followed by one untimed call on a copy of the inputs (made again:
    the same values, other memory), and the timed call finds only its inputs cold; the host time's calls are on
    the inputs themselves."""
    from flagperf.operation.impls import ImplEnv, OperatorImplementation

    seen: list[tuple[int, float]] = []

    class Recording(OperatorImplementation):
        def prepare(self, op: Any, dtype: str, native: Any) -> Any:
            def fn(*inputs: Any) -> Any:
                seen.append((inputs[0].data_ptr(), float(inputs[0].sum())))
                return native(*inputs)
            return fn

    cfg = config(operators=["add"], flush_cache=True, min_iters=4, max_iters=4)
    recording = Recording(ImplEnv(device=CPU, log=logging.getLogger("test")))
    runner = PointRunner(cfg, cpu_spec, CPU, Implementations(ready={"rec": recording}))
    assert runner.flush is not None and runner.flush.rewarm and "a copy of the inputs" in runner.flush.description
    runner.run(plan_points(cfg)[0])
    (point,) = runner.points
    assert point.status == "passed" and point.iterations == 4
    (inputs, total), (copy, copy_total) = seen[0], seen[1]  # the checked call, then the first rewarm
    assert copy != inputs and copy_total == total
    assert seen[1:] == [(copy, total), (inputs, total)] * (point.warmup_calls + 4) + [(inputs, total)] * 4


def test_a_point_whose_rewarm_does_not_fit_is_timed_without_it_and_says_so(cpu_spec: SpecTable,
                                                                             tmp_path: Path) -> None:
    """The rewarm takes one more set of the point's inputs and output (the copy, and the output held over the
    timed call), which memory_need does not count: where that set would take over USABLE_SHARE of the memory
    available the rewarm is left out, and where its call runs out of memory the point is timed without it (it
    was skipped as 'does not fit in memory'); either way the point records rewarmed false."""
    from flagperf.operation.impls import ImplEnv, OperatorImplementation

    class RewarmOutOfMemory(OperatorImplementation):  # a call that runs out of memory on any other inputs
        def prepare(self, op: Any, dtype: str, native: Any) -> Any:
            checked: list[int] = []

            def fn(*inputs: Any) -> Any:
                checked.append(checked[0] if checked else inputs[0].data_ptr())
                if inputs[0].data_ptr() != checked[0]:
                    raise RuntimeError("CPU out of memory: can't allocate memory for the output")
                return native(*inputs)
            return fn

    cfg = config(operators=["add"], flush_cache=True, min_iters=6, max_iters=6)
    impls = load_implementations(cfg, "cpu", CPU)
    impls.ready["tight"] = RewarmOutOfMemory(ImplEnv(device=CPU, log=logging.getLogger("test")))
    runner = PointRunner(cfg, cpu_spec, CPU, impls)
    planned = plan_points(cfg)[0]
    runner.run(planned)
    native, tight = runner.points
    assert (native.implementation, native.status, native.rewarmed) == ("native", "passed", True)
    assert (tight.implementation, tight.status, tight.rewarmed, tight.iterations) == ("tight", "passed", False, 6)
    # the report marks the cell, and the speed-up mixing the two cache conditions says so
    now = datetime.now(timezone.utc)
    write_result(round_dir(tmp_path / "run", "op-elementwise", 1, "h") / "result.json", RoundResult(
        run_id="run", case="op-elementwise", family="operation", round=1, host="h", node_rank=0, vendor="cpu",
        status="success", started_at=now, finished_at=now, duration_s=1.0, measured_seconds=1.0,
        metrics=runner.metrics, config={}, operation=OperationReport(timing="t", flush="f", graphs="g", counting={},
                                                                     tolerances={}, points=runner.points)))
    (row,) = [line for line in operation_markdown(tmp_path / "run") if "(tiny b1 s16) |" in line]
    native_cell, tight_cell, speedup_cell = [cell.strip() for cell in row.split("|")[4:7]]
    assert "no rewarm" not in native_cell and "**no rewarm**" in tight_cell
    assert speedup_cell.endswith("; **cache conditions differ** (tight timed without the rewarm)")
    bare = PointRunner(config(operators=["add"]), cpu_spec, CPU, load_implementations(cfg, "cpu", CPU))
    bare.run(planned)
    assert bare.points[0].rewarmed is None  # no flush: no rewarm to speak of
    need = planned.op.allocated_bytes(planned.dims, ELEMENT_BYTES[planned.dtype])
    assert rewarm_fits(planned, 2 * need) and not rewarm_fits(planned, need)


def test_rep_s_bounds_the_timed_loop_when_the_flush_outlasts_the_call() -> None:
    """The estimate of one iteration includes its flush (as do_bench's): a 20 ms flush before a call of
    microseconds gives about rep_s / 20 ms iterations, not max_iters of them (a CPU's 520 MiB flush made a
    rep_s of 0.1 s take minutes)."""
    spin_s, rep_s = 0.02, 0.1
    flushes = []

    def slow_flush() -> None:  # at least spin_s, however loaded the machine
        flushes.append(1)
        end = time.perf_counter() + spin_s
        while time.perf_counter() < end:
            pass

    x = torch.ones(4)
    timed = time_call(lambda: x + 1, CPU, TimingOptions(0.001, rep_s, 1, 200, True, False), slow_flush)
    assert 1 <= len(timed.latencies) <= math.ceil(rep_s / spin_s)
    assert len(flushes) > len(timed.latencies)  # the warm-up flushed too


def _point(impl: str, shape: dict[str, int], latency: float | None, status: str = "passed",
           error: str | None = None) -> OperatorPoint:
    name = f"add:fp16:R{shape['R']}xC{shape['C']}@{impl}" if status == "passed" else None
    return OperatorPoint(operator="add", group="elementwise", dtype="fp16", shape=shape, source="given",
                         implementation=impl, status=status, error=error, metric=name, latency_s=latency,
                         latency_p10_s=latency, latency_p90_s=latency, iterations=10 if latency else 0,
                         bytes=6 * shape["R"] * shape["C"], value=1.0 if latency else None,
                         unit="GB/s" if latency else None, roofline=0.25 if latency else None)


def test_the_report_has_the_table_the_geomean_and_the_failed_points(tmp_path: Path) -> None:
    run_dir = tmp_path / "run-ops"
    small, large = {"R": 4, "C": 8}, {"R": 8, "C": 8}
    # the small shape's records have host times, the large one's not (older ones): the host geomean is over 1
    points = [_point("native", small, 2e-3).model_copy(update={"host_latency_s": 2e-3}),
              _point("fast", small, 1e-3).model_copy(update={"host_latency_s": 1e-3}), _point("native", large, 2e-3),
              _point("fast", large, 4e-3),
              _point("wrong", small, None, "failed", "wrong result: 1 of 32 elements | off")]
    now = datetime.now(timezone.utc)
    metrics = [Metric(name=p.metric, value=1.0, unit="GB/s",
                      peak=Peak(value=4.0, unit="GB/s", source="test"), ratio=0.25) for p in points if p.metric]
    result = RoundResult(
        run_id="run-ops", case="op-elementwise", family="operation", round=1, host="h", node_rank=0, vendor="cpu",
        status="success", started_at=now, finished_at=now, duration_s=1.0, measured_seconds=1.0, metrics=metrics,
        operation=OperationReport(timing="t", flush="f", graphs="g", counting={}, tolerances={}, points=points),
        config={})
    write_result(round_dir(run_dir, "op-elementwise", 1, "h") / "result.json", result)
    lines = operation_markdown(run_dir)
    text = "\n".join(lines)
    # fast: 2 ms -> 1 ms (2x) and 2 ms -> 4 ms (0.5x): geomean exactly 1.
    (row,) = [r for r in geomean_speedups(collect_points(run_dir)) if r["implementation"] == "fast"]
    assert row["geomean"] == pytest.approx(1.0) and row["points"] == 2 and row["min"] == pytest.approx(0.5)
    # the host column says how many points its geomean is over; a host speed-up is a single sample
    assert "| points | geomean host speed-up (x, single samples) | host points |" in text
    assert "| fp16 | fast | 1 | 0.5 | 2 | 2 | 2 | 1 | 0 | 0 |" in text
    # The operator's table: a row per dtype and shape, a column per implementation (native first) and speed-up.
    assert ("| dtype | shape (from) | checked against | native | fast | fast vs native | wrong | wrong vs native "
            "|") in text
    assert ("| fp16 | R4xC8 (given) | - | 1 GB/s · 2 ms ±0% · host 2 ms · 25.0% roofline | 1 GB/s · 1 ms ±0% · host "
            "1 ms · 25.0% roofline | 2x; host 2x (single sample) | **FAILED** | - |") in text
    assert ("| fp16 | R8xC8 (given) | - | 1 GB/s · 2 ms ±0% · 25.0% roofline | 1 GB/s · 4 ms ±0% · 25.0% roofline | "
            "0.5x | - | - |") in text
    # a '|' in an error cannot break the table
    assert "- **FAILED** fp16 R4xC8 @wrong: wrong result: 1 of 32 elements \\| off" in text
    assert math.isclose(json.loads(result.model_dump_json())["operation"]["points"][0]["latency_s"], 2e-3)


def test_the_report_says_how_each_case_was_timed_and_why_a_roofline_is_missing(tmp_path: Path) -> None:
    """What result.json's operation block says of the clock, the flush, graphs and the implementations (with
    versions) is in the report once per case, as is why points have no share of the roofline."""
    run_dir = tmp_path / "run-ops"
    point = _point("native", {"R": 4, "C": 8}, 2e-3).model_copy(update={
        "roofline": None, "roofline_basis": "no memory_bandwidth peak in the spec table of cpu (set it)"})
    now = datetime.now(timezone.utc)
    result = RoundResult(
        run_id="run-ops", case="op-elementwise", family="operation", round=1, host="h", node_rank=0, vendor="cpu",
        status="success", started_at=now, finished_at=now, duration_s=1.0, measured_seconds=1.0, metrics=[],
        operation=OperationReport(timing="host clock, warm-up 0.05 s", flush="a 64 MiB buffer", graphs="off",
                                  counting={}, tolerances={}, points=[point],
                                  implementations={"native": "torch 2.9's own operators"}),
        config={})
    write_result(round_dir(run_dir, "op-elementwise", 1, "h") / "result.json", result)
    text = "\n".join(operation_markdown(run_dir))
    assert ("- **op-elementwise**: timing: host clock, warm-up 0.05 s; cache flush: a 64 MiB buffer; device "
            "graphs: off; timed iterations per point: 10\n  - native: torch 2.9's own operators\n  - % of roofline "
            "not computed: no "
            "memory_bandwidth peak in the spec table of cpu (set it)") in text
    assert "GB/s (1e9 bytes/s" in text


def test_a_roofline_on_an_estimated_peak_is_marked_an_upper_estimate() -> None:
    """A roofline that takes a peak the spec table calls a lower bound is an upper estimate: the point says so
    and the operator table writes its share as ≤ x %; on exact peaks it is plain."""
    from flagperf.results.operators import operator_cells, operator_summaries, points_of

    exact = Peak(value=1.0, unit="TFLOPS", source="test")
    lower = Peak(value=1.0, unit="TFLOPS", source="test", bound="lower", bound_reason="base clock")
    cells = {}
    for name, peak in (("exact", exact), ("lower", lower)):
        spec = SpecTable(device="test", peaks={"fp32": peak})
        outcome = run_operation(config(operators=["mm"]), "cpu", spec, CPU)
        (point,) = outcome.report.points
        assert point.status == "passed" and point.roofline is not None
        assert point.roofline_estimated is (name == "lower")
        result = RoundResult(run_id="r", case="op", family="operation", round=1, host="h", node_rank=0,
                             vendor="cpu", status="success", started_at=datetime.now(timezone.utc),
                             finished_at=datetime.now(timezone.utc), duration_s=1.0, measured_seconds=1.0,
                             metrics=outcome.metrics, config={}, operation=outcome.report)
        (entry,) = operator_summaries(points_of([result]))
        cells[name] = operator_cells(entry)[7]  # best % of roofline
    assert cells["lower"].startswith("≤ ") and not cells["exact"].startswith("≤")
