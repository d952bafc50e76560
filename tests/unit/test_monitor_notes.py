"""A monitor's note in the report says which rounds and hosts it came from: a lab that reads that a monitor had no
samples, or that a figure was unavailable, knows where to look; the same note from several rounds is said once."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from flagperf.results.schema import Metric, RoundResult, write_result
from flagperf.results.summary import summarize, write_summary

T0 = 1_800_000_000.0


def a_round(run: Path, case: str, round_no: int, host: str, header: dict[str, object], samples: int) -> None:
    folder = run / case / f"round{round_no}" / f"{host}_noderank0"
    now = datetime.now(timezone.utc)
    write_result(folder / "result.json", RoundResult(
        run_id=run.name, case=case, family="base", round=round_no, host=host, node_rank=0, vendor="cpu",
        status="success", started_at=now, finished_at=now, duration_s=1.0, measured_seconds=5.0, config={},
        metrics=[Metric(name="gemm_fp32", value=1.0, unit="TFLOPS", window=[T0, T0 + 5.0], work=5.0)]))
    lines = [{"type": "header", "monitor": "nvidia", "interval_s": 1.0, **header}]
    lines += [{"type": "sample", "t": T0 + i, "power_w": 100.0} for i in range(samples)]
    (folder / "monitor_nvidia.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_a_monitor_note_names_its_rounds_and_hosts_once(tmp_path: Path) -> None:
    run = tmp_path / "run-n"
    no_power = {"sources": {"power": {"available": False, "reason": "NVML: not supported"}}}
    a_round(run, "c1", 1, "h1", no_power, samples=7)
    a_round(run, "c1", 2, "h1", no_power, samples=7)
    a_round(run, "c1", 1, "h2", {}, samples=0)  # a monitor that wrote its header and no sample
    a_round(run, "c2", 1, "h2", no_power, samples=7)
    notes = summarize(run).monitor_notes
    assert "c1 rounds 1, 2 on h1; c2 round 1 on h2: nvidia monitor: power unavailable: NVML: not supported" in notes
    assert "c1 round 1 on h2: monitor_nvidia.jsonl: no samples" in notes
    assert not [note for note in notes if note.startswith(("nvidia", "monitor_", "energy"))]  # none without a round
    text = write_summary(run, summarize(run))["markdown"].read_text(encoding="utf-8")
    assert "- c1 round 1 on h2: monitor_nvidia.jsonl: no samples" in text
