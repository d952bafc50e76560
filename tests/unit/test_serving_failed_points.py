"""Failed and partly failed serving points, through the case entry against a real HTTP endpoint that answers
OpenAI-style event streams and refuses the requests it is told to: a point whose every request failed fails
the round in one line naming it and its first error, is kept as failed (no throughput, latency or goodput) and
shown so in the report; a partly failed point reports its failed count and share, flagged above 1 %."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from flagperf.config.job import Job
from flagperf.config.plan import RunPlan, plan_run
from flagperf.entry import run_job
from flagperf.errors import EXIT_USER_ERROR
from flagperf.generate.loadgen import REQUESTS_FILE, read_records
from flagperf.generate.serve import SERVING_FILE
from flagperf.hosts.inventory import host_spec
from flagperf.hosts.local import LocalHost
from flagperf.results.prompt_positions import (
    RUN_POSITIONS_DIR,
    Reservation,
    positions_taken,
    recover,
    reservations,
    reserve,
)
from flagperf.results.schema import read_result, round_dir
from flagperf.results.serving import FAILED_FLAG_FRACTION, ServingPoint, serving_markdown, serving_points

# Imported here, not in a test: importing Prefect configures logging, which in a test would drop caplog's handler.
from flows.evaluate import set_aside
from flows.host_round import round_job
from tasks.container import attempt_positions

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class RefusingEndpoint(http.server.BaseHTTPRequestHandler):
    """Streams ``max_tokens`` words (t1 t2 ...) with usage, except for the requests whose number (from 0, in the
    order they arrive) is in ``refuse``: those get HTTP 503."""

    refuse: ClassVar[set[int]] = set()
    arrived: ClassVar[list[int]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:  # http.server calls it by this name
        asked = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        with self.lock:
            number = len(self.arrived)
            self.arrived.append(number)
        if number in self.refuse:
            body = b"overloaded: request refused"
            self.send_response(503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        tokens = int(asked["max_tokens"])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()  # HTTP/1.0: the stream ends when the connection closes
        events = [{"choices": [{"index": 0, "delta": {"content": f"t{i + 1} "}, "finish_reason": None}]}
                  for i in range(tokens)]
        events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        events.append({"choices": [], "usage": {"prompt_tokens": 16, "completion_tokens": tokens}})
        for event in events:
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def served_by(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A local HTTP server of ``handler`` in a thread (the port from the OS), by its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


@pytest.fixture
def refusing() -> Iterator[str]:
    RefusingEndpoint.arrived.clear()
    with served_by(RefusingEndpoint) as url:
        yield url



def run_first_round(plan: RunPlan, out: Path) -> Path:
    """Round 1 of the plan's one case, run here into ``out``, which it must end well."""
    cp = plan.cases[0]
    job = Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, host="localhost", vendor="cpu",
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})
    out.mkdir()
    assert run_job(job, out) == 0
    return out

def test_a_point_whose_every_request_failed_fails_the_round_and_is_shown_failed(refusing: str,
                                                                                tmp_path: Path) -> None:
    # Request 0 is the endpoint's first (check) request; c1 sends 1-4 (closed loop, one at a time: 1 refused),
    # c2 sends 5-8, all refused.
    RefusingEndpoint.refuse = {1, 5, 6, 7, 8}
    plan = plan_run(cases=["tiny-llama-serve"], sets=["endpoint=lab", "concurrency=[1, 2]", "request_rates=[]",
                                                      "requests=4", "warmup_requests=0", "max_new_tokens=3"],
                    results_dir=tmp_path / "results", inventory_endpoints={"lab": {"base_url": refusing, "model": "m"}},
                    inventory_source="inventory.yaml")
    cp = plan.cases[0]
    job = Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, host="localhost", vendor="cpu",
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})
    run_dir = tmp_path / "run"
    out = run_dir / cp.name / "round1" / "localhost_noderank0"
    out.mkdir(parents=True)

    assert run_job(job, out) == EXIT_USER_ERROR
    assert len(RefusingEndpoint.arrived) == 9
    result = read_result(out / "result.json")
    assert result.status == "failed" and result.failure is not None and result.failure.kind == "user"
    assert result.failure.message == ("point c2: all 4 timed requests failed; the first: HTTP 503: overloaded: "
                                      "request refused")
    metrics = {m.name: m for m in result.metrics}
    # c1 is measured, its failed request counted and its share given.
    assert metrics["failed_requests@c1"].value == 1 and metrics["failed_fraction@c1"].value == 0.25
    assert metrics["output_tokens_per_s@c1"].work == 9  # the three successful requests of 3 tokens
    assert metrics["output_tokens_per_s@c1"].warning == "1 failed of 4 requests; the first failed: HTTP 503: " \
                                                        "overloaded: request refused"
    # c2 is kept as failed: its count and share only, nothing that would draw it on the curve or count as goodput.
    assert sorted(n for n in metrics if n.endswith("@c2")) == ["failed_fraction@c2", "failed_requests@c2"]
    assert metrics["failed_fraction@c2"].value == 1.0 and metrics["failed_fraction@c2"].iterations == 4
    serving = json.loads((out / SERVING_FILE).read_text(encoding="utf-8"))
    assert [(p["label"], p["status"], p["failed"]) for p in serving["points"]] == [("c1", "measured", 1),
                                                                                   ("c2", "failed", 4)]
    # Every figure above can be counted again from requests.jsonl.
    timed = [r for r in read_records(out / REQUESTS_FILE) if r.phase == "timed"]
    assert [(r.point, r.ok) for r in timed if not r.ok] == [("c1", False)] + [("c2", False)] * 4

    points = {p.label: p for p in serving_points(run_dir)}
    assert points["c2"].failed_point and not points["c1"].failed_point
    assert points["c1"].flagged  # 25 % failed, above the 1 % threshold
    report = "\n".join(serving_markdown(run_dir, None))
    assert "**Failed points**" in report and "- tiny-llama-serve c2: 4 of 4 requests failed; the first: HTTP 503" \
        in report
    assert "| tiny-llama-serve | 2 | - | 4 (4 failed = 100.0%) **failed point** | - | - |" in report
    assert "| - | **failed** |" in report  # its SLO verdict
    assert "| tiny-llama-serve | 1 | - | 4 (1 failed = 25.0%, 0 truncated, 0 empty, 0 count mismatch) **flagged** |" \
        in report
    assert "Flagged points: more than 1% of the requests failed" in report and "tiny-llama-serve c1." in report


def test_a_point_is_flagged_for_failures_only_above_the_stated_share() -> None:
    def point(failed: int, requests: int) -> ServingPoint:
        return ServingPoint(case="c", kind="rate", level=1.0, label="r1", engine="e", precision="fp32", rounds=1,
                            counts={"failed_requests": failed, "truncated_requests": 0}, requests=requests)

    assert FAILED_FLAG_FRACTION == 0.01
    assert not point(0, 200).flagged and not point(2, 200).flagged  # 1 %: the p99 is still the load's
    assert point(3, 200).flagged  # 1.5 %


