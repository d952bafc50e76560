"""Every device of a host: one process per device (the CPU split into logical devices by a test vendor),
per-device figures in result.json, and the host's min, median and max."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flagperf.config.job import Job
from flagperf.config.plan import plan_run
from flagperf.config.vendors import load_vendor
from flagperf.errors import ConfigError
from flagperf.measure.fanout import DeviceSlot, cpu_slices, device_spread, host_devices, narrow_environment
from flagperf.results.schema import Metric, read_result

ROOT = Path(__file__).resolve().parents[2]
TEST_VENDORS = ROOT / "tests" / "fixtures" / "vendors"
FAST = ["m=64", "n=64", "k=64", "min_duration_s=0.2", "warmup_iters=0", "min_iters=2"]


@pytest.fixture
def split_vendor(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(TEST_VENDORS))
    return "cpu-split"


def test_cores_are_dealt_into_equal_slices_of_neighbours() -> None:
    assert cpu_slices(2, [0, 1, 2, 3, 4]) == [(0, 1, 2), (3, 4)]
    assert cpu_slices(4, [0, 1, 2, 3]) == [(0,), (1,), (2,), (3,)]
    assert cpu_slices(3, [4, 5]) == [(4,), (5,), (4,)]  # fewer cores than devices: shared round-robin


def test_the_devices_of_a_vendor(split_vendor: str) -> None:
    split = load_vendor(split_vendor).manifest
    slots = host_devices(split)
    assert [s.index for s in slots] == [0, 1] and all(s.cpus for s in slots)
    assert narrow_environment(split, slots[1], {})["OMP_NUM_THREADS"] == str(len(slots[1].cpus or ()))
    assert [s.index for s in host_devices(load_vendor("cpu").manifest)] == [0]  # the CPU is one device
    # A visible-devices vendor: the host's own narrowing is the list of its devices, by their ids.
    nvidia = load_vendor("nvidia").manifest
    listed = host_devices(nvidia, {"CUDA_VISIBLE_DEVICES": "2,5"})
    assert [(s.index, s.visible) for s in listed] == [(2, "2"), (5, "5")]
    assert narrow_environment(nvidia, listed[1], {"CUDA_VISIBLE_DEVICES": "2,5"})["CUDA_VISIBLE_DEVICES"] == "5"
    # A device listed twice is measured once; ids that would give two devices one index are numbered instead.
    twice = host_devices(nvidia, {"CUDA_VISIBLE_DEVICES": "2,5,2"})
    assert [(s.index, s.visible) for s in twice] == [(2, "2"), (5, "5")]
    mixed = host_devices(nvidia, {"CUDA_VISIBLE_DEVICES": "1,GPU-a1b2"})
    assert [(s.index, s.visible) for s in mixed] == [(0, "1"), (1, "GPU-a1b2")]


def test_the_host_spread_is_min_median_max_with_the_lowest_device() -> None:
    metrics = [Metric(name="gemm_fp32", value=v, unit="TFLOPS", device=i) for i, v in enumerate([4.0, 1.0, 3.0, 2.0])]
    (spread,) = device_spread([*metrics, Metric(name="gemm_fp32", value=9.0, unit="TFLOPS")])  # untagged: ignored
    assert (spread.devices, spread.min, spread.median, spread.max, spread.min_device) == (4, 1.0, 2.5, 4.0, 1)


@pytest.mark.parametrize("key, value", [("devices", "some"), ("device_order", "random")])
def test_device_keys_are_validated(split_vendor: str, tmp_path: Path, key: str, value: str) -> None:
    with pytest.raises(ConfigError) as err:
        plan_run(cases=["computation-FP32"], vendor=split_vendor, sets=[f"{key}={value}"], results_dir=tmp_path)
    assert key in str(err.value) and "\n" not in str(err.value)


def run_round(tmp_path: Path, vendor: str, *sets: str) -> tuple[int, Path, str]:
    """The entry as a host runs it (its own process; it starts the device processes)."""
    plan = plan_run(cases=["computation-FP32"], vendor=vendor, sets=[*FAST, *sets], results_dir=tmp_path / "r")
    cp = plan.cases[0]
    job = Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, host="localhost", vendor=vendor,
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})
    out = tmp_path / "out"
    out.mkdir()
    (out / "job.json").write_text(job.model_dump_json())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FLAGPERF_PARENT_PID", None)
    done = subprocess.run([sys.executable, "-m", "flagperf.entry", "--job", str(out / "job.json")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, out, done.stdout + done.stderr


@pytest.mark.parametrize("order", ["parallel", "sequential"])
def test_a_round_measures_every_device_and_keeps_per_device_rows(split_vendor: str, tmp_path: Path,
                                                                 order: str) -> None:
    code, out, output = run_round(tmp_path, split_vendor, f"device_order={order}")
    assert code == 0, output
    result = read_result(out / "result.json")
    assert result.status == "success"
    assert [(d.index, d.status) for d in result.devices] == [(0, "success"), (1, "success")]
    assert sorted(m.device for m in result.metrics) == [0, 1]
    by_device = {m.device: m.value for m in result.metrics}
    (spread,) = result.device_spread
    assert (spread.metric, spread.devices) == ("gemm_fp32", 2)
    assert spread.min == min(by_device.values()) and spread.max == max(by_device.values())
    assert spread.median == pytest.approx(sum(by_device.values()) / 2)
    # Each device's process was pinned to its own slice and said so; its own result is kept in its folder.
    for slot in host_devices(load_vendor(split_vendor).manifest):
        assert read_result(out / f"device{slot.index}" / "result.json").metrics[0].device == slot.index
        assert f"[device {slot.index}] " in output and slot.label in output
    windows = {d: m.window for d, m in ((m.device, m) for m in result.metrics)}
    if order == "sequential":  # one after another: device 1's timed region starts after device 0's ended
        assert windows[1][0] >= windows[0][1]


def test_devices_one_measures_the_first_device_only(split_vendor: str, tmp_path: Path) -> None:
    code, out, output = run_round(tmp_path, split_vendor, "devices=one")
    assert code == 0, output
    result = read_result(out / "result.json")
    assert result.devices == [] and [m.device for m in result.metrics] == [None]


def test_a_device_that_fails_fails_the_round_naming_it_and_keeps_the_others(split_vendor: str,
                                                                            tmp_path: Path) -> None:
    """A device's process killed mid-round (as a lost GPU would be): the others' figures stay in the result."""
    code, out, output = run_round(tmp_path, split_vendor)
    assert code == 0, output
    from flagperf.entry import merge_devices
    from flagperf.training.launch import EXIT_WORKER_FAILED

    (out / "device1" / "result.json").unlink()
    slots = [DeviceSlot(0, cpus=(0,)), DeviceSlot(1, cpus=(1,))]
    outcome = merge_devices(slots, {0: 0, 1: -9}, out)
    assert outcome.failure is not None and outcome.failure.kind == "infrastructure"
    assert "1 of 2 devices did not measure: device 1 failed" in outcome.failure.message
    assert outcome.exit_code == EXIT_WORKER_FAILED and [m.device for m in outcome.metrics] == [0]
    assert json.loads((out / "device0" / "result.json").read_text())["status"] == "success"


def test_the_summary_keeps_a_row_per_device_with_its_own_monitor_figures(tmp_path: Path) -> None:
    """Hand-made: two GPUs of one host, a vendor monitor that samples both; each device's row has its own UUID
    and power, and the report's every-device section names the lowest device."""
    from datetime import datetime, timezone

    from flagperf.results.schema import RoundResult, round_dir, write_result
    from flagperf.results.summary import render_markdown, summarize

    run = tmp_path / "run1"
    folder = round_dir(run, "computation-BF16", 1, "h1")
    t0 = datetime(2026, 1, 2, tzinfo=timezone.utc)
    metrics = [Metric(name="gemm_bf16", value=v, unit="TFLOPS", device=i, window=[100.0, 110.0])
               for i, v in enumerate([700.0, 640.0])]
    write_result(folder / "result.json", RoundResult(
        run_id="run1", case="computation-BF16", family="base", round=1, host="h1", node_rank=0, vendor="nvidia",
        status="success", started_at=t0, finished_at=t0, duration_s=1.0, measured_seconds=20.0, metrics=metrics,
        config={}, device_spread=device_spread(metrics)))
    lines = [{"type": "header", "monitor": "nvml", "interval_s": 1.0, "started_at": 99.0,
              "devices": [{"index": 0, "uuid": "GPU-aaaa"}, {"index": 1, "uuid": "GPU-bbbb"}]}]
    lines += [{"type": "sample", "t": t, "devices": [{"index": 0, "power_w": 500.0}, {"index": 1, "power_w": 300.0}]}
              for t in (99.0, 105.0, 111.0)]
    (folder / "monitor_nvml.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    summary = summarize(run)
    rows = summary.rows.set_index("device_index")
    assert rows.loc[0, "device_uuid"] == "GPU-aaaa" and rows.loc[1, "device_uuid"] == "GPU-bbbb"
    assert rows.loc[0, "power_avg_w"] == pytest.approx(500.0) and rows.loc[1, "power_avg_w"] == pytest.approx(300.0)
    (spread,) = summary.device_spread
    assert (spread["min"], spread["median"], spread["max"], spread["min_device"]) == (640.0, 670.0, 700.0, 1)
    assert spread["min_device_uuid"] == "GPU-bbbb" and spread["per_device"] == {0: 700.0, 1: 640.0}
    report = render_markdown(summary)
    assert "## Every device" in report
    assert "| computation-BF16 | gemm_bf16 | TFLOPS | 1 | h1 | 2 | 640 (device 1, GPU-bbbb) | 670 | 700 |" in report
