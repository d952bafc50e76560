"""The serving metrics of one point, from its timed requests (flagperf.generate.loadgen.RequestRecord).

A point is a closed-loop concurrency C or an open-loop request rate R. Its label names its metrics:
``<what>@c<C>`` (c4) or ``<what>@r<R>`` (R written with Python's ``g`` format: r2, r0.5, r12.5). Every
figure below is one Metric of result.json; docs/serving.md repeats the table.

  output_tokens_per_s               output tokens of the successful requests / the point's duration (first
                                    send to last end); carries ``window`` (epoch start, end) and ``work``
                                    (the output tokens), so the run summary computes energy per output token
                                    from the monitors (energy_per_work, J/token)
  total_tokens_per_s                input and output tokens of the successful requests / the point's duration
                                    (vLLM's total token throughput; input: the server's usage.prompt_tokens first)
  output_tokens_per_s_per_device    the same / devices (tensor_parallel x nodes, or the endpoint's devices)
  tokens_per_s_per_user             per request: output tokens / E2EL; mean, p10 (the slow tail: of a rate, low
                                    is slow), p50, p90 over requests; no p99 (a rate's p99 is its fastest 1 %)
  interactivity                     1 / mean TPOT (tokens/s one user sees while decoding; InferenceX's axis)
  requests_per_s                    successful requests / the point's duration
  ttft_s  tpot_s  itl_s  e2el_s     mean, p50, p90, p95, p99, std (seconds) over successful requests:
                                    TTFT = first output chunk - send; E2EL = end of stream - send;
                                    TPOT = (E2EL - TTFT) / (output tokens - 1), requests of >= 2 tokens;
                                    ITL = every gap between consecutive output chunks, pooled (an output
                                    chunk: non-empty answer or reasoning text)
  goodput_requests_per_s            requests meeting every SLO / the point's duration (vLLM's goodput)
  goodput_fraction                  requests meeting every SLO / all timed requests (failed ones included)
  slo_p99_met                       1 when p99 TTFT <= slo.ttft_s and p99 TPOT <= slo.tpot_s (and p99 E2EL
                                    <= slo.e2el_s when given) and no request failed, else 0 (MLPerf's check)
  mean_concurrency, peak_concurrency  open loop only: the requests in flight it achieved, sum of E2EL of the successful
                                    requests / the point's duration (SGLang's concurrency), and the most in flight at
                                    once, every request's send to its end (vLLM counts per whole second)
  slo_p99_confident                 1 when slo_p99_met and each bounded latency has as many requests as MLPerf
                                    LoadGen's early stopping needs for a p99 at 99 % confidence (459 with none over)
  failed_requests                   requests with an error (HTTP status, error event, a stream that broke off
                                    or was aborted: flagperf.generate.loadgen)
  failed_fraction                   failed requests / all timed requests (iterations: the timed requests)
  truncated_requests                fewer output tokens than asked with exact output, or finish_reason
                                    "length" without it (the answer was cut)
  empty_outputs                     successful requests with no output token
  token_count_mismatches            requests whose client count differs from the server's usage (output
                                    tokens, or prompt tokens where the client knows the prompt as sent)
  exact_match, rouge1/rouge2/rougeL with a prompts file that has references (outputs vs references)

Output tokens per request are the server's usage where it sent one, else the client's count. A point with
failed, truncated or empty requests, with requests that resent a prompt already sent in the round, or whose open
loop sent late carries a ``warning`` on output_tokens_per_s (the report shows it). Every figure states how it
was counted in its ``convention`` (CONVENTIONS), one wording per word, as docs/serving.md's table.

A point whose every timed request failed is a **failed point** (``failed_point_metrics``): it has no throughput,
latency or goodput (a 0 would draw as a point of the curve), only failed_requests and failed_fraction (1.0, with
the first error as its warning); the round fails after its other points, naming it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from flagperf.generate.loadgen import OUTPUT_COUNTED_BY_TOKENIZER, RequestRecord
from flagperf.results.metrics import LATENCY_PERCENTILES, LatencyStats, latency_stats, latency_tail, percentile
from flagperf.results.schema import Metric
from flagperf.results.serving import FAILED_FLAG_FRACTION

FIRST_ERROR_CHARS = 200  # of the first failed request's error, in the point's warning

# How each figure is counted (its Metric.convention), one wording per word: docs/serving.md's metric table says the
# same. The batch engines' figures of the same name (flagperf.generate.metrics.CONVENTIONS) use the same formulas on
# the engine's own times (a request's arrival at the engine to its tokens), not the client's over HTTP: each
# convention of a latency or per-user figure says so, here and there.
BATCH = "a batch engine's (hf, vllm)"
OUTPUT_TOKENS = ("output tokens of a request: the server's usage.completion_tokens, else the client's count (the "
                 "model folder's tokenizer on the streamed answer and reasoning text; without one, output chunks)")
OUTPUT_CHUNK = "an output chunk: a streamed event with non-empty answer (content, text) or reasoning text"
DURATION = "the point's duration: its first send to its last stream end (client perf_counter)"
# A request whose kept-alive connection the server closed before any response is sent once more on a fresh one
# (flagperf.generate.loadgen.exchange_request), timed from its first send: the failed try is part of its times (a
# server that took the request, worked on it and dropped it is not flattered by the time it lost).
RESENT = ("a request whose kept-alive connection the server closed before any response was sent once more on a fresh "
          "connection, and is timed from its first send, the failed try included")
PERCENTILES = LATENCY_PERCENTILES
FAILED = ("a request fails on an HTTP status other than 200, a transport error or request_timeout_s, an error event, "
          "an event with none of choices, usage and error, or a stream that ends without a finish_reason or with "
          "finish_reason abort or error")
INPUT_TOKENS = ("input tokens of a request: the server's usage.prompt_tokens (the chat template included), else the "
                "client's count of the prompt as sent, else of its text")
# MLPerf Inference LoadGen's early stopping (loadgen/early_stopping.cc, results.cc, Server scenario): how many queries a
# p99 verdict needs at 99 % confidence, given how many were over the bound. The numbers are LoadGen's; the code is ours.
EARLY_STOPPING_PERCENTILE = 0.99
EARLY_STOPPING_CONFIDENCE = 0.99
EARLY_STOPPING_MAX_OVER = 10_000  # past this many requests over a bound, the count needed is not worked out
EARLY_STOPPING = ("MLPerf LoadGen's early stopping (Server): with t requests over a bound, a p99 verdict at 99 % "
                  "confidence needs n >= h + t requests, h the least for which t or fewer over in h + t would have a "
                  "chance under 1 % were 1 % over (459 with none over)")
# A server may send several tokens in one chunk (speculative decoding, a stream interval): ITL is then per chunk, as
# vLLM's bench serve counts it and SGLang's bench_serving does with its OpenAI-compatible backends (sglang-oai, vllm:
# a gap per chunk with text); only its native --backend sglang client (/generate) spreads a chunk's gap over the
# chunk's tokens (meta_info.completion_tokens). GenAI-Perf's and AIPerf's "inter token latency" is per token (this
# project's TPOT). From this many output tokens per chunk on average the point's itl_s warns (PER_CHUNK_ITL).
TOKENS_PER_CHUNK_FLAG = 1.1
# itl_s's warning where chunks bundle tokens: the same text at every point and round (the counts are in its note), so
# the run report says it once; "per chunk" is the phrase the report's next steps know it by (WARNING_STEPS).
PER_CHUNK_ITL = ("the server sent several output tokens per chunk (the note says how many): each ITL gap is per "
                 "chunk, as vLLM's bench serve and SGLang's bench_serving with an OpenAI-compatible backend count it; "
                 "SGLang's bench_serving with its native sglang backend (/generate) spreads a chunk's gap over its "
                 "tokens, and GenAI-Perf's and AIPerf's inter token latency is per token: compare those with tpot_s")
CONVENTIONS = {
    "output_tokens_per_s": f"output tokens of the successful timed requests / {DURATION}; {OUTPUT_TOKENS}",
    "total_tokens_per_s": f"input and output tokens of the successful timed requests / {DURATION} (vLLM's total token "
                          f"throughput, SGLang's total throughput); {INPUT_TOKENS}; {OUTPUT_TOKENS}",
    "slo_p99_confident": "1 when slo_p99_met is 1 and the point has as many requests as MLPerf LoadGen's early "
                         "stopping needs for each bounded p99 (TTFT, TPOT, E2EL when bounded), else 0; "
                         f"{EARLY_STOPPING}",
    "mean_concurrency": f"open loop: requests in flight on average, the E2EL of the successful timed requests summed / "
                        f"{DURATION} (SGLang bench_serving's concurrency)",
    "peak_concurrency": "open loop: the most timed requests in flight at once, each from its send to its end (failed "
                        "ones included, client perf_counter); vLLM's bench serve counts the requests active in each "
                        "whole second, so its peak can be higher",
    "output_tokens_per_s_per_device": "output_tokens_per_s / devices (tensor_parallel x nodes, or the endpoint's "
                                      "devices)",
    "requests_per_s": f"successful timed requests / {DURATION}",
    "goodput_requests_per_s": "timed requests meeting every SLO (vLLM's per-request rule: succeeded, TTFT, TPOT and "
                              f"E2EL within their bounds; a 1-token request has no TPOT and passes it) / {DURATION}",
    "goodput_fraction": "timed requests meeting every SLO (vLLM's per-request rule) / all timed requests, failed "
                        "ones included",
    "slo_p99_met": "1 when p99 TTFT and p99 TPOT (and p99 E2EL when bounded) of the successful requests are within "
                   "the SLO and no request failed (MLPerf Server's check), else 0",
    "failed_requests": FAILED,
    "failed_fraction": f"failed / all timed requests; {FAILED}",
    "truncated_requests": "exact output: fewer output tokens than max_tokens; else finish_reason length",
    "empty_outputs": f"successful requests with 0 output tokens; {OUTPUT_TOKENS}",
    "token_count_mismatches": "successful requests whose client count differs from the server's usage: output "
                              "tokens, or prompt tokens where the client knows the prompt as the server tokenizes "
                              "it (the chat template applied)",
    "tokens_per_s_per_user": "per successful request: output tokens / E2EL; mean over requests; p10 is the slow tail "
                             "(of a rate, low is slow) and p90 the fast side; no p99 (a rate's p99 is its fastest "
                             f"1 %); {OUTPUT_TOKENS}; {BATCH} divides by its last token - its arrival at the engine",
    "interactivity": "1 / mean TPOT (tpot_s's value)",
    "ttft_s": f"time to first token: send to the first output chunk, client perf_counter; {OUTPUT_CHUNK}; successful "
              f"requests; {PERCENTILES}; {RESENT}; {BATCH} runs from the request's arrival at the engine to its first "
              "token",
    "tpot_s": "time per output token after the first: (E2EL - TTFT) / (output tokens - 1) per successful request, "
              f"1-token requests left out; {OUTPUT_TOKENS}; {PERCENTILES}; {BATCH} is (last token - first token) / "
              "(output tokens - 1)",
    "itl_s": f"inter-token latency: every gap between consecutive output chunks of a successful request, pooled (a "
             "chunk may carry several tokens: then a gap is per chunk, as vLLM's bench serve and SGLang's "
             "bench_serving with an OpenAI-compatible backend count it, not per token as SGLang's native sglang "
             "backend spreads it; the note says the point's output tokens per chunk, counted over the requests whose "
             "output tokens the server's usage or a tokenizer counted); "
             f"{OUTPUT_CHUNK}; {PERCENTILES}; {BATCH} gaps are between tokens as the engine hands them out",
    "e2el_s": "end-to-end latency: send to the end of the response stream (its last event), client perf_counter; "
              f"successful requests; {PERCENTILES}; {RESENT}; {BATCH} ends at the request's last token, from its "
              "arrival at the engine",
    "exact_match": "outputs (the answer text, reasoning left out) equal to the reference, whitespace at the ends "
                   "ignored; failed requests score as empty outputs",
    "rouge": "rouge-score F1 (stemmed) of the outputs (the answer text, reasoning left out) against the references, "
             "mean; failed requests score as empty outputs",
}


class SloBounds(Protocol):
    ttft_s: float
    tpot_s: float
    e2el_s: float | None


def point_label(concurrency: int | None = None, rate: float | None = None) -> str:
    if (concurrency is None) == (rate is None):
        raise ValueError("a point has a concurrency or a rate")
    return f"c{concurrency}" if concurrency is not None else f"r{rate:g}"


def metric_name(what: str, label: str) -> str:
    return f"{what}@{label}"


def tpot(record: RequestRecord) -> float | None:
    if not record.ok or record.ttft_s is None or record.e2el_s is None or record.output_tokens < 2:
        return None
    return (record.e2el_s - record.ttft_s) / (record.output_tokens - 1)


def prompt_mismatch(record: RequestRecord) -> bool:
    """The server counted the prompt otherwise than the client's count of it as sent (chat template applied):
    another tokenizer, or a template the server applies differently. Unknown (no client count as sent, no
    usage) is no mismatch."""
    return (record.prompt_tokens_sent is not None and record.prompt_tokens_usage is not None
            and record.prompt_tokens_sent != record.prompt_tokens_usage)


def meets_slo(record: RequestRecord, slo: SloBounds) -> bool:
    """vLLM's per-request goodput rule: succeeded, and TTFT, TPOT (and E2EL when bounded) within bounds."""
    if not record.ok or record.ttft_s is None or record.e2el_s is None:
        return False
    per_token = tpot(record)
    return (record.ttft_s <= slo.ttft_s and (per_token is None or per_token <= slo.tpot_s)
            and (slo.e2el_s is None or record.e2el_s <= slo.e2el_s))


