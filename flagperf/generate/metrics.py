"""The serving metrics, defined once, from per-request traces of one concurrency level.

  TTFT      first token time - arrival, per request
  TPOT      (last token time - first token time) / (output tokens - 1), per request (time per output token
            after the first)
  ITL       every gap between consecutive tokens of a request, pooled over requests (inter-token latency)
  output tokens/s        all output tokens / the level's timed wall time (the device's throughput)
  tokens/s per user      a request's output tokens / (last token time - arrival), over requests: mean, p10 (the
                         slow tail: of a rate, low is slow), p50, p90; no p99 (a rate's p99 is its fastest 1 %)
  requests/s             completed requests / the level's timed wall time
  MFU       the level's model FLOPs / its timed wall time / the precision's peak FLOP/s, FLOPs counted as in
            every family (flagperf.results.metrics.TransformerFlops): each request's prefill and every decode
            step, 2 x matrix-product parameters per token plus the attention term over its context
Energy per output token follows from the output tokens/s metric's window and work (the monitors' energy over
that window / output tokens, in the run summary).
"""

from __future__ import annotations

from dataclasses import dataclass

from flagperf.generate.engines import RequestTrace
from flagperf.results.metrics import (
    LATENCY_PERCENTILES,
    LatencyStats,
    TransformerFlops,
    latency_stats,
    latency_tail,
    model_flops_utilisation,
    percentile,
)
from flagperf.results.schema import Metric, Peak

LEVEL_SEPARATOR = "@c"  # metric names: <what>@c<concurrency>, e.g. ttft_s@c32
MFU_CONVENTION = "MFU = model FLOPs of the level (prefill and decode) / timed seconds / {key} peak; FLOPs {flops}"
# How each figure is counted (its Metric.convention). The names are the serving engines' (flagperf.generate.points),
# and so are the formulas, but the times are the engine's, taken in the case process: a request's arrival is when it
# was handed to the engine (its batch's start), its end its last token. A serving engine's are the client's over
# HTTP (send, output chunks, the end of the response stream): each convention says where they differ.
ARRIVAL = ("arrival: the request handed to the engine (with its batch, or serving continuously on its own), host "
           "perf_counter in the case process")
LEVEL_TIME = ("the level's timed wall time (host perf_counter, from handing its first requests to the engine to the "
              "engine returning its last ones)")
PERCENTILES = LATENCY_PERCENTILES
CONVENTIONS = {
    "output_tokens_per_s": f"output tokens of the level's timed requests (each exactly max_new_tokens) / {LEVEL_TIME}",
    "tokens_per_s_per_user": f"per request: output tokens / (last token - arrival), the engine's E2EL; {ARRIVAL}; "
                             "mean over requests; p10 is the slow tail (of a rate, low is slow) and p90 the fast "
                             "side; no p99 (a rate's p99 is its fastest 1 %). A serving engine's divides by the "
                             "client's E2EL, send to the end of the response stream",
    "requests_per_s": f"timed requests (every one completes) / {LEVEL_TIME}",
    "ttft_s": f"time to first token: first token - arrival; {ARRIVAL}; {PERCENTILES}. A serving engine's runs from the "
              "client's send to the first output chunk it receives",
    "tpot_s": "time per output token after the first: (last token - first token) / (output tokens - 1) per request; "
              f"{PERCENTILES}. A serving engine's is (E2EL - TTFT) / (output tokens - 1), its E2EL ending at the end "
              "of the response stream",
    "itl_s": f"inter-token latency: every gap between consecutive tokens of a request, pooled; {PERCENTILES}. A "
             "serving engine's gaps are between output chunks as the client receives them (a chunk may carry "
             "several tokens)",
    "e2el_s": f"end-to-end latency: last token - arrival; {ARRIVAL}; {PERCENTILES}. A serving engine's runs from the "
              "client's send to the end of the response stream (its last event)",
    "rouge": "rouge-score F1 (stemmed) of the decoded outputs of the timed requests against the references, mean",
}


def level_name(what: str, concurrency: int) -> str:
    return f"{what}{LEVEL_SEPARATOR}{concurrency}"


