"""A generate case through the real flow: evaluate on a real Prefect server -> run_case -> `python -m flagperf.entry`
in a new process -> every concurrency level decoded for real (tiny preset) -> monitors -> the report's serving
table and trade-off plot, with energy per output token where the host has a power source."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flagperf.results.schema import read_result

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]


def test_a_generate_case_runs_through_the_evaluation(flagperf_env: Path) -> None:
    from flows.evaluate import evaluate

    run_id = f"run-generate-{time.time_ns()}"
    state = evaluate(cases=["tiny-llama-generate"], overrides=["input_len=8", "max_new_tokens=4", "requests=2"],
                     results_dir=str(flagperf_env), run_id=run_id, return_state=True)
    assert state.is_completed(), state.message
    run_dir = flagperf_env / run_id
    result = read_result(run_dir / "tiny-llama-generate" / "round1" / "localhost_noderank0" / "result.json")
    assert result.status == "success" and result.family == "generate"
    tokens = {m.name: m for m in result.metrics if m.name.startswith("output_tokens_per_s@")}
    assert sorted(tokens) == ["output_tokens_per_s@c1", "output_tokens_per_s@c4"]
    assert tokens["output_tokens_per_s@c4"].work == 16  # one batch of 4 requests x 4 tokens (2 rounded up)
    report = (run_dir / "report.md").read_text(encoding="utf-8")
    assert "## LLM serving (generate)" in report and "| tiny-llama-generate | 4 |" in report
    assert (run_dir / "plots" / "serving_tradeoff.png").is_file()