def is_truncated(record: RequestRecord) -> bool:
    if not record.ok:
        return False
    if record.exact:
        return record.output_tokens < record.requested_output
    return record.finish_reason == "length"


@dataclass(frozen=True)
class EarlyStopping:
    """MLPerf LoadGen's early stopping for one bounded latency: of ``requests``, ``over`` were over the bound, and a p99
    verdict at 99 % confidence needs ``needed`` requests (None: not worked out, where more than 1 % of the requests
    were over, which no count this point has can pass, or more than EARLY_STOPPING_MAX_OVER)."""

    requests: int
    over: int
    needed: int | None

    @property
    def met(self) -> bool:
        return self.needed is not None and self.requests >= self.needed

    def as_json(self) -> dict[str, int | bool | None]:
        return {"requests": self.requests, "over": self.over, "needed": self.needed, "met": self.met}


def _at_most_over_chance(under: int, over: int, percentile: float) -> float:
    """The chance of ``over`` or fewer of ``under + over`` requests over the bound, were a share 1 - percentile of
    them over it: the binomial distribution's CDF, summed in log space (n up to millions)."""
    n, q = under + over, 1.0 - percentile
    terms = [math.lgamma(n + 1) - math.lgamma(x + 1) - math.lgamma(n - x + 1) + x * math.log(q)
             + (n - x) * math.log(percentile) for x in range(over + 1)]
    top = max(terms)
    return math.exp(top) * math.fsum(math.exp(t - top) for t in terms)


