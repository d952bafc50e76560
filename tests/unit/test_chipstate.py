"""How the chip ran in a timed region (flagperf.results.chipstate), from sample files in the NVML monitor's format.

data/monitor_nvml_h100_power_capped.jsonl holds 40 one-second samples of one H100 in the monitor's format, with
the figures of the H100 probe's sustained BF16 GEMM (bench/results/h100_probe.md, 2026-11-23: SM clock
1080-1605 MHz, median 1395, power 657 W mean / 714 W max against a 700 W limit, SwPowerCap in 98 % of the
samples): power-capped through the timed region [T0+5, T0+29] after one uncapped sample, idle around it.
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest

from flagperf.results.analysis import read_monitor
from flagperf.results.chipstate import ChipState, chip_state, combine, render_chip_section
from flagperf.results.schema import Metric, Peak, RoundResult, ShapeSearch, round_dir, write_result
from flagperf.results.summary import REPORT_MD, render_markdown, summarize, write_summary

DATA = Path(__file__).parent / "data" / "monitor_nvml_h100_power_capped.jsonl"
T0 = 1_700_000_000.0
WINDOW = (T0 + 5, T0 + 29)


def test_power_capped_region() -> None:
    state = chip_state([read_monitor(DATA)], WINDOW)
    assert state is not None
    assert state.samples == 25
    assert state.sm_clock_max_mhz == 1980 and state.power_limit_w == 700
    assert state.sm_clock_min_mhz == 1080
    assert 1350 < state.sm_clock_mean_mhz < 1450  # type: ignore[operator]
    assert state.shares["sw_power_cap"] == pytest.approx(24 / 25)
    assert state.shares["gpu_idle"] == 0 and state.shares["hw_thermal_slowdown"] == 0
    assert state.clock_ratio == pytest.approx(state.sm_clock_mean_mhz / 1980)  # type: ignore[operator]
    assert 0.9 < state.power_ratio < 1.0  # type: ignore[operator]
    assert state.flagged
    assert state.limiter_text() == "power-capped 96 % of the timed region"


def test_whole_recording_names_idle_too() -> None:
    state = chip_state([read_monitor(DATA)], None)
    assert state is not None and state.samples == 40
    assert state.shares["gpu_idle"] == pytest.approx(15 / 40)
    assert state.limiter_text() == "power-capped 60 % of the timed region; SMs idle 38 % of the timed region"
    assert state.limiters == [("sw_power_cap", 0.6)]


def test_unlimited_and_unreported(tmp_path: Path) -> None:
    lines = DATA.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    calm = [header]
    old = [{k: v for k, v in header.items() if k != "throttle_bits"}]
    for line in lines[1:-1]:
        sample = json.loads(line)
        calm.append({**sample, "devices": [{**sample["devices"][0], "clock_event_bits": 0}]})
        old.append({**sample, "devices": [{k: v for k, v in sample["devices"][0].items() if k != "clock_event_bits"}]})
    for name, records in (("calm", calm), ("old", old)):
        (tmp_path / f"monitor_{name}.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    calm_state = chip_state([read_monitor(tmp_path / "monitor_calm.jsonl")], WINDOW)
    assert calm_state is not None and not calm_state.flagged
    assert calm_state.limiter_text() == "not limited (no throttle reason in the timed region)"
    old_state = chip_state([read_monitor(tmp_path / "monitor_old.jsonl")], WINDOW)
    assert old_state is not None and not old_state.reasons_reported and old_state.shares == {}
    assert old_state.limiter_text() == "throttle reasons not reported by the monitor"
    assert old_state.sm_clock_mean_mhz == calm_state.sm_clock_mean_mhz


def test_no_accelerator_no_state(tmp_path: Path) -> None:
    system = tmp_path / "monitor_system.jsonl"
    system.write_text(json.dumps({"type": "header", "monitor": "system"}) + "\n"
                      + json.dumps({"type": "sample", "t": T0, "cpu_percent": 50.0, "power_w": 100.0}) + "\n")
    assert chip_state([read_monitor(system)], None) is None
    assert render_chip_section([{"case": "c", "metric": "m", "chip": None}]) == []


def test_combine_takes_the_worst_device() -> None:
    a = ChipState(samples=10, sm_clock_mean_mhz=1700, sm_clock_min_mhz=1600, sm_clock_max_mhz=1980, power_mean_w=680,
                  power_limit_w=700, shares={"sw_power_cap": 0.9, "gpu_idle": 0.0}, reasons_reported=True)
    b = ChipState(samples=10, sm_clock_mean_mhz=1900, sm_clock_min_mhz=1800, sm_clock_max_mhz=1980, power_mean_w=500,
                  power_limit_w=700, shares={"sw_power_cap": 0.1, "hw_thermal_slowdown": 0.3}, reasons_reported=True)
    both = combine([a, b])
    assert both.samples == 20 and both.sm_clock_mean_mhz == 1800 and both.sm_clock_min_mhz == 1600
    assert both.shares == {"gpu_idle": 0.0, "hw_thermal_slowdown": 0.3, "sw_power_cap": 0.9}
    assert both.limiter_text() == ("power-capped 90 % of the timed region; thermally throttled (hardware) 30 % of "
                                   "the timed region")


def test_report_names_the_limiter(tmp_path: Path) -> None:
    run = tmp_path / "run7"
    folder = round_dir(run, "computation-BF16", 1, "gpu1")
    folder.mkdir(parents=True)
    shutil.copy(DATA, folder / "monitor_nvml.jsonl")
    peak = Peak(value=989.0, unit="TFLOPS", source="NVIDIA H100 datasheet")
    metrics = [Metric(name="gemm_bf16", value=688.6, unit="TFLOPS", measured_seconds=24.0, peak=peak,
                      ratio=688.6 / 989, window=[WINDOW[0], WINDOW[1]], note="8192x8192 @ 8192x8192, normal data"),
               Metric(name="gemm_bf16_max", value=760.0, unit="TFLOPS", measured_seconds=2.0, peak=peak,
                      ratio=760 / 989, window=[T0 + 30, T0 + 32],
                      note="best of 90 shapes searched in 60 s: 6144x2816 @ 2816x17920, normal data",
                      search=ShapeSearch(shape={"m": 6144, "n": 17920, "k": 2816}, search_value=771.0, shapes_tried=90,
                                         budget_s=60, spent_s=60.2, stopped="budget",
                                         ranges={a: [1024, 20480] for a in "mnk"}, step=256))]
    when = datetime(2026, 1, 2, tzinfo=timezone.utc)
    write_result(folder / "result.json", RoundResult(
        run_id="run7", case="computation-BF16", family="base", round=1, host="gpu1", node_rank=0, vendor="nvidia",
        status="success", started_at=when, finished_at=when, duration_s=40, measured_seconds=26, device="H100",
        metrics=metrics, config={}))
    summary = summarize(run)
    capped, searched = summary.headline
    assert capped["chip"]["limiter"] == "power-capped 96 % of the timed region" and capped["chip"]["flagged"]
    # After the load: idle samples, said but not flagged (a transfer's SMs are idle too).
    assert searched["chip"]["limiter"] == ("not limited (no throttle reason in the timed region); SMs idle 100 % of "
                                           "the timed region")
    assert not searched["chip"]["flagged"]
    row = summary.rows[summary.rows["metric"] == "gemm_bf16"].iloc[0]
    assert row["limiter"] == "power-capped 96 % of the timed region" and row["power_limit_w"] == 700
    text = render_markdown(summary)
    assert "## How the chip ran in each timed region" in text
    assert "**power-capped 96 % of the timed region**" in text
    assert "| 1980 | " not in text and "/ 1980 |" in text
    assert "## Max-achievable (shape search) beside the fixed shape" in text
    assert "6144x2816 @ 2816x17920" in text and "110.4%" in text
    assert searched["search"]["shape"] == {"m": 6144, "n": 17920, "k": 2816} and capped["search"] is None
    write_summary(run, summary)
    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk["headline"][0]["chip"]["shares"]["sw_power_cap"] == pytest.approx(0.96)
    assert "power-capped 96 %" in (run / REPORT_MD).read_text()
