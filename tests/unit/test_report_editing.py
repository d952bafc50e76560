"""The report read as an editor reads it before a figure is published: every percentage of a peak legible (never
0.0%), every table's unit in its header, every abbreviation explained, every warning with a next step, figures
written out and one row for figures measured over the same region."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from flagperf.results.markup import number, percent
from flagperf.results.operators import PointFigures, point_cell
from flagperf.results.schema import Metric, Peak, RoundResult, round_dir, write_result
from flagperf.results.serving import LATENCY_HEADER, SERVER_HEADER, THROUGHPUT_HEADER
from flagperf.results.summary import REPORT_MD, render_devices, summarize, write_summary

T0 = datetime(2026, 1, 2, tzinfo=timezone.utc)
PEAK = Peak(value=100.0, unit="TFLOPS", source="test datasheet")


def put(run: Path, case: str, metrics: list[Metric], family: str = "base", round_no: int = 1) -> Path:
    result = RoundResult(run_id=run.name, case=case, family=family, round=round_no, host="h1", node_rank=0,
                         vendor="cpu", status="success", started_at=T0, finished_at=T0, duration_s=1.0,
                         measured_seconds=1.0, device="Test CPU", metrics=metrics, config={})
    folder = round_dir(run, case, round_no, "h1")
    write_result(folder / "result.json", result)
    return folder


@pytest.mark.parametrize(("fraction", "shown"), [
    (0.5, "50.0%"), (0.0123, "1.2%"), (0.0056, "0.56%"), (0.00012, "0.012%"), (0.0001, "0.01%"),
    (0.00000099, "< 0.01%"), (0.0, "0%"), (None, "-"), (1.25, "125.0%")])
def test_a_percentage_keeps_its_significant_digits(fraction: float | None, shown: str) -> None:
    assert percent(fraction) == shown


def test_small_shares_of_a_peak_never_print_as_zero(tmp_path: Path) -> None:
    """An MFU of 0.012 % and a ratio under 0.01 % printed as "0.0%" (read: nothing measured) and "≤ 0.0%"."""
    run = tmp_path / "run"
    tiny = Metric(name="gemm_fp32", value=1e-5, unit="TFLOPS", iterations=10, measured_seconds=1.0, peak=PEAK,
                  ratio=1e-7, convention="2*M*N*K")
    rate = Metric(name="inference_core", value=10.0, unit="images/s", iterations=10, measured_seconds=1.0,
                  mfu=0.00012, mfu_peak_key="fp32", mfu_peak=PEAK, convention="MFU = 1 FLOP per image")
    put(run, "case", [tiny, rate])
    write_summary(run, summarize(run))
    text = (run / REPORT_MD).read_text(encoding="utf-8")
    assert "| < 0.01% |" in text  # the ratio
    assert "| 0.012% |" in text  # the MFU
    assert "0.0%" not in text
    # An operator's share of the roofline and its spread, by the same rule.
    point = PointFigures("op", "add", "fp32", "N8", "native", "test", bound_unit="GB/s", latencies=[1e-3],
                         values=[1.0], rooflines=[0.00034], statuses=["passed"], iteration_spreads=[0.00004])
    assert point_cell(point, {}) == "1 GB/s · 1 ms < ±0.01% · 0.034% roofline"


def test_figures_are_written_out_and_a_figure_without_a_unit_says_so(tmp_path: Path) -> None:
    run = tmp_path / "run"
    put(run, "case", [Metric(name="samples", value=24543.2, unit="samples/s", iterations=1, measured_seconds=1.0),
                      Metric(name="final_accuracy", value=0.9638, unit="", iterations=1, measured_seconds=1.0,
                             statistic="single")])
    write_summary(run, summarize(run))
    text = (run / REPORT_MD).read_text(encoding="utf-8")
    assert "| case | samples | 24540 | samples/s |" in text and "e+04" not in text
    assert "| case | final_accuracy | 0.9638 | (none given) |" in text
    assert "final_accuracy: one measurement, or one figure derived from others (no counting convention needed); " \
           "peak: none\n" in text
    assert number(2.5e16) == "2.5e+16" and number(0.0006226) == "0.0006226"


def test_every_table_header_names_its_unit() -> None:
    """Latencies are ms in inference and s in generate's metrics (ttft_s): each serving table says its unit in its
    header, and the per-device table has a unit column (the unit stood on the max cell alone)."""
    for header in (THROUGHPUT_HEADER, LATENCY_HEADER, SERVER_HEADER):
        assert "offered rate (requests/s)" in header and "concurrency (requests in flight)" in header
    assert all(" ms " in column for column in LATENCY_HEADER[3:])
    assert all(" ms " in column for column in SERVER_HEADER[5:])
    assert {"output tokens/s per device", "tokens/s per user", "completed requests/s", "J per output token",
            "MFU (%)"} <= set(THROUGHPUT_HEADER)
    table = render_devices([{"case": "c", "metric": "gemm_fp32", "round": 1, "host": "h1", "unit": "TFLOPS",
                             "devices": 2, "min": 1.0, "median": 1.5, "max": 2.0, "min_device": 0,
                             "min_device_uuid": None, "per_device": {0: 1.0, 1: 2.0}}])
    assert "| case | metric | unit | round |" in table[4] and "| c | gemm_fp32 | TFLOPS | 1 |" in table[6]


def test_the_report_explains_its_abbreviations_and_each_warning_has_a_next_step(tmp_path: Path) -> None:
    run = tmp_path / "run"
    warned = Metric(name="gemm_fp32", value=1.0, unit="TFLOPS", p50=2.0, cv=0.1, chunks=10, iterations=10,
                    measured_seconds=1.0, peak=PEAK, ratio=0.01, convention="2*M*N*K",
                    warning="headline 1 and median 2 differ by 50%, beyond the chunks' spread (±5% of the median, "
                            "from p10-p90): a few outlying chunks dominate the total")
    odd = Metric(name="other", value=1.0, unit="GB/s", iterations=1, measured_seconds=1.0, warning="something odd")
    put(run, "case", [warned, odd])
    write_summary(run, summarize(run))
    text = (run / REPORT_MD).read_text(encoding="utf-8")
    glossary = text[text.index("## Abbreviations and units"):]
    assert "- **CV**: coefficient of variation" in glossary and "- **FLOP, TFLOPS**:" in glossary
    assert "- **GB/s**: 10^9 bytes per second" in glossary and "- **p10, p50, p90, p99**:" in glossary
    assert "TTFT" not in glossary  # only what the report uses
    steps = text[text.index("Next steps:"):text.index("## Power")]
    assert "run again with more rounds (--rounds) or a longer measuring window" in steps
    assert "the round's case.log (in its round folder) says more" in steps  # a warning no rule knows


def test_figures_of_one_timed_region_share_a_row_of_the_power_table(tmp_path: Path) -> None:
    """A training round's eight figures over the same region had eight identical rows."""
    run = tmp_path / "run"
    folder = put(run, "train", [Metric(name=name, value=1.0, unit="s", iterations=1, measured_seconds=1.0)
                                for name in ("e2e_time", "init_time", "raw_train_time")], family="training")
    samples = [{"type": "sample", "t": 1.0 + i, "cpu_percent": 50.0} for i in range(4)]
    (folder / "monitor_system.jsonl").write_text("\n".join(json.dumps(s) for s in samples) + "\n", encoding="utf-8")
    write_summary(run, summarize(run))
    text = (run / REPORT_MD).read_text(encoding="utf-8")
    power = [line for line in text[text.index("## Power"):].splitlines() if line.startswith("| train |")]
    assert power == ["| train | e2e_time, init_time, raw_train_time | - | - | - | - | 50 | - | - | - | - |"]