def early_stopping_needed(over: int, percentile: float = EARLY_STOPPING_PERCENTILE,
                          confidence: float = EARLY_STOPPING_CONFIDENCE) -> int | None:
    """The requests a percentile verdict needs when ``over`` of them were over its bound (LoadGen's
    find_min_passing + t): the least h with a chance under 1 - confidence of ``over`` or fewer over in h + over."""
    if over > EARLY_STOPPING_MAX_OVER:
        return None
    low, high = 0, max(1, math.ceil(math.log(1 - confidence) / math.log(percentile)))
    while _at_most_over_chance(high, over, percentile) >= 1 - confidence:
        low, high = high, high * 2
    while low < high:  # the chance falls as h grows: the least passing h
        middle = (low + high) // 2
        if _at_most_over_chance(middle, over, percentile) < 1 - confidence:
            high = middle
        else:
            low = middle + 1
    return high + over


def early_stopping(values: list[float], bound: float) -> EarlyStopping:
    over = sum(1 for v in values if v > bound)  # LoadGen counts a latency over its target, not at it
    # More than 1 % of n over: t or fewer over in n has a chance of a half or more were 1 % over (t is past the
    # binomial's median), so n is short of what t needs and the verdict fails whatever that is: not worked out (its
    # cost grows with t).
    beyond = over > (1.0 - EARLY_STOPPING_PERCENTILE) * len(values)
    return EarlyStopping(requests=len(values), over=over, needed=None if beyond else early_stopping_needed(over))


