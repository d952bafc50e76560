"""The report names every fault it saw and every bound it applied (flagperf/results/faults.py), with a real
monitor process killed mid-round and result files written through the schema."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from pydantic import ValidationError

from flagperf.paths import PROJECT_ROOT
from flagperf.results.schema import Failure, Metric, Peak, Provenance, RoundResult, round_dir, write_result
from flagperf.results.summary import headline_cells, render_markdown, summarize

T0 = datetime(2026, 1, 2, tzinfo=timezone.utc)
PROV = Provenance(engine_version="0.1.0", git_revision="0123456789abcdef", git_dirty=False, command="flagperf run",
                  python="3.11.9", libraries={"torch": "2.13.0"}, host={}, image={"status": "none"},
                  config_origins={}, run_overrides={})
PEAK = Peak(value=2.0, unit="TFLOPS", source="derived: 2 cores x 1 GHz")


def put(run_dir: Path, case: str, metrics: list[Metric], status: str = "success",
        failure: Failure | None = None, round_no: int = 1) -> Path:
    result = RoundResult(run_id=run_dir.name, case=case, family="base", round=round_no, host="localhost",
                         node_rank=0, vendor="cpu", status=status, failure=failure, started_at=T0, finished_at=T0,
                         duration_s=1.0, measured_seconds=1.0, device="Test CPU", metrics=metrics, config={},
                         provenance=PROV)
    folder = round_dir(run_dir, case, round_no, "localhost")
    write_result(folder / "result.json", result)
    return folder


def killed_monitor(folder: Path) -> None:
    """A real system monitor, killed with SIGKILL once it has written a sample: no footer, as in the field."""
    out = folder / "monitor_system.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "flagperf.monitoring.system", "--out", str(out),
                             "--interval", "0.2"], env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    try:
        deadline = time.monotonic() + 120  # a guard against a hang, not a timing assumption
        while proc.poll() is None and (not out.exists() or '"sample"' not in out.read_text()):
            assert time.monotonic() < deadline, "the monitor wrote no sample"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert '"footer"' not in out.read_text()


def test_every_fault_and_bound_is_named_in_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run7"
    run.mkdir()
    (run / "plan.json").write_text(json.dumps({"vendor": {"manifest": {"monitors": [
        {"name": "system"}, {"name": "nvml"}]}}}))
    gemm = put(run, "computation-FP32", [Metric(name="gemm_fp32", value=2.5, unit="TFLOPS", peak=PEAK, ratio=1.25)])
    killed_monitor(gemm)
    attempt = gemm / "attempts" / "attempt1"
    attempt.mkdir(parents=True)
    (attempt / "failure.txt").write_text("computation-FP32 round 1 on localhost: killed by signal 9\n")
    put(run, "resnet50-infer", [Metric(name="inference_core", value=100.0, unit="images/s", mfu=8.7)])
    put(run, "main_memory-capacity", [Metric(name="memory_capacity", value=0.25, unit="GiB", note=(
        "bounded by design at 0.25 GiB (50% of 12.00 GiB free, max_gib 0.25): a lower bound on capacity, "
        "not a limit reached"))])
    earlier = RoundResult(run_id="run7", case="resnet50-infer", family="inference", round=1, host="localhost",
                          node_rank=0, vendor="cpu", status="failed", started_at=T0, finished_at=T0, duration_s=1.0,
                          measured_seconds=0.0, config={},
                          failure=Failure(kind="infrastructure", message="the case left no result"))
    write_result(run / "retries" / "attempt1" / "resnet50-infer" / "round1" / "localhost_noderank0" / "result.json",
                 earlier)

    summary = summarize(run)
    faults = "\n".join(summary.faults)
    assert "computation-FP32 round 1 on localhost: monitor system died during the round" in faults
    assert "monitor nvml left no samples file" in faults
    assert "attempt1 failed and the round was retried: computation-FP32 round 1 on localhost: killed by signal 9" \
        in faults
    assert "resnet50-infer round 1 on localhost: run again by a retry of the flow run" in faults
    assert "the case left no result" in faults
    assert "resnet50-infer / inference_core: MFU 870.0% is above 100 %" in faults
    assert "computation-FP32 / gemm_fp32: measured 125.0% of its peak" in faults
    assert "main_memory-capacity / memory_capacity: bounded by design at 0.25 GiB" in faults

    report = render_markdown(summary)
    assert "## Faults and bounds" in report and all(f in report for f in summary.faults)
    cells = {e["case"]: headline_cells(e) for e in summary.headline}
    assert cells["main_memory-capacity"][2].startswith("≥ ")  # the table says it is a bound
    assert cells["resnet50-infer"][8].endswith("(above 100%!)")
    assert cells["computation-FP32"][7].endswith("(above peak!)")

    # The console after a run: a bound the case chose is said as a bound, never labelled a fault (a newcomer's first
    # run bounds its capacity check by design); what went wrong is a fault.
    from flows.cli import _print_summary

    _print_summary(summary.to_json(), run)
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("bound main_memory-capacity / memory_capacity: bounded by design") for line in lines)
    assert not any(line.startswith("fault ") and "bounded by design" in line for line in lines)
    assert any(line.startswith("fault computation-FP32 / gemm_fp32: measured 125.0%") for line in lines)


def test_a_monitor_whose_tool_is_missing_is_named_with_its_reason(tmp_path: Path) -> None:
    """The nvidia monitor run here for real, where nvidia-smi and NVML are missing: no samples, and the fault says
    why (it read "took 0 sample(s): its averages and maxima are one reading", which it has none of)."""
    run = tmp_path / "run9"
    run.mkdir()
    folder = put(run, "computation-FP32", [Metric(name="gemm_fp32", value=1.0, unit="TFLOPS", peak=PEAK, ratio=0.5)])
    out = folder / "monitor_nvml.jsonl"
    subprocess.run([sys.executable, str(PROJECT_ROOT / "vendor_images" / "nvidia" / "monitor_nvml.py"), "--out",
                    str(out), "--interval", "0.2", "--max-seconds", "2"], check=True,
                   env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "PATH": "/nonexistent"})
    header = json.loads(out.read_text().splitlines()[0])
    reason = next(iter(header["sources"].values()))["reason"]
    faults = summarize(run).faults
    assert len(faults) == 1 and faults[0].startswith(
        "computation-FP32 round 1 on localhost: monitor nvml took no samples, its source is unavailable ("), faults
    assert reason in faults[0] and "one reading" not in faults[0]


def test_a_clean_round_has_no_faults(tmp_path: Path) -> None:
    run = tmp_path / "run8"
    put(run, "computation-FP32", [Metric(name="gemm_fp32", value=1.0, unit="TFLOPS", peak=PEAK, ratio=0.5)])
    summary = summarize(run)
    assert summary.faults == []
    assert "Faults and bounds" not in render_markdown(summary)


BASE_CLOCK = "base clock from the model name; the cores may boost above it"
ESTIMATED = Peak(value=2.0, unit="TFLOPS", source="derived: 2 cores x 1 GHz (model name)", bound="lower",
                 bound_reason=BASE_CLOCK)


def test_above_an_estimated_peak_is_an_upper_estimate_not_a_fault(tmp_path: Path) -> None:
    """A peak from a clock the cores may exceed is a lower bound: 125 % of it is 'at most 125 %' of the real peak,
    said with the reason, never 'above peak!' nor a fault; the same figure against an exact peak still is one."""
    run = tmp_path / "run9"
    put(run, "computation-FP32", [Metric(name="gemm_fp32", value=2.5, unit="TFLOPS", peak=ESTIMATED, ratio=1.25)])
    put(run, "computation-FP64", [Metric(name="gemm_fp64", value=1.0, unit="TFLOPS", peak=ESTIMATED, ratio=0.5)])
    put(run, "digits", [Metric(name="train_samples_per_s", value=10.0, unit="samples/s", mfu=1.3,
                               mfu_peak_key="fp32", mfu_peak=ESTIMATED)])
    put(run, "computation-INT8", [Metric(name="gemm_int8", value=2.5, unit="TFLOPS", peak=PEAK, ratio=1.25)])

    summary = summarize(run)
    by_case = {e["case"]: e for e in summary.headline}
    fp32 = by_case["computation-FP32"]
    assert (fp32["above_peak"], fp32["above_estimated_peak"], fp32["peak_bound"]) == (False, True, "lower")
    assert fp32["peak_bound_reason"] == BASE_CLOCK
    assert by_case["computation-INT8"]["above_peak"] is True  # an exact peak: as before
    assert summary.faults == ["computation-INT8 / gemm_int8: measured 125.0% of its peak: above the peak means the "
                              "spec table's peak is wrong for this machine (its source: report.md, 'How these "
                              "numbers were made')"]

    cells = {e["case"]: headline_cells(e) for e in summary.headline}
    assert cells["computation-FP32"][7] == f"≤ 125.0% (above the estimated peak; a lower bound: {BASE_CLOCK})"
    assert cells["computation-FP64"][7] == "≤ 50.0%"  # an upper estimate below 100 % too
    assert cells["digits"][8] == "≤ 130.0% (above 100 % of the estimated peak, a lower bound)"
    assert cells["computation-INT8"][7] == "125.0% (above peak!)"
    report = render_markdown(summary)
    assert "≤: measured against an estimated peak, a lower bound of this machine's real peak" in report
    assert (f"- computation-FP32 / gemm_fp32, computation-FP64 / gemm_fp64: the peak is an estimate, a lower bound "
            f"({BASE_CLOCK})") in report
    assert f"peak: {ESTIMATED.source}; an estimate, a lower bound of the real peak: {BASE_CLOCK}" in report
    assert f"MFU against the fp32 peak, 2 TFLOPS ({ESTIMATED.source}; a lower bound: {BASE_CLOCK})" in report


def test_a_run_with_only_estimated_peaks_has_no_peak_fault(tmp_path: Path) -> None:
    run = tmp_path / "run10"
    put(run, "computation-FP32", [Metric(name="gemm_fp32", value=2.5, unit="TFLOPS", peak=ESTIMATED, ratio=1.25)])
    summary = summarize(run)
    report = render_markdown(summary)
    assert summary.faults == [] and "Faults and bounds" not in report
    assert "above peak!" not in report and "A measurement above its peak" not in report


def test_a_peak_says_why_it_is_only_a_lower_bound() -> None:
    with pytest.raises(ValidationError, match="bound: lower needs bound_reason"):
        Peak(value=2.0, unit="TFLOPS", source="derived", bound="lower")
    with pytest.raises(ValidationError, match="bound_reason goes with bound: lower"):
        Peak(value=2.0, unit="TFLOPS", source="datasheet", bound_reason="why")
    with pytest.raises(ValidationError, match="bound"):
        Peak(value=2.0, unit="TFLOPS", source="datasheet", bound="upper")
    assert Peak(value=2.0, unit="TFLOPS", source="datasheet").bound == "exact"  # result files of before read so