def test_a_peak_is_unknown_only_where_one_could_be_known(tmp_path: Path) -> None:
    """"unknown" beside a latency or an accuracy read as missing data: a figure no peak applies to shows "-"; a
    figure in a spec table's units, or whose case looked for a peak, stays "unknown"."""
    run = tmp_path / "run"
    put(run, "case", [Metric(name="e2e_time", value=3.0, unit="s", iterations=1, measured_seconds=1.0),
                      Metric(name="copy", value=4.0, unit="GB/s", iterations=1, measured_seconds=1.0,
                             peak=Peak(value=None, unit="GB/s", source="unknown: set memory_channels"))])
    write_summary(run, summarize(run))
    text = (run / REPORT_MD).read_text(encoding="utf-8")
    assert "| case | e2e_time | 3 | s | - | - | - |" in text
    assert "| case | copy | 4 | GB/s | - | - | unknown |" in text


def test_the_speedup_plot_marks_a_failed_implementation_instead_of_a_bar_of_zero(tmp_path: Path) -> None:
    from flagperf.results.operators import failed_everywhere, speedup_bars, speedups_left_out

    def point(op: str, impl: str, latency: float | None) -> PointFigures:
        passed = latency is not None
        return PointFigures("c", op, "fp32", "N8", impl, "t", bound_unit="GB/s", latencies=[latency] if passed else [],
                            values=[1.0] if passed else [], statuses=["passed" if passed else "failed"])

    points = [point("add", "native", 2e-3), point("add", "compile", 1e-3), point("add", "gems", None),
              point("mul", "native", None), point("mul", "compile", 1e-3)]
    bars = speedup_bars(points)
    assert bars[("add", "fp32")] == {"compile": [pytest.approx(2.0)], "gems": []}
    assert bars[("mul", "fp32")] == {"compile": []}  # native failed: no speed-up to take
    assert failed_everywhere(points, ("add", "fp32"), "gems")
    assert not failed_everywhere(points, ("mul", "fp32"), "compile")
    assert speedups_left_out(points) == ("left out: 1 failed point (gems 1); 1 point whose native run failed or "
                                         "was skipped; each is listed in the report's Operators section")
