"""Base specs on a real NVIDIA GPU through the in-host entry (skipped without one).

Checks what only a GPU can show: the datasheet peak is found, the figures are below it, TF32 is really
off for FP32 and on for TF32, and the NVML monitor produces samples."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from flagperf.config.job import Job
from flagperf.config.plan import plan_run
from flagperf.entry import run_job
from flagperf.paths import PROJECT_ROOT
from flagperf.results.schema import read_result

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")]


def run_case(tmp_path: Path, case: str, *sets: str):
    plan = plan_run(cases=[case], vendor="nvidia", sets=["min_duration_s=2", *sets], results_dir=tmp_path / "r")
    cp = plan.cases[0]
    job = Job(run_id=plan.run_id, case=case, family=cp.family, round=1, host="gpu", vendor="nvidia",
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})
    out = tmp_path / case
    out.mkdir()
    assert run_job(job, out) == 0
    return read_result(out / "result.json")


@pytest.mark.parametrize("case", ["computation-BF16", "computation-FP32", "computation-TF32",
                                  "main_memory-bandwidth", "interconnect-h2d"])
def test_measured_is_below_the_datasheet_peak(tmp_path: Path, case: str) -> None:
    result = run_case(tmp_path, case)
    metric = result.metrics[0]
    assert metric.peak is not None and metric.peak.value, f"no datasheet peak for {result.device}"
    assert 0.05 < metric.ratio < 1.0, metric


def test_fp32_does_not_use_tf32(tmp_path: Path) -> None:
    fp32 = run_case(tmp_path, "computation-FP32").metrics[0].value
    tf32 = run_case(tmp_path, "computation-TF32").metrics[0].value
    assert tf32 > 2 * fp32  # tensor cores vs CUDA cores


def test_nvml_monitor_samples(tmp_path: Path) -> None:
    pytest.importorskip("pynvml")
    out = tmp_path / "monitor_nvml.jsonl"
    proc = subprocess.Popen([sys.executable, str(PROJECT_ROOT / "vendor_images/nvidia/monitor_nvml.py"),
                             "--out", str(out), "--interval", "0.2"])
    time.sleep(2)
    proc.terminate()
    assert proc.wait(timeout=10) == 0
    text = out.read_text()
    assert '"power_w"' in text and '"energy_j"' in text