def test_prompts_resent_past_the_end_of_a_short_file_and_an_open_loop_that_sent_late_are_said(
        refusing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompts file of 2 prompts for a round of 9 requests: past its end the prompts are sent again, and each
    point counts its resent ones in serving.json and in its warning (a server's prefix cache may serve them). An
    open loop at 100000 requests/s with one request in flight cannot send at its drawn arrivals (each request takes
    far longer than 10 us): each request's queue wait is recorded, and the point is warned."""
    import yaml

    from flagperf.config.cases import load_case

    RefusingEndpoint.refuse = set()
    manifest = yaml.safe_load(load_case("tiny-llama-serve").folder.joinpath("case.yaml").read_text())
    manifest["name"] = "short-serve"
    folder = tmp_path / "cases" / "generate" / "short-serve"
    folder.mkdir(parents=True)
    (folder / "case.yaml").write_text(yaml.safe_dump(manifest), encoding="utf-8")
    (folder / "prompts.jsonl").write_text('{"prompt": "t1 t2"}\n{"prompt": "t3 t4"}\n', encoding="utf-8")
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(tmp_path / "cases"))
    plan = plan_run(cases=["short-serve"], sets=["endpoint=lab", "concurrency=[1]", "request_rates=[100000]",
                                                 "max_concurrency=1", "requests=3", "warmup_requests=1",
                                                 "max_new_tokens=2", "prompts_path=prompts.jsonl"],
                    results_dir=tmp_path / "results", inventory_endpoints={"lab": {"base_url": refusing, "model": "m"}},
                    inventory_source="inventory.yaml")
    out = run_first_round(plan, tmp_path / "round")
    serving = json.loads((out / SERVING_FILE).read_text(encoding="utf-8"))
    assert serving["prompts"] == "prompts.jsonl: 2 prompts of 2 tokens before the chat template, 2 out"
    # The check sends prompt 0; c1's warm-up prompt 1; its timed requests 0, 1, 0; r100000's 1, then 0, 1, 0 (each
    # phase's first prompt by its index in the file, requests.jsonl's prompt_index).
    assert [(p["label"], p["warmup_first_prompt"], p["first_prompt"], p["repeated_prompts"])
            for p in serving["points"]] == [("c1", 1, 0, 3), ("r100000", 1, 0, 3)]
    assert serving["prompt_set"]["requests_planned"] == 9 and not serving["prompt_set"]["each_sent_once"]
    assert serving["prompt_set"]["repeated_requests"] == 7
    metrics = {m.name: m for m in read_result(out / "result.json").metrics}
    assert (metrics["output_tokens_per_s@c1"].warning or "").startswith(
        "3 of 3 timed requests resent a prompt already sent to this server (the prompt set has 2)")
    rate = serving["points"][1]["send_rate"]
    assert rate["asked"] == 100000 and rate["achieved"] < 0.95 * rate["drawn"]
    assert "under 95% of the" in (metrics["output_tokens_per_s@r100000"].warning or "")
    timed = [r for r in read_records(out / REQUESTS_FILE) if r.point == "r100000" and r.phase == "timed"]
    assert all(r.scheduled_offset_s is not None and r.queue_wait_s is not None for r in timed)
    assert max(r.queue_wait_s or 0.0 for r in timed) > 0 and rate["queue_wait_s"]["max"] > 0


def test_a_duration_s_round_makes_only_the_prompts_its_points_reach(refusing: str, tmp_path: Path) -> None:
    """A duration_s round's set holds up to 8192 synthetic prompts, as its count is not known before; it makes the
    check's, each warm-up's, and for each timed phase an estimate made before it (an open loop: its expected
    arrivals with a margin), not the whole set. The open loop's arrivals are drawn from the seed, so it sends the
    same requests on any machine (a slow one sends them late), all within the estimate."""
    from flagperf.generate.serve import MAX_SYNTHETIC

    RefusingEndpoint.refuse = set()
    plan = plan_run(cases=["tiny-llama-serve"], sets=["endpoint=lab", "concurrency=[]", "request_rates=[20]",
                                                      "requests=null", "duration_s=0.5", "warmup_requests=1",
                                                      "max_new_tokens=2"],
                    results_dir=tmp_path / "results", inventory_endpoints={"lab": {"base_url": refusing, "model": "m"}},
                    inventory_source="inventory.yaml")
    out = run_first_round(plan, tmp_path / "round")
    serving = json.loads((out / SERVING_FILE).read_text(encoding="utf-8"))
    made = serving["prompt_set"]
    # 20 requests/s for 0.5 s: 10 expected, 1.25 x 10 + 4 x sqrt(10) + 1 = 27 made before the timed phase.
    assert made["count"] == 1 + 1 + 27 and made["requests_planned"] is None
    assert made["set_size"] == MAX_SYNTHETIC
    (point,) = serving["points"]
    assert 0 < point["requests"] <= 27 and point["prompts_made_during"] == 0 and point["repeated_prompts"] == 0


@pytest.mark.parametrize("warmups", [0, 2])
def test_a_closed_loop_duration_s_point_makes_no_prompt_on_the_event_loop(
        refusing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warmups: int) -> None:
    """A closed loop for duration_s has no estimate of its count before its warm-up (none without one): its prompts
    are made in a worker thread while the phases run, so that no stream in flight pauses for one and no pause between
    the warm-up and the timed requests outlasts the warm-up's connections. Each request's wait for its prompt (before
    its send) is recorded."""
    import contextlib
    import threading

    from flagperf.generate import serve

    on_loop: list[int] = []  # prompts made on the event loop's thread while the point's client was open
    in_worker: list[int] = []
    client_open = threading.Event()
    real_make, real_client = serve.SyntheticPrompts._make, serve.load_client

    def make(self: serve.SyntheticPrompts, count: int) -> None:
        if threading.current_thread() is not threading.main_thread():
            in_worker.append(count)
        elif client_open.is_set():
            on_loop.append(count)
        real_make(self, count)

    @contextlib.asynccontextmanager
    async def tracked(*args: object) -> object:
        async with real_client(*args) as client:
            client_open.set()
            try:
                yield client
            finally:
                client_open.clear()

    monkeypatch.setattr(serve.SyntheticPrompts, "_make", make)
    monkeypatch.setattr(serve, "load_client", tracked)
    RefusingEndpoint.refuse = set()
    plan = plan_run(cases=["tiny-llama-serve"], sets=["endpoint=lab", "concurrency=[2]", "request_rates=[]",
                                                      "requests=null", "duration_s=0.3", f"warmup_requests={warmups}",
                                                      "max_new_tokens=2"],
                    results_dir=tmp_path / "results", inventory_endpoints={"lab": {"base_url": refusing, "model": "m"}},
                    inventory_source="inventory.yaml")
    out = run_first_round(plan, tmp_path / "round")
    assert on_loop == [] and in_worker, (on_loop, in_worker)
    timed = [r for r in read_records(out / REQUESTS_FILE) if r.phase == "timed"]
    assert timed and all(r.prompt_wait_s is not None and r.send_offset_s is not None for r in timed)
    (point,) = json.loads((out / SERVING_FILE).read_text(encoding="utf-8"))["points"]
    assert point["prompt_waits"] == sum(1 for r in timed if r.prompt_wait_s)


def test_a_requests_wait_for_its_prompt_comes_before_its_send_and_is_recorded(refusing: str) -> None:
    """run_phase with prompts still being made (a PromptSupply): a request waits for its prompt before its send is
    stamped, so no latency holds the wait, and the wait is its record's prompt_wait_s (within an open loop's
    queue_wait_s, which counts from its drawn arrival)."""
    import asyncio
    import time

    from flagperf.generate.loadgen import Load, ServingPrompt, Target, run_phase

    class Slow:
        """Positions from 2 on are 'made' only after a pause."""

        async def wait_for(self, count: int) -> float:
            if count <= 2:
                return 0.0
            began = time.perf_counter()
            await asyncio.sleep(0.02)
            return time.perf_counter() - began

    RefusingEndpoint.refuse = set()
    target = Target(refusing, "m", "chat")
    prompts = [ServingPrompt(i, f"t{i}", 1, 2) for i in range(4)]
    for load in (Load("c1", concurrency=1), Load("r1000", rate=1000.0)):
        run = asyncio.run(run_phase(target, load, prompts, "timed", requests=4, duration_s=None, writer=None,
                                    count_tokens=None, supply=Slow()))
        records = sorted(run.records, key=lambda r: r.seq)
        assert all(r.ok for r in records), [r.error for r in records]
        assert [r.prompt_wait_s == 0.0 for r in records] == [True, True, False, False]
        for record in records[2:]:
            assert record.send_offset_s is not None and record.prompt_wait_s is not None
            assert record.send_offset_s >= record.prompt_wait_s
            if load.rate is not None:
                assert (record.queue_wait_s or 0.0) >= record.prompt_wait_s
    plain = asyncio.run(run_phase(target, Load("c1", concurrency=1), prompts, "timed", requests=1, duration_s=None,
                                  writer=None, count_tokens=None))
    assert plain.records[0].prompt_wait_s is None  # every prompt made before: nothing to wait for


def _endpoint_plan(base_url: str, tmp_path: Path, *sets: str, rounds: int = 1, case: str = "tiny-llama-serve"
                   ) -> RunPlan:
    return plan_run(cases=[case], sets=["endpoint=lab", "concurrency=[1]", "request_rates=[]", "warmup_requests=0",
                                        "max_new_tokens=2", *sets],
                    results_dir=tmp_path / "results", inventory_endpoints={"lab": {"base_url": base_url, "model": "m"}},
                    inventory_source="inventory.yaml", rounds=rounds)


def _run_round(plan: RunPlan, run_dir: Path, round_no: int, case: str | None = None) -> int:
    """Round ``round_no`` of the plan's case (its first, else ``case``) run here into its folder of ``run_dir``, with
    the job the controller gives it (flows.host_round.round_job: what the run folder says of the run so far)."""

    cp = next(c for c in plan.cases if case in (None, c.name))
    job = round_job(plan, run_dir, cp, round_no, "localhost", host_spec({"name": "localhost"}), {}, None)
    out = round_dir(run_dir, cp.name, round_no, "localhost")
    out.mkdir(parents=True)
    return run_job(job, out)


def _sent(folder: Path) -> list[int]:
    """The prompts a round folder's requests sent, in the order of its phases (the check, each point's warm-up, then
    its timed requests) and of their sends."""
    order = {"check": 0, "warmup": 1, "timed": 2}
    records = read_records(folder / REQUESTS_FILE)
    points = list(dict.fromkeys(r.point for r in records))
    return [r.prompt_index for r in sorted(records, key=lambda r: (points.index(r.point), order[r.phase], r.seq))]


def test_a_retried_round_at_an_endpoint_sends_none_of_its_failed_attempts_prompts(refusing: str, tmp_path: Path,
                                                                                   caplog: pytest.LogCaptureFixture
                                                                                   ) -> None:
    """An endpoint keeps its prefix cache across a round's attempts: attempt 2 (run_case's retry after an
    infrastructure failure) starts after the positions attempt 1 took on the host (its prompt_positions.json), and
    says so."""
    from flagperf.results.prompt_positions import PROMPT_POSITIONS

    RefusingEndpoint.refuse = set()
    plan = _endpoint_plan(refusing, tmp_path, "requests=2", rounds=2)
    cp = plan.cases[0]
    stage = tmp_path / "work" / "stage"
    host = LocalHost(work_root=tmp_path / "work")
    for attempt in (1, 2):
        job = Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, attempt=attempt, host="localhost",
                  vendor="cpu", config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={},
                  prompt_positions=attempt_positions(host, stage, attempt, {}))
        (stage / f"attempt{attempt}").mkdir(parents=True)
        assert run_job(job, stage / f"attempt{attempt}") == 0
    sent = [_sent(stage / f"attempt{attempt}") for attempt in (1, 2)]
    assert sent == [[0, 1, 2], [3, 4, 5]]  # the check's, then the timed requests'
    assert json.loads((stage / "attempt2" / PROMPT_POSITIONS).read_text())["first"] == 3
    assert "attempt 2: its prompts start at position 3 of its prompt stream (prompt 3)" in caplog.text


def test_a_retry_of_the_run_sends_none_of_the_prompts_its_earlier_flow_runs_sent(refusing: str, tmp_path: Path,
                                                                                  caplog: pytest.LogCaptureFixture
                                                                                  ) -> None:
    """`flagperf run --retry` of a run whose round 1 at an endpoint failed (its point's every request refused) and
    whose round 2 completed: the retry sets round 1 aside and runs it again, its attempts counted from 1 again. Its job
    says where the endpoint's prompt stream stands after every round the run sent (round 1's failed attempt, round
    2), so the rerun sends none of their prompts, and its log says where it starts and that it is a retry."""

    RefusingEndpoint.refuse = {1, 2}  # round 1's timed requests, after its check (request 0)
    plan = _endpoint_plan(refusing, tmp_path, "requests=2", rounds=2)
    run_dir = tmp_path / "run"
    assert _run_round(plan, run_dir, 1) == EXIT_USER_ERROR  # c1 is a failed point: the round fails
    assert _run_round(plan, run_dir, 2) == 0
    RefusingEndpoint.refuse = set()
    first = set_aside(run_dir, round_dir(run_dir, plan.cases[0].name, 1, "localhost"))  # the retry's first step
    assert first is not None
    caplog.clear()
    assert _run_round(plan, run_dir, 1) == 0
    earlier = _sent(first) + _sent(round_dir(run_dir, plan.cases[0].name, 2, "localhost"))
    assert earlier == [0, 1, 2, 3, 4, 5]
    assert _sent(round_dir(run_dir, plan.cases[0].name, 1, "localhost")) == [6, 7, 8]
    assert ("round 1 at an endpoint, attempt 1 (a retry of the run: 1 earlier attempt(s) of this round): its prompts "
            "start at position 6 of its prompt stream (prompt 6)") in caplog.text
    # The report says which prompts each round sent, not the first round's alone.
    report = "\n".join(serving_markdown(run_dir, None))
    assert [line for line in report.splitlines() if line.startswith("| tiny-llama-serve | ")][-2:] == [
        "| tiny-llama-serve | 1 | localhost | 6 to 8 | 6 | 3 | yes | 0 |",
        "| tiny-llama-serve | 2 | localhost | 3 to 5 | 3 | 3 | yes | 0 |"], report
    # A round that took no position (its points failed before they sent) says where it would have started.
    serving_file = round_dir(run_dir, plan.cases[0].name, 2, "localhost") / SERVING_FILE
    serving = json.loads(serving_file.read_text())
    serving["prompt_set"]["positions_taken"] = 0
    serving_file.write_text(json.dumps(serving))
    assert "| tiny-llama-serve | 2 | localhost | none (at 3) | 3 | 3 | yes | 0 |" in "\n".join(
        serving_markdown(run_dir, None))


