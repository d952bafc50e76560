"""Serving engines of the generate family, for real on the CPU: `transformers serve` with a tiny random Llama
saved to a local folder (one server for the module), our load generator against it (closed and open loop,
client counts against the exact lengths asked), a server killed mid-point and one that never gets ready
through the case entry, ports taken again when the server loses its port, the engine folders' exact command
lines, goodput on hand-made traces, and the serving keys' one-line errors."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import socket
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import httpx
import psutil
import pytest
import torch
import transformers
from packaging.version import Version

from flagperf.config.job import Job
from flagperf.config.models import CASE_FOLDER
from flagperf.config.plan import plan_run
from flagperf.entry import run_job
from flagperf.errors import EXIT_USER_ERROR, ConfigError
from flagperf.generate.config import GenerateConfig
from flagperf.generate.engines import load_engine
from flagperf.generate.loadgen import (
    MAX_LINE_BYTES,
    REQUESTS_FILE,
    LineSplitter,
    LineTooLong,
    Load,
    RecordWriter,
    RequestRecord,
    ServingPrompt,
    Target,
    count_output,
    first_answer,
    phase_span,
    read_records,
    run_phase,
    send_request,
)
from flagperf.generate.models import random_checkpoint
from flagperf.generate.points import (
    CONVENTIONS,
    PER_CHUNK_ITL,
    early_stopping,
    early_stopping_needed,
    meets_slo,
    point_metrics,
    point_stats,
)
from flagperf.generate.serve import SERVING_FILE, Tokens, synthetic_serving_prompts
from flagperf.generate.server import (
    EXIT_SERVER_FAILED,
    SERVER_LOG,
    ServerFailed,
    ServerProcess,
    ServerSpec,
    start_server,
)
from flagperf.results.prompt_positions import PROMPT_POSITIONS, merged
from flagperf.results.schema import read_result
from tasks.container import attempt_positions
from tests.unit.quoting_endpoint import QuotingEndpoint

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# ---- goodput and the point's figures on hand-made traces -------------------------------------------------

class Bounds:
    ttft_s = 0.5
    tpot_s = 0.1
    e2el_s: float | None = None


def trace(ttft: float, gap: float, tokens: int, error: str | None = None, requested: int | None = None,
          usage: int | None = None) -> RequestRecord:
    chunks = [ttft + gap * i for i in range(tokens)]
    return RequestRecord(point="c2", phase="timed", seq=0, prompt_index=0, sent_at=100.0,
                         requested_output=requested or tokens, exact=True, ttft_s=ttft if tokens else None,
                         chunk_times_s=chunks, e2el_s=chunks[-1] if chunks else 0.3, output_tokens_client=tokens,
                         output_tokens_usage=usage, finish_reason="stop", error=error,
                         output_counted_by=None if error else "tokenizer")


def test_goodput_counts_a_request_only_when_every_slo_holds() -> None:
    records = [
        trace(0.2, 0.05, 11),   # TTFT 0.2, TPOT 0.05: good
        trace(0.6, 0.05, 11),   # TTFT over
        trace(0.2, 0.15, 11),   # TPOT over
        trace(0.5, 0.1, 11),    # both exactly at the bounds: good
        trace(0.1, 0.0, 0, error="HTTP 500: boom"),  # failed
        trace(0.2, 0.05, 6, requested=11),  # truncated, but fast: good by the SLO rule
    ]
    assert [meets_slo(r, Bounds) for r in records] == [True, False, False, True, False, True]
    seconds = 4.0
    stats = point_stats("c2", records, seconds, Bounds)
    assert (stats.requests, stats.succeeded, stats.failed, stats.truncated, stats.good) == (6, 5, 1, 1, 3)
    assert stats.output_tokens == 4 * 11 + 6
    m = {x.name: x for x in point_metrics(stats, (100.0, 104.0), 2, Bounds, "closed loop")}
    assert m["goodput_requests_per_s@c2"].value == pytest.approx(3 / seconds)
    assert m["goodput_fraction@c2"].value == pytest.approx(3 / 6)
    assert m["failed_requests@c2"].value == 1 and m["truncated_requests@c2"].value == 1
    assert m["slo_p99_met@c2"].value == 0.0  # a failed request (and p99 over the bounds)
    assert m["output_tokens_per_s@c2"].value == pytest.approx(50 / seconds)
    assert m["output_tokens_per_s@c2"].work == 50 and m["output_tokens_per_s@c2"].window == [100.0, 104.0]
    assert m["output_tokens_per_s_per_device@c2"].value == pytest.approx(50 / seconds / 2)
    assert (m["output_tokens_per_s@c2"].warning or "").endswith(
        "1 failed, 1 truncated of 6 requests; the first failed: HTTP 500: boom")  # what to look at first
    assert m["ttft_s@c2"].p50 == pytest.approx(0.2)
    ttfts = sorted(r.ttft_s for r in records if r.ok)
    assert m["ttft_s@c2"].p95 == pytest.approx(ttfts[3] + 0.8 * (ttfts[4] - ttfts[3]))  # the tail inference records
    assert m["ttft_s@c2"].std == pytest.approx(statistics.stdev(ttfts))
    tpots = sorted([0.05, 0.05, 0.15, 0.1, 0.05])
    assert m["tpot_s@c2"].value == pytest.approx(sum(tpots) / 5)
    assert m["interactivity@c2"].value == pytest.approx(5 / sum(tpots))
    gaps = [0.05] * 10 + [0.05] * 10 + [0.15] * 10 + [0.1] * 10 + [0.05] * 5
    assert m["itl_s@c2"].value == pytest.approx(sum(gaps) / len(gaps))
    # Tokens/s per user is a rate: its tail is the slow side, p10 (here the slowest user), and no p99 (a rate's
    # p99 is its fastest 1 %).
    rates = sorted(r.output_tokens / (r.e2el_s or 1.0) for r in records if r.ok)
    per_user = m["tokens_per_s_per_user@c2"]
    assert per_user.p99 is None and per_user.p10 == pytest.approx(rates[0] + 0.4 * (rates[1] - rates[0]))
    assert per_user.p10 < per_user.p50 < per_user.p90
    # Every figure says how it was counted (the report's "How these numbers were made"), and how it is formed.
    assert all(x.convention and x.statistic for x in m.values()), [x.name for x in m.values() if not x.convention]
    assert m["ttft_s@c2"].convention.startswith("time to first token: send to the first output chunk")
    assert "1-token requests left out" in m["tpot_s@c2"].convention
    assert "usage.completion_tokens" in m["output_tokens_per_s@c2"].convention
    assert "first send to its last stream end" in m["requests_per_s@c2"].convention and m["requests_per_s@c2"].note
    assert m["failed_fraction@c2"].statistic == "single" and "finish_reason" in m["failed_fraction@c2"].convention
    # All good and within the p99 bounds: the point meets its SLO.
    fast = point_stats("r1.5", [trace(0.2, 0.05, 11), trace(0.3, 0.08, 11)], 2.0, Bounds)
    metrics = {x.name: x.value for x in point_metrics(fast, (0.0, 2.0), 1, Bounds, "open loop")}
    assert metrics["slo_p99_met@r1.5"] == 1.0 and metrics["goodput_fraction@r1.5"] == 1.0


def test_an_e2el_bound_and_a_usage_mismatch_are_counted() -> None:
    class WithE2el(Bounds):
        e2el_s = 0.6

    records = [trace(0.2, 0.05, 11), trace(0.1, 0.01, 11, usage=12)]  # E2EL 0.7 and 0.2
    assert [meets_slo(r, WithE2el) for r in records] == [False, True]
    stats = point_stats("c1", records, 1.0, WithE2el)
    assert stats.mismatched == 1 and stats.output_tokens == 11 + 12  # the server's usage counts
    # A prompt the server counted otherwise than the client's count of it as sent (the chat template applied) is
    # a mismatch too; a request off by both counts once.
    off = [trace(0.2, 0.05, 11), trace(0.2, 0.05, 11, usage=12), trace(0.2, 0.05, 11)]
    for record, sent, server in zip(off, (5, 5, 5), (7, 9, 5), strict=True):
        record.prompt_tokens_sent, record.prompt_tokens_usage = sent, server
    stats = point_stats("c1", off, 1.0, WithE2el)
    assert (stats.mismatched, stats.prompt_mismatched, stats.output_mismatched) == (2, 2, 1)


def test_a_p99_verdict_says_how_many_requests_mlperf_early_stopping_needs() -> None:
    """MLPerf LoadGen's early stopping (Server): with none over a bound a p99 verdict at 99 % confidence needs 459
    requests, with one over 662 (LoadGen's own reference values), more with each over. A point whose p99s are within
    the SLO on fewer is not slo_p99_confident (its note says how many it needs); one with enough is."""
    assert [early_stopping_needed(over) for over in (0, 1, 2)] == [459, 662, 838]
    assert all(early_stopping_needed(over) < early_stopping_needed(over + 1) for over in range(40))
    assert early_stopping([0.5] * 3 + [0.6], 0.5).over == 1  # a latency at its bound is not over it
    # More than 1 % over: no count this point has can pass; the count it would need is not worked out.
    beyond = early_stopping([0.1] * 98 + [0.9] * 2, 0.5)
    assert (beyond.over, beyond.needed, beyond.met) == (2, None, False)
    assert early_stopping([0.1] * 99 + [0.9], 0.5).needed == 662
    few = point_stats("c1", [trace(0.2, 0.05, 11) for _ in range(100)], 10.0, Bounds)
    m = {x.name: x for x in point_metrics(few, (0.0, 10.0), 1, Bounds, "closed loop")}
    assert m["slo_p99_met@c1"].value == 1.0 and m["slo_p99_confident@c1"].value == 0.0
    assert "TTFT: 0 of 100 over its bound, needs 459" in m["slo_p99_confident@c1"].note
    assert few.early_stopping is not None and few.early_stopping["tpot"].as_json() == {
        "requests": 100, "over": 0, "needed": 459, "met": False}
    # 662 requests, one over the TTFT bound (its p99 still within it): enough for both verdicts.
    enough = [trace(0.2, 0.05, 11) for _ in range(661)] + [trace(0.9, 0.05, 11)]
    stats = point_stats("c1", enough, 66.2, Bounds)
    m = {x.name: x for x in point_metrics(stats, (0.0, 66.2), 1, Bounds, "closed loop")}
    assert (m["slo_p99_met@c1"].value, m["slo_p99_confident@c1"].value) == (1.0, 1.0)
    assert "TTFT: 1 of 662 over its bound, needs 662" in m["slo_p99_confident@c1"].note
    # One request short of that with the same one over: the p99 holds, the confidence does not.
    short = point_stats("c1", enough[1:], 66.1, Bounds)
    assert short.slo_p99_met(Bounds) and not short.slo_p99_confident

    class E2elBounded(Bounds):
        e2el_s = 1.0

    bounded = point_stats("c1", [trace(0.2, 0.05, 11) for _ in range(3)] + [trace(0.2, 0.1, 11)], 4.0, E2elBounded)
    assert bounded.early_stopping is not None and bounded.early_stopping["e2el"].as_json() == {
        "requests": 4, "over": 1, "needed": None, "met": False}  # E2EL 1.2 s of one request: 25 % over
    m = {x.name: x for x in point_metrics(bounded, (0.0, 4.0), 1, E2elBounded, "closed loop")}
    assert "E2EL: 1 of 4 over its bound, more than 1 % over: needs more than it has" in m[
        "slo_p99_confident@c1"].note
    # Nothing succeeded: nothing to judge, never confident.
    failed = point_stats("c1", [trace(0.1, 0.0, 0, error="HTTP 500: x")], 1.0, Bounds)
    assert failed.early_stopping is None and failed.slo_p99_confident is False


def test_total_token_throughput_counts_the_prompts_as_the_server_did() -> None:
    """vLLM's total token throughput: input and output tokens / the duration; a prompt's tokens are the server's
    usage where it sent one, else the client's count as sent, else of the text."""
    records = [trace(0.2, 0.05, 11), trace(0.2, 0.05, 11), trace(0.2, 0.05, 11), trace(0.1, 0.0, 0, error="x")]
    for record, usage, sent, text in zip(records, (30, None, None, 99), (28, 27, None, 99), (20, 20, 21, 99),
                                         strict=True):
        record.prompt_tokens_usage, record.prompt_tokens_sent, record.prompt_tokens_client = usage, sent, text
    stats = point_stats("c2", records, 2.0, Bounds)
    assert stats.input_tokens == 30 + 27 + 21  # the failed request's prompt is not counted
    m = {x.name: x for x in point_metrics(stats, (0.0, 2.0), 1, Bounds, "closed loop")}
    assert m["total_tokens_per_s@c2"].value == pytest.approx((78 + 33) / 2.0)
    # The failed request is said on the total throughput as on the output throughput.
    assert m["total_tokens_per_s@c2"].warning == m["output_tokens_per_s@c2"].warning
    assert (m["total_tokens_per_s@c2"].warning or "").startswith("1 failed of 4 requests")
    # A token per chunk: the ITL says so in its note, and warns of nothing.
    assert stats.tokens_per_chunk == 1.0 and m["itl_s@c2"].warning is None
    assert m["itl_s@c2"].note.endswith("; 33 output tokens in 33 chunks, 1 per chunk")


def test_an_open_loop_point_says_how_many_requests_it_had_in_flight() -> None:
    """An open loop's achieved concurrency: SGLang's mean (sum of E2EL / the duration) and the most in flight at once;
    a request that ends as another is sent is not in flight with it. A closed loop sets its own: none."""
    records = [trace(0.2, 0.08, 11) for _ in range(3)]  # E2EL 1.0 s each, sent 0.5 s apart
    for n, record in enumerate(records):
        record.send_offset_s = record.scheduled_offset_s = 0.5 * n
    stats = point_stats("r2", records, 2.0, Bounds)
    assert (stats.mean_concurrency, stats.peak_concurrency) == (pytest.approx(1.5), 2)
    m = {x.name: x for x in point_metrics(stats, (0.0, 2.0), 1, Bounds, "open loop")}
    assert (m["mean_concurrency@r2"].value, m["peak_concurrency@r2"].value) == (pytest.approx(1.5), 2.0)
    records[2].send_offset_s = 0.99  # now all three overlap
    assert point_stats("r2", records, 2.0, Bounds).peak_concurrency == 3
    for record in records:
        record.scheduled_offset_s = None
    closed = point_stats("c2", records, 2.0, Bounds)
    assert (closed.mean_concurrency, closed.peak_concurrency) == (None, None)
    assert not any(x.name.startswith(("mean_concurrency", "peak_concurrency"))
                   for x in point_metrics(closed, (0.0, 2.0), 1, Bounds, "closed loop"))


def test_tokens_per_chunk_counts_only_outputs_counted_in_tokens() -> None:
    """Output counted in chunks (no usage, no tokenizer) is a token per chunk by construction: such requests are left
    out of tokens_per_chunk, which is unknown where every request was; the server's usage counts whatever the
    client did."""
    no_tokenizer = RequestRecord(point="c1", phase="timed", seq=0, prompt_index=0, sent_at=0.0, requested_output=3,
                                 exact=False, ttft_s=0.1, chunk_times_s=[0.1, 0.2, 0.3], e2el_s=0.3)
    asyncio.run(count_output(no_tokenizer, None))
    assert (no_tokenizer.output_tokens, no_tokenizer.output_counted_by) == (3, "chunks")
    tokenized = RequestRecord(point="c1", phase="timed", seq=1, prompt_index=0, sent_at=0.0, requested_output=3,
                              exact=False, ttft_s=0.1, chunk_times_s=[0.1, 0.2], e2el_s=0.2, output_text="a b c d")
    asyncio.run(count_output(tokenized, lambda text: len(text.split())))
    assert (tokenized.output_tokens, tokenized.output_counted_by) == (4, "tokenizer")
    unknown = point_stats("c1", [no_tokenizer], 1.0, Bounds)
    assert (unknown.tokens_per_chunk, unknown.output_chunks, unknown.chunk_counted) == (None, 0, 1)
    m = {x.name: x for x in point_metrics(unknown, (0.0, 1.0), 1, Bounds, "closed loop")}
    assert m["itl_s@c1"].note.endswith("; output tokens per chunk unknown: output counted in chunks (no server usage, "
                                       "no tokenizer)") and m["itl_s@c1"].warning is None
    # With the tokenizer's 4 tokens in 2 chunks beside it, and one counted in chunks but with the server's usage (9 in
    # 3 chunks): 13 tokens in 5 chunks; the one without usage is left out.
    used = RequestRecord(**{**no_tokenizer.__dict__, "seq": 2, "output_tokens_usage": 9})
    stats = point_stats("c1", [no_tokenizer, tokenized, used], 1.0, Bounds)
    assert (stats.chunked_tokens, stats.output_chunks, stats.chunk_counted) == (13, 5, 1)
    itl = {x.name: x for x in point_metrics(stats, (0.0, 1.0), 1, Bounds, "closed loop")}["itl_s@c1"]
    assert itl.note.endswith("; 13 output tokens in 5 chunks, 2.6 per chunk; 1 request counted in chunks left out")
    assert itl.warning == PER_CHUNK_ITL


def test_a_bundled_points_itl_warning_is_one_text_that_names_each_tools_convention() -> None:
    """Tokens bundled in chunks: the ITL's warning is the same text at any count (the report says it once, with its
    next step), says which clients count per chunk (vLLM's, SGLang's OpenAI-compatible ones) and which per token
    (SGLang's native one, GenAI-Perf's and AIPerf's), and keeps a round's other cautions beside it."""
    def bundled(tokens: int, chunks: int, **cautions: list[str]) -> dict[str, object]:
        record = trace(0.2, 0.05, chunks, usage=tokens)
        stats = point_stats("c1", [record], 1.0, Bounds)
        return {x.name: x for x in point_metrics(stats, (0.0, 1.0), 1, Bounds, "closed loop", **cautions)}

    two, three = bundled(22, 11)["itl_s@c1"], bundled(30, 10)["itl_s@c1"]
    assert two.warning == three.warning == PER_CHUNK_ITL  # type: ignore[attr-defined]
    assert two.note.endswith("22 output tokens in 11 chunks, 2 per chunk")  # type: ignore[attr-defined]
    for said in ("as vLLM's bench serve and SGLang's bench_serving with an OpenAI-compatible backend count it",
                 "SGLang's bench_serving with its native sglang backend (/generate) spreads a chunk's gap over its "
                 "tokens", "GenAI-Perf's and AIPerf's inter token latency is per token: compare those with tpot_s"):
        assert said in PER_CHUNK_ITL
    assert "not per token as SGLang's native sglang backend spreads it" in CONVENTIONS["itl_s"]
    assert "SGLang's bench_serving spreads a chunk" not in CONVENTIONS["itl_s"] + PER_CHUNK_ITL
    # A latency caution of the round comes first, the per-chunk warning after it.
    cautioned = bundled(22, 11, latency_cautions=["x"])["itl_s@c1"]
    assert cautioned.warning == f"x; {PER_CHUNK_ITL}"  # type: ignore[attr-defined]
    # The report gives it its own next step, once for every point that says it: nothing to run again.
    import pandas as pd

    from flagperf.results.summary import OTHER_WARNING_STEP, RunSummary, render_warnings

    summary = RunSummary(run_id="r", rows=pd.DataFrame(), not_measured=[], counts={},
                         headline=[{"case": "s", "metric": f"itl_s@c{n}", "warnings": [PER_CHUNK_ITL]}
                                   for n in (1, 2)])
    steps = render_warnings(summary)[render_warnings(summary).index("Next steps:") + 2:]
    assert steps == ["- the ITL is per chunk, not per token: compare other tools' per-token ITL with tpot_s (its note "
                     "says the tokens per chunk); nothing to run again", ""]
    assert OTHER_WARNING_STEP not in "".join(steps)


def _prompt_config(**values: object) -> GenerateConfig:
    return GenerateConfig.model_validate({"model": "tiny", "precision": "fp32", "engine": "transformers-serve",
                                          "input_len": 4, "max_new_tokens": 5, "concurrency": [1], "requests": 4,
                                          "timeout_s": 600.0, "max_retries": 0, **values})


def _word_tokens(template: str | None) -> Tokens:
    from flagperf.generate.models import word_tokenizer

    tokens = Tokens(None)
    tokens.tokenizer = word_tokenizer(512)
    tokens.tokenizer.chat_template = template
    return tokens


def test_prompt_lengths_are_labelled_as_the_server_counts_them() -> None:
    """A chat template that adds tokens to every prompt: the label gives the length with it, where the client has
    the tokenizer and its template; without a template, it says its lengths are before it. Prompt i is the same
    whatever the count made, across the batches it is made in (256 at a time): 300 and 600 prompts agree on their
    first 300, and a set that starts at prompt 290 (an endpoint's later round) holds the same prompts from there."""
    from flagperf.generate.serve import SYNTHETIC_CHUNK, SyntheticPrompts, describe_prompts

    tokens = _word_tokens("t0 t0 {% for message in messages %}{{ message['content'] }}{% endfor %}")
    config = _prompt_config()
    prompts = synthetic_serving_prompts(config, tokens, 512, 300)
    assert [(p.prompt_tokens, p.sent_tokens) for p in prompts] == [(4, 6)] * 300
    assert describe_prompts("synthetic prompts (seed 0)", prompts, "chat") == (
        "synthetic prompts (seed 0) of 6 tokens with the chat template, 5 out")
    more = synthetic_serving_prompts(config, tokens, 512, 600)
    assert SYNTHETIC_CHUNK < 300 and more[:300] == prompts and len({p.text for p in more}) == 600
    later = SyntheticPrompts(config, tokens, 512, 20, start=290)
    assert [later[p] for p in range(20)] == more[290:310] and later.index_at(3) == 293
    tokens.tokenizer.chat_template = None
    prompts = synthetic_serving_prompts(config, tokens, 512, 3)
    assert [p.sent_tokens for p in prompts] == [None] * 3
    assert describe_prompts("synthetic prompts (seed 0)", prompts, "chat") == (
        "synthetic prompts (seed 0) of 4 tokens before the chat template, 5 out")


def test_prompts_are_made_as_the_load_reaches_them() -> None:
    """A round's set holds up to 8192 prompts (a duration_s round's): only the positions asked for are made, and one
    asked for past them is made then, its time counted."""
    from flagperf.generate.serve import MAX_SYNTHETIC, SyntheticPrompts

    prompts = SyntheticPrompts(_prompt_config(), _word_tokens(None), 512, MAX_SYNTHETIC)
    assert len(prompts) == MAX_SYNTHETIC and prompts.made == []
    prompts.ensure(3)
    assert len(prompts.made) == 3
    assert prompts[9].index == 9 and len(prompts.made) == 10 and prompts.seconds > 0


def test_a_constant_template_is_counted_once_and_checked_against_full_counts(monkeypatch: pytest.MonkeyPatch
                                                                             ) -> None:
    """A template that puts the message between added tokens adds the same tokens to every prompt: after
    CHECKED_PROMPTS prompts counted through it in full agreed, the others are the text's count plus those, without
    rendering and encoding each again. One that puts text next to the message (which a tokenizer may merge with
    it) is counted through in full for every prompt; and a constant that disagrees with the full count is dropped."""
    from flagperf.generate.serve import CHECKED_PROMPTS

    tokens = _word_tokens("<s>{% for message in messages %}{{ message['content'] }}{% endfor %}</s>")
    tokens.tokenizer.add_special_tokens({"additional_special_tokens": ["<s>", "</s>"]})
    rendered: list[int] = []
    render = tokens.tokenizer.apply_chat_template

    def counted(conversations: list[object], **kwargs: object) -> object:
        rendered.append(len(conversations) if isinstance(conversations[0], list) else 1)
        return render(conversations, **kwargs)

    monkeypatch.setattr(tokens.tokenizer, "apply_chat_template", counted)
    config = _prompt_config()
    prompts = synthetic_serving_prompts(config, tokens, 512, 600)
    assert tokens.overhead("chat") == 2 and {(p.prompt_tokens, p.sent_tokens) for p in prompts} == {(4, 6)}
    assert sum(rendered) == CHECKED_PROMPTS + 2  # the first batch in full, and the two probes
    assert tokens.overhead("completions") == 0  # the word tokenizer adds no BOS

    merging = _word_tokens("t0 t0 {% for message in messages %}{{ message['content'] }}{% endfor %}")
    assert merging.overhead("chat") is None
    trimming = _word_tokens("<s>{% for message in messages %}{{ message['content'] | trim }}{% endfor %}</s>")
    trimming.tokenizer.add_special_tokens({"additional_special_tokens": ["<s>", "</s>"]})
    assert trimming.overhead("chat") is None  # the message is not sent as it is

    wrong = _word_tokens("<s>{% for message in messages %}{{ message['content'] }}{% endfor %}</s>")
    wrong.tokenizer.add_special_tokens({"additional_special_tokens": ["<s>", "</s>"]})
    wrong._overhead["chat"] = 5  # a constant the tokenizer's pipeline does not keep
    assert {p.sent_tokens for p in synthetic_serving_prompts(config, wrong, 512, 300)} == {6}
    assert wrong.overhead("chat") is None


def test_the_run_folder_says_where_each_endpoint_prompt_stream_stands(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """An endpoint is a long-lived server: a round there starts after every position of its prompt stream that the
    run's earlier rounds took, as their prompt_positions.json say: a round's last attempt, its earlier attempts, the
    rounds a retry of the run set aside (and theirs); a record without an end (a round killed mid-point) counts what
    it reserved; one that is not a record (a position below 0 or past MAX_POSITION, not JSON, unreadable) is passed
    over with a warning naming it (its prompts may be sent again). The positions of a round's earlier attempts on the
    host join them before attempt K runs, and a Job holds no position out of bounds."""
    from pydantic import ValidationError

    from flagperf.config.job import Job
    from flagperf.generate.serve import stream_key
    from flagperf.hosts.local import LocalHost
    from flagperf.results.prompt_positions import (
        MAX_POSITION,
        PROMPT_POSITIONS,
        merged,
        positions_taken,
        write_positions,
    )

    def record(folder: Path, stream: str, first: int, reserved: int, end: int | None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        write_positions(folder / PROMPT_POSITIONS, stream, first, reserved, end)

    run = tmp_path / "run"
    record(run / "serve" / "round1" / "h_noderank0", "a", 0, 11, 11)
    record(run / "serve" / "round1" / "h_noderank0" / "attempts" / "attempt1", "a", 11, 30, 22)
    record(run / "retries" / "attempt1" / "serve" / "round2" / "h_noderank0", "a", 22, 40, None)  # killed: reserved
    record(run / "retries" / "attempt1" / "serve" / "round2" / "h_noderank0" / "attempts" / "attempt1", "b", 0, 9, 5)
    record(run / "other" / "round1" / "h_noderank0", "b", 5, 7, 7)
    (run / "other" / "round2" / "h_noderank0").mkdir(parents=True)
    (run / "other" / "round2" / "h_noderank0" / PROMPT_POSITIONS).write_text('{"stream": "a", "end": -1}')
    (run / "other" / "round3" / "h_noderank0").mkdir(parents=True)
    huge = f'{{"stream": "a", "first": 0, "reserved": 0, "end": {10**400}}}'  # an integer of any size parses
    (run / "other" / "round3" / "h_noderank0" / PROMPT_POSITIONS).write_text(huge)
    (run / "other" / "round4" / "h_noderank0" / PROMPT_POSITIONS).mkdir(parents=True)  # a folder: unreadable
    caplog.clear()
    assert positions_taken(run) == {"a": 40, "b": 7}
    unread = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert sorted(line.split(":")[0].rsplit("/", 3)[-3] for line in unread) == ["round2", "round3", "round4"], unread
    assert all("passed over, so a later round at its endpoint may resend prompts" in line for line in unread)
    assert positions_taken(tmp_path / "none") == {}
    assert merged({"a": 50}, [("x", '{"stream": "a", "first": 40, "reserved": 45, "end": null}'),
                              ("y", "not json"), ("z", f'{{"stream": "a", "end": {MAX_POSITION + 1}}}')]) == {"a": 50}

    stage = tmp_path / "work" / "stage"
    record(stage / "attempt1", "a", 40, 64, None)  # attempt 1 killed: what it reserved
    record(stage / "attempt2", "a", 64, 70, 66)
    host = LocalHost(work_root=tmp_path / "work")
    assert attempt_positions(host, stage, 1, {"a": 40}) == {"a": 40}
    assert attempt_positions(host, stage, 3, {"a": 40, "b": 7}) == {"a": 66, "b": 7}
    (stage / "attempt3").mkdir()
    (stage / "attempt3" / PROMPT_POSITIONS).write_text(huge)
    caplog.clear()
    assert attempt_positions(host, stage, 4, {"a": 40}) == {"a": 66}
    assert f"{stage / 'attempt3' / PROMPT_POSITIONS}: not a record of prompt positions" in caplog.text
    job = {"run_id": "r", "case": "c", "family": "generate", "round": 1, "host": "h", "vendor": "cpu", "config": {},
           "config_origins": {}, "run_overrides": {}, "image": {}}
    for bad in (-1, MAX_POSITION + 1):
        with pytest.raises(ValidationError):
            Job.model_validate({**job, "prompt_positions": {"a": bad}})

    # The stream: the endpoint, model and API, and what gives the prompts (synthetic: the seed, input_len, the preset
    # and the tokenizer; a file: its text's digest).
    lab = {"base_url": "http://10.0.0.5:8000", "model": "m"}
    assert stream_key(_prompt_config(endpoint=lab)) == stream_key(_prompt_config(endpoint=lab, requests=9))
    assert len({stream_key(_prompt_config(**{"endpoint": lab, **change})) for change in (
        {}, {"seed": 1}, {"input_len": 5}, {"api": "completions"}, {"model": "llama-3.2-1b"},
        {"endpoint": {**lab, "base_url": "http://10.0.0.6:8000"}})}) == 6


def test_a_duration_s_point_makes_its_prompts_before_it_from_an_estimate() -> None:
    """An open loop's expected arrivals with a margin for the draw; a closed loop twice its warm-up's rate; none to go
    on (no warm-up): made as reached, and the point says so."""
    from flagperf.generate.loadgen import PhaseRun
    from flagperf.generate.serve import PointRun, made_late, timed_ahead

    config = _prompt_config(requests=None, duration_s=10.0)
    assert timed_ahead(_prompt_config(), Load("c1", concurrency=1), None) == 4  # a request count: exactly
    assert timed_ahead(config, Load("r4", rate=4.0), None) == 50 + 26 + 1  # 1.25 x 40 + 4 sd (sqrt 40 = 6.3)
    assert timed_ahead(config, Load("c2", concurrency=2), None) == 0
    warm = PhaseRun(records=[RequestRecord("c2", "warmup", i, i, 0.0, 5, True) for i in range(4)], started_at=0.0,
                    ended_at=2.0, seconds=2.0)
    assert timed_ahead(config, Load("c2", concurrency=2), warm) == 2 * 2 * 10 + 2
    run = PhaseRun(records=[], started_at=0.0, ended_at=0.0, seconds=0.0)
    assert made_late(PointRun(warm, run, 42, 0, 0.0)) is None
    assert (made_late(PointRun(warm, run, 42, 7, 0.25)) or "").startswith(
        "7 prompts were made while the timed requests ran, past the 42 made before them")


def test_requests_that_waited_for_their_prompt_flag_the_points_latencies() -> None:
    """A request that waited for its prompt to be made was sent late: meanwhile fewer were in flight than the load
    asks, so the point's latencies are of a lighter load; the caution is on every latency figure, not only on the
    throughput."""
    from flagperf.generate.serve import waited_for_prompts

    records = [trace(0.2, 0.05, 11), trace(0.2, 0.05, 11), trace(0.2, 0.05, 11)]
    assert waited_for_prompts(records) is None
    records[1].prompt_wait_s, records[2].prompt_wait_s = 0.5, 0.25
    caution = waited_for_prompts(records)
    assert caution is not None and caution.startswith(
        "2 of 3 timed requests waited for their prompt to be made (0.75 s in all, at most 0.5 s;")
    stats = point_stats("c2", records, 2.0, Bounds)
    m = {x.name: x for x in point_metrics(stats, (0.0, 2.0), 1, Bounds, "closed loop", [caution], [caution])}
    for name in ("ttft_s", "tpot_s", "itl_s", "e2el_s", "tokens_per_s_per_user", "interactivity"):
        assert m[f"{name}@c2"].warning == caution, name
    assert m["output_tokens_per_s@c2"].warning == caution
    assert m["output_tokens_per_s_per_device@c2"].warning is None and m["goodput_fraction@c2"].warning is None
    plain = {x.name: x for x in point_metrics(stats, (0.0, 2.0), 1, Bounds, "closed loop")}
    assert plain["ttft_s@c2"].warning is None and plain["output_tokens_per_s@c2"].warning is None


def test_the_prompt_makers_tokenizer_is_its_own() -> None:
    """The worker thread that makes a duration_s round's prompts uses a tokenizer no other thread uses (the event
    loop counts outputs with the round's): a fast tokenizer used from two threads at once raises "Already
    borrowed". The copy counts as the original does."""
    tokens = _word_tokens("t0 t0 {% for message in messages %}{{ message['content'] }}{% endfor %}")
    twin = tokens.clone()
    assert twin.tokenizer is not tokens.tokenizer and twin.tokenizer.backend_tokenizer is not \
        tokens.tokenizer.backend_tokenizer
    assert twin.counts(["t1 t2 t3", "t4"]) == tokens.counts(["t1 t2 t3", "t4"]) == [3, 1]
    assert twin.sent_counts(["t1 t2"], "chat") == tokens.sent_counts(["t1 t2"], "chat") == [4]
    assert Tokens(None).clone().tokenizer is None


# ---- engine folders: the exact command lines ----------------------------------------------------------------

FIELDS = {"model_dir": "/models/llama", "dtype": "bfloat16", "tensor_parallel": 2, "host": "127.0.0.1",
          "port": 8123, "python": "/usr/bin/python3"}


def test_engine_folders_render_the_command_lines_they_would_start() -> None:
    vllm = load_engine("nvidia", "vllm-serve").server
    sglang = load_engine("nvidia", "sglang").server
    hf_gpu = load_engine("nvidia", "transformers-serve").server
    hf_cpu = load_engine("cpu", "transformers-serve").server
    assert vllm and sglang and hf_gpu and hf_cpu
    assert vllm.argv(FIELDS, ["--max-model-len", "4096"]) == [
        "vllm", "serve", "/models/llama", "--host", "127.0.0.1", "--port", "8123", "--dtype", "bfloat16",
        "--tensor-parallel-size", "2", "--disable-log-requests", "--max-model-len", "4096"]
    assert vllm.exact_output_fields(128) == {"ignore_eos": True, "min_tokens": 128}
    assert vllm.metrics_path == "/metrics" and vllm.apis == ["chat", "completions"]
    assert sglang.argv(FIELDS, []) == [
        "/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "/models/llama", "--host", "127.0.0.1",
        "--port", "8123", "--dtype", "bfloat16", "--tp-size", "2", "--enable-metrics"]
    assert hf_gpu.argv(FIELDS, []) == ["transformers", "serve", "--host", "127.0.0.1", "--port", "8123", "--dtype",
                                       "bfloat16", "--device", "cuda", "--log-level", "info"]
    assert hf_cpu.argv(FIELDS, [])[-3:] == ["cpu", "--log-level", "info"]
    assert json.loads(hf_cpu.exact_output_fields(7)["generation_config"]) == {
        "min_new_tokens": 7, "max_new_tokens": 7, "do_sample": False}
    assert hf_cpu.apis == ["chat"]


def test_a_command_placeholder_that_does_not_exist_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown placeholder"):
        ServerSpec.model_validate({"command": ["srv", "--port", "{prot}"]})
    with pytest.raises(ValueError, match="unknown placeholder"):
        ServerSpec.model_validate({"command": ["srv"], "exact_output": {"min_tokens": "{len}"}})


# ---- the serving keys: one line naming file and key ----------------------------------------------------------

@pytest.mark.parametrize(("changes", "key", "message"), [
    ({"request_rates": [0.0]}, "request_rates", "every request rate must be > 0"),
    ({"endpoint": {"base_url": "http://h:1", "model": "m", "api_key": "sk-literal"}}, "endpoint.api_key",
     "${NAME} reference"),
    ({"endpoint": {"base_url": "ftp://h", "model": "m"}}, "endpoint.base_url", "http:// or https://"),
    ({"slo": {"ttft_s": -1.0}}, "slo.ttft_s", "greater than 0"),
    ({"slo": {"ttft": 1.0}}, "slo.ttft", "unknown key"),
    ({"server_env": {"1BAD": "x"}}, "server_env", "not an environment variable name"),
    ({"server_args": ["--api-key=sk-literal"]}, "server_args", "a key on the server's command line"),
    ({"server_args": ["--api-key", "sk-literal"]}, "server_args", "give it as ${NAME} in server_env"),
    ({"api": "completions"}, "api", "serves chat only"),
    ({"engine": "hf"}, "request_rates", "needs a serving engine"),
    ({"concurrency": [], "request_rates": []}, "concurrency", "at least one point"),
    ({"duration_s": 10.0}, "duration_s", "give exactly one of requests and duration_s (requests is 8 too; set it to "
                                         "null"),
    ({"requests": None}, "requests", "give exactly one of requests and duration_s (both are null)"),
    ({"slo": {"ttft": 2.0}}, "slo.ttft", "unknown key (did you mean ttft_s?)"),
    ({"request_rates": [], "max_concurrency": 8}, "max_concurrency", "caps the open-loop points (request_rates), and "
                                                                      "there are none"),
    ({"request_rates": [], "burstiness": 0.5}, "burstiness", "there are none"),
    ({"concurrency": [-1]}, "concurrency", "must be 1 to 65536"),
    ({"concurrency": [65537]}, "concurrency", "must be 1 to 65536"),
    ({"max_concurrency": 0}, "max_concurrency", "greater than or equal to 1"),
    ({"request_rates": [float("inf")]}, "request_rates.0", "finite number"),
    ({"request_rates": [2e6]}, "request_rates", "at most 1e+06 requests/s"),
    ({"request_rates": [0.001]}, "request_rates", "8 requests at 0.001 requests/s take about 8000 s, beyond "
                                                  "timeout_s (900)"),
    ({"requests": 0}, "requests", "greater than or equal to 1"),
    ({"warmup_requests": 10 ** 7}, "warmup_requests", "less than or equal to 1000000"),
    ({"burstiness": float("nan")}, "burstiness", "finite number"),
    ({"burstiness": 1e9}, "burstiness", "less than or equal to 1000"),
    ({"ready_timeout_s": float("inf")}, "ready_timeout_s", "finite number"),
    ({"request_timeout_s": 0.0}, "request_timeout_s", "greater than 0"),
    ({"input_len": 10 ** 9}, "input_len", "less than or equal to 1048576"),
    ({"max_new_tokens": 0}, "max_new_tokens", "greater than or equal to 1"),
    ({"seed": 2 ** 64}, "seed", "less than or equal to"),
    ({"slo": {"e2el_s": float("nan")}}, "slo.e2el_s", "finite number"),
    ({"prompts_path": "case.yaml"}, "prompts_path", "must be a .jsonl or .csv file"),
    # a data file stays in its root: the case's folder (relative), a data root (absolute), never a credentials folder
    ({"sharegpt_path": "/etc/hostname"}, "sharegpt_path", "'/etc/hostname' is outside the data roots (/data, "),
    ({"prompts_path": "../../../../outside.jsonl"}, "prompts_path", "is outside the case's folder"),
    ({"prompts_path": "../" + "a" * 300 + ".jsonl"}, "prompts_path", "is outside the case's folder"),  # no such name
    ({"prompts_path": "/data/../etc/x.jsonl"}, "prompts_path",
     "the file '/data/../etc/x.jsonl' must be an absolute path without '..'"),
    ({"sharegpt_path": "/data/u/.ssh/id_rsa"}, "sharegpt_path", "is in a credentials folder (.ssh)"),
    ({"sharegpt_path": "/data/none.json"}, "sharegpt_path", "/data/none.json does not exist"),
    ({"endpoint": {"base_url": "http://u:pw-0042@h:1", "model": "m"}}, "endpoint.base_url", "credentials"),
    ({"endpoint": {"base_url": "http://h:1", "model": "m", "devices": 0}}, "endpoint.devices", "greater than"),
])
def test_serving_keys_are_checked_with_one_line_naming_file_and_key(
        changes: dict[str, object], key: str | None, message: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A case file with one bad serving key: refused by the plan, before anything runs."""
    import yaml

    from flagperf.config.cases import load_case

    manifest = yaml.safe_load(load_case("tiny-llama-serve").folder.joinpath("case.yaml").read_text())
    manifest["name"] = "bad-serve"
    manifest["configurations"].update(changes)
    case_file = tmp_path / "cases" / "generate" / "bad-serve" / "case.yaml"
    case_file.parent.mkdir(parents=True)
    case_file.write_text(yaml.safe_dump(manifest), encoding="utf-8")
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(tmp_path / "cases"))
    with pytest.raises(ConfigError) as err:
        plan_run(cases=["bad-serve"], sets=[], results_dir=tmp_path / "results")
    text = str(err.value)
    assert "\n" not in text and message in text and "bad-serve" in text and "case.yaml" in text
    assert "sk-literal" not in text and "pw-0042" not in text  # a secret is never quoted
    assert "(got {" not in text  # a rule between keys names its key, not the whole configuration
    if key:  # by its path in the case.yaml
        assert f": configurations.{key}:" in text, text


# ---- a server process: readiness, its log, ports --------------------------------------------------------------

def test_a_server_that_never_gets_ready_fails_within_its_timeout(tmp_path: Path) -> None:
    """A real HTTP server that answers 404 on the ready path: refused after ready_timeout_s, then stopped."""
    spec = ServerSpec(command=["{python}", "-m", "http.server", "{port}", "--bind", "{host}"], ready_path="/health")
    started = time.monotonic()
    with pytest.raises(ServerFailed, match=r"not ready within 2 s .*GET /health") as err:
        start_server(spec, {}, [], {}, tmp_path / SERVER_LOG, ready_timeout_s=2.0)
    waited = time.monotonic() - started
    assert err.value.user and waited >= 2.0
    assert "\n" not in str(err.value) and '"GET /health HTTP/1.1" 404' in str(err.value)  # the log's tail
    assert not [p for p in psutil.process_iter(["cmdline"]) if "http.server" in " ".join(p.info["cmdline"] or [])
                and str(tmp_path) in " ".join(p.info["cmdline"] or [])]


def test_a_server_that_exits_before_ready_fails_with_its_log_tail(tmp_path: Path) -> None:
    spec = ServerSpec(command=["{python}", "-c", "import sys; print('no such model: ' + sys.argv[1]); sys.exit(3)",
                               "{model_dir}"])
    with pytest.raises(ServerFailed, match=r"exited 3 before it was ready.*no such model: /m") as err:
        start_server(spec, {"model_dir": "/m"}, [], {}, tmp_path / SERVER_LOG, ready_timeout_s=600.0)
    assert err.value.user


def test_a_refused_server_argument_leads_the_failure_before_the_usage_text(tmp_path: Path) -> None:
    """A server that refuses an argument (`transformers serve --bogus`: click prints the error, then 30 lines of
    options) names the refusal first in the one-line failure, although it is not among the log's last lines."""
    usage = "; ".join(f"print('  --option-{i} TEXT  an option')" for i in range(30))
    spec = ServerSpec(command=["{python}", "-c", "import sys; print('Usage: serve [OPTIONS]'); "
                               "print(\"Error: No such option '\" + sys.argv[1] + \"'.\"); " + usage + "; sys.exit(2)"])
    with pytest.raises(ServerFailed) as err:
        start_server(spec, {}, ["--bogus"], {}, tmp_path / SERVER_LOG, ready_timeout_s=600.0)
    assert str(err.value).startswith("the server exited 2 before it was ready: Error: No such option '--bogus'.; "
                                     "last lines of server.log: ")
    assert "\n" not in str(err.value) and err.value.user


def test_config_values_reach_the_server_as_words_no_shell_reads(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A model folder and server_args full of shell syntax arrive as the server's argv words, as written; no
    shell runs them (nothing is touched)."""
    monkeypatch.chdir(tmp_path)
    said = tmp_path / "argv.json"
    spec = ServerSpec(command=["{python}", "-c", "import json, sys; open(sys.argv[1], 'w').write(json.dumps("
                               "sys.argv[2:])); sys.exit(3)", str(said), "{model_dir}"])
    model = "m; touch marker1 && $(touch marker2) `touch marker3`"
    extra = ["--x=$(touch marker4)", "| touch marker5", "{model_dir}"]
    with pytest.raises(ServerFailed, match="exited 3 before it was ready"):
        start_server(spec, {"model_dir": model}, extra, {}, tmp_path / SERVER_LOG, ready_timeout_s=600.0)
    assert json.loads(said.read_text(encoding="utf-8")) == [model, *extra]  # server_args are not rendered
    assert not list(tmp_path.glob("marker*"))


def test_data_files_are_read_only_when_regular_bounded_and_parsable(tmp_path: Path) -> None:
    """What a round reads from prompts_path and sharegpt_path: a FIFO is refused on the opened file (never
    blocks), a file over the bound by its size (a sparse file: no disk used), JSON too deep for the parser and
    broken JSON as one line naming the file."""
    import os

    from flagperf.errors import CaseUserError
    from flagperf.generate.config import MAX_DATA_FILE_BYTES, GenerateConfig
    from flagperf.generate.prompts import read_prompt_file
    from flagperf.generate.serve import sharegpt_prompts

    tokens = Tokens(None)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000, encoding="utf-8")
    with pytest.raises(CaseUserError, match=r"deep.json: sharegpt_path: not read: JSON nested too deeply"):
        sharegpt_prompts(str(deep), tokens, 16, 16)
    broken = tmp_path / "broken.json"
    broken.write_text('[{"conversations": [', encoding="utf-8")
    with pytest.raises(CaseUserError, match=r"broken.json: sharegpt_path: not JSON \(.*line 1"):
        sharegpt_prompts(str(broken), tokens, 16, 16)
    pipe = tmp_path / "prompts.jsonl"
    os.mkfifo(pipe)
    with pytest.raises(ConfigError, match=r"prompts.jsonl: prompts_path: not a regular file but a named pipe"):
        read_prompt_file(str(pipe))
    huge = tmp_path / "huge.json"
    with huge.open("wb") as handle:
        handle.truncate(MAX_DATA_FILE_BYTES + 1)
    with pytest.raises(ConfigError, match=r"huge.json: sharegpt_path: .* is at most 1073741824 bytes; not read"):
        sharegpt_prompts(str(huge), tokens, 16, 16)
    base = {"model": "tiny", "precision": "fp32", "engine": "transformers-serve", "input_len": 6,
            "max_new_tokens": 5, "concurrency": [1], "requests": 4, "timeout_s": 600.0, "max_retries": 0}
    for name, words in (("huge.json", "is at most"), ("prompts.jsonl", "named pipe"), (".", "is a directory")):
        with pytest.raises(ValueError, match=words):
            GenerateConfig.model_validate({**base, "sharegpt_path": name}, context={CASE_FOLDER: tmp_path})


def test_a_data_file_is_resolved_in_its_root_again_when_the_round_reads_it(tmp_path: Path) -> None:
    """A relative data file is the case folder's (the round's own copy of the project, wherever it lies); a link
    put in its place after the plan, leading out, is refused when the round reads it, by key, not read."""
    from flagperf.errors import CaseUserError
    from flagperf.generate.config import GenerateConfig

    (tmp_path / "conversations.json").write_text("[]", encoding="utf-8")
    values = {"model": "tiny", "precision": "fp32", "engine": "transformers-serve", "input_len": 6,
              "max_new_tokens": 5, "concurrency": [1], "requests": 4, "timeout_s": 600.0, "max_retries": 0,
              "sharegpt_path": "conversations.json"}
    config = GenerateConfig.model_validate(values, context={CASE_FOLDER: tmp_path})
    assert config.data_file("sharegpt_path") == (tmp_path / "conversations.json").resolve()
    assert config.model_dump()["sharegpt_path"] == "conversations.json"  # the plan keeps it as written
    (tmp_path / "conversations.json").unlink()
    (tmp_path / "conversations.json").symlink_to("/etc/hostname")
    with pytest.raises(CaseUserError, match=r"^sharegpt_path: 'conversations.json' is outside the case's folder "
                                            r"\(a link to /etc/hostname\)"):
        config.data_file("sharegpt_path")
    unplaced = GenerateConfig.model_validate({**values, "sharegpt_path": "elsewhere.json"})  # no case folder given
    with pytest.raises(CaseUserError, match="relative to the case's folder, and this round was given none"):
        unplaced.data_file("sharegpt_path")


SERVER_LOSES_ITS_PORT = """
import http.server, pathlib, sys
marker = pathlib.Path(sys.argv[1])
if not marker.exists():  # the first start: another process took the port meanwhile
    marker.write_text("x")
    print("OSError: [Errno 98] Address already in use", flush=True)
    sys.exit(1)
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), http.server.SimpleHTTPRequestHandler).serve_forever()
"""


def test_a_server_that_lost_its_port_is_started_again_on_another(tmp_path: Path) -> None:
    script = tmp_path / "server.py"
    script.write_text(SERVER_LOSES_ITS_PORT, encoding="utf-8")
    spec = ServerSpec(command=["{python}", str(script), str(tmp_path / "marker"), "{port}"], ready_path="/")
    server = start_server(spec, {}, [], {}, tmp_path / SERVER_LOG, ready_timeout_s=600.0)
    try:
        log = (tmp_path / SERVER_LOG).read_text(encoding="utf-8")
        assert "# flagperf: attempt 1:" in log and "# flagperf: attempt 2:" in log
        assert server.exited() is None
    finally:
        server.stop()
    assert server.exited() is not None


# ---- transformers serve, for real --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_checkpoint("tiny", "fp32", 0, tmp_path_factory.mktemp("models"), torch.device("cpu"))


@pytest.fixture(scope="module")
def served(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One `transformers serve` for the module's client tests."""
    spec = load_engine("cpu", "transformers-serve").server
    assert spec is not None
    log = tmp_path_factory.mktemp("server") / SERVER_LOG
    server = start_server(spec, {"model_dir": str(model_dir), "dtype": "float32", "tensor_parallel": 1}, [], {},
                          log, ready_timeout_s=600.0)
    target = Target(server.base_url, str(model_dir), "chat")
    assert first_answer(target, ServingPrompt(0, "t1 t2", 2, 1), 600.0) is None  # it loads the model now
    yield server
    server.stop()


def test_the_client_counts_equal_the_exact_lengths_the_server_made(served: ServerProcess, model_dir: Path,
                                                                   tmp_path: Path) -> None:
    """Closed loop at 2 and open loop at 20 requests/s: every request succeeds with exactly the tokens asked
    (the server's generation_config min = max), one content chunk per token, in order, recorded to the file
    as it ends and read back the same."""
    from flagperf.generate.config import GenerateConfig

    spec = load_engine("cpu", "transformers-serve").server
    assert spec is not None
    config = GenerateConfig.model_validate({"model": "tiny", "precision": "fp32", "engine": "transformers-serve",
                                            "input_len": 6, "max_new_tokens": 5, "concurrency": [2],
                                            "requests": 4, "timeout_s": 600.0, "max_retries": 0})
    tokens = Tokens(model_dir)
    prompts = synthetic_serving_prompts(config, tokens, 512, 4)
    assert [p.prompt_tokens for p in prompts] == [6] * 4
    target = Target(served.base_url, str(model_dir), "chat", exact_fields=spec.exact_output_fields)
    writer = RecordWriter(tmp_path / REQUESTS_FILE)
    closed = asyncio.run(run_phase(target, Load("c2", concurrency=2), prompts, "timed", requests=4, duration_s=None,
                                   writer=writer, count_tokens=tokens.counter()))
    opened = asyncio.run(run_phase(target, Load("r20", rate=20.0, seed=1), prompts, "timed", requests=3,
                                   duration_s=None, writer=writer, count_tokens=tokens.counter()))
    writer.close()
    records = closed.records + opened.records
    assert all(r.ok for r in records), [r.error for r in records]
    assert [r.output_tokens_client for r in records] == [5] * 7
    assert all(len(r.chunk_times_s) == 5 == len(r.output_text.split()) for r in records)
    assert all(r.ttft_s is not None and r.e2el_s is not None and r.ttft_s <= r.e2el_s for r in records)
    assert all(r.chunk_times_s == sorted(r.chunk_times_s) for r in records)
    assert sorted(r.prompt_index for r in closed.records) == [0, 1, 2, 3]
    saved = read_records(tmp_path / REQUESTS_FILE)
    assert [(r.point, r.seq, r.output_text) for r in saved] == [(r.point, r.seq, r.output_text) for r in records]
    stats = point_stats("c2", closed.records, closed.seconds, Bounds)
    assert stats.truncated == 0 and stats.failed == 0 and stats.output_tokens == 20


# transformers serve streams usage with its last chat chunk from 5.5 (5.0-5.4 left it a TODO; 4.57.1, the lock's,
# sends none): the round then counts the server's figure and flags each request whose client count differs.
SERVE_SENDS_USAGE = Version(transformers.__version__) >= Version("5.5")


def test_the_server_usage_agrees_with_the_client_counts_where_it_is_sent(served: ServerProcess,
                                                                         model_dir: Path) -> None:
    """Where the server sends usage, its prompt and completion tokens equal the client's counts (the word
    tokenizer makes them exact), so the point's mismatch count is 0; where it sends none, the point falls
    back on the client's count. Which of the two is fixed by the installed transformers: a server that
    stops (or starts) sending usage fails this test."""
    from flagperf.generate.config import GenerateConfig

    spec = load_engine("cpu", "transformers-serve").server
    assert spec is not None
    config = GenerateConfig.model_validate({"model": "tiny", "precision": "fp32", "engine": "transformers-serve",
                                            "input_len": 4, "max_new_tokens": 3, "concurrency": [1],
                                            "requests": 2, "timeout_s": 600.0, "max_retries": 0})
    tokens = Tokens(model_dir)
    prompts = synthetic_serving_prompts(config, tokens, 512, 2)
    target = Target(served.base_url, str(model_dir), "chat", exact_fields=spec.exact_output_fields)
    run = asyncio.run(run_phase(target, Load("c1", concurrency=1), prompts, "timed", requests=2, duration_s=None,
                                writer=None, count_tokens=tokens.counter()))
    assert all(r.ok for r in run.records), [r.error for r in run.records]
    assert [(r.prompt_tokens_client, r.output_tokens_client) for r in run.records] == [(4, 3)] * 2
    if SERVE_SENDS_USAGE:
        assert [(r.prompt_tokens_usage, r.output_tokens_usage) for r in run.records] == [(4, 3)] * 2
    else:
        assert [(r.prompt_tokens_usage, r.output_tokens_usage) for r in run.records] == [(None, None)] * 2
    stats = point_stats("c1", run.records, run.seconds, Bounds)
    assert stats.mismatched == 0 and stats.output_tokens == 6


def test_a_point_spans_its_first_send_to_its_last_end(served: ServerProcess, model_dir: Path) -> None:
    """The point's window and duration (the denominators of tokens/s and goodput) are its first send to its last
    request's end, as documented and as vLLM times its benchmark: not the client's set-up before the first send
    (httpx builds an SSL context) nor its closing after the last end; on perf_counter alone (each request's send
    offset in the phase plus its E2EL), the first send's wall clock only placing the window."""
    prompts = [ServingPrompt(i, f"t{i + 1} t2", 2, 2) for i in range(3)]
    target = Target(served.base_url, str(model_dir), "chat")
    run = asyncio.run(run_phase(target, Load("c1", concurrency=1), prompts, "timed", requests=3, duration_s=None,
                                writer=None, count_tokens=None))
    assert all(r.ok for r in run.records), [r.error for r in run.records]
    offsets = [r.send_offset_s for r in run.records]
    assert all(o is not None for o in offsets) and offsets == sorted(offsets)  # closed loop at 1: one after another
    first = min(run.records, key=lambda r: r.send_offset_s or 0.0)
    span = max((r.send_offset_s or 0.0) + (r.e2el_s or 0.0) for r in run.records) - (first.send_offset_s or 0.0)
    assert run.started_at == first.sent_at
    assert run.seconds == pytest.approx(span, abs=1e-9)  # the same figure from requests.jsonl by hand
    assert run.ended_at == pytest.approx(first.sent_at + run.seconds)
    assert all(r.scheduled_offset_s is None and r.queue_wait_s is None for r in run.records)  # closed loop


def test_the_client_lets_an_idle_connection_go_before_the_server_closes_it() -> None:
    """uvicorn (the HTTP server of vLLM, SGLang and transformers serve) closes a connection idle for 5 s: a client that
    keeps one as long (httpx's default) may send a request on it just as the server closes it, and the request fails
    (httpx retries no POST). The point's client drops an idle connection sooner, and the next request opens one."""
    import inspect

    import uvicorn

    from flagperf.generate.loadgen import load_client

    server_idle_s = inspect.signature(uvicorn.Config).parameters["timeout_keep_alive"].default
    client = load_client(Load("c4", concurrency=4), Target("http://127.0.0.1:1", "m", "chat"))
    pool = client._transport._pool  # httpx gives no public view of its limits
    assert pool._keepalive_expiry < server_idle_s and pool._max_keepalive_connections == 4
    assert pool._max_connections > 4  # a response still read after its [DONE] (Drains) holds no request back
    asyncio.run(client.aclose())


def test_a_points_duration_is_on_one_clock_whatever_the_wall_clock_did() -> None:
    """The wall clock stepped back 600 s (NTP) between two sends: the duration is the send offsets' and E2ELs'
    (perf_counter), 1.5 s, not the wall clock's; lines written before send offsets existed keep their sent_at
    figure."""
    def line(seq: int, sent_at: float, offset: float | None) -> RequestRecord:
        return RequestRecord(point="c2", phase="timed", seq=seq, prompt_index=seq, sent_at=sent_at, requested_output=2,
                             exact=True, e2el_s=1.0, send_offset_s=offset, finish_reason="length")

    epoch, seconds = phase_span([line(0, 1000.0, 0.0), line(1, 400.5, 0.5)])
    assert (epoch, seconds) == (1000.0, 1.5)
    assert phase_span([line(0, 1000.0, None), line(1, 1000.5, None)]) == (1000.0, 1.5)
    old = RequestRecord.from_json(json.dumps({  # a line of requests.jsonl written before the later fields
        "point": "c1", "phase": "timed", "seq": 0, "prompt_index": 0, "sent_at": 1.0, "requested_output": 2,
        "exact": True, "ttft_s": 0.1, "chunk_times_s": [0.1, 0.2], "e2el_s": 0.2, "prompt_tokens_client": 2,
        "output_tokens_client": 2, "prompt_tokens_usage": None, "output_tokens_usage": None,
        "finish_reason": "length", "error": None, "output_text": "t1 t2"}))
    assert old.send_offset_s is None and old.reasoning_chunks == 0 and old.prompt_tokens_sent is None


def test_an_http_error_is_recorded_as_a_failed_request(served: ServerProcess) -> None:
    target = Target(served.base_url, "/no/such/model", "chat", exact_fields=None)
    run = asyncio.run(run_phase(target, Load("c1", concurrency=1), [ServingPrompt(0, "t1 t2", 2, 3)], "timed",
                                requests=1, duration_s=None, writer=None, count_tokens=None))
    assert len(run.records) == 1 and not run.records[0].ok
    assert served.exited() is None  # the server outlived the bad request


def _job(tmp_path: Path, *sets: str) -> Job:
    plan = plan_run(cases=["tiny-llama-serve"], sets=list(sets), results_dir=tmp_path / "results")
    cp = plan.cases[0]
    return Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, host="localhost", vendor="cpu",
               config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})