@dataclass(frozen=True)
class PointStats:
    label: str
    requests: int
    succeeded: int
    failed: int
    truncated: int
    empty: int
    mismatched: int
    output_tokens: int
    seconds: float
    good: int
    ttft: LatencyStats | None
    tpot: LatencyStats | None
    itl: LatencyStats | None
    e2el: LatencyStats | None
    per_user: LatencyStats | None
    first_error: str | None = None  # of the first failed request in sending order: what a reader checks first
    per_user_p10: float | None = None  # tokens/s per user: the slow tail (of a rate, low is slow)
    prompt_mismatched: int = 0  # of ``mismatched``: by the prompt's count
    output_mismatched: int = 0  # of ``mismatched``: by the output's count
    input_tokens: int = 0  # of the successful requests (RequestRecord.prompt_tokens)
    output_chunks: int = 0  # of the successful requests whose output tokens were counted (usage, a tokenizer)
    chunked_tokens: int = 0  # the output tokens of those same requests
    chunk_counted: int = 0  # successful requests with output counted in chunks (no usage, no tokenizer): left out
    early_stopping: dict[str, EarlyStopping] | None = None  # by bound (ttft, tpot, e2el): MLPerf's count
    mean_concurrency: float | None = None  # open loop: sum of the successful requests' E2EL / seconds
    peak_concurrency: int | None = None  # open loop: the most requests in flight at once

    @property
    def tokens_per_chunk(self) -> float | None:
        """Output tokens per output chunk: 1 where the server streams a token per chunk, more where it bundles."""
        return self.chunked_tokens / self.output_chunks if self.output_chunks else None

    @property
    def slo_p99_confident(self) -> bool:
        """Every bounded latency has the requests MLPerf's early stopping needs; False with nothing to judge."""
        return bool(self.early_stopping) and all(e.met for e in (self.early_stopping or {}).values())

    @property
    def failed_point(self) -> bool:
        """Every timed request failed: nothing was measured but the failure."""
        return self.succeeded == 0

    def slo_p99_met(self, slo: SloBounds) -> bool:
        if self.failed or self.ttft is None:
            return False
        return (self.ttft.p99 <= slo.ttft_s and (self.tpot is None or self.tpot.p99 <= slo.tpot_s)
                and (slo.e2el_s is None or (self.e2el is not None and self.e2el.p99 <= slo.e2el_s)))


