"""INT8 and FP8 on the tensor-core layout, data patterns, the spec tables' FP8 peaks, and the max-achievable
shape search: real torch on the CPU (the layout and the search are the same code a GPU runs)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from flagperf.basespec import gemm, shapesearch
from flagperf.basespec.shapesearch import Shape
from flagperf.config.job import Job
from flagperf.config.plan import plan_run
from flagperf.config.vendors import import_file, load_vendor
from flagperf.entry import run_job
from flagperf.errors import EXIT_OK, EXIT_UNSUPPORTED, CaseUserError, Unsupported
from flagperf.measure.casekit import CaseContext
from flagperf.measure.timing import TimingPlan
from flagperf.results.schema import Peak, SpecTable, read_result

TINY = TimingPlan(0, 0.05, 2)
LOG = logging.getLogger("flagperf.case.test")
CPU = torch.device("cpu")


def make_job(tmp_path: Path, case: str, sets: list[str]) -> Job:
    plan = plan_run(cases=[case], sets=sets, results_dir=tmp_path / "results", run_id="run1")
    cp = plan.cases[0]
    return Job(run_id=plan.run_id, case=case, family=cp.family, round=1, host="localhost", vendor="cpu",
               config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, command="pytest",
               image={"status": "none"})


def config(precision: str, size: int = 64, **extra: Any) -> gemm.Config:
    return gemm.Config.model_validate({"precision": precision, "m": size, "n": size, "k": size, "warmup_iters": 0,
                                       "min_duration_s": 0.05, "min_iters": 2, "timeout_s": 60, "max_retries": 0,
                                       **extra})


def supporting_ctx(*keys: str) -> CaseContext:
    """A context whose spec table says the CPU can do ``keys``: the kernel's own code runs on real torch."""
    units = {"int8": "TOPS"}
    spec = SpecTable(device="test", peaks={k: Peak(value=1.0, unit=units.get(k, "TFLOPS"), source="test")
                                           for k in keys})
    return CaseContext("cpu", spec, TINY, LOG, shares_host_memory=True)


# --- layouts -----------------------------------------------------------------------------------------------


def test_int8_operands_are_tn_and_multiply_exactly() -> None:
    ops = gemm.operands(config("int8", m=48, n=40, k=32), CPU)
    assert ops.a.dtype == ops.b.dtype == torch.int8
    assert ops.a.shape == (48, 32) and ops.a.is_contiguous()  # row-major [M, K]
    assert ops.b.shape == (32, 40) and ops.b.stride() == (1, 32)  # column-major [K, N]
    assert gemm.is_column_major(ops.b) and not gemm.is_column_major(ops.a)
    assert ops.out.dtype == torch.int32
    gemm.multiply(ops)
    assert torch.equal(ops.out, ops.a.to(torch.int32) @ ops.b.to(torch.int32))  # int32 accumulate, exact


def test_layout_check_refuses_a_row_major_b() -> None:
    ops = gemm.operands(config("int8"), CPU)
    with pytest.raises(AssertionError, match="B column-major"):
        gemm._tn(gemm.Operands(ops.a, ops.b.contiguous(), ops.out))