def _kill_server_when(out: Path, point: str, done: threading.Event) -> None:
    """Wait until the point's first timed request is recorded, then SIGKILL the server the round started."""
    requests = out / REQUESTS_FILE
    while not done.is_set():
        lines = requests.read_text(encoding="utf-8").splitlines() if requests.exists() else []
        if any(json.loads(line)["point"] == point and json.loads(line)["phase"] == "timed" for line in lines):
            first = (out / SERVER_LOG).read_text(encoding="utf-8").splitlines()[0]
            port = first.split("--port ")[1].split()[0]
            for p in psutil.process_iter(["cmdline"]):
                if f"--port {port}" in " ".join(p.info["cmdline"] or []) and "serve" in (p.info["cmdline"] or []):
                    p.kill()
            return
        done.wait(0.05)


def test_a_server_killed_mid_point_fails_the_round_with_its_log_kept(model_dir: Path, tmp_path: Path) -> None:
    """Point c2 loses its server: the round fails as an infrastructure failure (retried), c1's metrics stay,
    server.log and requests.jsonl stay in the round folder."""
    job = _job(tmp_path, f"checkpoint_path={model_dir}", "input_len=4", "max_new_tokens=2", "concurrency=[1, 2]",
               "request_rates=[]", "requests=40", "warmup_requests=1")
    out = tmp_path / "round"
    out.mkdir()
    done = threading.Event()
    killer = threading.Thread(target=_kill_server_when, args=(out, "c2", done), daemon=True)
    killer.start()
    try:
        code = run_job(job, out)
    finally:
        done.set()
        killer.join()
    assert code == EXIT_SERVER_FAILED
    result = read_result(out / "result.json")
    assert result.status == "failed" and result.failure is not None and result.failure.kind == "infrastructure"
    assert result.failure.message.startswith("point c2: the server exited -9 during the load; last lines of "
                                             "server.log: ")
    names = {m.name for m in result.metrics}
    assert "output_tokens_per_s@c1" in names and not any(n.endswith("@c2") for n in names)
    assert (out / SERVER_LOG).stat().st_size > 0 and (out / REQUESTS_FILE).is_file()
    serving = json.loads((out / SERVING_FILE).read_text(encoding="utf-8"))
    assert serving["failed_point"] == "c2"
    # What a lab publishes with the figures: the server's packages, the model, the prompts, the client.
    assert serving["server"]["packages"]["transformers"] == transformers.__version__
    assert serving["model"] == {"model": "tiny", "checkpoint_path": str(model_dir), "precision": "fp32", "seed": 0,
                                "folder": str(model_dir.resolve()), "revision": None, "served_by": "the round"}
    assert serving["prompt_set"]["input_tokens"] == {"min": 4, "mean": 4.0, "max": 4}
    # With the model folder's tokenizer the lengths are of the prompt as the server counts it, through its chat
    # template (the word tokenizer's adds nothing); one prompt per request: the readiness request's, then 1 + 40
    # per point.
    assert serving["prompt_set"]["input_tokens_sent"] == {"min": 4, "mean": 4.0, "max": 4}
    assert serving["prompts"] == "synthetic prompts (seed 0) of 4 tokens with the chat template, 2 out"
    assert serving["prompt_set"]["count"] == serving["prompt_set"]["requests_planned"] == 1 + 2 * (1 + 40)
    assert serving["server"]["prefix_cache"].startswith("off: each request runs its own generate")
    assert serving["client"]["max_tokens"] == 2 and serving["client"]["requests"] == 40
    assert serving["client"]["exact_output_fields"] == {"generation_config": json.dumps(
        {"min_new_tokens": 2, "max_new_tokens": 2, "do_sample": False})}