def peak_in_flight(records: list[RequestRecord]) -> int | None:
    """The most requests in flight at once, each from its send to its end (perf_counter offsets); None where a record
    lacks its offsets (written before send_offset_s)."""
    if any(r.send_offset_s is None or r.e2el_s is None for r in records):
        return None
    # At one instant an end comes before a send (-1 sorts first): a request that ended as another was sent is not
    # counted with it.
    events = sorted([(r.send_offset_s or 0.0, 1) for r in records]
                    + [((r.send_offset_s or 0.0) + (r.e2el_s or 0.0), -1) for r in records])
    peak = in_flight = 0
    for _, step in events:
        in_flight += step
        peak = max(peak, in_flight)
    return peak


def point_stats(label: str, records: list[RequestRecord], seconds: float, slo: SloBounds) -> PointStats:
    if not records or seconds <= 0:
        raise ValueError("a point needs requests and a positive duration")
    done = [r for r in records if r.ok]
    timed = [r for r in done if r.ttft_s is not None and r.e2el_s is not None]
    per_token = [t for t in (tpot(r) for r in timed) if t is not None]
    gaps = [b - a for r in timed for a, b in zip(r.chunk_times_s, r.chunk_times_s[1:], strict=False)]
    per_user = [r.output_tokens / r.e2el_s for r in timed if r.e2el_s]
    output_off = {id(r) for r in done if r.output_tokens_usage is not None and r.output_tokens_client is not None
                  and r.output_tokens_usage != r.output_tokens_client}
    prompt_off = {id(r) for r in done if prompt_mismatch(r)}
    ttfts = [r.ttft_s for r in timed if r.ttft_s is not None]
    e2els = [r.e2el_s for r in timed if r.e2el_s is not None]
    bounded = {"ttft": early_stopping(ttfts, slo.ttft_s)} if ttfts else {}
    if per_token:
        bounded["tpot"] = early_stopping(per_token, slo.tpot_s)
    if slo.e2el_s is not None and e2els:
        bounded["e2el"] = early_stopping(e2els, slo.e2el_s)
    # Output counted in chunks (no usage, no tokenizer) is a token per chunk by construction: those requests say
    # nothing of how many tokens a chunk carried.
    chunked = [r for r in timed if r.chunk_times_s]
    open_loop = any(r.scheduled_offset_s is not None for r in records)  # what the load achieved is not set there
    counted = [r for r in chunked if r.output_tokens_usage is not None
               or r.output_counted_by == OUTPUT_COUNTED_BY_TOKENIZER]
    return PointStats(
        input_tokens=sum(r.prompt_tokens for r in done), output_chunks=sum(len(r.chunk_times_s) for r in counted),
        chunked_tokens=sum(r.output_tokens for r in counted), chunk_counted=len(chunked) - len(counted),
        early_stopping=bounded or None,
        mean_concurrency=sum(e2els) / seconds if open_loop else None,
        peak_concurrency=peak_in_flight(records) if open_loop else None,
        label=label, requests=len(records), succeeded=len(done), failed=len(records) - len(done),
        truncated=sum(1 for r in records if is_truncated(r)),
        empty=sum(1 for r in done if r.output_tokens == 0), mismatched=len(output_off | prompt_off),
        prompt_mismatched=len(prompt_off), output_mismatched=len(output_off),
        per_user_p10=percentile(per_user, 10) if per_user else None,
        output_tokens=sum(r.output_tokens for r in done), seconds=seconds,
        good=sum(1 for r in records if meets_slo(r, slo)),
        ttft=latency_stats(ttfts) if ttfts else None,
        tpot=latency_stats(per_token) if per_token else None, itl=latency_stats(gaps) if gaps else None,
        e2el=latency_stats(e2els) if e2els else None,
        per_user=latency_stats(per_user) if per_user else None,
        first_error=next((r.error for r in sorted(records, key=lambda r: r.seq) if r.error is not None), None))


