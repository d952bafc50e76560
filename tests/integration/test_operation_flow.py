"""An operation case through the real flow: evaluate on a real Prefect server -> run_case -> `python -m
flagperf.entry` in a new process -> every operator of the group native and through a planted wrong library
(a test vendor folder on FLAGPERF_VENDOR_PATH) -> result.json's points -> the report's row per operator, its
table per operator with the failed points and the speed-up plot."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flagperf.results.schema import read_result

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]

FIXTURE_VENDORS = Path(__file__).resolve().parents[1] / "fixtures" / "vendors"


def test_an_operation_case_runs_through_the_evaluation(flagperf_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.evaluate import evaluate

    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(FIXTURE_VENDORS))
    run_id = f"run-operation-{time.time_ns()}"
    state = evaluate(cases=["op-norm"], overrides=["dtypes=[fp32, bf16]", "implementations=[native, planted-wrong]",
                                                   "seq_lens=[16]", "rep_s=0.001", "min_iters=2", "max_iters=3",
                                                   "flush_cache=false", "op-norm.reference_cpu_max_elements=0",
                                                   "energy_intervals=3"],
                     results_dir=str(flagperf_env), run_id=run_id, monitor_interval_s=0.1, return_state=True)
    assert state.is_completed(), state.message
    run_dir = flagperf_env / run_id
    result = read_result(run_dir / "op-norm" / "round1" / "localhost_noderank0" / "result.json")
    assert result.status == "success" and result.family == "operation" and result.operation is not None
    by_impl = {impl: [p for p in result.operation.points if p.implementation == impl]
               for impl in ("native", "planted-wrong")}
    assert [p.status for p in by_impl["native"]] == ["passed"] * 4  # layer_norm, rms_norm x fp32, bf16
    assert all(p.status == "failed" and "wrong result" in (p.error or "") for p in by_impl["planted-wrong"])
    assert sorted(m.name for m in result.metrics) == sorted(p.metric for p in by_impl["native"])
    # every point over reference_cpu_max_elements: on the CPU, the host itself, its whole reference is float64 on
    # the host, so no host sample of it is made again (an accelerator's large points are held to one);
    # each figure's energy per work is over its energy loop, 3 of the monitors' intervals the round was told
    # (--monitor-interval, through the job), its window the timed iterations before it
    assert all(p.reference == "float64 on cpu" and p.reference_sample is None
               for p in result.operation.points), [(p.reference, p.reference_sample) for p in result.operation.points]
    assert result.operation.energy == "0.3 s: energy_intervals 3 x the monitors' 0.1 s interval"
    assert all("calls of the energy loop (0.3 s: energy_intervals 3 x the monitors' 0.1 s interval)" in (m.note or "")
               and m.energy_window and m.window and m.window[1] <= m.energy_window[0]
               and m.energy_window[1] - m.energy_window[0] >= 0.3 for m in result.metrics)
    report = (run_dir / "report.md").read_text(encoding="utf-8")
    # The headline: a row per operator; every point in its operator's table, the failed ones FAILED.
    assert "| op-norm | rms_norm | GB/s | native, planted-wrong | 2 (fp32, bf16) | 2 of 4; **2 FAILED** | " \
           "planted-wrong - (0 of 2; **2 FAILED**) |" in report
    section = report[report.index("### op-norm / rms_norm (GB/s)"):]
    assert "## Operators (operation)" in report and "| bf16 | R16xC128 (" in section
    assert "| native | planted-wrong | planted-wrong vs native |" in section and "| **FAILED** | - |" in section
    # each passed cell has the host's time per call beside the device clock's (docs/operation.md, Timing)
    assert all(p.host_latency_s for p in by_impl["native"]) and section.count(" · host ") == 2
    assert "@planted-wrong: wrong result:" in section
    assert "checked against: float64 on cpu, whole output (8 point-implementation pairs: native 4, planted-wrong 4)" \
        in report
    # and each operator's headline row and each point's row say it (the CPU: the whole reference, float64)
    assert "| float64 on cpu, whole output: 4 |" in report
    assert "| bf16 | R16xC128 (tiny b1 s16) | float64 on cpu, whole output | " in section
    assert "; energy loop: 0.3 s: energy_intervals 3 x the monitors' 0.1 s interval;" in report