NEVER_READY_ENGINE = """name: never-ready
description: a real HTTP server whose ready path never answers 200
server:
  command: ["{python}", -m, http.server, "{port}", --bind, "{host}"]
  ready_path: /health
  apis: [chat]
"""


def test_a_server_that_never_gets_ready_fails_the_round_as_a_user_error(model_dir: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    engine = tmp_path / "vendors" / "cpu" / "generate" / "never-ready"
    engine.mkdir(parents=True)
    (engine / "engine.yaml").write_text(NEVER_READY_ENGINE, encoding="utf-8")
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(tmp_path / "vendors"))
    job = _job(tmp_path, "engine=never-ready", f"checkpoint_path={model_dir}", "ready_timeout_s=2.0")
    out = tmp_path / "round"
    out.mkdir()
    assert run_job(job, out) == EXIT_USER_ERROR
    result = read_result(out / "result.json")
    assert result.failure is not None and result.failure.kind == "user"
    assert "not ready within 2 s (ready_timeout_s" in result.failure.message
    assert (out / SERVER_LOG).is_file()


def test_python_is_the_running_one() -> None:  # the {python} placeholder: the case process's interpreter
    spec = ServerSpec(command=["{python}", "-V"])
    assert spec.argv({"python": sys.executable}, []) == [sys.executable, "-V"]



