"""Monitor analysis on synthetic sample files whose answers are known exactly."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from flagperf.results.analysis import (
    counter_delta,
    integrate_power,
    read_monitor,
    window_stats,
    work_unit,
)
from flagperf.results.schema import Metric, RoundResult, write_result
from flagperf.results.summary import summarize, write_summary

T0 = 1_800_000_000.0  # an epoch second; sample times are T0 + 0..10


def write_monitor(path: Path, samples: list[dict[str, Any]], *, header: dict[str, Any] | None = None,
                  garbage: list[str] = ()) -> Path:
    lines = [json.dumps({"type": "header", "monitor": "system", "interval_s": 1.0, **(header or {})})]
    lines += [json.dumps({"type": "sample", **s}) for s in samples]
    lines += list(garbage)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_counter_and_integral_are_exact_on_linear_data() -> None:
    import numpy as np

    t = np.arange(0.0, 11.0)
    assert counter_delta(t, 50 * t, 2.5, 7.5) == pytest.approx(250.0)
    assert integrate_power(t, np.full_like(t, 100.0), 2.5, 7.5) == pytest.approx(500.0)
    assert integrate_power(t, 10 * t, 2.5, 7.5) == pytest.approx(5 * (7.5**2 - 2.5**2))
    # Never extrapolated outside the sampled span.
    assert counter_delta(t, t, -1.0, 5.0) is None
    assert integrate_power(t, t, 5.0, 11.0) is None
    assert integrate_power(t[:1], t[:1], 0.0, 0.0) is None


def test_window_stats_prefers_accelerator_energy_and_reports_averages(tmp_path: Path) -> None:
    samples = [{"t": T0 + i, "cpu_percent": 10.0 * i, "mem_used_bytes": 1000 + i, "power_w": 100.0,
                "energy_j": 50.0 * i,
                "devices": [{"index": 0, "power_w": 300.0, "energy_j": 300.0 * i, "util_percent": 90.0,
                             "mem_used_bytes": 5 * 2**30 + i}]}
               for i in range(11)]
    mon = read_monitor(write_monitor(tmp_path / "monitor_system.jsonl", samples))
    stats = window_stats([mon], (T0 + 2.5, T0 + 7.5))
    v = stats.values
    assert v["energy_source"] == "accelerators"
    assert v["energy_j"] == pytest.approx(1500.0)
    assert v["power_avg_w"] == pytest.approx(300.0)
    assert v["power_max_w"] == pytest.approx(300.0)
    assert v["cpu_percent_mean"] == pytest.approx(50.0)  # samples at 3..7 inside the window
    assert v["mem_used_bytes_max"] == 1007
    assert v["dev0.util_percent_mean"] == pytest.approx(90.0)
    assert v["dev0.mem_used_bytes_max"] == 5 * 2**30 + 7


def test_window_stats_falls_back_to_cpu_energy_then_system_power(tmp_path: Path) -> None:
    rapl = read_monitor(write_monitor(tmp_path / "monitor_a.jsonl",
                                      [{"t": T0 + i, "energy_j": 50.0 * i, "power_w": 100.0} for i in range(11)]))
    assert window_stats([rapl], (T0 + 2.5, T0 + 7.5)).values["energy_source"] == "cpu packages"
    assert window_stats([rapl], (T0 + 2.5, T0 + 7.5)).values["energy_j"] == pytest.approx(250.0)
    bmc = read_monitor(write_monitor(tmp_path / "monitor_b.jsonl",
                                     [{"t": T0 + i, "energy_j": None, "power_w": 10.0 * i} for i in range(11)]))
    v = window_stats([bmc], (T0 + 2.5, T0 + 7.5)).values
    assert v["energy_source"] == "whole system"
    assert v["energy_j"] == pytest.approx(250.0)
    assert v["power_avg_w"] == pytest.approx(50.0)
    assert v["power_max_w"] == pytest.approx(70.0)


def test_unavailable_sources_are_notes_never_zero(tmp_path: Path) -> None:
    header = {"sources": {"energy_j": {"available": False, "reason": "no RAPL here"},
                          "power_w": {"available": False, "reason": "ipmitool is not installed"}}}
    mon = read_monitor(write_monitor(tmp_path / "monitor_system.jsonl",
                                     [{"t": T0 + i, "cpu_percent": 5.0, "energy_j": None, "power_w": None}
                                      for i in range(5)], header=header))
    stats = window_stats([mon], (T0 + 1, T0 + 3))
    assert "energy_j" not in stats.values and "power_avg_w" not in stats.values
    assert any("no RAPL here" in n for n in stats.notes)
    assert any("ipmitool is not installed" in n for n in stats.notes)


def test_malformed_and_truncated_lines_are_counted_not_fatal(tmp_path: Path) -> None:
    garbage = ["not json at all", '{"type": "sample", "t": "yesterday"}', '["a list"]', '{"type": "sample", "t": 1']
    mon = read_monitor(write_monitor(tmp_path / "monitor_system.jsonl",
                                     [{"t": T0 + i, "cpu_percent": 1.0} for i in range(3)], garbage=garbage))
    assert mon.malformed == 4
    assert len(mon.samples) == 3
    assert any("4 malformed line(s)" in n for n in window_stats([mon], None).notes)


def test_too_few_samples_in_a_short_window_is_said(tmp_path: Path) -> None:
    mon = read_monitor(write_monitor(tmp_path / "monitor_system.jsonl",
                                     [{"t": T0 + i, "cpu_percent": 1.0} for i in range(5)]))
    notes = window_stats([mon], (T0 + 1.2, T0 + 1.8)).notes
    assert any("0 sample(s) inside" in n and "--monitor-interval" in n for n in notes)


def test_a_monitor_that_stopped_before_the_timed_region_says_so_not_sample_faster(tmp_path: Path) -> None:
    """One sample and a footer 0.3 ms after start (the SSH hosts' monitors once did): sampling faster would not
    help, so the note says the monitor stopped early, and why."""
    footer = json.dumps({"type": "footer", "samples": 1, "stopped_at": T0 + 0.0003, "reason": "parent-exited"})
    mon = read_monitor(write_monitor(tmp_path / "monitor_system.jsonl", [{"t": T0, "cpu_percent": 1.0}],
                                     garbage=[footer]))
    notes = window_stats([mon], (T0 + 4.0, T0 + 6.8)).notes
    assert "monitor_system.jsonl: 0 sample(s) inside the 2.8 s timed region; the monitor stopped early: " \
           "parent-exited, 6.8 s before the timed region ended" in notes, notes
    assert not any("--monitor-interval" in n for n in notes)
    died = read_monitor(write_monitor(tmp_path / "monitor_died.jsonl",
                                      [{"t": T0 + i, "cpu_percent": 1.0} for i in range(5)]))  # no footer
    notes = window_stats([died], (T0 + 2.0, T0 + 6.0)).notes
    assert any(n.endswith("the monitor stopped early: no footer (killed or crashed), 2.0 s before the timed region "
                          "ended") and "3 sample(s)" in n for n in notes), notes


@pytest.mark.parametrize(("rate", "work"), [("TFLOPS", "TFLOP"), ("TOPS", "TOP"), ("GB/s", "GB"),
                                            ("samples/s", "samples"), ("GiB", "GiB*s")])
def test_work_unit(rate: str, work: str) -> None:
    assert work_unit(rate) == work


def _result(case: str, rnd: int, value: float, window: list[float] | None, work: float | None) -> RoundResult:
    now = datetime.now(timezone.utc)
    metric = Metric(name="gemm_fp32", value=value, unit="TFLOPS", window=window, work=work)
    return RoundResult(run_id="run-x", case=case, family="base", round=rnd, host="h1", node_rank=0, vendor="cpu",
                       status="success", started_at=now, finished_at=now, duration_s=1.0, measured_seconds=5.0,
                       metrics=[metric], config={})


def test_summary_joins_energy_per_work_and_reports_a_missing_monitor(tmp_path: Path) -> None:
    run = tmp_path / "run-x"
    with_monitor = run / "c1" / "round1" / "h1_noderank0"
    write_result(with_monitor / "result.json", _result("c1", 1, 2.0, [T0 + 2.5, T0 + 7.5], work=10.0))
    write_monitor(with_monitor / "monitor_system.jsonl",
                  [{"t": T0 + i, "energy_j": 50.0 * i, "cpu_percent": 50.0} for i in range(11)])
    without = run / "c2" / "round1" / "h1_noderank0"
    write_result(without / "result.json", _result("c2", 1, 1.0, None, None))
    summary = summarize(run)
    c1 = next(e for e in summary.headline if e["case"] == "c1")
    assert c1["energy_per_work"] == pytest.approx(25.0)  # 250 J / 10 TFLOP
    assert c1["energy_per_work_unit"] == "J/TFLOP"
    assert c1["power_avg_w"] == pytest.approx(50.0)
    assert c1["energy_source"] == "cpu packages"
    assert "c2 round 1 on h1: no monitor file" in summary.monitor_notes
    paths = write_summary(run, summary)
    text = paths["markdown"].read_text()
    assert "25 J/TFLOP" in text and "no monitor file" in text


def test_scaling_table_like_dlperf(tmp_path: Path) -> None:
    """1 -> 8 -> 16 devices: speed-up and efficiency against 1 device; a training job's global throughput,
    reported by each of its nodes, counts once."""
    run = tmp_path / "run-s"
    now = datetime.now(timezone.utc)
    layouts = {"resnet50-1x1": (1, 1, [100.0]), "resnet50-1x8": (1, 8, [760.0]),
               "resnet50-2x8": (2, 8, [1400.0, 1400.0])}
    for case, (nnodes, nproc, per_node) in layouts.items():
        for rank, value in enumerate(per_node):
            result = RoundResult(
                run_id="run-s", case="resnet50", family="training", round=1, host=f"h{rank}", node_rank=rank,
                vendor="cpu", status="success", started_at=now, finished_at=now, duration_s=1.0, measured_seconds=1.0,
                metrics=[Metric(name="throughput", value=value, unit="samples/s")],
                config={"nnodes": nnodes, "nproc_per_node": nproc})
            write_result(run / case / "round1" / f"h{rank}_noderank{rank}" / "result.json", result)
    # Results from different sizes of the same case carry the same case name.
    scaling = summarize(run).scaling
    assert [(s["devices"], s["throughput"]) for s in scaling] == [(1, 100.0), (8, 760.0), (16, 1400.0)]
    assert [s["speedup"] for s in scaling] == pytest.approx([1.0, 7.6, 14.0])
    assert [s["efficiency"] for s in scaling] == pytest.approx([1.0, 0.95, 0.875])
    assert "## Scaling" in write_summary(run, summarize(run))["markdown"].read_text()