@pytest.mark.parametrize(("fmt", "a_type"), [("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)])
def test_fp8_operands_and_scaled_multiply(fmt: str, a_type: torch.dtype) -> None:
    ops = gemm.operands(config("fp8", m=32, n=48, k=64, fp8_format=fmt), CPU)
    assert ops.a.dtype == a_type
    assert ops.b.dtype == torch.float8_e4m3fn  # never e5m2 x e5m2: cuBLASLt has no such kernel
    assert ops.a.is_contiguous() and ops.b.shape == (64, 48) and ops.b.stride() == (1, 64)
    assert ops.out.dtype == torch.bfloat16
    assert ops.scale_a is not None and float(ops.scale_a) == 1.0
    gemm.multiply(ops)
    reference = ops.a.to(torch.float32) @ ops.b.to(torch.float32)
    assert torch.allclose(ops.out.to(torch.float32), reference, rtol=1e-2, atol=1e-1)
    assert reference.abs().sum() > 0


@pytest.mark.parametrize("precision", ["int8", "fp8", "bf16", "fp32"])
def test_data_patterns(precision: str) -> None:
    zeros = gemm.operands(config(precision, data_pattern="zeros"), CPU)
    assert not zeros.a.to(torch.float32).any() and not zeros.b.to(torch.float32).any()
    uniform = gemm.operands(config(precision, data_pattern="uniform"), CPU).a.to(torch.float32)
    normal = gemm.operands(config(precision, data_pattern="normal"), CPU).a.to(torch.float32)
    if precision == "int8":
        assert uniform.min() < -100 and uniform.max() > 100  # the whole int8 range: every bit toggles
    else:
        assert uniform.abs().max() <= 1.0 and normal.abs().max() > 1.0
    assert normal.std() > 0


def test_fp8_runs_and_says_how(caplog: pytest.LogCaptureFixture) -> None:
    (m,) = gemm.run(config("fp8", fp8_format="e5m2", data_pattern="uniform"), supporting_ctx("fp8"))
    assert (m.name, m.unit) == ("gemm_fp8", "TFLOPS")
    assert m.value > 0 and m.iterations >= 2
    assert m.note == "64x64 @ 64x64, B column-major, e5m2, uniform data"


def test_int8_note_names_the_layout() -> None:
    (m,) = gemm.run(config("int8"), supporting_ctx("int8"))
    assert (m.name, m.unit) == ("gemm_int8", "TOPS")
    assert m.note == "64x64 @ 64x64, B column-major, normal data"


def test_fp8_shape_rule() -> None:
    with pytest.raises(CaseUserError, match="multiples of 16"):
        gemm.run(config("fp8", m=40), supporting_ctx("fp8"))


# --- unsupported, never a crash -----------------------------------------------------------------------------


def test_fp8_unsupported_on_cpu_vendor(tmp_path: Path) -> None:
    spec = load_vendor("cpu").spec_table()
    assert spec.peaks["fp8"].supported is False
    with pytest.raises(Unsupported, match=r"fp8 on .*no native FP8"):
        gemm.run(config("fp8"), CaseContext("cpu", spec, TINY, LOG, shares_host_memory=True))
    job = make_job(tmp_path, "computation-FP8", ["m=64", "n=64", "k=64", "min_duration_s=0.05", "min_iters=2"])
    assert run_job(job, tmp_path) == EXIT_UNSUPPORTED
    result = read_result(tmp_path / "result.json")
    assert result.status == "unsupported" and result.metrics == []
    assert result.failure is not None and "FP8" in result.failure.message


def test_backend_refusals_are_recognised() -> None:
    # torch's words on an A100 (no FP8) and on a build without an int8 kernel, against a real failure.
    assert gemm.refusal(RuntimeError("torch._scaled_mm is only supported on CUDA devices with compute capability "
                                     ">= 9.0 or 8.9, or ROCm MI300+"))
    assert gemm.refusal(NotImplementedError("Could not run 'aten::_int_mm' with arguments from the 'XPU' backend"))
    assert gemm.refusal(RuntimeError("_int_mm_out_cuda not implemented for this architecture"))
    assert gemm.refusal(ValueError("Multiplication of two Float8_e5m2 matrices is not supported"))  # torch 2.11, H100
    assert not gemm.refusal(RuntimeError("CUDA error: an illegal memory access was encountered"))


def nvidia_spec() -> Any:
    return import_file(Path(__file__).parents[2] / "vendor_images" / "nvidia" / "spec.py", "nvidia_spec_test")


def test_nvidia_fp8_peaks_by_capability() -> None:
    spec = nvidia_spec()
    h100 = spec.peaks_for("NVIDIA H100 80GB HBM3", (9, 0), 80 * 2**30)["peaks"]
    assert (h100["fp8"]["value"], h100["fp8"]["unit"]) == (1979.0, "TFLOPS")
    assert (h100["int8"]["value"], h100["int8"]["unit"]) == (1979.0, "TOPS")
    assert h100["bf16"]["value"] == 989.0
    assert "3,958" in h100["fp8"]["source"] and "sparsity" in h100["fp8"]["source"]
    a100 = spec.peaks_for("NVIDIA A100-SXM4-80GB", (8, 0), 80 * 2**30)["peaks"]
    assert a100["fp8"]["supported"] is False and "8.9" in a100["fp8"]["source"]
    assert a100["int8"]["value"] == 624.0
    unknown = spec.peaks_for("NVIDIA L4", (8, 9), 24 * 2**30)["peaks"]
    assert unknown["fp8"]["value"] is None and "no datasheet entry" in unknown["fp8"]["source"]
    SpecTable.model_validate(spec.peaks_for("NVIDIA H100 80GB HBM3", (9, 0), 80 * 2**30))


# --- max-achievable search ----------------------------------------------------------------------------------


class StepClock:
    """A clock that advances one 'second' per measurement: budgets count measurements, not wall time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def peaked(best: Shape, clock: StepClock) -> Any:
    def rate(shape: Shape) -> float:
        clock.now += 1
        return 1000.0 - abs(shape.m - best.m) - abs(shape.n - best.n) - 2 * abs(shape.k - best.k)
    return rate


def test_search_finds_the_peak_of_a_smooth_surface() -> None:
    grid = {a: shapesearch.axis_values(256, 4096, 256) for a in "mnk"}
    clock = StepClock()
    best = Shape(1536, 3328, 768)
    outcome = shapesearch.search(grid, peaked(best, clock), budget_s=400, start=Shape(2048, 2048, 2048),
                                 clock=clock)
    assert outcome.best == best and outcome.best_rate == 1000.0
    assert outcome.stopped == "converged"
    assert outcome.tried[0][0] == Shape(2048, 2048, 2048)  # the fixed shape is measured first
    assert len({s for s, _ in outcome.tried}) == len(outcome.tried)  # no shape measured twice
    assert len(outcome.tried) < 16**3 / 10  # far fewer than the grid
    assert [r for _, r in outcome.top(3)] == sorted((r for _, r in outcome.tried if r is not None), reverse=True)[:3]


def test_search_stops_at_the_budget() -> None:
    grid = {a: shapesearch.axis_values(256, 16384, 256) for a in "mnk"}
    clock = StepClock()
    outcome = shapesearch.search(grid, peaked(Shape(7168, 256, 16384), clock), budget_s=20, clock=clock)
    assert outcome.stopped == "budget"
    assert len(outcome.tried) == 20  # checked before each measurement
    assert outcome.best_rate == max(r for _, r in outcome.tried if r is not None)


def test_search_skips_shapes_it_cannot_measure() -> None:
    grid = {a: [64, 128, 192, 256] for a in "mnk"}
    clock = StepClock()

    def rate(shape: Shape) -> float | None:
        clock.now += 1
        return None if shape.m * shape.n * shape.k > 128**3 else float(shape.m + shape.n + shape.k)

    outcome = shapesearch.search(grid, rate, budget_s=1000, clock=clock)
    assert outcome.best is not None and outcome.best.m * outcome.best.n * outcome.best.k <= 128**3
    assert any(r is None for _, r in outcome.tried)
    nothing = shapesearch.search(grid, lambda s: None, budget_s=5, clock=StepClock())
    assert nothing.best is None and nothing.best_rate is None


def test_axis_values() -> None:
    assert shapesearch.axis_values(100, 1000, 256) == [256, 512, 768]
    assert shapesearch.lattice(list(range(0, 17)), 4) == [0, 5, 11, 16]
    with pytest.raises(ValueError, match="no multiple"):
        shapesearch.axis_values(257, 300, 256)
    with pytest.raises(ValueError, match="empty"):
        shapesearch.axis_values(512, 256, 256)


def test_gemm_max_achievable_on_cpu() -> None:
    c = config("fp32", sweep_budget_s=1.0, sweep_m=[32, 128], sweep_n=[32, 128], sweep_k=[32, 128],
               sweep_step=32, sweep_shape_s=0.01)
    ctx = supporting_ctx("fp32")
    fixed, best = gemm.run(c, ctx)
    assert fixed.name == "gemm_fp32" and fixed.search is None
    assert best.name == "gemm_fp32_max" and best.unit == "TFLOPS" and best.value > 0
    search = best.search
    assert search is not None
    assert all(search.shape[a] in (32, 64, 96, 128) for a in "mnk")
    assert search.shapes_tried >= 1 and search.ranges == {"m": [32, 128], "n": [32, 128], "k": [32, 128]}
    assert search.top[0]["value"] == search.search_value
    assert {a: int(search.top[0][a]) for a in "mnk"} == search.shape
    assert best.note is not None and best.note.startswith(f"best of {search.shapes_tried} shapes")
    assert len(ctx.windows) == 2  # the best shape is re-measured in its own timed region


def test_sweep_config_needs_a_grid() -> None:
    with pytest.raises(ValueError, match="no multiple"):
        config("fp32", sweep_budget_s=1.0, sweep_m=[100, 200], sweep_step=256)
    config("fp32", sweep_m=[100, 200], sweep_step=256)  # no search: the grid is not checked


def test_run_job_records_pattern_and_search(tmp_path: Path) -> None:
    sets = ["m=64", "n=64", "k=64", "warmup_iters=0", "min_duration_s=0.05", "min_iters=2", "data_pattern=zeros",
            "sweep_budget_s=0.5", "sweep_m=[32, 64]", "sweep_n=[32, 64]", "sweep_k=[32, 64]", "sweep_step=32",
            "sweep_shape_s=0.01"]
    assert run_job(make_job(tmp_path, "computation-FP32", sets), tmp_path) == EXIT_OK
    result = read_result(tmp_path / "result.json")
    assert result.config["data_pattern"] == "zeros"
    assert [m.name for m in result.metrics] == ["gemm_fp32", "gemm_fp32_max"]
    assert result.metrics[1].search is not None and result.metrics[1].search.step == 32


def test_plan_loads_every_gemm_case() -> None:
    names = [f"computation-{p}" for p in ("FP64", "FP32", "TF32", "FP16", "BF16", "INT8", "FP8")]
    for vendor in ("cpu", "nvidia"):
        plan = plan_run(cases=names, vendor=vendor, results_dir=Path("unused"), run_id="r")
        for case in plan.cases:
            assert case.config["data_pattern"] == "normal" and case.config["sweep_budget_s"] == 0