SECRET = "sk-flagperf-canary-7f3e9c2a51d84b06"  # distinctive: found only if the key itself leaked


def _files_holding(secret: str, folder: Path) -> list[str]:
    """Every file under folder (records, logs, metrics, plots) whose bytes hold the secret."""
    return [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def _endpoint_job(tmp_path: Path, base_url: str, model: str, *sets: str) -> tuple[Job, Path]:
    """The plan of tiny-llama-serve on the inventory's endpoint `lab` (its key: ${LAB_SERVING_KEY}) as the flow
    would make it, and an empty round folder."""
    from flagperf.hosts.inventory import load_inventory

    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(json.dumps({"hosts": [{"name": "localhost"}], "endpoints": {"lab": {
        "base_url": base_url, "model": model, "api_key": "${LAB_SERVING_KEY}", "devices": 2}}}))
    inv = load_inventory(inventory)
    plan = plan_run(cases=["tiny-llama-serve"], sets=["endpoint=lab", *sets], results_dir=tmp_path / "results",
                    inventory_endpoints=inv.endpoints, inventory_source=inv.source)
    cp = plan.cases[0]
    assert cp.config["endpoint"]["api_key"] == "${LAB_SERVING_KEY}"  # the reference travels, never the key
    assert cp.origins["endpoint"].endswith("endpoints.lab")
    assert SECRET not in plan.model_dump_json()
    out = tmp_path / "round"
    out.mkdir()
    return Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, host="localhost", vendor="cpu",
               config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={}), out


