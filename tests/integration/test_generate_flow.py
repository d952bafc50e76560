"""A generate case through the real flow: evaluate on a real Prefect server -> run_case -> `python -m flagperf.entry`
in a new process -> every concurrency level decoded for real (tiny preset) -> monitors -> the report's serving
table and trade-off plot, with energy per output token where the host has a power source."""

from __future__ import annotations

import http.server
import logging
import threading
import time
from pathlib import Path

import pytest

from flagperf.results.schema import read_result
from tests.unit.quoting_endpoint import QuotingEndpoint

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
    # No prompt is sent twice in the round (a prefix cache would serve it): the readiness request took prompt 0,
    # each warm-up and timed phase of each point the next ones.
    indexes = sorted(r["prompt_index"] for r in records)
    assert indexes == list(range(1, len(records) + 1)), indexes
    points = json.loads((round_dir / "serving.json").read_text())["points"]
    assert [(p["label"], p["kind"], p["level"]) for p in points] == [("c1", "concurrency", 1),
                                                                      ("c2", "concurrency", 2), ("r4", "rate", 4.0)]


CANARY = "sk-flagperf-flow-canary-4b1d92e07c36a5f8"  # an endpoint key no file or log line may hold


async def _all_prefect_logs() -> str:
    from prefect.client.orchestration import get_client

    lines: list[str] = []
    async with get_client() as client:
        while page := await client.read_logs(limit=200, offset=len(lines)):
            lines += [log.message for log in page]
    return "\n".join(lines)


def test_an_endpoint_key_is_in_no_record_and_no_log_of_the_flow(flagperf_env: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """evaluate -> run_case -> the entry loads the inventory's endpoint `lab`, whose key is ${NAME} in the
    inventory and a canary in the controller's environment, passed to the host by its inventory env: the endpoint
    gets the key, quotes it back in its 401 pages, and the canary is in no file of the run folder (records,
    result.json, serving.json, the controller log), none of the host's work folder, and no log line the Prefect
    server holds. The round fails (the 401s): a retry of the run (`flagperf run --retry`: a new flow run of the same
    run folder) sets it aside and runs it again, its attempts counted from 1 again, and its first request sends the
    prompt after the one the earlier flow run's attempt sent (the endpoint's prefix cache may hold that one)."""
    import asyncio
    import json

    from flows.evaluate import evaluate
    from flows.progress import RunFolderLog

    QuotingEndpoint.received.clear()  # shared with the unit tests' use in one session
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuotingEndpoint)  # the port from the OS
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("FLAGPERF_TEST_ENDPOINT_KEY", CANARY)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(json.dumps({"hosts": [{"name": "localhost", "env": {  # the host's env carries the key
        "FLAGPERF_TEST_ENDPOINT_KEY": "${FLAGPERF_TEST_ENDPOINT_KEY}"}}], "endpoints": {"lab": {
        "base_url": f"http://127.0.0.1:{server.server_address[1]}", "model": "m",
        "api_key": "${FLAGPERF_TEST_ENDPOINT_KEY}"}}}), encoding="utf-8")
    run_id = f"run-endpoint-key-{time.time_ns()}"
    controller_log = RunFolderLog(flagperf_env / run_id)  # what `flagperf run` adds: the run's controller.log
    logging.getLogger().addHandler(controller_log)
    try:
        for resume in (False, True):  # the run, then its retry
            evaluate(cases=["tiny-llama-serve"], inventory=str(inventory), results_dir=str(flagperf_env),
                     run_id=run_id, overrides=["endpoint=lab", "concurrency=[1]", "request_rates=[]", "requests=2",
                                               "warmup_requests=0", "max_new_tokens=4"], resume=resume,
                     return_state=True)
    finally:
        logging.getLogger().removeHandler(controller_log)
        controller_log.close()
        server.shutdown()
        thread.join()
    assert QuotingEndpoint.received and set(QuotingEndpoint.received) == {f"Bearer {CANARY}"}
    run_dir = flagperf_env / run_id
    requests = list(run_dir.rglob("requests.jsonl"))
    assert requests and "Authorization: ***" in requests[0].read_text(encoding="utf-8")  # the 401 pages were recorded
    rounds = [run_dir / "retries" / "attempt1" / "tiny-llama-serve" / "round1" / "localhost_noderank0",
              run_dir / "tiny-llama-serve" / "round1" / "localhost_noderank0"]
    assert [[json.loads(line)["prompt_index"] for line in (folder / "requests.jsonl").read_text().splitlines()]
            for folder in rounds] == [[0], [1]]
    assert "(a retry of the run: 1 earlier attempt(s) of this round): its prompts start at position 1" in \
        (rounds[1] / "case.log").read_text(encoding="utf-8")
    assert "tiny-llama-serve" in (run_dir / "controller.log").read_text(encoding="utf-8")
    searched = [p for folder in (run_dir, tmp_path / "work") for p in folder.rglob("*") if p.is_file()]
    assert [str(p) for p in searched if CANARY.encode() in p.read_bytes()] == []
    logs = asyncio.run(_all_prefect_logs())
    assert "tiny-llama-serve" in logs and CANARY not in logs