def test_a_prompts_files_rounds_for_duration_s_start_after_the_prompts_earlier_rounds_used(
        refusing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """duration_s: the prompts a round sends are counted only as it runs. At an endpoint, each round of a prompts file
    starts after the positions the earlier rounds took (their prompt_positions.json), read round and round; once the
    run has sent the file's every prompt, a round sends them again, and every request that resends one the endpoint
    was sent (by an earlier round, or earlier in the round) is counted (serving.json's repeated_requests) and said."""
    import yaml

    from flagperf.config.cases import load_case
    from flagperf.results.prompt_positions import PROMPT_POSITIONS

    RefusingEndpoint.refuse = set()
    manifest = yaml.safe_load(load_case("tiny-llama-serve").folder.joinpath("case.yaml").read_text())
    manifest["name"] = "file-serve"
    folder = tmp_path / "cases" / "generate" / "file-serve"
    folder.mkdir(parents=True)
    count = 7
    (folder / "prompts.jsonl").write_text("".join(f'{{"prompt": "p{i} q{i}"}}\n' for i in range(count)),
                                          encoding="utf-8")
    (folder / "case.yaml").write_text(yaml.safe_dump(manifest), encoding="utf-8")
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(tmp_path / "cases"))
    # Each round takes at least 4 positions (the check, 2 warm-ups, the arrival at 0 s): round 3 starts past the file.
    plan = _endpoint_plan(refusing, tmp_path, "concurrency=[]", "request_rates=[20]", "requests=null",
                          "duration_s=0.3", "warmup_requests=2", "prompts_path=prompts.jsonl", rounds=3,
                          case="file-serve")
    run_dir = tmp_path / "run"
    position = 0
    sent_before: set[int] = set()
    for round_no in (1, 2, 3):
        assert _run_round(plan, run_dir, round_no) == 0
        out = round_dir(run_dir, "file-serve", round_no, "localhost")
        sent = _sent(out)
        # The round went on from where the earlier ones stopped: its check took the next position, and the others
        # followed in order.
        assert sent == [(position + i) % count for i in range(len(sent))], (round_no, position, sent)
        ledger = json.loads((out / PROMPT_POSITIONS).read_text())
        assert (ledger["first"], ledger["end"]) == (position, position + len(sent))
        serving = json.loads((out / SERVING_FILE).read_text())
        assert serving["prompt_set"]["first_position"] == position
        seen = sent_before | {sent[0]}  # what the endpoint was sent before: earlier rounds, then the check
        repeated = 0
        for index in sent[1:]:
            repeated += index in seen
            seen.add(index)
        assert serving["prompt_set"]["repeated_requests"] == repeated, (round_no, sent, sent_before)
        position += len(sent)
        sent_before |= set(sent)
    assert sent_before == set(range(count))
    assert serving["points"][0]["repeated_prompts"] == serving["points"][0]["requests"]  # round 3: all sent before
    assert "this round resends prompts they sent" in caplog.text


def test_outputs_are_counted_off_the_event_loop_that_reads_the_streams(refusing: str) -> None:
    """The client's count of a finished output (the tokenizer: milliseconds for a long one) is never made on the
    event loop that reads the streams in flight, where it would hold up their chunks and so their TTFT and ITL; it is
    made in one worker thread of the phase's (a tokenizer is used by one thread at a time), and counts the same."""
    import asyncio
    import threading

    from flagperf.generate.loadgen import Load, ServingPrompt, Target, run_phase

    RefusingEndpoint.refuse = set()
    counted_on: list[threading.Thread] = []

    def count(text: str) -> int:
        counted_on.append(threading.current_thread())
        return len(text.split())

    async def phase() -> tuple[threading.Thread, list[int | None]]:
        run = await run_phase(Target(refusing, "m", "chat"), Load("c3", concurrency=3),
                              [ServingPrompt(i, f"t{i}", 1, 3) for i in range(6)], "timed", requests=6,
                              duration_s=None, writer=None, count_tokens=count)
        assert all(r.ok for r in run.records), [r.error for r in run.records]
        return threading.current_thread(), [r.output_tokens_client for r in run.records]

    loop_thread, counts = asyncio.run(phase())
    assert counts == [3] * 6  # "t1 t2 t3 "
    assert len(counted_on) == 6 and loop_thread not in counted_on and len(set(counted_on)) == 1