def test_a_case_measures_an_endpoint_the_inventory_names(served: ServerProcess, model_dir: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """`endpoint: NAME` in the case, the server's address, model and key reference in the inventory's endpoints:
    the plan puts the inventory's entry in the config once (its origin says so), and the round loads that running
    server, starting none; the key is in no file of the round and in no log line. A name the inventory does not
    list is one line naming the key and what it lists."""
    monkeypatch.setenv("LAB_SERVING_KEY", SECRET)
    caplog.set_level("DEBUG")
    job, out = _endpoint_job(tmp_path, served.base_url, str(model_dir), "concurrency=[1, 2]", "request_rates=[]",
                             "requests=2", "max_new_tokens=4")
    assert run_job(job, out) == 0, (out / "case.log").read_text() if (out / "case.log").exists() else ""
    result = read_result(out / "result.json")
    metrics = {m.name: m for m in result.metrics}
    assert metrics["output_tokens_per_s@c1"].work == 8  # two requests of exactly 4 tokens
    assert all(m.convention for m in result.metrics)  # every figure says how it was counted
    # Every phase of every point sends prompts of its own, none sent before in the round (a prefix cache would
    # serve a resent one's prefill): the check's, then c1's warm-up and timed ones, then c2's.
    sent: dict[tuple[str, str], list[int]] = {}
    for record in sorted(read_records(out / REQUESTS_FILE), key=lambda r: r.seq):
        sent.setdefault((record.point, record.phase), []).append(record.prompt_index)
    assert sent == {("check", "check"): [0], ("c1", "warmup"): [1, 2], ("c1", "timed"): [3, 4],
                    ("c2", "warmup"): [5, 6, 7, 8], ("c2", "timed"): [9, 10]}
    per_device = metrics["output_tokens_per_s_per_device@c1"].value
    assert per_device == pytest.approx(metrics["output_tokens_per_s@c1"].value / 2)  # the inventory's devices
    serving = json.loads((out / SERVING_FILE).read_text())
    assert serving["endpoint"]["base_url"] == served.base_url and "server" not in serving
    assert serving["points"][0]["input_tokens"] == 2 * 16 and serving["points"][0]["output_tokens"] == 8
    # vLLM's total token throughput: both, over the same duration as the output's; a token per streamed chunk (the
    # word tokenizer), so ITL is per token; 2 requests are far from the 459 a p99 verdict needs (MLPerf).
    total = metrics["total_tokens_per_s@c1"]
    assert total.iterations == 2 * 16 + 8
    assert total.measured_seconds == metrics["output_tokens_per_s@c1"].measured_seconds
    assert total.value == pytest.approx(40 / total.measured_seconds)
    assert serving["points"][0]["tokens_per_chunk"] == 1.0 and serving["points"][0]["output_chunks"] == 8
    assert metrics["itl_s@c1"].warning is None
    early = serving["points"][0]["early_stopping"]
    # None over needs 459; one of two over is past 1 %, whose count is not worked out: met either way is false.
    assert early["ttft"] == {"requests": 2, "over": early["ttft"]["over"], "met": False,
                             "needed": 459 if early["ttft"]["over"] == 0 else None}
    assert serving["points"][0]["outputs_counted_in_chunks"] == 0  # the server's usage counted every output
    assert metrics["slo_p99_confident@c1"].value == 0.0
    assert serving["prompt_set"]["counted_with"].startswith("words")  # no model folder at an endpoint
    assert serving["prompt_set"]["count"] == 11 and serving["prompt_set"]["repeated_requests"] == 0
    assert serving["prompt_set"]["each_sent_once"] and [p["repeated_prompts"] for p in serving["points"]] == [0, 0]
    assert serving["prompts"] == "synthetic prompts (seed 0) of 16 tokens before the chat template, 4 out"
    if SERVE_SENDS_USAGE:
        assert serving["prompt_set"]["input_tokens_server"] == {"min": 16, "mean": 16.0, "max": 16}  # its usage
    assert serving["model"]["model"] == str(model_dir) and serving["model"]["precision"] is None  # the endpoint's
    assert not (out / SERVER_LOG).exists()  # no server was started
    assert {"result.json", REQUESTS_FILE, SERVING_FILE} <= {p.name for p in out.rglob("*")}
    assert _files_holding(SECRET, out) == [] and SECRET not in caplog.text
    # The round recorded the positions of its prompt stream it took: 0 to 10.
    ledger = json.loads((out / PROMPT_POSITIONS).read_text())
    assert (ledger["first"], ledger["end"]) == (0, 11) and json.loads(ledger["stream"])["endpoint"] == served.base_url
    (stream, taken), = merged({}, [("round1", (out / PROMPT_POSITIONS).read_text())]).items()
    # Round 2 at the same endpoint (a long-lived server, its prefix cache holding round 1's prompts) sends the 11
    # prompts after round 1's, in the same order of phases.
    second = tmp_path / "round2"
    second.mkdir()
    assert run_job(job.model_copy(update={"round": 2, "prompt_positions": {stream: taken}}), second) == 0
    again = sorted(read_records(second / REQUESTS_FILE), key=lambda r: (r.point, r.phase, r.seq))
    assert sorted(r.prompt_index for r in again) == list(range(11, 22))
    serving = json.loads((second / SERVING_FILE).read_text())
    assert serving["prompt_set"]["first_index"] == 11 and serving["prompt_set"]["repeated_requests"] == 0
    assert serving["prompt_set"]["first_position"] == 11 and serving["prompt_set"]["positions_taken"] == 11
    assert [(p["warmup_first_prompt"], p["first_prompt"]) for p in serving["points"]] == [(12, 14), (16, 20)]
    with pytest.raises(ConfigError, match=r"'elsewhere' names no endpoint of the inventory .*: lab\)") as refused:
        plan_run(cases=["tiny-llama-serve"], sets=["endpoint=elsewhere"], results_dir=tmp_path / "results",
                 inventory_endpoints={"lab": job.config["endpoint"]}, inventory_source="inventory.yaml")
    assert refused.value.key == "tiny-llama-serve.endpoint" and "\n" not in str(refused.value)


@pytest.fixture
def echoing_proxy() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuotingEndpoint)  # the port from the OS
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    QuotingEndpoint.received.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