def _latency(name: str, what: str, stats: LatencyStats, seconds: float, note: str) -> Metric:
    return Metric(name=name, value=stats.mean, unit="s", **latency_tail(stats),
                  iterations=stats.count, measured_seconds=seconds, note=note, statistic="mean",
                  convention=CONVENTIONS[what])


def _count(what: str, label: str, value: int, seconds: float, note: str) -> Metric:
    return Metric(name=metric_name(what, label), value=float(value), unit="requests", iterations=value,
                  measured_seconds=seconds, note=note, statistic="single", convention=CONVENTIONS[what])


def point_metrics(stats: PointStats, window: tuple[float, float], devices: int, slo: SloBounds,
                  load_note: str, cautions: list[str] | None = None,
                  latency_cautions: list[str] | None = None) -> list[Metric]:
    """The point's metrics (names in this module's docstring). ``cautions``: what else makes its figures not
    plain, from the round (prompts resent, an open loop that sent late), added to output_tokens_per_s's warning;
    ``latency_cautions``: those that make its latencies not the load's (requests that waited for their prompt), also
    the warning of each latency, of tokens/s per user and of interactivity."""
    label, seconds = stats.label, stats.seconds
    tokens_per_s = stats.output_tokens / seconds
    problems = [f"{n} {what}" for n, what in ((stats.failed, "failed"), (stats.truncated, "truncated"),
                                               (stats.empty, "empty")) if n]
    warnings = [(f"{', '.join(problems)} of {stats.requests} requests"
                 + (f"; the first failed: {stats.first_error[:FIRST_ERROR_CHARS]}" if stats.first_error else ""))
                ] if problems else []
    warnings += cautions or []
    slo_text = (f"TTFT <= {slo.ttft_s:g} s, TPOT <= {slo.tpot_s:g} s"
                + (f", E2EL <= {slo.e2el_s:g} s" if slo.e2el_s is not None else ""))
    metrics = [
        Metric(name=metric_name("output_tokens_per_s", label), value=tokens_per_s, unit="tokens/s",
               iterations=stats.output_tokens, measured_seconds=seconds, window=list(window),
               work=float(stats.output_tokens), statistic="rate", convention=CONVENTIONS["output_tokens_per_s"],
               note=f"{load_note}; {stats.requests} requests, {stats.output_tokens} output tokens",
               warning="; ".join(warnings) or None),
        Metric(name=metric_name("total_tokens_per_s", label),
               value=(stats.input_tokens + stats.output_tokens) / seconds, unit="tokens/s",
               iterations=stats.input_tokens + stats.output_tokens, measured_seconds=seconds, statistic="rate",
               convention=CONVENTIONS["total_tokens_per_s"],
               note=f"({stats.input_tokens} input + {stats.output_tokens} output tokens) / {seconds:.4g} s",
               warning="; ".join(warnings) or None),
        Metric(name=metric_name("output_tokens_per_s_per_device", label), value=tokens_per_s / devices,
               unit="tokens/s", iterations=stats.output_tokens, measured_seconds=seconds, statistic="rate",
               convention=CONVENTIONS["output_tokens_per_s_per_device"],
               note=f"output tokens/s / {devices} device(s)"),
        Metric(name=metric_name("requests_per_s", label), value=stats.succeeded / seconds, unit="requests/s",
               iterations=stats.succeeded, measured_seconds=seconds, statistic="rate",
               convention=CONVENTIONS["requests_per_s"],
               note=f"{stats.succeeded} successful of {stats.requests} timed requests / {seconds:.4g} s"),
        Metric(name=metric_name("goodput_requests_per_s", label), value=stats.good / seconds, unit="requests/s",
               iterations=stats.good, measured_seconds=seconds, statistic="rate",
               convention=CONVENTIONS["goodput_requests_per_s"], note=f"requests meeting every SLO ({slo_text})"),
        Metric(name=metric_name("goodput_fraction", label), value=stats.good / stats.requests, unit="fraction",
               iterations=stats.requests, measured_seconds=seconds, statistic="single",
               convention=CONVENTIONS["goodput_fraction"], note=f"of all timed requests ({slo_text})"),
        Metric(name=metric_name("slo_p99_met", label), value=float(stats.slo_p99_met(slo)), unit="bool",
               iterations=stats.requests, measured_seconds=seconds, statistic="single",
               convention=CONVENTIONS["slo_p99_met"],
               note=f"p99 TTFT and p99 TPOT within the SLO ({slo_text}), no failed request; whether the requests "
                    "were enough to trust the p99s: slo_p99_confident"),
        Metric(name=metric_name("slo_p99_confident", label),
               value=float(stats.slo_p99_met(slo) and stats.slo_p99_confident), unit="bool",
               iterations=stats.requests, measured_seconds=seconds, statistic="single",
               convention=CONVENTIONS["slo_p99_confident"], note=_early_stopping_note(stats)),
        _count("failed_requests", label, stats.failed, seconds, "requests with an error"),
        _failed_fraction(stats),
        _count("truncated_requests", label, stats.truncated, seconds,
               "fewer output tokens than asked (exact output), or cut at max_tokens"),
        _count("empty_outputs", label, stats.empty, seconds, "successful requests with no output"),
        _count("token_count_mismatches", label, stats.mismatched, seconds,
               f"requests whose client token count differs from the server's usage ({stats.output_mismatched} by "
               f"the output, {stats.prompt_mismatched} by the prompt)"),
    ]
    if stats.mean_concurrency is not None:
        metrics.append(Metric(name=metric_name("mean_concurrency", label), value=stats.mean_concurrency,
                              unit="requests", iterations=stats.succeeded, measured_seconds=seconds, statistic="mean",
                              convention=CONVENTIONS["mean_concurrency"],
                              note=f"sum of E2EL of {stats.succeeded} successful requests / {seconds:.4g} s"))
    if stats.peak_concurrency is not None:
        metrics.append(Metric(name=metric_name("peak_concurrency", label), value=float(stats.peak_concurrency),
                              unit="requests", iterations=stats.requests, measured_seconds=seconds,
                              statistic="single", convention=CONVENTIONS["peak_concurrency"],
                              note=f"the most of {stats.requests} timed requests in flight at once"))
    if stats.per_user is not None:
        p = stats.per_user
        metrics.append(Metric(name=metric_name("tokens_per_s_per_user", label), value=p.mean, unit="tokens/s",
                              p10=stats.per_user_p10, p50=p.p50, p90=p.p90, iterations=p.count,
                              measured_seconds=seconds, statistic="mean",
                              convention=CONVENTIONS["tokens_per_s_per_user"],
                              note="a request's output tokens / its E2EL; mean over requests; p10: the slowest "
                                   "10 % of users got at most this"))
    for what, stats_of, note in (
            ("ttft_s", stats.ttft, "time to first token: first output chunk - send"),
            ("tpot_s", stats.tpot, "time per output token after the first: (E2EL - TTFT) / (tokens - 1)"),
            ("itl_s", stats.itl, f"inter-token latency: every gap between output chunks, pooled; {chunks_note(stats)}"),
            ("e2el_s", stats.e2el, "end-to-end latency: end of stream - send")):
        if stats_of is not None:
            metrics.append(_latency(metric_name(what, label), what, stats_of, seconds, note))
    if stats.tpot is not None and stats.tpot.mean > 0:
        metrics.append(Metric(name=metric_name("interactivity", label), value=1.0 / stats.tpot.mean,
                              unit="tokens/s", iterations=stats.tpot.count, measured_seconds=seconds,
                              note="1 / mean TPOT", statistic="single", convention=CONVENTIONS["interactivity"]))
    bundled = bundled_chunks(stats)
    if bundled is not None:
        metrics = [m.model_copy(update={"warning": bundled}) if m.name == metric_name("itl_s", label) else m
                   for m in metrics]
    if latency_cautions:
        latency_names = {metric_name(what, label) for what in ("ttft_s", "tpot_s", "itl_s", "e2el_s",
                                                               "tokens_per_s_per_user", "interactivity")}
        metrics = [m.model_copy(update={"warning": "; ".join([*latency_cautions, *([m.warning] if m.warning else [])])})
                   if m.name in latency_names else m for m in metrics]
    return metrics


