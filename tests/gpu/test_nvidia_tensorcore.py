"""INT8, FP8, the shape search, the cuBLASLt toolkit and the chip state on a real NVIDIA GPU (skipped without one)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from flagperf.config.job import Job
from flagperf.config.plan import plan_run
from flagperf.entry import run_job
from flagperf.errors import EXIT_OK, EXIT_UNSUPPORTED
from flagperf.paths import PROJECT_ROOT
from flagperf.results.analysis import read_monitor
from flagperf.results.chipstate import chip_state
from flagperf.results.schema import RoundResult, read_result

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")]


def run_case(tmp_path: Path, case: str, *sets: str, expect: int = EXIT_OK) -> RoundResult:
    plan = plan_run(cases=[case], vendor="nvidia", sets=["min_duration_s=2", *sets], results_dir=tmp_path / "r")
    cp = plan.cases[0]
    job = Job(run_id=plan.run_id, case=case, family=cp.family, round=1, host="gpu", vendor="nvidia",
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})
    out = tmp_path / case
    out.mkdir(parents=True)  # test_fp8 runs a second round under tmp_path / 'e5m2'
    assert run_job(job, out) == expect
    return read_result(out / "result.json")


def has_fp8() -> bool:
    return torch.cuda.get_device_capability(0) >= (8, 9)


def test_int8_on_tensor_cores(tmp_path: Path) -> None:
    (metric,) = run_case(tmp_path, "computation-INT8").metrics
    assert metric.unit == "TOPS" and metric.peak is not None and metric.peak.value
    assert 0.3 < metric.ratio < 1.0, metric  # a row-major B measured 6.7 % of peak on an H100


def test_int8_column_major_beats_row_major() -> None:
    a = torch.randint(-8, 8, (8192, 8192), dtype=torch.int8, device="cuda")
    col = torch.randint(-8, 8, (8192, 8192), dtype=torch.int8, device="cuda").t()
    row = col.contiguous()

    def rate(b: torch.Tensor) -> float:
        out = torch.empty(8192, 8192, dtype=torch.int32, device="cuda")
        for _ in range(3):
            torch._int_mm(a, b, out=out)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            torch._int_mm(a, b, out=out)
        stop.record()
        stop.synchronize()
        return 20 / start.elapsed_time(stop)

    assert rate(col) > 2 * rate(row)


def test_fp8(tmp_path: Path) -> None:
    if not has_fp8():
        result = run_case(tmp_path, "computation-FP8", expect=EXIT_UNSUPPORTED)
        assert result.status == "unsupported" and result.failure is not None
        assert "8.9" in result.failure.message
        return
    (metric,) = run_case(tmp_path, "computation-FP8").metrics
    assert metric.peak is not None and metric.peak.value
    assert 0.3 < metric.ratio < 1.0, metric
    (e5m2,) = run_case(tmp_path / "e5m2", "computation-FP8", "fp8_format=e5m2").metrics
    assert e5m2.note is not None and "e5m2" in e5m2.note


def test_bf16_max_achievable(tmp_path: Path) -> None:
    result = run_case(tmp_path, "computation-BF16", "sweep_budget_s=10", "sweep_m=[2048, 8192]",
                      "sweep_n=[2048, 8192]", "sweep_k=[2048, 8192]", "sweep_step=1024", "sweep_shape_s=0.05")
    fixed, best = result.metrics
    assert best.name == "gemm_bf16_max" and best.search is not None and best.search.shapes_tried >= 5
    assert best.ratio is not None and best.ratio < 1.0
    assert best.search.search_value >= 0.8 * fixed.value  # the search starts at (or next to) the fixed shape


def test_cublaslt_toolkit(tmp_path: Path) -> None:
    if shutil.which("nvcc") is None:
        result = run_case(tmp_path, "toolkit-gemm", expect=EXIT_UNSUPPORTED)
        assert result.failure is not None and "nvcc not found" in result.failure.message
        return
    result = run_case(tmp_path, "toolkit-gemm", "precisions=[bf16, int8, fp8]", "warmup_iters=5")
    names = [m.name for m in result.metrics]
    assert names[:2] == ["toolkit_gemm_bf16", "toolkit_gemm_int8"]
    assert ("toolkit_gemm_fp8" in names) == has_fp8()
    for metric in result.metrics:
        assert metric.value > 0 and (metric.ratio is None or metric.ratio < 1.0), metric


def test_chip_state_from_a_real_recording(tmp_path: Path) -> None:
    pytest.importorskip("pynvml")
    out = tmp_path / "monitor_nvml.jsonl"
    proc = subprocess.Popen([sys.executable, str(PROJECT_ROOT / "vendor_images/nvidia/monitor_nvml.py"),
                             "--out", str(out), "--interval", "0.1"])
    time.sleep(1)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    start = time.time()
    while time.time() - start < 3:
        for _ in range(50):
            a @ a
        torch.cuda.synchronize()
    window = (start, time.time())
    time.sleep(0.5)
    proc.terminate()
    assert proc.wait(timeout=10) == 0
    state = chip_state([read_monitor(out)], window)
    assert state is not None and state.samples >= 10
    assert state.sm_clock_max_mhz and state.power_limit_w and state.reasons_reported
    assert state.sm_clock_mean_mhz is not None and 0 < state.sm_clock_mean_mhz <= state.sm_clock_max_mhz
    assert state.shares.get("gpu_idle", 0) < 0.5  # the GPU was busy in the window