def test_an_endpoint_that_is_down_or_lacks_the_model_is_one_line_naming_the_key(
        served: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The endpoint's first request fails: the round is a user error whose one line names endpoint.base_url (no
    server listens there) or endpoint.model (the server refuses the name), not points of failed requests that
    read as a success; the request is kept in requests.jsonl."""
    monkeypatch.setenv("LAB_SERVING_KEY", SECRET)
    (tmp_path / "down").mkdir()
    (tmp_path / "model").mkdir()
    with socket.socket() as bound:  # bound, never listening: a connection to it is refused
        bound.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{bound.getsockname()[1]}"
        job, out = _endpoint_job(tmp_path / "down", down, "m", "concurrency=[1]", "request_rates=[]", "requests=2")
        assert run_job(job, out) == EXIT_USER_ERROR
    failure = read_result(out / "result.json").failure
    assert failure is not None and failure.message.startswith(f"endpoint.base_url {down}: the endpoint's first "
                                                              "request")
    assert "ConnectError" in failure.message and "\n" not in failure.message
    assert [(r.point, r.phase) for r in read_records(out / REQUESTS_FILE)] == [("check", "check")]
    assert json.loads((out / SERVING_FILE).read_text())["failed_point"] == "check"

    job, out = _endpoint_job(tmp_path / "model", served.base_url, "/no/such/model", "concurrency=[1]",
                             "request_rates=[]", "requests=2")
    assert run_job(job, out) == EXIT_USER_ERROR
    failure = read_result(out / "result.json").failure
    assert failure is not None and failure.message.startswith("endpoint.model '/no/such/model': the endpoint's first "
                                                              "request")
    assert "HTTP 5" in failure.message and served.exited() is None


def test_an_endpoint_that_quotes_the_key_back_leaves_it_in_no_record(echoing_proxy: str, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """The key is sent (the endpoint got it), every request fails with the endpoint's 401 page, and that page,
    which quotes the key, is recorded with the key masked: in no file of the round, in no log line."""
    monkeypatch.setenv("LAB_SERVING_KEY", SECRET)
    caplog.set_level("DEBUG")
    job, out = _endpoint_job(tmp_path, echoing_proxy, "m", "concurrency=[1]", "request_rates=[]", "requests=2",
                             "warmup_requests=0", "max_new_tokens=4")
    run_job(job, out)
    assert QuotingEndpoint.received and set(QuotingEndpoint.received) == {f"Bearer {SECRET}"}
    records = read_records(out / REQUESTS_FILE)
    assert records and all((r.error or "").startswith("HTTP 401: invalid credentials") for r in records)
    assert all("Authorization: ***" in (r.error or "") for r in records)
    assert _files_holding(SECRET, out) == [] and SECRET not in caplog.text


def test_a_key_a_header_cannot_carry_is_refused_by_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key with a line end (a file read with its newline) would make httpx's error quote it: refused before any
    request, naming the variable, never the value."""
    monkeypatch.setenv("LAB_SERVING_KEY", SECRET + "\n")
    job, out = _endpoint_job(tmp_path, "http://127.0.0.1:9", "m", "concurrency=[1]", "request_rates=[]")
    assert run_job(job, out) == EXIT_USER_ERROR
    result = read_result(out / "result.json")
    assert result.failure is not None and "endpoint.api_key: ${LAB_SERVING_KEY} is empty or holds spaces, line " \
        "ends" in result.failure.message
    assert _files_holding(SECRET, out) == [] and not (out / REQUESTS_FILE).exists()