def send_token_stream(handler: http.server.BaseHTTPRequestHandler, tokens: int) -> None:
    """An OpenAI-style chunked SSE answer of ``tokens`` tokens, up to and with its [DONE] event (the caller ends
    the body: at once, or late)."""
    events = [{"choices": [{"index": 0, "delta": {"content": f"t{i + 1} "}, "finish_reason": None}]}
              for i in range(tokens)]
    events += [{"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
               {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": tokens}}]
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    for data in [*(json.dumps(e) for e in events), "[DONE]"]:
        chunk = f"data: {data}\n\n".encode()
        handler.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")


class KeepAliveEndpoint(http.server.BaseHTTPRequestHandler):
    """HTTP/1.1 with its connections kept alive, as uvicorn (vLLM's, SGLang's server) streams: chunked, each event a
    chunk, ``[DONE]`` last and the response's end (the empty chunk) in a write of its own. It answers the first request
    of each connection (``max_tokens`` words, with usage), and closes the connection without a byte of response when
    its second request arrives, as a server (or proxy) whose idle timeout closes a connection just as the client sends
    on it."""

    protocol_version = "HTTP/1.1"
    dropped: ClassVar[list[float]] = []  # wall clock of each request closed unanswered
    work_s: ClassVar[float] = 0.0  # how long the server holds a request it drops, as if it worked on it

    def do_POST(self) -> None:  # http.server calls it by this name
        asked = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        served = self.__dict__.get("served", 0)  # one handler per connection
        self.served = served + 1
        if served:
            time.sleep(self.work_s)
            self.dropped.append(time.time())
            self.close_connection = True
            return
        send_token_stream(self, int(asked["max_tokens"]))
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: object) -> None:
        pass


def test_a_request_the_server_dropped_on_a_kept_alive_connection_is_sent_again_on_a_fresh_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A server that closes a kept-alive connection as a request is sent on it, before any response: the request is
    sent once more on a fresh connection, counted (serving.json's reconnects, the record's reconnected_after), and
    timed from its first send: the time the server held the request before it dropped it (failed_try_s) is part of
    its TTFT and E2EL, so a server that took a request, worked on it and dropped it is not flattered. It is not a
    failed request."""
    KeepAliveEndpoint.dropped.clear()
    KeepAliveEndpoint.work_s = 0.3
    try:
        with served_by(KeepAliveEndpoint) as url:
            out = run_first_round(_endpoint_plan(url, tmp_path, "requests=4"), tmp_path / "round")
    finally:
        KeepAliveEndpoint.work_s = 0.0
    # c1's one connection answers its first request and drops its second, which is sent again on a fresh connection;
    # the third opens a new one, and its fourth is dropped and sent again too.
    timed = sorted((r for r in read_records(out / REQUESTS_FILE) if r.phase == "timed"), key=lambda r: r.seq)
    assert [r.error for r in timed] == [None] * 4
    assert [bool(r.reconnected_after) for r in timed] == [False, True, False, True]
    assert all((r.reconnected_after or "RemoteProtocolError").startswith("RemoteProtocolError") for r in timed)
    assert len(KeepAliveEndpoint.dropped) == 2
    for record, dropped in zip([r for r in timed if r.reconnected_after], KeepAliveEndpoint.dropped, strict=True):
        assert record.sent_at <= dropped  # timed from the first send, before the server dropped it
        assert record.failed_try_s is not None and record.failed_try_s >= 0.3  # the server held it 0.3 s
        assert record.ttft_s is not None and record.e2el_s is not None
        assert record.e2el_s >= record.ttft_s >= record.failed_try_s
    assert [r.failed_try_s for r in timed if not r.reconnected_after] == [None, None]
    serving = json.loads((out / SERVING_FILE).read_text(encoding="utf-8"))
    assert serving["reconnects"] == 2 and serving["points"][0]["reconnects"] == 2
    assert serving["points"][0]["failed"] == 0 and "sent once more on a fresh connection" in caplog.text
    metrics = {m.name: m for m in read_result(out / "result.json").metrics}
    assert "timed from its first send, the failed try included" in metrics["ttft_s@c1"].convention


class DroppingEndpoint(http.server.BaseHTTPRequestHandler):
    """Closes every connection as its request arrives, without a byte of response: a server that refuses the request
    itself (not a kept-alive connection it closed before the request came)."""

    protocol_version = "HTTP/1.1"
    arrived: ClassVar[list[float]] = []

    def do_POST(self) -> None:  # http.server calls it by this name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.arrived.append(time.time())
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


def test_a_request_that_fails_on_a_connection_it_opened_is_not_sent_again() -> None:
    """Only a send on a connection kept alive from an earlier request is sent again where it fails before any
    response (the server closed that connection as the request went out): a request the server dropped on the
    connection opened for it, or one whose connection could not be opened (ConnectError: no kept connection gives
    one), failed, once."""
    import asyncio
    import socket

    from flagperf.generate.loadgen import Load, RequestRecord, ServingPrompt, Target, run_phase

    def one_request(base_url: str) -> list[RequestRecord]:
        run = asyncio.run(run_phase(Target(base_url, "m", "chat"), Load("c1", concurrency=1),
                                    [ServingPrompt(0, "t0", 1, 2)], "timed", requests=1, duration_s=None, writer=None,
                                    count_tokens=None))
        return run.records

    DroppingEndpoint.arrived.clear()
    with served_by(DroppingEndpoint) as url:
        dropped, = one_request(url)
    assert (dropped.error or "").startswith("RemoteProtocolError") and dropped.reconnected_after is None
    assert len(DroppingEndpoint.arrived) == 1
    with socket.socket() as bound:  # bound, never listening: a connection to it is refused
        bound.bind(("127.0.0.1", 0))
        refused, = one_request(f"http://127.0.0.1:{bound.getsockname()[1]}")
    assert (refused.error or "").startswith("ConnectError") and refused.reconnected_after is None


class HeldEndEndpoint(http.server.BaseHTTPRequestHandler):
    """HTTP/1.1, chunked, as uvicorn streams: ``max_tokens`` words with usage, ``[DONE]``, and then the response's end
    (its empty chunk) held back: for the requests in ``until_next`` (numbered from 0 as they arrive) until the next
    request arrived; for the others, where ``hold_all``, until ``release`` is set; at most 60 s either way.
    ``ended_after_next``: the requests whose end was held until the next one arrived."""

    protocol_version = "HTTP/1.1"
    arrived: ClassVar[list[int]] = []
    until_next: ClassVar[set[int]] = set()
    hold_all: ClassVar[bool] = False
    ended_after_next: ClassVar[list[int]] = []
    release = threading.Event()
    lock = threading.Lock()

    def do_POST(self) -> None:  # http.server calls it by this name
        asked = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        with self.lock:
            number = len(self.arrived)
            self.arrived.append(number)
        send_token_stream(self, int(asked["max_tokens"]))
        self.wfile.flush()
        deadline = time.monotonic() + 60
        while (number in self.until_next or self.hold_all) and time.monotonic() < deadline \
                and not self.release.is_set():
            if number in self.until_next and len(self.arrived) > number + 1:
                self.ended_after_next.append(number)
                break
            time.sleep(0.01)
        try:
            self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client closed the connection meanwhile
            self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def held_end() -> Iterator[str]:
    HeldEndEndpoint.arrived.clear()
    HeldEndEndpoint.ended_after_next.clear()
    HeldEndEndpoint.release.clear()
    with served_by(HeldEndEndpoint) as url:
        try:
            yield url
        finally:
            HeldEndEndpoint.release.set()  # before the shutdown, which waits for the held answers


def test_the_read_after_done_is_outside_the_requests_time_limit_and_holds_no_slot(
        held_end: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a stream's [DONE] the client reads on for the response's end (so that its connection serves another
    request), but outside the request: a request whose stream ended is not failed by its time limit while the end is
    read, and its place in the load is free meanwhile: a closed loop of 1 sends its next request while the server
    still holds the first response's end (which it sends once that request arrived)."""
    import asyncio

    from flagperf.generate import loadgen
    from flagperf.generate.loadgen import Load, ServingPrompt, Target, run_phase

    monkeypatch.setattr(loadgen, "DRAIN_S", 120.0)  # far past the request's limit: the read never gives up first
    monkeypatch.setattr(HeldEndEndpoint, "until_next", {0})
    run = asyncio.run(run_phase(Target(held_end, "m", "chat", request_timeout_s=10.0), Load("c1", concurrency=1),
                                [ServingPrompt(i, f"t{i}", 1, 2) for i in range(2)], "timed", requests=2,
                                duration_s=None, writer=None, count_tokens=None))
    assert [r.error for r in sorted(run.records, key=lambda r: r.seq)] == [None, None]
    assert HeldEndEndpoint.ended_after_next == [0]  # request 1 went out while request 0's end was still held
    assert run.unended == 0  # request 0's end came, and was read


def test_a_response_whose_end_never_comes_after_done_is_counted_and_said(
        held_end: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A server that never ends its responses after their [DONE]: each request succeeds (its stream ended), the read
    of its end gives up after DRAIN_S and closes the connection, and the point counts and says it (the requests after
    it open connections of their own)."""
    from flagperf.generate import loadgen

    monkeypatch.setattr(loadgen, "DRAIN_S", 0.2)
    monkeypatch.setattr(HeldEndEndpoint, "until_next", set())
    monkeypatch.setattr(HeldEndEndpoint, "hold_all", True)
    out = run_first_round(_endpoint_plan(held_end, tmp_path, "requests=2"), tmp_path / "round")
    assert [r.error for r in read_records(out / REQUESTS_FILE)] == [None] * 3  # the check and the 2 timed requests
    serving = json.loads((out / SERVING_FILE).read_text(encoding="utf-8"))
    assert serving["points"][0]["unended_responses"] == 2 and serving["points"][0]["failed"] == 0
    assert "point c1: 2 responses did not end within" in caplog.text


def test_a_requests_place_in_the_load_is_free_while_its_output_is_counted(refusing: str) -> None:
    """The client's count of a request's output (in the phase's counting thread) does not hold its place in the load:
    a closed loop of 1 sends its next request while the first one's output is still being counted."""
    import asyncio

    from flagperf.generate.loadgen import Load, ServingPrompt, Target, run_phase

    RefusingEndpoint.refuse = set()
    next_sent: list[bool] = []

    def count(text: str) -> int:  # the first count waits for the next request's arrival, at most 60 s
        deadline = time.monotonic() + 60
        while len(RefusingEndpoint.arrived) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        next_sent.append(len(RefusingEndpoint.arrived) >= 2)
        return len(text.split())

    run = asyncio.run(run_phase(Target(refusing, "m", "chat"), Load("c1", concurrency=1),
                                [ServingPrompt(i, f"t{i}", 1, 3) for i in range(2)], "timed", requests=2,
                                duration_s=None, writer=None, count_tokens=count))
    assert next_sent[0] and [r.output_tokens_client for r in run.records] == [3, 3]


def test_a_half_round_left_on_the_host_gives_its_prompt_positions_before_it_is_removed(refusing: str,
                                                                                      tmp_path: Path) -> None:
    """A round an interrupted attempt of the flow run left on the host without a result (its case process killed
    mid-point) is removed before the round runs again; the positions of the endpoint's prompt stream its attempts took
    join the round's job first, so that the rerun sends none of the prompts the endpoint was sent."""
    from flagperf.results.prompt_positions import PROMPT_POSITIONS
    from flows.host_round import cleared_stage
    from tasks.collect import leftover_result, stage_folder
    from tasks.container import seen_ended

    RefusingEndpoint.refuse = set()
    plan = _endpoint_plan(refusing, tmp_path, "requests=2")
    cp = plan.cases[0]
    host = LocalHost(work_root=tmp_path / "work")
    run = tmp_path / "run"
    run.mkdir()
    stage = stage_folder(host.work_root, plan.run_id, cp.name, 1, "localhost")
    job = round_job(plan, run, cp, 1, "localhost", host_spec({"name": "localhost"}), {}, None)
    reserved = reserve(run, Reservation(case=cp.name, round=1, host="localhost", attempts=cp.max_retries + 1,
                                        config=cp.config))  # as the controller does before it dispatches the round
    (stage / "attempt1").mkdir(parents=True)
    assert run_job(job, stage / "attempt1") == 0
    seen_ended(host, stage / "attempt1", 0)  # its runtime saw it end: what its record says it took is final
    (stage / "attempt1" / "result.json").unlink()  # killed before its result: nothing to collect
    assert leftover_result(host, stage, cp.max_retries + 1) is None
    stream = json.loads((stage / "attempt1" / PROMPT_POSITIONS).read_text())["stream"]
    job = round_job(plan, run, cp, 1, "localhost", host_spec({"name": "localhost"}), {}, None)  # the retry's
    assert [r.id for r in job.prompt_reservations] == [reserved.id]
    cleared = cleared_stage(host, stage, job, run, reserved)
    assert not stage.exists() and cleared.prompt_positions == {stream: 3} and cleared.prompt_reservations == []
    # Its records are kept in the run folder, with its reach beside its reservation, which they stand for, closed.
    assert sorted(p.name.split("-")[0] for p in (run / RUN_POSITIONS_DIR).iterdir()) == ["collected", "reach",
                                                                                        "recovered"]
    assert positions_taken(run) == {stream: 3} and reservations(run) == []
    (stage / "attempt1").mkdir(parents=True)
    assert run_job(cleared, stage / "attempt1") == 0
    assert _sent(stage / "attempt1") == [3, 4, 5]


def test_a_round_dispatched_but_never_collected_holds_its_prompts_by_its_reservation(
        refusing: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The controller writes a round's reservation into the run folder before it dispatches the round at an endpoint:
    a round interrupted before its files were collected (its folder on the host removed, or the host lost) leaves the
    run folder no record of the prompts it sent, only that reservation. The rounds after it start after the most it may
    have sent, worked out from where it started (its own job's positions and the reservations it started after, one
    closed since included), in their own stream only; they say which reservations they passed, and serving.json keeps
    them, with the reach worked out for each open one. A reservation of another stream (another seed) moves nothing,
    and a later round does not pay for a lost one twice: once a round whose records pass it is collected, it is
    closed."""
    from flagperf.config.job import JOB_FILE
    from flows.host_round import after_collection, cleared_stage, round_reservation
    from tasks.collect import stage_folder
    from tasks.container import seen_ended

    RefusingEndpoint.refuse = set()
    plan = _endpoint_plan(refusing, tmp_path, "requests=2", rounds=3)
    cp = plan.cases[0]
    run = tmp_path / "run"
    run.mkdir()
    host = LocalHost(work_root=tmp_path / "work")
    spec = host_spec({"name": "localhost"})
    other = _endpoint_plan(refusing, tmp_path, "requests=2", "seed=1")
    elsewhere = reserve(run, round_reservation(round_job(other, run, other.cases[0], 1, "h2", spec, {}, None), 1))

    def dispatched(round_no: int, code: int = 0) -> tuple[Job, Reservation, Path]:
        """The round's job and reservation as the controller makes them, run on the host into its folder there."""
        job = round_job(plan, run, cp, round_no, "localhost", spec, {}, None)
        reservation = reserve(run, round_reservation(job, cp.max_retries + 1))
        stage = stage_folder(host.work_root, plan.run_id, cp.name, round_no, "localhost")
        (stage / "attempt1").mkdir(parents=True)
        assert run_job(job, stage / "attempt1") == code
        seen_ended(host, stage / "attempt1", code)
        return job, reservation, stage

    RefusingEndpoint.refuse = {0}  # round 1 ends at its check, short of what it planned (and reserved)
    _, first, stage1 = dispatched(1, EXIT_USER_ERROR)  # interrupted: its folder stays on the host, without a result
    (stage1 / "attempt1" / "result.json").unlink()
    RefusingEndpoint.refuse = set()
    job2, second, stage2 = dispatched(2)  # interrupted too, and its folder there removed (a clean-up)
    assert (_sent(stage1 / "attempt1"), _sent(stage2 / "attempt1")) == ([0], [3, 4, 5])
    assert second.after == [elsewhere.id, first.id] == [r.id for r in job2.prompt_reservations]
    host.remove_tree(stage2)
    assert positions_taken(run) == {}

    # The retry: round 1's folder is found, its records kept and its reservation closed; round 2's stays open, and its
    # start is worked out from the closed one.
    job = round_job(plan, run, cp, 1, "localhost", spec, {}, None)
    job = cleared_stage(host, stage1, job, run, first)
    assert [(r.id, r.open) for r in job.prompt_reservations] == [(elsewhere.id, True), (first.id, False),
                                                                 (second.id, True)]
    caplog.clear()
    out = round_dir(run, cp.name, 1, "localhost")
    out.mkdir(parents=True)
    assert run_job(job, out) == 0
    assert _sent(out) == [6, 7, 8]
    assert ("after the most that 1 round(s) the controller dispatched there, and whose records the run folder does "
            "not hold (interrupted before they were collected), may have sent: their reservations "
            f"{RUN_POSITIONS_DIR}/reserved-{second.id}.json") in caplog.text
    prompt_set = json.loads((out / SERVING_FILE).read_text())["prompt_set"]
    stream = prompt_set["stream"]
    assert prompt_set["after_reservations"] == [second.where] and prompt_set["unknown_reservations"] == []
    reaches = {r["id"]: (r["stream"], r["upto"]) for r in prompt_set["reservation_reaches"]}
    assert reaches[second.id] == (stream, 6) and reaches[elsewhere.id][0] != stream
    # Collected, round 1's records pass the lost round's reach as round 1's case worked it out, but that is
    # case-written (serving.json): the lost round's reservation stays open, as does the other stream's; only a reach
    # the controller kept closes one. Nor does a forged reach of 0 in it close one.
    (out / JOB_FILE).write_text(job.model_dump_json(), encoding="utf-8")  # as collected from the host
    serving = json.loads((out / SERVING_FILE).read_text())
    serving["prompt_set"]["reservation_reaches"] = [{"id": r, "stream": stream, "upto": 0} for r in reaches]
    (out / SERVING_FILE).write_text(json.dumps(serving))
    after_collection(host, stage1, run, cp, 1, 0, None, "round 1")
    assert [r.id for r in reservations(run) if r.open] == [elsewhere.id, second.id]
    assert _run_round(plan, run, 2) == 0  # after round 1's record, which lies past the lost round's reach
    assert _sent(round_dir(run, cp.name, 2, "localhost")) == [9, 10, 11]


def test_a_reservation_is_written_whole_or_not_at_all_on_a_full_disk(tmp_path: Path) -> None:
    """A results folder that is full refuses a reservation (and a half round's records) with an OSError, and keeps
    nothing of it: no half-written file, no temporary one. A later reader finds none."""
    import errno

    from tests.unit.mounts import fill_to_the_last_block, mounted_tmpfs

    with mounted_tmpfs(tmp_path / "full", "size=256k") as run:
        (run / RUN_POSITIONS_DIR).mkdir()
        fill_to_the_last_block(run)
        config = {"endpoint": {"base_url": "http://10.0.0.5:8000", "model": "m"}, "note": "x" * 8192}
        with pytest.raises(OSError) as full:
            reserve(run, Reservation(case="c", round=1, host="h", attempts=1, config=config))
        assert full.value.errno == errno.ENOSPC
        with pytest.raises(OSError):
            recover(run, ['{"stream": "s", "first": 0, "reserved": 9, "end": null}' + " " * 8192])
        assert list((run / RUN_POSITIONS_DIR).iterdir()) == [] and reservations(run) == []


def test_a_reservation_is_kept_only_once_flushed_with_the_folder_made_for_it(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A reservation's folder, made for the first one, is flushed in the run folder with it (a power cut would
    otherwise lose the folder, and the reservation in it). Where the rename cannot be flushed (an I/O error: not a file
    system that cannot flush a folder, which is left to its own guarantees), the reservation is refused and removed: its
    round is not sent, so it must not hold later rounds back."""
    import errno

    from flagperf.results import schema

    flushed: list[Path] = []
    real_sync = schema.sync_folder

    def recording(folder: Path) -> None:
        flushed.append(Path(folder))
        real_sync(folder)

    def failing(folder: Path) -> None:
        raise OSError(errno.EIO, "Input/output error")

    run = tmp_path / "run"
    run.mkdir()
    config = {"endpoint": {"base_url": "http://10.0.0.5:8000", "model": "m"}}
    monkeypatch.setattr(schema, "sync_folder", recording)
    made = reserve(run, Reservation(case="c", round=1, host="h", attempts=1, config=config))
    assert {run / RUN_POSITIONS_DIR, run} <= set(flushed)
    monkeypatch.setattr(schema, "sync_folder", failing)
    with pytest.raises(OSError):
        reserve(run, Reservation(case="c", round=2, host="h", attempts=1, config=config))
    assert reservations(run) == [made] and len(list((run / RUN_POSITIONS_DIR).iterdir())) == 1


def test_a_results_folder_that_refuses_a_reservation_stops_the_run_before_the_round_is_sent(refusing: str,
                                                                                           tmp_path: Path) -> None:
    """A round at an endpoint whose reservation the results folder refuses (full) is not sent: it fails in one line
    saying the results folder cannot be written, nothing reaches the endpoint or the host, and the run stops there,
    saying how to go on."""
    from flagperf.results.schema import RESULTS_UNWRITABLE
    from flows.evaluate import ResultsUnwritable, stop_if_results_unwritable
    from flows.host_round import node_round
    from tests.unit.mounts import fill_to_the_last_block, mounted_tmpfs

    plan = _endpoint_plan(refusing, tmp_path, "requests=2")
    host = LocalHost(work_root=tmp_path / "work")
    with mounted_tmpfs(tmp_path / "full", "size=256k") as run:
        fill_to_the_last_block(run)
        result = node_round(host, host_spec({"name": "localhost"}), plan, run, plan.cases[0], 1, {}, None, 1.0,
                            "flagperf run --cases tiny-llama-serve")
        assert result.status == "failed" and result.failure is not None
        assert RESULTS_UNWRITABLE in result.failure.message and "so it was not run" in result.failure.message
        assert RefusingEndpoint.arrived == [] and not host.work_root.exists()
        assert reservations(run) == [] and not any((run / RUN_POSITIONS_DIR).glob("*"))
        with pytest.raises(ResultsUnwritable) as stopped:
            stop_if_results_unwritable([result], run, "flagperf run --cases tiny-llama-serve")
    assert f"`flagperf run --cases tiny-llama-serve --retry {run}`" in str(stopped.value)


def test_a_reservation_is_closed_once_its_round_is_collected_and_not_for_a_lost_hosts_round(refusing: str,
                                                                                           tmp_path: Path) -> None:
    """A round whose host was lost (its collection found no folder there) gets a result saying so from the
    controller, but the run folder has none of its records: its reservation stays open. A round that is collected
    closes its own; the lost round's stays open though the collected round's records pass what that one may have sent
    as the collected round worked it out (serving.json is case-written: a forged reach there closes nothing), so later
    rounds keep starting after it."""
    from flagperf.config.job import JOB_FILE
    from flagperf.results.prompt_positions import CONTROLLER_ENDED_FILE, ENDED_FILE
    from flagperf.results.schema import RESULT_FILE, Failure, write_result
    from flows.host_round import after_collection, round_reservation
    from tasks.collect import stage_folder

    RefusingEndpoint.refuse = set()
    plan = _endpoint_plan(refusing, tmp_path, "requests=2", rounds=2)
    cp = plan.cases[0]
    host = LocalHost(work_root=tmp_path / "work")
    spec = host_spec({"name": "localhost"})
    run = tmp_path / "run"
    run.mkdir()
    lost_job = round_job(plan, run, cp, 1, "localhost", spec, {}, None)
    lost = reserve(run, round_reservation(lost_job, cp.max_retries + 1))
    lost_dir = round_dir(run, cp.name, 1, "localhost")
    lost_dir.mkdir(parents=True)  # what node_round stores where the collection failed: a result, nothing else
    write_result(lost_dir / RESULT_FILE, lost_job.failed_result(Failure(
        kind="infrastructure", message="collecting the round's files failed: ... does not exist"), None))
    after_collection(host, stage_folder(host.work_root, plan.run_id, cp.name, 1, "localhost"), run, cp, 1, 0, lost,
                     "round 1")
    assert [(r.id, r.open) for r in reservations(run)] == [(lost.id, True)]

    job = round_job(plan, run, cp, 2, "localhost", spec, {}, None)
    own = reserve(run, round_reservation(job, cp.max_retries + 1))
    out = round_dir(run, cp.name, 2, "localhost")
    out.mkdir(parents=True)
    assert run_job(job, out) == 0
    (out / JOB_FILE).write_text(job.model_dump_json(), encoding="utf-8")  # as collected from the host
    assert _sent(out) == [3, 4, 5]  # after the lost round's reach
    stage = stage_folder(host.work_root, plan.run_id, cp.name, 2, "localhost")
    # The case wrote ended.json in its own folder (what an older version's controller wrote there), or even the
    # controller's file: neither proves its end, so its reservation stays open (its stored record may not be final)
    (out / ENDED_FILE).write_text('{"exit_code": 0}\n')
    after_collection(host, stage, run, cp, 2, 0, own, "round 2")
    # the lost round's stays open too: only serving.json (the case's) says where it reached
    assert [r.id for r in reservations(run) if r.open] == [lost.id, own.id]
    # Its runtime saw it end: collection brings the controller's marker in as CONTROLLER_ENDED_FILE
    (out / CONTROLLER_ENDED_FILE).write_text('{"exit_code": 0}\n')
    after_collection(host, stage, run, cp, 2, 0, own, "round 2")
    assert [(r.id, r.open) for r in reservations(run)] == [(lost.id, True)]
    assert sorted(p.name.split("-")[0] for p in (run / RUN_POSITIONS_DIR).iterdir()) == ["collected", "reserved"]


def test_a_half_round_whose_attempts_are_not_all_read_keeps_its_reservation_open(
        refusing: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A half round on the host is read whole before it goes: every attempt<N> folder there, also past what
    max_retries allows now. Where an attempt's record cannot be read (larger than 64 KiB), what it took is not known:
    the round's reservation stays open, so that the rerun starts after the most the half round may have sent; its folder
    goes only where that reservation bounds every attempt found there, else it is kept and the round is not run."""
    from flagperf.results.prompt_positions import MAX_POSITIONS_BYTES, PROMPT_POSITIONS, Reach
    from flagperf.results.schema import RESULT_FILE, Failure, write_result
    from flows import evaluate
    from flows.evaluate import clean_work_roots, failed_line, half_rounds_kept
    from flows.host_round import HalfRoundKept, cleared_stage, round_reservation, secure_half_round
    from tasks.collect import stage_folder
    from tasks.container import seen_ended

    RefusingEndpoint.refuse = set()
    plan = _endpoint_plan(refusing, tmp_path, "requests=2", "max_retries=1")
    cp = plan.cases[0]
    host = LocalHost(work_root=tmp_path / "work")
    spec = host_spec({"name": "localhost"})
    stage = stage_folder(host.work_root, plan.run_id, cp.name, 1, "localhost")
    (stage / "attempt1").mkdir(parents=True)
    assert run_job(round_job(plan, tmp_path / "none", cp, 1, "localhost", spec, {}, None), stage / "attempt1") == 0
    record = json.loads((stage / "attempt1" / PROMPT_POSITIONS).read_text())
    assert (record["first"], record["end"], record["bound"]) == (0, 3, 6)  # 2 attempts of 3 prompts may reach 6
    host.remove_tree(stage)
    too_large = " " * (MAX_POSITIONS_BYTES + 1)

    def half(name: str, attempts: dict[int, str], ended: tuple[int, ...] = ()) -> tuple[Path, Job, Reservation]:
        """A run folder whose round 1 was dispatched, and left on the host with these attempts' records."""
        run = tmp_path / name / plan.run_id  # the plan's run folder where its results folder is tmp_path / name
        run.mkdir(parents=True)
        job = round_job(plan, run, cp, 1, "localhost", spec, {}, None)
        reserved = reserve(run, round_reservation(job, cp.max_retries + 1))
        for number, text in attempts.items():
            (stage / f"attempt{number}").mkdir(parents=True)
            (stage / f"attempt{number}" / PROMPT_POSITIONS).write_text(text)
            if number in ended:
                seen_ended(host, stage / f"attempt{number}", 0)
        return run, round_job(plan, run, cp, 1, "localhost", spec, {}, None), reserved

    # Attempt 1's record cannot be read: the reservation bounds it, so the folder goes and the reservation stays.
    run, job, reserved = half("unread", {1: too_large})
    cleared = cleared_stage(host, stage, job, run, reserved)
    assert not stage.exists() and [(r.id, r.open) for r in cleared.prompt_reservations] == [(reserved.id, True)]
    out = round_dir(run, cp.name, 1, "localhost")
    out.mkdir(parents=True)
    assert run_job(cleared, out) == 0
    assert _sent(out) == [6, 7, 8]  # after the most its 2 attempts may have sent

    # An attempt past max_retries + 1 (3 of 2) is read too: the reservation closes on what every attempt took.
    past = {1: json.dumps(record), 3: json.dumps({**record, "first": 3, "reserved": 6, "end": 6, "bound": 6})}
    run, job, reserved = half("past", past, ended=(1, 3))
    cleared = cleared_stage(host, stage, job, run, reserved)
    assert cleared.prompt_positions == {record["stream"]: 6} and reservations(run) == []
    assert (run / RUN_POSITIONS_DIR / f"collected-{reserved.id}.json").is_file()

    # One past it cannot be read: nothing bounds it, so the folder stays (and the reservation), and the round is not
    # run.
    run, job, reserved = half("unbounded", {1: json.dumps(record), 3: too_large})
    with pytest.raises(HalfRoundKept, match=r"attempt3/prompt_positions\.json") as caught:
        cleared_stage(host, stage, job, run, reserved)
    assert (stage / "attempt3").is_dir() and [(r.id, r.open) for r in reservations(run)] == [(reserved.id, True)]
    assert positions_taken(run) == {record["stream"]: 3}  # attempt 1's record kept
    # The run's clean-up keeps it too (its round's failed result says where), and the run's final line says where.
    hosts, specs = {"localhost": host}, {"localhost": spec}
    assert caught.value.where == f"localhost:{stage}"
    kept = job.failed_result(Failure(kind="infrastructure", message=f"{cp.name} round 1 on localhost: {caught.value}",
                                     kept_at=caught.value.where), None)
    secured: list[Path] = []

    def secure(host: LocalHost, stage_dir: Path, *args: Any) -> str | None:
        secured.append(stage_dir)
        return secure_half_round(host, stage_dir, *args)

    monkeypatch.setattr(evaluate, "secure_half_round", secure)
    caplog.clear()
    clean_work_roots(hosts, specs, plan.model_copy(update={"results_dir": str(tmp_path / "unbounded")}), [kept])
    assert (stage / "attempt3").is_dir() and secured == []  # kept as its round said: not looked at again
    said = [r.getMessage() for r in caplog.records]
    looked_at = [m for m in said if "half round(s) to look at" in m]
    assert len(looked_at) == 1 and looked_at[0].endswith(f"half round(s) to look at (localhost:{stage})"), said
    assert not [m for m in said if "could not clean" in m or m.startswith("kept the half round")], said
    line = failed_line([kept], 1, f"flagperf run --cases {cp.name}", run)
    assert line.count(f"localhost:{stage}") == 1 and "\n" not in line, line
    cut = kept.model_copy(update={"failure": Failure(kind="infrastructure", message="too long to be listed",
                                                     kept_at=caught.value.where)})
    assert failed_line([cut], 1, None, run).endswith(f"could not all be read): localhost:{stage}")
    # Where it lies is the failure's own field: a message that only quotes the words (a case log's tail, an endpoint's
    # error body) keeps nothing.
    forged = job.failed_result(Failure(kind="infrastructure", message=(
        "last lines of case.log: the half round is kept on its host at localhost:/etc")), None)
    assert half_rounds_kept([forged]) == [] and "kept on the host" not in failed_line([forged], 1, None, run)
    host.remove_tree(stage)

    # A round interrupted mid-attempt (Ctrl-C) has no result on the host: the clean-up keeps its records in the run
    # folder, and its reach (the bound: its case process may still be stopping) beside its reservation, before the
    # folder goes; where they cannot all be read and nothing bounds them, the folder stays, said in one line.
    halfway = {**record, "reserved": 2, "end": None}
    run, job, reserved = half("interrupted", {1: json.dumps(halfway)})
    clean_work_roots(hosts, specs, plan.model_copy(update={"results_dir": str(tmp_path / "interrupted")}), [])
    assert not stage.exists() and positions_taken(run) == {record["stream"]: 2}
    assert [(r.id, r.open, r.reach) for r in reservations(run)] == [
        (reserved.id, True, Reach(stream=record["stream"], end=6, taken=6, ended_checked=True,
                                  ended_by_controller=True))]  # no end seen
    # A round whose subflow crashed has a failed result the controller wrote itself, with none of its records: while
    # its reservation is open its folder on the host is a half round all the same, secured before it goes.
    run, job, reserved = half("crashed", {1: json.dumps(halfway)})
    out = round_dir(run, cp.name, 1, "localhost")
    write_result(out / RESULT_FILE, job.failed_result(Failure(kind="infrastructure", message="crashed"), None))
    secured.clear()
    clean_work_roots(hosts, specs, plan.model_copy(update={"results_dir": str(tmp_path / "crashed")}), [])
    assert secured == [stage] and not stage.exists() and positions_taken(run) == {record["stream"]: 2}
    run, job, reserved = half("lost", {1: json.dumps(halfway), 3: too_large})
    caplog.clear()
    clean_work_roots(hosts, specs, plan.model_copy(update={"results_dir": str(tmp_path / "lost")}), [])
    assert (stage / "attempt3").is_dir() and positions_taken(run) == {record["stream"]: 2}
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("kept the half round")]
    assert len(said) == 1 and said[0].startswith(f"kept the half round localhost:{stage}: its attempts' prompt "
                                                 "positions could not all be read") and "\n" not in said[0], said
    host.remove_tree(stage)

    # The clean-up removes the run's markers, and their folder (<work_root>/.ended) once no other run's are in it:
    # the host keeps nothing of a cleaned run (another run's markers beside them stay)
    markers = host.ended_path(host.work_root / plan.run_id)
    assert markers is not None and markers.parent == host.ended_root
    (markers / "x").mkdir(parents=True)
    other = host.ended_root / "run-other"
    other.mkdir()
    clean_work_roots(hosts, specs, plan.model_copy(update={"results_dir": str(tmp_path / "tidy")}), [])
    assert not markers.exists() and other.is_dir()
    other.rmdir()
    (markers / "x").mkdir(parents=True)
    clean_work_roots(hosts, specs, plan.model_copy(update={"results_dir": str(tmp_path / "tidy")}), [])
    assert not host.ended_root.exists()


def test_a_reservations_reach_is_kept_beside_it_and_read_where_its_files_are_gone(
        refusing: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Each attempt writes its stream and the most it and the round's later attempts may take before it sends; the
    controller keeps that beside the round's reservation once its attempts end (also when interrupted). A later round
    whose host lacks the round's files (its tokenizer moved, or on another client_host) reads it instead of working it
    out. One whose reach was not kept and that cannot be worked out there is not dropped in silence: the round warns
    that it may resend its prompts, and serving.json says so (each_sent_once false, unknown_reservations)."""
    import shutil

    from flagperf.generate.models import model_config, word_tokenizer
    from flows.host_round import keep_round_reach, round_reservation
    from tasks.collect import stage_folder

    RefusingEndpoint.refuse = set()
    tokenizer = tmp_path / "tok"
    model_config("tiny", None).save_pretrained(tokenizer)
    word_tokenizer(512).save_pretrained(tokenizer)
    plan = _endpoint_plan(refusing, tmp_path, "requests=2", f"checkpoint_path={tokenizer}", rounds=3)
    cp = plan.cases[0]
    host = LocalHost(work_root=tmp_path / "work")
    spec = host_spec({"name": "localhost"})
    run = tmp_path / "run"
    run.mkdir()

    def interrupted(round_no: int, keep: bool) -> tuple[Reservation, Path]:
        """The round dispatched and run on the host, then its folder removed there (Ctrl-C's clean-up)."""
        job = round_job(plan, run, cp, round_no, "localhost", spec, {}, None)
        reservation = reserve(run, round_reservation(job, cp.max_retries + 1))
        stage = stage_folder(host.work_root, plan.run_id, cp.name, round_no, "localhost")
        (stage / "attempt1").mkdir(parents=True)
        assert run_job(job, stage / "attempt1") == 0
        if keep:
            keep_round_reach(host, stage, run, reservation, f"round {round_no}")
        sent = _sent(stage / "attempt1")
        host.remove_tree(stage)
        return reservation, sent

    first, sent = interrupted(1, keep=True)
    assert sent == [0, 1, 2] and reservations(run)[0].reach is not None
    assert (run / RUN_POSITIONS_DIR / f"reach-{first.id}.json").is_file()
    second, sent = interrupted(2, keep=False)
    assert sent == [3, 4, 5]  # after the first's reach
    shutil.move(tokenizer, tmp_path / "moved")  # the same tokenizer, elsewhere: the same stream
    moved = _endpoint_plan(refusing, tmp_path, "requests=2", f"checkpoint_path={tmp_path / 'moved'}", rounds=3)
    caplog.clear()
    assert _run_round(moved, run, 3) == 0
    out = round_dir(run, cp.name, 3, "localhost")
    prompt_set = json.loads((out / SERVING_FILE).read_text())["prompt_set"]
    assert prompt_set["first_position"] == 3  # the first round's reach, read: its tokenizer is gone
    assert prompt_set["unknown_reservations"] == [second.where] and prompt_set["each_sent_once"] is False
    assert ("1 round(s) the controller dispatched to the same endpoint, model and API, whose records the run folder "
            f"does not hold, cannot be worked out here (their reservations {second.where})") in caplog.text


def test_a_later_reservation_is_worked_out_from_where_its_round_started_not_from_what_an_earlier_one_took(
        refusing: str, tmp_path: Path) -> None:
    """Round 2 was dispatched while round 1's reach was not known: it started after the most round 1 may take (its
    bound). Round 1's reach, with what it took, is kept only later; round 3, working out round 2's reservation (its
    reach never kept), starts it where it started (round 1's bound), not after what round 1 took, so it resends none
    of round 2's prompts."""
    import shutil

    from flagperf.results.prompt_positions import close
    from flows.host_round import keep_round_reach, round_reservation
    from tasks.collect import stage_folder
    from tasks.container import seen_ended

    RefusingEndpoint.refuse = set()
    plan = _endpoint_plan(refusing, tmp_path, "requests=2", "max_retries=2", rounds=3)
    cp = plan.cases[0]
    host = LocalHost(work_root=tmp_path / "work")
    spec = host_spec({"name": "localhost"})
    run = tmp_path / "run"
    run.mkdir()

    def attempt(round_no: int, number: int, job: Job) -> list[int]:
        stage = stage_folder(host.work_root, plan.run_id, cp.name, round_no, "localhost")
        job = job.model_copy(update={"attempt": number, "prompt_positions": attempt_positions(
            host, stage, number, job.prompt_positions)})
        (stage / f"attempt{number}").mkdir(parents=True)
        assert run_job(job, stage / f"attempt{number}") == 0
        seen_ended(host, stage / f"attempt{number}", 0)
        return _sent(stage / f"attempt{number}")

    job1 = round_job(plan, run, cp, 1, "localhost", spec, {}, None)
    first = reserve(run, round_reservation(job1, cp.max_retries + 1))
    assert attempt(1, 1, job1) == [0, 1, 2]  # its bound: 3 attempts of 3 prompts, 9
    job2 = round_job(plan, run, cp, 2, "localhost", spec, {}, None)  # round 1's reach not kept (yet)
    reserve(run, round_reservation(job2, cp.max_retries + 1))
    sent2 = attempt(2, 1, job2) + attempt(2, 2, job2)  # its first attempt failed after it sent (infrastructure)
    assert sent2 == [9, 10, 11, 12, 13, 14]
    host.remove_tree(stage_folder(host.work_root, plan.run_id, cp.name, 2, "localhost"))  # lost: no reach kept
    # Round 1 is collected later (a retry): its reach, with what it took, is kept, and its reservation closed.
    stage1 = stage_folder(host.work_root, plan.run_id, cp.name, 1, "localhost")
    keep_round_reach(host, stage1, run, first, "round 1")
    assert [(r.reach.end, r.reach.taken) for r in reservations(run) if r.id == first.id and r.reach] == [(9, 3)]
    shutil.copytree(stage1 / "attempt1", round_dir(run, cp.name, 1, "localhost"))
    close(run, first)
    assert _run_round(plan, run, 3) == 0
    sent3 = _sent(round_dir(run, cp.name, 3, "localhost"))
    assert sent3[0] == 9 + 9 and not set(sent3) & set(sent2), (sent2, sent3)


def test_an_endpoints_synthetic_prompt_stream_is_its_tokenizer_wherever_its_folder_lies(
        refusing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Synthetic prompts are decided by the seed, input_len, the vocabulary and the tokenizer, not by the folder that
    holds it: one tokenizer named by a relative path, copied to another folder, or reached through a link is one
    stream (each round starts after the one before), and so is one whose chat template alone differs (the template
    decides what is sent around a prompt, not the prompt). Another tokenizer (a token made special, which the prompts
    leave out) is a stream of its own, from position 0."""
    import shutil

    from flagperf.generate.models import model_config, word_tokenizer

    RefusingEndpoint.refuse = set()

    def folder(name: str, template: str | None = None, special: list[str] | None = None) -> Path:
        made = tmp_path / name
        model_config("tiny", None).save_pretrained(made)
        tokenizer = word_tokenizer(512)
        if template is not None:
            tokenizer.chat_template = template
        if special:
            tokenizer.add_special_tokens({"additional_special_tokens": special})
        tokenizer.save_pretrained(made)
        return made

    original = folder("tok")
    shutil.copytree(original, tmp_path / "copies" / "tok")
    (tmp_path / "tok-link").symlink_to(original)
    folder("tok-templated", template="{{ messages[0]['content'] }} ...")
    folder("tok-other", special=["t5"])
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    firsts = []
    for round_no, path in enumerate(["tok", str(tmp_path / "copies" / "tok"), str(tmp_path / "tok-link"),
                                     "tok-templated", "tok-other"], 1):
        plan = _endpoint_plan(refusing, tmp_path, "requests=2", f"checkpoint_path={path}", rounds=5)
        assert _run_round(plan, run, round_no) == 0
        out = round_dir(run, plan.cases[0].name, round_no, "localhost")
        firsts.append(json.loads((out / SERVING_FILE).read_text())["prompt_set"]["first_position"])
    assert firsts == [0, 3, 6, 9, 0]


def test_an_endpoint_case_runs_on_the_one_host_its_endpoint_names_of_several(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A single-node case runs on every host of the inventory at once: an endpoint would be loaded by every host
    together, each point measured under all their requests. So an endpoint names the host that sends its load,
    ``client_host``, and its case runs there alone (the rounds the plan counts, and the run's, are that host's): in the
    inventory's entry, checked when the inventory is read, or in the case's own settings, checked with the plan. Where
    the inventory has several hosts and the endpoint names none, or names one it does not have, the run is refused
    before anything runs, in one line naming the file and the key to write; one host needs no name."""
    import yaml

    from flagperf.config.cases import load_case
    from flagperf.errors import ConfigError
    from flagperf.hosts.inventory import build_inventory
    from flagperf.results.schema import node_groups
    from flagperf.results.summary import run_progress
    from flows.progress import Progress

    lab = {"base_url": "http://10.0.0.5:8000", "model": "m"}

    def plan(hosts: list[str], endpoints: dict[str, dict[str, object]], *sets: str, case: str = "tiny-llama-serve",
             rounds: int = 1, suite: Path | None = None) -> RunPlan:
        return plan_run(cases=None if suite else [case], sets=list(sets), results_dir=tmp_path / "results",
                        hosts=[{"name": name} for name in hosts], inventory_endpoints=endpoints,
                        inventory_source="inventory.yaml", rounds=rounds, suite=str(suite) if suite else None)

    def refused(*args: object, **kwargs: object) -> ConfigError:
        with pytest.raises(ConfigError) as caught:
            plan(*args, **kwargs)  # type: ignore[arg-type]
        assert "\n" not in str(caught.value)
        return caught.value

    error = refused(["h1", "h2"], {"lab": lab}, "endpoint=lab")
    assert (error.source, error.key) == ("inventory.yaml", "endpoints.lab.client_host")
    assert str(error) == ("inventory.yaml: endpoints.lab.client_host: not given, and the inventory (inventory.yaml) "
                          "has 2 hosts (h1, h2): case tiny-llama-serve would load its endpoint from every one at once, "
                          "each point measured under every host's requests, not the load its label says; name the one "
                          "host that sends the load (client_host: h1)")
    error = refused(["h1", "h2"], {"lab": {**lab, "client_host": "h3"}}, "endpoint=lab")
    assert (error.source, error.key) == ("inventory.yaml", "endpoints.lab.client_host")
    assert "'h3' names no host of the inventory (inventory.yaml: 2 hosts (h1, h2))" in str(error)

    chosen = plan(["h1", "h2", "h3"], {"lab": {**lab, "client_host": "h2"}}, "endpoint=lab", rounds=2)
    assert node_groups(chosen.cases[0].config, ["h1", "h2", "h3"]) == [["h2"]]
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text(chosen.model_dump_json(), encoding="utf-8")
    assert run_progress(run, [])["planned"] == 2  # 2 rounds on h2, not on every host
    live = Progress(chosen, ["h1", "h2", "h3"], run)  # flagperf run's live view lays them out there too
    assert list(live.rows) == [("tiny-llama-serve", 1, "h2"), ("tiny-llama-serve", 2, "h2")]
    assert plan(["h1"], {"lab": lab}, "endpoint=lab").cases[0].config["endpoint"]["client_host"] is None
    # --set sets the named entry's client_host (before or after the name, for every case or one), checked the same way.
    for sets in (("endpoint=lab", "endpoint.client_host=h3"), ("endpoint.client_host=h3", "endpoint=lab"),
                 ("endpoint=lab", "tiny-llama-serve.endpoint.client_host=h3"),
                 ("tiny-llama-serve.endpoint.client_host=h3", "tiny-llama-serve.endpoint=lab"),
                 ("tiny-llama-serve.endpoint.client_host=h3", "endpoint=lab"),
                 ("endpoint.client_host=h3", "tiny-llama-serve.endpoint=lab")):
        moved = plan(["h1", "h2", "h3"], {"lab": {**lab, "client_host": "h2"}}, *sets).cases[0]
        assert (moved.config["endpoint"]["client_host"], moved.origins["endpoint.client_host"]) == ("h3", "--set")
        assert moved.config["endpoint"]["base_url"] == lab["base_url"]
    error = refused(["h1", "h2"], {"lab": {**lab, "client_host": "h2"}}, "endpoint=lab", "endpoint.client_host=h9")
    assert (error.source, error.key) == ("--set", "tiny-llama-serve.endpoint.client_host") and "'h9'" in str(error)
    # Its other keys are the inventory's: set on a named endpoint they would repoint it while its origin says
    # inventory.yaml. Refused in one line, whichever comes first.
    for sets, key in ((("endpoint=lab", "endpoint.base_url=http://elsewhere:1"), "endpoint.base_url"),
                      (("tiny-llama-serve.endpoint.model=other", "tiny-llama-serve.endpoint=lab"), "endpoint.model")):
        error = refused(["h1"], {"lab": lab}, *sets)
        assert (error.source, error.key) == ("--set", f"tiny-llama-serve.{key}")
        assert "only its client_host and devices may be set here" in str(error), error
    assert plan(["h1", "h2"], {"lab": lab}).cases[0].config["endpoint"] is None  # no endpoint: every host

    # The case's own settings: the key is named in its case.yaml.
    manifest = yaml.safe_load(load_case("tiny-llama-serve").folder.joinpath("case.yaml").read_text())
    folder = tmp_path / "cases" / "generate" / "own-endpoint"
    folder.mkdir(parents=True)
    manifest["configurations"]["endpoint"] = {**lab, "client_host": "h9"}
    (folder / "case.yaml").write_text(yaml.safe_dump({**manifest, "name": "own-endpoint"}), encoding="utf-8")
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(tmp_path / "cases"))
    error = refused(["h1", "h2"], {}, case="own-endpoint")
    assert (error.source.rsplit("/", 1)[-1], error.key) == ("case.yaml", "configurations.endpoint.client_host")
    # ... or where the name it gives was set: --set, or a suite's overrides (by its path in the file).
    error = refused(["h1", "h2"], {}, "own-endpoint.endpoint.client_host=h7", case="own-endpoint")
    assert (error.source, error.key) == ("--set", "own-endpoint.endpoint.client_host") and "'h7'" in str(error)
    suite = tmp_path / "serve-suite.yaml"
    for section in ("tiny-llama-serve", "*"):
        suite.write_text(yaml.safe_dump({"name": "serve-suite", "cases": ["tiny-llama-serve"],
                                         "overrides": {section: {"endpoint": lab}}}), encoding="utf-8")
        error = refused(["h1", "h2"], {}, suite=suite)
        assert (error.source, error.key) == (str(suite), f"overrides.{section}.endpoint.client_host")

    # The inventory's entries are checked when it is read (flagperf validate too), whether a case names them or not.
    with pytest.raises(ConfigError) as caught:
        build_inventory({"hosts": [{"name": "h1"}, {"name": "h2"}],
                         "endpoints": {"lab": {**lab, "client_host": "h9"}}}, "inventory.yaml", tmp_path)
    assert (caught.value.key, str(caught.value)) == (
        "endpoints.lab.client_host", "inventory.yaml: endpoints.lab.client_host: 'h9' names no host of the inventory "
                                     "(h1, h2)")


def test_an_endpoints_prompt_files_are_streams_by_their_text_and_sharegpt_positions_are_its_conversations(
        refusing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A prompts or ShareGPT file's stream at an endpoint is its text (a digest), not its name: two cases that ship
    different files of the same relative name have a stream each (the second resends nothing and is warned of
    nothing), and the same text named another way is one stream (the second case starts after the first's prompts).
    A ShareGPT file's positions are its conversations: a case whose input_len leaves some out starts after the
    conversations another case sent from the same file, and sends none of them again."""
    import yaml

    from flagperf.config.cases import load_case
    from flagperf.results.prompt_positions import PROMPT_POSITIONS

    RefusingEndpoint.refuse = set()
    manifest = yaml.safe_load(load_case("tiny-llama-serve").folder.joinpath("case.yaml").read_text())

    def case(name: str, files: dict[str, str], **values: object) -> None:
        folder = tmp_path / "cases" / "generate" / name
        for relative, text in files.items():
            (folder / relative).parent.mkdir(parents=True, exist_ok=True)
            (folder / relative).write_text(text, encoding="utf-8")
        (folder / "case.yaml").write_text(yaml.safe_dump({**manifest, "name": name, "configurations": {
            **manifest["configurations"], **values}}), encoding="utf-8")

    def jsonl(tag: str, count: int) -> str:
        return "".join(f'{{"prompt": "{tag}{i} q{i}"}}\n' for i in range(count))

    case("file-a", {"prompts.jsonl": jsonl("a", 6)}, prompts_path="prompts.jsonl")
    case("file-b", {"prompts.jsonl": jsonl("b", 6)}, prompts_path="prompts.jsonl")  # same name, other prompts
    case("file-c", {"data/other.jsonl": jsonl("a", 6)}, prompts_path="./data/other.jsonl")  # file-a's, named so
    # Conversations of 5 or 12 words (the word tokenizer counts them): input_len 8 leaves the long ones out.
    lengths = [5, 12, 5, 12, 5, 5, 12, 5]
    sharegpt = json.dumps([{"conversations": [{"from": "human", "value": " ".join(f"c{n}w{i}" for i in range(words))},
                                              {"from": "gpt", "value": "r r r r"}]}
                           for n, words in enumerate(lengths)])
    case("sg-long", {"chats.json": sharegpt}, sharegpt_path="chats.json", input_len=20)
    case("sg-short", {"chats.json": sharegpt}, sharegpt_path="chats.json", input_len=8)
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(tmp_path / "cases"))
    plan = plan_run(cases=["file-a", "file-b", "file-c", "sg-long", "sg-short"],
                    sets=["endpoint=lab", "concurrency=[1]", "request_rates=[]", "warmup_requests=0",
                          "max_new_tokens=2", "requests=2"],
                    results_dir=tmp_path / "results", inventory_endpoints={"lab": {"base_url": refusing, "model": "m"}},
                    inventory_source="inventory.yaml")
    run_dir = tmp_path / "run"

    def round_of(name: str) -> tuple[list[int], dict[str, object]]:
        assert _run_round(plan, run_dir, 1, name) == 0
        out = round_dir(run_dir, name, 1, "localhost")
        return _sent(out), json.loads((out / PROMPT_POSITIONS).read_text())

    assert round_of("file-a")[0] == [0, 1, 2]  # the check's prompt, then c1's two
    caplog.clear()
    sent, ledger = round_of("file-b")
    assert sent == [0, 1, 2] and ledger["first"] == 0  # a stream of its own: its prompts were never sent there
    assert "resends prompts" not in caplog.text and "resent a prompt" not in caplog.text
    sent, ledger = round_of("file-c")
    assert sent == [3, 4, 5] and ledger["first"] == 3  # file-a's prompts: after those file-a sent
    assert round_of("sg-long")[0] == [0, 1, 2]  # conversations 0, 1, 2: every one is short enough
    sent, ledger = round_of("sg-short")
    assert sent == [4, 5, 7] and (ledger["first"], ledger["end"]) == (3, 8)  # the short ones after conversation 2
    # file-a's six prompts are spent (by file-a and file-c): its round 2 resends three, and says so from the start
    first = json.loads((round_dir(run_dir, "file-a", 1, "localhost") / SERVING_FILE).read_text())["prompt_set"]
    assert _run_round(plan, run_dir, 2, "file-a") == 0
    again = json.loads((round_dir(run_dir, "file-a", 2, "localhost") / SERVING_FILE).read_text())["prompt_set"]
    assert _sent(round_dir(run_dir, "file-a", 2, "localhost")) == [0, 1, 2]
    assert (first["each_sent_once"], again["each_sent_once"], again["repeated_requests"]) == (True, False, 2)


def test_collection_brings_the_controllers_ended_markers_in_and_never_one_the_case_wrote(tmp_path: Path) -> None:
    """Collection puts the controller's marker of each attempt seen to end (kept outside the round's folder) into
    that attempt's copy as CONTROLLER_ENDED_FILE; a file of that name the case left anywhere in the round's folder is
    removed from the copy, said in a warning, and an attempt whose end was not seen gets none."""
    import logging

    from flagperf.results.prompt_positions import CONTROLLER_ENDED_FILE, ENDED_FILE
    from tasks.collect import bring_ended_markers
    from tasks.container import seen_ended

    host = LocalHost(work_root=tmp_path / "work")
    stage = host.work_root / "run" / "c" / "round1" / "localhost_noderank0"
    copy = tmp_path / "copy"
    for where in ("attempt1", "attempt2", "attempts/attempt1", "."):
        (copy / where).mkdir(parents=True, exist_ok=True)
        (copy / where / CONTROLLER_ENDED_FILE).write_text('{"exit_code": 0}\n')  # what the case forged
    (copy / "attempt1" / ENDED_FILE).write_text('{"exit_code": 0}\n')
    seen_ended(host, stage / "attempt2", 3)
    said: list[str] = []

    class Said(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    logger = logging.getLogger("test.collect")
    logger.addHandler(Said())
    bring_ended_markers(host, stage, copy, logger)
    assert sorted(str(p.relative_to(copy)) for p in copy.rglob(CONTROLLER_ENDED_FILE)) == [
        f"attempt2/{CONTROLLER_ENDED_FILE}"]
    assert json.loads((copy / "attempt2" / CONTROLLER_ENDED_FILE).read_text()) == {"exit_code": 3}
    assert len(said) == 4 and all("not written by the controller" in line for line in said), said


def test_a_marker_clean_up_that_fails_fails_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Once a round is stored or cleared, its ended markers go; where that fails (an SSH link that drops raises in
    remove_tree) the round stands: the failure is said at debug level only (a stale marker is harmless: run_case
    removes an attempt's marker before it reuses its number)."""
    import logging

    from tasks.collect import remove_ended_markers
    from tasks.container import seen_ended

    class LinkDrops(LocalHost):
        def remove_tree(self, remote: Path) -> None:
            raise OSError(f"host {self.name}: the link to the host dropped")

    host = LinkDrops(work_root=tmp_path / "work")
    stage = host.work_root / "run" / "c" / "round1" / "localhost_noderank0"
    seen_ended(host, stage / "attempt1", 0)
    with caplog.at_level(logging.DEBUG, logger="tasks.collect"):
        remove_ended_markers(host, stage)
    marker = host.ended_marker(stage / "attempt1")
    assert marker is not None and marker.is_file()
    assert [r.levelno for r in caplog.records] == [logging.DEBUG] and "the link to the host dropped" in caplog.text
    remove_ended_markers(LocalHost(work_root=host.work_root), stage)
    assert not marker.exists()


def test_an_attempt_with_neither_a_record_nor_a_seen_end_leaves_the_rounds_reach_at_its_bound(tmp_path: Path) -> None:
    """An attempt folder with no record of prompt positions and no ended marker may belong to an attempt still starting
    (its record not written yet when read) or sending: the round's reach counts its bound, not what the others took."""
    from flagperf.results.prompt_positions import PROMPT_POSITIONS
    from tasks.container import attempt_records, seen_ended

    host = LocalHost(work_root=tmp_path)
    stage = tmp_path / "stage"
    (stage / "attempt1").mkdir(parents=True)
    (stage / "attempt1" / PROMPT_POSITIONS).write_text(json.dumps(
        {"stream": "s", "first": 0, "reserved": 3, "end": 3, "bound": 9, "attempt_bound": 3}))
    seen_ended(host, stage / "attempt1", 0)
    assert attempt_records(host, stage).reach().taken == 3
    (stage / "attempt2").mkdir()
    assert attempt_records(host, stage).reach().taken == 9
    seen_ended(host, stage / "attempt2", 1)  # ended before it wrote a record: it sent nothing
    assert attempt_records(host, stage).reach().taken == 3


def test_a_reach_kept_by_an_older_version_is_read_without_what_it_took(tmp_path: Path) -> None:
    """A reach file written before what an attempt took counted only where its end was seen (no ended_checked), or
    only where the controller's own marker said so (no ended_by_controller), may trust an attempt still sending: read
    as its bound alone."""
    from flagperf.results.prompt_positions import Reach, keep_reach

    run = tmp_path / "run"
    reserved = reserve(run, Reservation(case="c", round=1, host="h", attempts=3, config={}))
    keep_reach(run, reserved, Reach(stream="s", end=9, taken=3, ended_checked=True, ended_by_controller=True))
    assert [r.reach.upto for r in reservations(run)] == [3]
    (run / RUN_POSITIONS_DIR / f"reach-{reserved.id}.json").write_text('{"stream": "s", "end": 9, "taken": 3}\n')
    assert [(r.reach.taken, r.reach.upto) for r in reservations(run)] == [(None, 9)]
    # Kept by the version that trusted an ended.json in the attempt's folder, which the case could write: unproven
    (run / RUN_POSITIONS_DIR / f"reach-{reserved.id}.json").write_text(
        '{"stream": "s", "end": 9, "taken": 3, "ended_checked": true}\n')
    assert [(r.reach.taken, r.reach.upto) for r in reservations(run)] == [(None, 9)]


def test_a_reservation_is_worked_out_from_what_its_job_saw_of_those_it_started_after(tmp_path: Path) -> None:
    """Z's reach is kept (its bound 5) only after A was dispatched: A's job worked Z out from its configuration (3
    attempts of 3 prompts: 9), so A started there, not at Z's kept bound; B and C after A and B likewise. A round after
    C starts after C's bound worked out from that chain (36), not from Z's kept bound (32). Where a job saw a kept reach
    (its upto), its round started right after it."""
    from flagperf.config.cases import load_case
    from flagperf.config.models import CASE_FOLDER
    from flagperf.generate.config import GenerateConfig
    from flagperf.generate.serve import Tokens, prompt_source, stream_start, vocab_size
    from flagperf.results.prompt_positions import WORKED_OUT, Reach, SeenReach

    plan = _endpoint_plan("http://127.0.0.1:9", tmp_path, "requests=2", "max_retries=2")
    cp = plan.cases[0]
    config = GenerateConfig.model_validate(cp.config, context={CASE_FOLDER: load_case(cp.name).folder})
    source = prompt_source(config, Tokens(None), vocab_size(config))
    stream = source.stream
    assert stream is not None

    def reservation(rid: str, after: str | None, seen: SeenReach | str = WORKED_OUT, reach: Reach | None = None
                    ) -> Reservation:
        return Reservation(case=cp.name, round=1, host="h", attempts=3, config=cp.config, id=rid, reach=reach,
                           after=[after] if after else [], seen={after: seen} if after else {})

    z = reservation("1", None, reach=Reach(stream=stream, end=5, taken=3, ended_checked=True))
    chain = [z, reservation("2", "1"), reservation("3", "2"), reservation("4", "3")]
    assert stream_start(source, {}, chain).start == 36
    # A's job saw Z's kept reach: A started after its upto (3), and may reach 3 + 9
    assert stream_start(source, {}, [z, reservation("2", "1", SeenReach(stream=stream, upto=3))]).start == 12


def test_a_stage_folder_without_an_attempt_lets_its_reservation_close_and_an_unended_attempt_does_not(
        tmp_path: Path) -> None:
    """A round interrupted after its stage folder was made (the monitors' start) and before run_case wrote its first
    attempt's job.json sent nothing: its reservation may close (it was kept open, so every later round on the stream
    started after its whole bound). An attempt folder whose runtime was not seen to end keeps it open; once its
    controller's ended marker is there, it closes; an ended.json the case wrote in its own folder (where an older
    version kept the marker) proves nothing."""
    from flagperf.results.prompt_positions import CONTROLLER_ENDED_FILE, ENDED_FILE
    from tasks.container import attempt_records, seen_ended

    host = LocalHost(work_root=tmp_path)
    stage = tmp_path / "run" / "stage"
    stage.mkdir(parents=True)
    assert attempt_records(host, stage).all_ended
    (stage / "attempt1").mkdir()
    assert not attempt_records(host, stage).all_ended
    for forged in (ENDED_FILE, CONTROLLER_ENDED_FILE):
        (stage / "attempt1" / forged).write_text('{"exit_code": 0}\n')
    assert not attempt_records(host, stage).all_ended
    seen_ended(host, stage / "attempt1", 0)
    marker = host.ended_marker(stage / "attempt1")
    assert attempt_records(host, stage).all_ended and marker is not None and marker.is_file()
    assert not marker.is_relative_to(stage.parent)  # outside the run's folder, which a container gets