def bundled_chunks(stats: PointStats) -> str | None:
    """Where the server sent several output tokens per chunk (speculative decoding, a stream interval), what that makes
    of the point's ITL (PER_CHUNK_ITL, the same at every point); None where it streamed about a token per chunk, or
    where that is unknown."""
    per_chunk = stats.tokens_per_chunk
    return None if per_chunk is None or per_chunk < TOKENS_PER_CHUNK_FLAG else PER_CHUNK_ITL


def _counted(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def chunks_note(stats: PointStats) -> str:
    """The point's output tokens per chunk, as itl_s's note and the log say it."""
    per_chunk = stats.tokens_per_chunk
    left_out = (f"; {_counted(stats.chunk_counted, 'request')} counted in chunks left out"
                if stats.chunk_counted else "")
    if per_chunk is None:
        return ("output tokens per chunk unknown: output counted in chunks (no server usage, no tokenizer)"
                if stats.chunk_counted else "no output chunk")
    return (f"{_counted(stats.chunked_tokens, 'output token')} in {_counted(stats.output_chunks, 'chunk')}, "
            f"{per_chunk:.3g} per chunk{left_out}")


def _early_stopping_note(stats: PointStats) -> str:
    if not stats.early_stopping:
        return "no successful request: nothing to judge"
    return "MLPerf LoadGen's early stopping, requests a p99 verdict needs at 99 % confidence: " + "; ".join(
        f"{what.upper()}: {e.over} of {e.requests} over its bound, "
        + (f"needs {e.needed}" if e.needed is not None
           else "more than 1 % over: needs more than it has" if e.over > (1.0 - EARLY_STOPPING_PERCENTILE) * e.requests
           else "too many over to work out")
        for what, e in stats.early_stopping.items())


def _failed_fraction(stats: PointStats) -> Metric:
    share = stats.failed / stats.requests
    return Metric(name=metric_name("failed_fraction", stats.label), value=share, unit="fraction",
                  iterations=stats.requests, measured_seconds=stats.seconds, statistic="single",
                  convention=CONVENTIONS["failed_fraction"],
                  note=f"failed / all timed requests (flagged above {FAILED_FLAG_FRACTION:.0%}: the p99 shown would "
                       "not be the load's)",
                  # A failed point's only warning (a measured point's is on its output_tokens_per_s, said once)
                  warning=(f"{stats.failed} of {stats.requests} requests failed"
                           + (f"; the first: {stats.first_error[:FIRST_ERROR_CHARS]}" if stats.first_error else "")
                           if stats.failed_point else None))


def failed_point_metrics(stats: PointStats) -> list[Metric]:
    """A point whose every timed request failed: its count and failed_fraction (1.0, the first error as its
    warning) only; no throughput, latency or goodput, so that it is never drawn as a point of the curve."""
    return [_count("failed_requests", stats.label, stats.failed, stats.seconds,
                   "requests with an error: every timed request of the point (a failed point)"),
            _failed_fraction(stats)]


def failed_point_message(stats: PointStats) -> str:
    first = " ".join((stats.first_error or "no error recorded").split())[:FIRST_ERROR_CHARS]  # one line
    return f"point {stats.label}: all {stats.requests} timed requests failed; the first: {first}"


def quality_metrics(label: str, records: list[RequestRecord], references: dict[int, str]) -> list[Metric]:
    """Exact match and ROUGE of the outputs of prompts that have a reference (failed requests score 0)."""
    scored = [(r.output_text if r.ok else "", references[r.prompt_index]) for r in records
              if r.prompt_index in references]
    if not scored:
        return []
    from flagperf.generate.prompts import rouge_scores

    exact = sum(1 for out, ref in scored if out.strip() == ref.strip()) / len(scored)
    metrics = [Metric(name=metric_name("exact_match", label), value=exact, unit="fraction", iterations=len(scored),
                      statistic="single", convention=CONVENTIONS["exact_match"],
                      note="outputs equal to the reference (whitespace at the ends ignored)")]
    scores = rouge_scores([o for o, _ in scored], [r for _, r in scored])
    metrics += [Metric(name=metric_name(key, label), value=value, unit="F1", iterations=len(scored),
                       statistic="single", convention=CONVENTIONS["rouge"],
                       note="rouge-score F1 (stemmed) of the outputs against the references, mean")
                for key, value in scores.items() if not math.isnan(value)]
    return metrics
