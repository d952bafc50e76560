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


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny preset with random weights and its word tokenizer, saved once for the module."""
    import torch

    from flagperf.generate.models import random_checkpoint

    return random_checkpoint("tiny", "fp32", 0, tmp_path_factory.mktemp("models"), torch.device("cpu"))


def test_a_serving_case_sweeps_concurrency_and_rate_through_transformers_serve(flagperf_env: Path,
                                                                              tiny_model: Path) -> None:
    """evaluate -> run_case -> the entry starts `transformers serve` on the saved model, loads it at
    concurrency 1 and 2 and at 4 requests/s, stops it; the stored round folder keeps result.json with every
    point's metrics, requests.jsonl (each request exactly the tokens asked, counted by the client), server.log
    and serving.json."""
    import json

    from flows.evaluate import evaluate

    run_id = f"run-serve-{time.time_ns()}"
    state = evaluate(cases=["tiny-llama-serve"], overrides=[f"checkpoint_path={tiny_model}", "input_len=8",
                                                            "max_new_tokens=6", "requests=3", "warmup_requests=1"],
                     results_dir=str(flagperf_env), run_id=run_id, return_state=True)
    assert state.is_completed(), state.message
    round_dir = flagperf_env / run_id / "tiny-llama-serve" / "round1" / "localhost_noderank0"
    result = read_result(round_dir / "result.json")
    assert result.status == "success" and result.family == "generate"
    names = {m.name for m in result.metrics}
    for label in ("c1", "c2", "r4"):
        assert {f"output_tokens_per_s@{label}", f"ttft_s@{label}", f"tpot_s@{label}", f"itl_s@{label}",
                f"e2el_s@{label}", f"goodput_requests_per_s@{label}", f"failed_requests@{label}"} <= names
    metric = {m.name: m for m in result.metrics}
    assert metric["output_tokens_per_s@c2"].work == 3 * 6 and metric["failed_requests@r4"].value == 0
    files = {p.name for p in round_dir.rglob("*") if p.is_file()}
    assert {"requests.jsonl", "server.log", "serving.json"} <= files, files
    records = [json.loads(line) for line in (round_dir / "requests.jsonl").read_text().splitlines()]
    timed = [r for r in records if r["phase"] == "timed"]
    assert sorted({r["point"] for r in timed}) == ["c1", "c2", "r4"] and len(timed) == 9
    assert all(r["error"] is None and r["output_tokens_client"] == 6 == len(r["chunk_times_s"]) for r in timed)
    points = json.loads((round_dir / "serving.json").read_text())["points"]
    assert [(p["label"], p["kind"], p["level"]) for p in points] == [("c1", "concurrency", 1),
                                                                      ("c2", "concurrency", 2), ("r4", "rate", 4.0)]