KEYED_ENGINE = """name: keyed
description: a real OpenAI-style server that answers only requests carrying the key of its environment
server:
  command: ["{python}", %s, "{port}", "{host}", KEYED_SERVER_KEY]
  ready_path: /health
  apis: [chat]
  request_model: "{model_dir}"
%s"""


def _keyed_round(tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch, declared: bool,
                 server_env: dict[str, str] | None = None) -> tuple[int, Path]:
    """One round of a copy of tiny-llama-serve (with ``server_env``) on the engine `keyed`
    (tests/unit/keyed_endpoint.py, started by the round from its command), which declares its key variable when
    ``declared``."""
    import yaml

    from flagperf.config.cases import load_case

    engine = tmp_path / "vendors" / "cpu" / "generate" / "keyed"
    engine.mkdir(parents=True)
    script = json.dumps(str(Path(__file__).with_name("keyed_endpoint.py")))
    (engine / "engine.yaml").write_text(KEYED_ENGINE % (script, "  api_key_env: KEYED_SERVER_KEY\n" if declared
                                                        else ""), encoding="utf-8")
    manifest = yaml.safe_load(load_case("tiny-llama-serve").folder.joinpath("case.yaml").read_text())
    manifest["name"] = "keyed-serve"
    manifest["configurations"].update(server_env=server_env or {})
    case_file = tmp_path / "cases" / "generate" / "keyed-serve" / "case.yaml"
    case_file.parent.mkdir(parents=True)
    case_file.write_text(yaml.safe_dump(manifest), encoding="utf-8")
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(tmp_path / "cases"))
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(tmp_path / "vendors"))
    plan = plan_run(cases=["keyed-serve"], sets=["engine=keyed", f"checkpoint_path={model_dir}", "concurrency=[1]",
                                                 "request_rates=[]", "requests=2", "warmup_requests=0",
                                                 "max_new_tokens=3"], results_dir=tmp_path / "results")
    cp = plan.cases[0]
    job = Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, host="localhost", vendor="cpu",
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})
    assert SECRET not in plan.model_dump_json()  # the plan holds the ${NAME} reference only
    out = tmp_path / "round"
    out.mkdir()
    return run_job(job, out), out


