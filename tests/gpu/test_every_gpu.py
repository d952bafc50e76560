"""Every GPU of the host and the NVML monitor's health facts, on real NVIDIA GPUs (skipped without one).

    python -m pytest tests/gpu/test_every_gpu.py -q
"""

from __future__ import annotations

import json
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


def test_a_round_measures_every_gpu(tmp_path: Path) -> None:
    """One process per GPU, each narrowed to its own by CUDA_VISIBLE_DEVICES; per-GPU figures and the host's
    min, median and max (one GPU: the round measures it itself, as before)."""
    plan = plan_run(cases=["computation-BF16"], vendor="nvidia", sets=["min_duration_s=2"], results_dir=tmp_path / "r")
    cp = plan.cases[0]
    job = Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, host="gpu", vendor="nvidia",
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})
    out = tmp_path / "round"
    out.mkdir()
    assert run_job(job, out) == 0
    result = read_result(out / "result.json")
    count = torch.cuda.device_count()
    if count == 1:
        assert result.devices == [] and result.metrics[0].device is None
        return
    assert [d.index for d in result.devices] == list(range(count))
    assert sorted(m.device for m in result.metrics if m.name == "gemm_bf16") == list(range(count))
    spread = next(s for s in result.device_spread if s.metric == "gemm_bf16")
    assert spread.devices == count and spread.min <= spread.median <= spread.max


def test_the_nvml_monitor_reads_the_health_facts(tmp_path: Path) -> None:
    pytest.importorskip("pynvml")
    out = tmp_path / "monitor_nvml.jsonl"
    proc = subprocess.Popen([sys.executable, str(PROJECT_ROOT / "vendor_images/nvidia/monitor_nvml.py"),
                             "--out", str(out), "--interval", "0.2"])
    time.sleep(2)
    proc.terminate()
    assert proc.wait(timeout=10) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    header, samples = lines[0], [line for line in lines if line["type"] == "sample"]
    assert all("uuid" in d and "serial" in d for d in header["devices"])
    device = samples[-1]["devices"][0]
    # Reported or null (a GPU without ECC, events not permitted), never missing.
    assert {"ecc_uncorrected", "xid_events", "retirement_pending"} <= set(device)
    print({k: device[k] for k in ("ecc_uncorrected", "xid_events", "retirement_pending")})


def test_the_health_probe_reads_every_gpu_through_nvml() -> None:
    """The healthcheck's reading (vendor_images/nvidia/health.py): every GPU NVML counts, its PCIe link within
    what it can train at, and the fields the default health rules read reported or null, never missing."""
    pytest.importorskip("pynvml")
    from flagperf.config.diagnose import load_rules
    from flagperf.config.vendors import load_vendor
    from flagperf.results.devicehealth import checked_reading
    from flagperf.results.diagnosis import health_findings

    answer = load_vendor("nvidia").device_health()
    reading = checked_reading(answer, "device_health()")
    assert reading.available, reading.reason
    assert len(reading.devices) >= torch.cuda.device_count()  # NVML counts every GPU, visible to torch or not
    for device in reading.devices:
        fields = device.fields
        assert device.uuid and device.uuid.startswith(("GPU-", "MIG-"))
        assert 0 < fields["pcie_link_width"] <= fields["pcie_link_width_max"]
        assert 0 < fields["pcie_link_gen"] <= fields["pcie_link_gen_max"]
        assert fields["unreachable"] == 0
        assert {r.health_field for r in load_rules().rules if r.health_field} <= set(fields)
    print(json.dumps(answer)[:2000])
    print(health_findings(reading, load_rules()))
