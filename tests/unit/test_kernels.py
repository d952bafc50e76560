"""The real base-spec kernels on tiny sizes, directly and through flagperf.entry.run_job."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from flagperf.basespec import capacity, copy, gemm, transfer
from flagperf.config.job import Job
from flagperf.config.plan import plan_run
from flagperf.config.vendors import load_vendor
from flagperf.entry import main as entry_main
from flagperf.entry import run_job
from flagperf.errors import EXIT_OK, EXIT_UNSUPPORTED, EXIT_USER_ERROR, CaseUserError, Unsupported
from flagperf.measure.casekit import CaseContext, comparable_ratio
from flagperf.measure.timing import TimingPlan
from flagperf.results.metrics import COPY_CONVENTION, GEMM_CONVENTION
from flagperf.results.schema import Peak, SpecTable, read_result

TINY = TimingPlan(0, 0.05, 2)
LOG = logging.getLogger("flagperf.case.test")


@pytest.fixture(scope="module")
def cpu_spec() -> SpecTable:
    return load_vendor("cpu").spec_table()


@pytest.fixture
def ctx(cpu_spec: SpecTable) -> CaseContext:
    return CaseContext("cpu", cpu_spec, TINY, LOG, shares_host_memory=True)


def test_the_gemm_sizes_its_operands_by_torchs_element_sizes() -> None:
    """Its memory need is counted without torch (the planner's, on a controller that may have none)."""
    for precision, name in gemm.DTYPE_NAMES.items():
        assert gemm.ELEMENT_BYTES[precision] == getattr(torch, name).itemsize, precision
    for name in gemm.FP8_DTYPE_NAMES.values():
        assert gemm.ELEMENT_BYTES["fp8"] == getattr(torch, name).itemsize, name


def gemm_config(precision: str, size: int = 64, **extra: Any) -> gemm.Config:
    return gemm.Config.model_validate({"precision": precision, "m": size, "n": size, "k": size, "warmup_iters": 0,
                                       "min_duration_s": 0.05, "min_iters": 2, "timeout_s": 60, "max_retries": 0,
                                       **extra})


@pytest.fixture(autouse=True)
def _restore_matmul_precision():
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def test_gemm_fp32(ctx: CaseContext, cpu_spec: SpecTable) -> None:
    metrics = gemm.run(gemm_config("fp32"), ctx)
    assert len(metrics) == 1
    m = metrics[0]
    assert m.name == "gemm_fp32"
    assert m.unit == "TFLOPS"
    assert m.value > 0
    assert m.iterations >= 2
    assert m.measured_seconds >= 0.05
    assert m.value == pytest.approx(2 * 64**3 * m.iterations / m.measured_seconds / 1e12)
    assert m.convention == GEMM_CONVENTION
    assert m.note == "64x64 @ 64x64, normal data"
    assert m.peak == cpu_spec.peaks["fp32"]
    if cpu_spec.peaks["fp32"].value:
        assert m.ratio == pytest.approx(m.value / cpu_spec.peaks["fp32"].value)
    assert ctx.measured_seconds == pytest.approx(m.measured_seconds)
    assert torch.get_float32_matmul_precision() == "highest"  # fp32 must not use TF32/BF16 arithmetic


def test_gemm_fp64_rectangular(ctx: CaseContext) -> None:
    config = gemm.Config.model_validate({**gemm_config("fp64").model_dump(), "m": 32, "n": 16, "k": 48})
    (m,) = gemm.run(config, ctx)
    assert m.name == "gemm_fp64"
    assert m.note == "32x48 @ 48x16, normal data"
    assert m.value == pytest.approx(2 * 32 * 16 * 48 * m.iterations / m.measured_seconds / 1e12)


def test_gemm_multiply_is_correct() -> None:
    config = gemm_config("fp64", size=8)
    ops = gemm.operands(config, torch.device("cpu"))
    gemm.multiply(ops)
    assert torch.allclose(ops.out, ops.a @ ops.b)


def test_bf16_unsupported_when_the_spec_says_so(ctx: CaseContext, cpu_spec: SpecTable) -> None:
    """Proves something on CPUs without native BF16 arithmetic (per the cpu spec table); skips on others."""
    if cpu_spec.peaks["bf16"].supported:
        pytest.skip("this CPU has native BF16 arithmetic")
    with pytest.raises(Unsupported, match="bf16"):
        gemm.run(gemm_config("bf16"), ctx)
    assert ctx.measured_seconds == 0


@pytest.mark.parametrize("precision", ["fp16", "int8", "tf32"])
def test_unsupported_precisions_follow_the_spec(ctx: CaseContext, cpu_spec: SpecTable, precision: str) -> None:
    """Proves something for each precision the cpu spec table says this CPU lacks; skips the others."""
    if cpu_spec.peaks[precision].supported:
        pytest.skip(f"this CPU supports {precision}")
    with pytest.raises(Unsupported, match=cpu_spec.peaks[precision].source[:20]):
        gemm.run(gemm_config(precision), ctx)


def test_int8_shape_rules() -> None:
    # A spec table that says int8 is supported reaches the kernel's own input checks.
    spec = SpecTable(device="test", peaks={"int8": Peak(value=1.0, unit="TOPS", source="test")})
    ctx = CaseContext("cpu", spec, TINY, LOG, shares_host_memory=True)
    with pytest.raises(CaseUserError, match="int8 GEMM needs"):
        gemm.run(gemm_config("int8", size=16), ctx)
    with pytest.raises(CaseUserError):
        gemm.run(gemm.Config.model_validate({**gemm_config("int8").model_dump(), "n": 60}), ctx)


def test_gemm_too_big_for_memory(ctx: CaseContext) -> None:
    """Proves something on hosts where three 65536^2 fp64 matrices (96 GiB) exceed 80 % of the memory available;
    skips on larger ones rather than allocating that much."""
    need = 3 * 65536**2 * 8
    if need <= 0.8 * ctx.memory_info()[0]:
        pytest.skip("this host could hold a 65536^3 fp64 GEMM; not running it")
    with pytest.raises(CaseUserError, match="more than 80%"):
        gemm.run(gemm_config("fp64", size=65536), ctx)


@pytest.mark.parametrize(("key", "value"), [("m", 0), ("k", 65537), ("precision", "fp4"), ("data_pattern", "ones"),
                                            ("fp8_format", "e3m4"), ("sweep_m", [512]), ("sweep_n", [0, 64]),
                                            ("sweep_k", [128, 64])])
def test_gemm_config_bounds(key: str, value: Any) -> None:
    with pytest.raises(ValueError):
        gemm.Config.model_validate({**gemm_config("fp32").model_dump(), key: value})


def test_memory_copy(ctx: CaseContext) -> None:
    config = copy.Config.model_validate({"size_mib": 1, "warmup_iters": 1, "min_duration_s": 0.05, "min_iters": 2,
                                         "timeout_s": 60, "max_retries": 0})
    (m,) = copy.run(config, ctx)
    assert m.name == "memory_copy_bandwidth"
    assert m.unit == "GB/s"
    assert m.value == pytest.approx(2 * 2**20 * m.iterations / m.measured_seconds / 1e9)
    assert m.convention == COPY_CONVENTION
    assert m.ratio is None  # the cpu vendor does not know its memory bandwidth without spec_settings


def test_capacity_bounded_on_cpu(ctx: CaseContext) -> None:
    config = capacity.Config.model_validate({"chunk_mib": 1, "max_fraction_of_free": 1.0, "max_gib": 4 / 1024,
                                             "timeout_s": 60, "max_retries": 0})
    (m,) = capacity.run(config, ctx)
    assert m.unit == "GiB"
    assert m.value == pytest.approx(4 / 1024)
    assert m.iterations == 4
    assert m.ratio is None  # bounded by design, not a limit reached
    assert "bounded by design" in (m.note or "")
    assert "80%" in (m.note or "")  # the host-memory ceiling applies on the CPU


def test_transfer_unsupported_on_cpu(ctx: CaseContext) -> None:
    config = transfer.Config.model_validate({"direction": "h2d", "size_mib": 1, "pinned": False, "warmup_iters": 0,
                                             "min_duration_s": 0.05, "min_iters": 2, "timeout_s": 60,
                                             "max_retries": 0})
    with pytest.raises(Unsupported):
        transfer.run(config, ctx)


def test_comparable_ratio() -> None:
    peak = Peak(value=4.0, unit="TFLOPS", source="s")
    assert comparable_ratio(1.0, "TFLOPS", peak) == 0.25
    assert comparable_ratio(1.0, "TOPS", peak) is None
    assert comparable_ratio(1.0, "TFLOPS", None) is None
    assert comparable_ratio(1.0, "TFLOPS", Peak(value=4.0, unit="TFLOPS", source="s", supported=False)) is None
    assert comparable_ratio(1.0, "TFLOPS", Peak(value=None, unit="TFLOPS", source="s")) is None


def test_context_require() -> None:
    spec = SpecTable(device="dev", peaks={"a": Peak(value=1.0, unit="u", source="s"),
                                         "b": Peak(value=None, unit="u", source="no b here", supported=False)})
    ctx = CaseContext("cpu", spec, TINY, LOG, shares_host_memory=True)
    assert ctx.require("a") == spec.peaks["a"]
    assert ctx.require("missing") is None
    with pytest.raises(Unsupported, match="b on dev: no b here"):
        ctx.require("b")
    assert not ctx.has_separate_memory
    free, total = ctx.memory_info()
    assert 0 < free <= total


# --- through the in-host entry ------------------------------------------------------------------------------


def make_job(tmp_path: Path, case: str, sets: list[str]) -> Job:
    plan = plan_run(cases=[case], sets=sets, results_dir=tmp_path / "results", run_id="run1")
    cp = plan.cases[0]
    return Job(run_id=plan.run_id, case=case, family=cp.family, round=1, host="localhost", vendor="cpu",
               config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, command="pytest",
               image={"status": "none"})


TINY_GEMM = ["m=64", "n=64", "k=64", "warmup_iters=0", "min_duration_s=0.05", "min_iters=2"]


def test_run_job_success(tmp_path: Path) -> None:
    job = make_job(tmp_path, "computation-FP32", TINY_GEMM)
    out = tmp_path / "out"
    out.mkdir()
    assert run_job(job, out) == EXIT_OK
    result = read_result(out / "result.json")
    assert result.status == "success"
    assert result.failure is None
    assert (result.case, result.round, result.host, result.vendor) == ("computation-FP32", 1, "localhost", "cpu")
    assert [m.name for m in result.metrics] == ["gemm_fp32"]
    assert result.metrics[0].unit == "TFLOPS" and result.metrics[0].value > 0
    assert result.measured_seconds == pytest.approx(result.metrics[0].measured_seconds)
    assert result.duration_s >= result.measured_seconds
    assert result.config["m"] == 64
    assert result.provenance is not None
    assert result.provenance.config_origins["m"] == "--set"
    assert result.provenance.run_overrides == {"--set": {"m": 64, "n": 64, "k": 64, "warmup_iters": 0,
                                                         "min_duration_s": 0.05, "min_iters": 2}}
    assert "torch" in result.provenance.libraries


def test_run_job_unsupported(tmp_path: Path, cpu_spec: SpecTable) -> None:
    """Proves something on CPUs the cpu spec table gives no TF32; skips where it gives one."""
    if cpu_spec.peaks["tf32"].supported:
        pytest.skip("tf32 supported here")
    job = make_job(tmp_path, "computation-TF32", TINY_GEMM)
    assert run_job(job, tmp_path) == EXIT_UNSUPPORTED
    result = read_result(tmp_path / "result.json")
    assert result.status == "unsupported"
    assert result.failure is not None and result.failure.kind == "unsupported"
    assert result.metrics == []


def test_run_job_user_error(tmp_path: Path) -> None:
    job = make_job(tmp_path, "computation-FP32", TINY_GEMM)
    job = job.model_copy(update={"config": {**job.config, "m": 0}})  # a job file edited by hand
    assert run_job(job, tmp_path) == EXIT_USER_ERROR
    result = read_result(tmp_path / "result.json")
    assert result.status == "failed"
    assert result.failure is not None and result.failure.kind == "user"
    assert "greater than 0" in result.failure.message


def test_entry_main_bad_job_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps({"run_id": "r"}), encoding="utf-8")
    assert entry_main(["--job", str(job_file)]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "cannot read the job file" in err
    assert err.count("\n") == 1
    assert not (tmp_path / "result.json").exists()