@dataclass(frozen=True)
class LevelStats:
    concurrency: int
    requests: int
    output_tokens: int
    seconds: float
    ttft: LatencyStats
    tpot: LatencyStats | None  # None when every request has a single output token
    itl: LatencyStats | None
    per_user: LatencyStats  # tokens/s per user over requests (a rate: its p10 is the slow tail)
    e2e: LatencyStats
    request_tokens: tuple[tuple[int, int], ...] = ()  # (prompt, output) tokens of each request
    per_user_p10: float | None = None

    def model_flops(self, flops: TransformerFlops) -> float:
        return sum(flops.generation(prompt, output) for prompt, output in self.request_tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds


def level_stats(concurrency: int, traces: list[RequestTrace], seconds: float) -> LevelStats:
    if not traces or seconds <= 0:
        raise ValueError("a level needs requests and a positive duration")
    done = [t for t in traces if t.token_times]
    if len(done) != len(traces):
        raise ValueError(f"{len(traces) - len(done)} request(s) produced no token")
    ttft = [t.token_times[0] - t.arrival for t in done]
    e2e = [t.token_times[-1] - t.arrival for t in done]
    tpot = [(t.token_times[-1] - t.token_times[0]) / (t.output_tokens - 1) for t in done if t.output_tokens > 1]
    itl = [b - a for t in done for a, b in zip(t.token_times, t.token_times[1:], strict=False)]
    per_user = [t.output_tokens / latency for t, latency in zip(done, e2e, strict=True) if latency > 0]
    return LevelStats(concurrency=concurrency, requests=len(done), output_tokens=sum(t.output_tokens for t in done),
                      seconds=seconds, ttft=latency_stats(ttft), tpot=latency_stats(tpot) if tpot else None,
                      itl=latency_stats(itl) if itl else None, per_user=latency_stats(per_user or [0.0]),
                      e2e=latency_stats(e2e), per_user_p10=percentile(per_user or [0.0], 10),
                      request_tokens=tuple((t.prompt_tokens, t.output_tokens) for t in done))


def _latency(name: str, what: str, stats: LatencyStats, seconds: float, note: str) -> Metric:
    return Metric(name=name, value=stats.mean, unit="s", **latency_tail(stats),
                  iterations=stats.count, measured_seconds=seconds, note=note, statistic="mean",
                  convention=CONVENTIONS[what])


def level_metrics(stats: LevelStats, window: tuple[float, float], flops: TransformerFlops, precision: str,
                  peak: Peak | None) -> list[Metric]:
    """The level's metrics; output tokens/s carries the window and work, so energy per token follows."""
    c, seconds = stats.concurrency, stats.seconds
    per_output_token = stats.model_flops(flops) / stats.output_tokens  # prefill included: MFU is all the work
    mfu = model_flops_utilisation(stats.tokens_per_s, per_output_token, peak.value if peak else None,
                                  peak.unit if peak else "", dense=peak.dense if peak else True)
    metrics = [
        Metric(name=level_name("output_tokens_per_s", c), value=stats.tokens_per_s, unit="tokens/s",
               iterations=stats.output_tokens, measured_seconds=seconds, window=list(window),
               work=float(stats.output_tokens), mfu=mfu, mfu_peak_key=precision if peak else None, mfu_peak=peak,
               convention=f"{CONVENTIONS['output_tokens_per_s']}; "
                          + MFU_CONVENTION.format(key=precision, flops=flops.convention), statistic="rate",
               note=f"{stats.requests} requests, {c} at a time, {stats.output_tokens} output tokens"),
        Metric(name=level_name("tokens_per_s_per_user", c), value=stats.per_user.mean,
               unit="tokens/s", p10=stats.per_user_p10, p50=stats.per_user.p50, p90=stats.per_user.p90,
               iterations=stats.requests, measured_seconds=seconds, statistic="mean",
               convention=CONVENTIONS["tokens_per_s_per_user"],
               note="a request's output tokens / (last token - arrival); mean over requests; p10: the slowest 10 % "
                    "of users got at most this"),
        Metric(name=level_name("requests_per_s", c), value=stats.requests_per_s, unit="requests/s",
               iterations=stats.requests, measured_seconds=seconds, statistic="rate",
               convention=CONVENTIONS["requests_per_s"]),
        _latency(level_name("ttft_s", c), "ttft_s", stats.ttft, seconds, "time to first token: first token - arrival"),
        _latency(level_name("e2el_s", c), "e2el_s", stats.e2e, seconds, "end-to-end latency: last token - arrival"),
    ]
    if stats.tpot is not None and stats.itl is not None:
        metrics += [_latency(level_name("tpot_s", c), "tpot_s", stats.tpot, seconds,
                             "time per output token after the first: (last - first token) / (tokens - 1)"),
                    _latency(level_name("itl_s", c), "itl_s", stats.itl, seconds,
                             "inter-token latency: every gap, pooled")]
    return metrics


def rouge_metrics(concurrency: int, scores: dict[str, float], count: int) -> list[Metric]:
    return [Metric(name=level_name(key, concurrency), value=value, unit="F1", iterations=count, statistic="single",
                   convention=CONVENTIONS["rouge"],
                   note="rouge-score F1 (stemmed) of the outputs against the file's references, mean")
            for key, value in scores.items()]