@pytest.mark.parametrize("given", ["server_env", "host environment"])
def test_a_server_started_with_a_key_gets_it_from_every_request(given: str, model_dir: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A server the round starts with a key (vLLM's VLLM_API_KEY) refuses every request without it. The key is
    given once, to the server's environment (the case's server_env as ${NAME}, or the host's own variable); the
    engine's api_key_env names the variable, and the client sends its value: every request succeeds, and the
    key is in no file of the round and in no log line."""
    caplog.set_level("DEBUG")
    if given == "server_env":
        monkeypatch.setenv("LAB_SERVER_KEY", SECRET)
        monkeypatch.delenv("KEYED_SERVER_KEY", raising=False)
        server_env = {"KEYED_SERVER_KEY": "${LAB_SERVER_KEY}"}
    else:
        monkeypatch.setenv("KEYED_SERVER_KEY", SECRET)
        server_env = {}
    code, out = _keyed_round(tmp_path, model_dir, monkeypatch, True, server_env)
    assert code == 0, read_result(out / "result.json").failure
    records = read_records(out / REQUESTS_FILE)
    assert len(records) == 2 and all(r.ok and r.output_text == "t1 t2 t3" for r in records), records
    assert _files_holding(SECRET, out) == [] and SECRET not in caplog.text


def test_a_key_server_refuses_a_client_without_its_key(model_dir: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The same server with its key, the engine not saying where the key is: every request is the server's 401
    (what every round against a keyed vLLM got before engines named their key variable)."""
    monkeypatch.setenv("KEYED_SERVER_KEY", SECRET)
    _, out = _keyed_round(tmp_path, model_dir, monkeypatch, False)
    records = read_records(out / REQUESTS_FILE)
    assert records and all((r.error or "").startswith("HTTP 401") for r in records), records


def test_a_server_key_a_header_cannot_carry_is_refused_before_the_server_starts(
        model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEYED_SERVER_KEY", SECRET + "\n")
    code, out = _keyed_round(tmp_path, model_dir, monkeypatch, True)
    assert code == EXIT_USER_ERROR
    failure = read_result(out / "result.json").failure
    assert failure is not None and "the server's key variable KEYED_SERVER_KEY is empty or holds spaces" in \
        failure.message
    assert not (out / SERVER_LOG).exists() and _files_holding(SECRET, out) == []


HOSTILE_EVENTS = {  # what a broken or hostile endpoint streams, by path: each is the request's error, never a crash
    "/choices-text": ['{"choices": "abc"}'],
    "/delta-text": ['{"choices": [{"delta": "abc"}]}'],
    "/content-number": ['{"choices": [{"delta": {"content": 7}}]}'],
    "/usage-text": ['{"choices": [], "usage": {"prompt_tokens": "many", "completion_tokens": 1}}'],
    "/deep": ["[" * 100_000 + "]" * 100_000],
    # A stream that breaks off: answer chunks, then the end without a finish_reason (a server that dropped it).
    "/broken": ['{"choices": [{"index": 0, "delta": {"role": "assistant"}}]}',
                '{"choices": [{"index": 0, "delta": {"content": "t1"}, "finish_reason": null}]}'],
    # vLLM's and SGLang's finish reason of a request the server gave up on.
    "/abort": ['{"choices": [{"index": 0, "delta": {"content": "t1"}, "finish_reason": null}]}',
               '{"choices": [{"index": 0, "delta": {}, "finish_reason": "abort"}]}',
               '{"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 1}}'],
    # An error event of vLLM's older shape: no choices, no usage, no error key.
    "/object-error": ['{"object": "error", "message": "prompt too long", "type": "BadRequestError", "code": 400}'],
}
# A reasoning model's streams (vLLM: delta.reasoning, SGLang and older vLLM: delta.reasoning_content): a role-only
# chunk first, then reasoning, then the answer; the second one never gets to an answer (it reasons to max_tokens).
REASONING_EVENTS = {
    "/reasoning": ['{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}',
                   '{"choices": [{"index": 0, "delta": {"reasoning_content": "r1"}}]}',
                   '{"choices": [{"index": 0, "delta": {"reasoning": " r2", "reasoning_content": " r2"}}]}',
                   '{"choices": [{"index": 0, "delta": {"content": "t1"}}]}',
                   '{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}',
                   '{"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3}}'],
    "/reasoning-only": ['{"choices": [{"index": 0, "delta": {"reasoning": "r1"}}]}',
                        '{"choices": [{"index": 0, "delta": {"reasoning": " r2"}, "finish_reason": "length"}]}'],
    # Several tokens per chunk (speculative decoding, a stream interval): 6 tokens in 2 chunks, by the server's usage.
    "/bundled": ['{"choices": [{"index": 0, "delta": {"content": "t1 t2 t3"}}]}',
                 '{"choices": [{"index": 0, "delta": {"content": " t4 t5 t6"}, "finish_reason": "stop"}]}',
                 '{"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 6}}'],
}


# Streams of well-formed events that never end: text pieces past any max_tokens, or pieces without text (no
# piece to count: only the request's whole limit stops it).
ENDLESS_EVENTS = {"/endless-text": '{"choices": [{"delta": {"content": "t"}}]}',
                  "/endless-empty": '{"choices": [{"delta": {"content": ""}}]}'}
ENDLESS_LINE_CAP = 16 * MAX_LINE_BYTES  # what /endless-line sends at most: far past the client's bound
# /trickle: a line that grows a byte at a time, each read far within the request's limit (1 s in the test), for at
# most this many bytes (30 s at 10 ms each, far past the limit), then ended as a well-formed stream.
TRICKLE_BYTES = 3000


class HostileEndpoint(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    endless_line_sent: ClassVar[list[int]] = []  # bytes /endless-line wrote before the client hung up (or the cap)
    endless_line_done = threading.Event()
    # Set when the client hung up on a stream it stopped (the server's write failed), before its cap, if any.
    hung_up: ClassVar[dict[str, threading.Event]] = {"/endless-empty": threading.Event(), "/trickle": threading.Event()}

    def do_POST(self) -> None:  # http.server calls it by this name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        prefix = self.path.removesuffix("/v1/chat/completions")
        if prefix == "/endless-line":  # an event stream whose one line never ends (up to the cap)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk, sent = b"data: " + b"x" * 65530, 0
            try:
                with contextlib.suppress(OSError):
                    while sent < ENDLESS_LINE_CAP:
                        self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                        sent += len(chunk)
                    self.wfile.write(b"0\r\n\r\n")
            finally:
                self.endless_line_sent.append(sent)
                self.endless_line_done.set()
            return
        if prefix in ENDLESS_EVENTS:  # well-formed events until the client hangs up
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            event = f"data: {ENDLESS_EVENTS[prefix]}\n\n".encode()
            try:
                while True:
                    self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            except OSError:
                if prefix in self.hung_up:
                    self.hung_up[prefix].set()
            return
        if prefix == "/trickle":  # "data: x...", a byte at a time (up to TRICKLE_BYTES), then ended well
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for piece in [b"data: ", *[b"x"] * TRICKLE_BYTES, b"\n\ndata: [DONE]\n\n", b""]:
                    self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                    self.wfile.flush()
                    time.sleep(0.01)  # the hostile server's pace, not a wait of the test
            except OSError:
                self.hung_up[prefix].set()
            return
        if prefix == "/endless":  # a 500 page that never ends: the client reads a bounded part of it
            self.send_response(500)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b"x" * 65536
            with contextlib.suppress(OSError):
                while True:
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            return
        body = "".join(f"data: {event}\n\n" for event in {**HOSTILE_EVENTS, **REASONING_EVENTS}[prefix]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_the_event_stream_is_split_at_every_line_end_whatever_the_parts() -> None:
    """CR LF, LF and CR each end a line (server-sent events), also when a CR LF is cut between two parts; the
    stream's last line is kept without its end; a line over the bound stops, whole or still growing."""
    splitter = LineSplitter(limit=12)
    lines = [line for part in (b"data: a\r", b"\ndata: b\n\nx", b"y\rz") for line in splitter.feed(part)]
    assert [*lines, *splitter.end()] == ["data: a", "data: b", "", "xy", "z"]
    # A CR, then parts of one LF each: the first LF ends nothing (the CR's), the second ends an empty line.
    splitter = LineSplitter(limit=12)
    assert [line for part in (b"a\r", b"\n", b"\n", b"b\n") for line in splitter.feed(part)] == ["a", "", "b"]
    with pytest.raises(LineTooLong):
        LineSplitter(limit=12).feed(b"data: 0123456789\n")
    growing = LineSplitter(limit=12)
    growing.feed(b"data: 012345")
    with pytest.raises(LineTooLong):
        growing.feed(b"6")


def test_a_hostile_endpoints_answers_are_request_errors(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HostileEndpoint)  # the port from the OS
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        records = {}
        for prefix in [*HOSTILE_EVENTS, *REASONING_EVENTS, "/endless-text", "/endless", "/endless-line"]:
            # The whole-request limit is far off: these end by their own bounds (the request's limit: below).
            target = Target(f"http://127.0.0.1:{server.server_address[1]}{prefix}", "m", "chat",
                            request_timeout_s=600.0)
            run = asyncio.run(run_phase(target, Load("c1", concurrency=1), [ServingPrompt(0, "t1 t2", 2, 3)],
                                        "timed", requests=1, duration_s=None, writer=None, count_tokens=None))
            records[prefix] = run.records[0]
    finally:
        server.shutdown()
        thread.join()
        server.server_close()
    errors = {prefix: record.error or "" for prefix, record in records.items()}
    assert errors["/choices-text"].startswith("unexpected choices")
    assert errors["/delta-text"].startswith("unexpected choices")
    assert errors["/content-number"].startswith("unexpected content")
    assert errors["/usage-text"].startswith("unexpected usage")
    assert errors["/deep"].startswith("not JSON in the stream")
    assert errors["/endless"].startswith("HTTP 500: xxx") and len(errors["/endless"]) < 400
    # A stream that ended before the server said why it stopped, or with its giving up, is a failed request (it
    # counts in failed_fraction), not a short success; so is an error event without an error key.
    assert errors["/broken"] == "the stream ended without a finish_reason after 1 output chunk(s): it broke off"
    assert errors["/abort"] == "the server ended the request with finish_reason 'abort' after 1 output chunk(s)"
    assert errors["/object-error"].startswith('an event with none of choices, usage and error: {"object": "error"')
    stats = point_stats("c1", [records["/broken"], records["/abort"], records["/reasoning"]], 1.0, Bounds)
    assert (stats.failed, stats.succeeded) == (2, 1)
    # Reasoning is output: its first chunk is the first token (TTFT), each of its chunks is an output chunk (ITL),
    # and its tokens count; the answer text alone is the output text (what quality scores).
    reasoned = records["/reasoning"]
    assert reasoned.ok and reasoned.chunk_times_s and reasoned.ttft_s == reasoned.chunk_times_s[0]
    assert len(reasoned.chunk_times_s) == 3 and reasoned.reasoning_chunks == 2  # the role-only chunk is none
    assert (reasoned.reasoning_text, reasoned.output_text) == ("r1 r2", "t1")
    assert (reasoned.output_tokens_client, reasoned.reasoning_tokens_client, reasoned.output_tokens) == (3, 2, 3)
    # Tokens the server bundled in one chunk: TPOT is per token (the usage's 6), an ITL gap per chunk, which the
    # point's ITL says in its warning and serving.json in tokens_per_chunk.
    bundled = records["/bundled"]
    assert bundled.ok and len(bundled.chunk_times_s) == 2 and bundled.output_tokens == 6
    stats = point_stats("c1", [bundled], 1.0, Bounds)
    assert (stats.output_chunks, stats.chunked_tokens, stats.tokens_per_chunk) == (2, 6, 3.0)
    itl = {m.name: m for m in point_metrics(stats, (0.0, 1.0), 1, Bounds, "closed loop")}["itl_s@c1"]
    assert itl.warning == PER_CHUNK_ITL and itl.note.endswith("6 output tokens in 2 chunks, 3 per chunk")
    assert stats.tpot is not None and stats.tpot.mean == pytest.approx(
        (bundled.e2el_s - bundled.ttft_s) / 5)  # type: ignore[operator]
    only = records["/reasoning-only"]
    assert only.ok and only.ttft_s is not None and only.output_tokens == 2 and only.output_text == ""
    # Events that never end: more text pieces than max_tokens (3) allows.
    assert errors["/endless-text"] == ("the server streamed more than 22 text pieces for max_tokens 3; the request "
                                       "was stopped")
    # One line that never ends: the request's error once the line passes the bound, the connection closed then
    # (the server could not send all it had), not a line held in memory until the stream or the timeout ends.
    assert errors["/endless-line"] == (f"a line of the event stream is longer than {MAX_LINE_BYTES} bytes "
                                       "(MAX_LINE_BYTES); the request was stopped")
    assert HostileEndpoint.endless_line_done.wait(60)
    assert HostileEndpoint.endless_line_sent and HostileEndpoint.endless_line_sent[0] < ENDLESS_LINE_CAP


@pytest.mark.parametrize("prefix", ["/endless-empty", "/trickle"])
def test_a_request_past_its_limit_is_stopped_and_its_connection_closed(prefix: str) -> None:
    """request_timeout_s bounds the whole request from the send, not each read: a server streaming events without
    text (no piece to count) or a line a byte at a time (each read far within the limit) is stopped at the limit,
    whichever of the client's limits sees it first (one verdict, whatever the machine's speed), and the connection
    is closed then, while the client is still open (the server sees the hang-up, before its cap)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HostileEndpoint)  # the port from the OS
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    target = Target(f"http://127.0.0.1:{server.server_address[1]}{prefix}", "m", "chat", request_timeout_s=1.0)

    async def stopped_request() -> tuple[RequestRecord, bool]:
        async with httpx.AsyncClient() as client:
            record = await send_request(client, target, ServingPrompt(0, "t1 t2", 2, 3), "c1", "timed", 0, None)
            return record, await asyncio.to_thread(HostileEndpoint.hung_up[prefix].wait, 60)

    try:
        record, hung_up = asyncio.run(stopped_request())
    finally:
        server.shutdown()
        thread.join()
        server.server_close()
    assert (record.error or "").startswith("the request ran past request_timeout_s (1 s)"), record.error
    assert record.error.endswith("; it was stopped")
    assert hung_up
