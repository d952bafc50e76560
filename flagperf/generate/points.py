"""The serving metrics of one point, from its timed requests (flagperf.generate.loadgen.RequestRecord).

A point is a closed-loop concurrency C or an open-loop request rate R. Its label names its metrics:
``<what>@c<C>`` (c4) or ``<what>@r<R>`` (R written with Python's ``g`` format: r2, r0.5, r12.5). Every
figure below is one Metric of result.json; docs/serving.md repeats the table.

  output_tokens_per_s               output tokens of the successful requests / the point's duration (first
                                    send to last end); carries ``window`` (epoch start, end) and ``work``
                                    (the output tokens), so the run summary computes energy per output token
                                    from the monitors (energy_per_work, J/token)
  output_tokens_per_s_per_device    the same / devices (tensor_parallel x nodes, or the endpoint's devices)
  tokens_per_s_per_user             per request: output tokens / E2EL; mean (p50 p90 p99 over requests)
  interactivity                     1 / mean TPOT (tokens/s one user sees while decoding; InferenceX's axis)
  requests_per_s                    successful requests / the point's duration
  ttft_s  tpot_s  itl_s  e2el_s     mean, p50, p90, p99 (seconds) over successful requests:
                                    TTFT = first content chunk - send; E2EL = end of stream - send;
                                    TPOT = (E2EL - TTFT) / (output tokens - 1), requests of >= 2 tokens;
                                    ITL = every gap between consecutive content chunks, pooled
  goodput_requests_per_s            requests meeting every SLO / the point's duration (vLLM's goodput)
  goodput_fraction                  requests meeting every SLO / all timed requests (failed ones included)
  slo_p99_met                       1 when p99 TTFT <= slo.ttft_s and p99 TPOT <= slo.tpot_s (and p99 E2EL
                                    <= slo.e2el_s when given) and no request failed, else 0 (MLPerf's check)
  failed_requests                   requests with an error (HTTP status, broken stream, no event)
  failed_fraction                   failed requests / all timed requests (iterations: the timed requests)
  truncated_requests                fewer output tokens than asked with exact output, or finish_reason
                                    "length" without it (the answer was cut)
  empty_outputs                     successful requests with no output token
  token_count_mismatches            requests whose client count differs from the server's usage
  exact_match, rouge1/rouge2/rougeL with a prompts file that has references (outputs vs references)

Output tokens per request are the server's usage where it sent one, else the client's count. A point with
failed, truncated or empty requests carries a ``warning`` on output_tokens_per_s (the report shows it).

A point whose every timed request failed is a **failed point** (``failed_point_metrics``): it has no throughput,
latency or goodput (a 0 would draw as a point of the curve), only failed_requests and failed_fraction (1.0, with
the first error as its warning); the round fails after its other points, naming it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from flagperf.generate.loadgen import RequestRecord
from flagperf.results.metrics import LatencyStats, latency_stats
from flagperf.results.schema import Metric
from flagperf.results.serving import FAILED_FLAG_FRACTION

FIRST_ERROR_CHARS = 200  # of the first failed request's error, in the point's warning


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

    @property
    def failed_point(self) -> bool:
        """Every timed request failed: nothing was measured but the failure."""
        return self.succeeded == 0

    def slo_p99_met(self, slo: SloBounds) -> bool:
        if self.failed or self.ttft is None:
            return False
        return (self.ttft.p99 <= slo.ttft_s and (self.tpot is None or self.tpot.p99 <= slo.tpot_s)
                and (slo.e2el_s is None or (self.e2el is not None and self.e2el.p99 <= slo.e2el_s)))


def point_stats(label: str, records: list[RequestRecord], seconds: float, slo: SloBounds) -> PointStats:
    if not records or seconds <= 0:
        raise ValueError("a point needs requests and a positive duration")
    done = [r for r in records if r.ok]
    timed = [r for r in done if r.ttft_s is not None and r.e2el_s is not None]
    per_token = [t for t in (tpot(r) for r in timed) if t is not None]
    gaps = [b - a for r in timed for a, b in zip(r.chunk_times_s, r.chunk_times_s[1:], strict=False)]
    per_user = [r.output_tokens / r.e2el_s for r in timed if r.e2el_s]
    mismatched = sum(1 for r in done if r.output_tokens_usage is not None and r.output_tokens_client is not None
                     and r.output_tokens_usage != r.output_tokens_client)
    return PointStats(
        label=label, requests=len(records), succeeded=len(done), failed=len(records) - len(done),
        truncated=sum(1 for r in records if is_truncated(r)),
        empty=sum(1 for r in done if r.output_tokens == 0), mismatched=mismatched,
        output_tokens=sum(r.output_tokens for r in done), seconds=seconds,
        good=sum(1 for r in records if meets_slo(r, slo)),
        ttft=latency_stats([r.ttft_s for r in timed if r.ttft_s is not None]) if timed else None,
        tpot=latency_stats(per_token) if per_token else None, itl=latency_stats(gaps) if gaps else None,
        e2el=latency_stats([r.e2el_s for r in timed if r.e2el_s is not None]) if timed else None,
        per_user=latency_stats(per_user) if per_user else None,
        first_error=next((r.error for r in sorted(records, key=lambda r: r.seq) if r.error is not None), None))


def _latency(name: str, stats: LatencyStats, seconds: float, note: str) -> Metric:
    return Metric(name=name, value=stats.mean, unit="s", p50=stats.p50, p90=stats.p90, p99=stats.p99,
                  iterations=stats.count, measured_seconds=seconds, note=note, statistic="mean")


def _count(name: str, value: int, seconds: float, note: str) -> Metric:
    return Metric(name=name, value=float(value), unit="requests", iterations=value, measured_seconds=seconds,
                  note=note, statistic="single")


def point_metrics(stats: PointStats, window: tuple[float, float], devices: int, slo: SloBounds,
                  load_note: str) -> list[Metric]:
    """The point's metrics (names in this module's docstring)."""
    label, seconds = stats.label, stats.seconds
    tokens_per_s = stats.output_tokens / seconds
    problems = [f"{n} {what}" for n, what in ((stats.failed, "failed"), (stats.truncated, "truncated"),
                                               (stats.empty, "empty")) if n]
    slo_text = (f"TTFT <= {slo.ttft_s:g} s, TPOT <= {slo.tpot_s:g} s"
                + (f", E2EL <= {slo.e2el_s:g} s" if slo.e2el_s is not None else ""))
    metrics = [
        Metric(name=metric_name("output_tokens_per_s", label), value=tokens_per_s, unit="tokens/s",
               iterations=stats.output_tokens, measured_seconds=seconds, window=list(window),
               work=float(stats.output_tokens), statistic="rate",
               note=f"{load_note}; {stats.requests} requests, {stats.output_tokens} output tokens",
               warning=(f"{', '.join(problems)} of {stats.requests} requests"
                        + (f"; the first failed: {stats.first_error[:FIRST_ERROR_CHARS]}" if stats.first_error else "")
                        if problems else None)),
        Metric(name=metric_name("output_tokens_per_s_per_device", label), value=tokens_per_s / devices,
               unit="tokens/s", iterations=stats.output_tokens, measured_seconds=seconds, statistic="rate",
               note=f"output tokens/s / {devices} device(s)"),
        Metric(name=metric_name("requests_per_s", label), value=stats.succeeded / seconds, unit="requests/s",
               iterations=stats.succeeded, measured_seconds=seconds, statistic="rate"),
        Metric(name=metric_name("goodput_requests_per_s", label), value=stats.good / seconds, unit="requests/s",
               iterations=stats.good, measured_seconds=seconds, statistic="rate",
               note=f"requests meeting every SLO ({slo_text})"),
        Metric(name=metric_name("goodput_fraction", label), value=stats.good / stats.requests, unit="fraction",
               iterations=stats.requests, measured_seconds=seconds, statistic="single",
               note=f"of all timed requests ({slo_text})"),
        Metric(name=metric_name("slo_p99_met", label), value=float(stats.slo_p99_met(slo)), unit="bool",
               iterations=stats.requests, measured_seconds=seconds, statistic="single",
               note=f"p99 TTFT and p99 TPOT within the SLO ({slo_text}), no failed request"),
        _count(metric_name("failed_requests", label), stats.failed, seconds, "requests with an error"),
        _failed_fraction(stats),
        _count(metric_name("truncated_requests", label), stats.truncated, seconds,
               "fewer output tokens than asked (exact output), or cut at max_tokens"),
        _count(metric_name("empty_outputs", label), stats.empty, seconds, "successful requests with no output"),
        _count(metric_name("token_count_mismatches", label), stats.mismatched, seconds,
               "requests whose client token count differs from the server's usage"),
    ]
    if stats.per_user is not None:
        p = stats.per_user
        metrics.append(Metric(name=metric_name("tokens_per_s_per_user", label), value=p.mean, unit="tokens/s",
                              p50=p.p50, p90=p.p90, p99=p.p99, iterations=p.count, measured_seconds=seconds,
                              note="a request's output tokens / its E2EL; mean over requests", statistic="mean"))
    for what, stats_of, note in (
            ("ttft_s", stats.ttft, "time to first token: first content chunk - send"),
            ("tpot_s", stats.tpot, "time per output token after the first: (E2EL - TTFT) / (tokens - 1)"),
            ("itl_s", stats.itl, "inter-token latency: every gap between content chunks, pooled"),
            ("e2el_s", stats.e2el, "end-to-end latency: end of stream - send")):
        if stats_of is not None:
            metrics.append(_latency(metric_name(what, label), stats_of, seconds, note))
    if stats.tpot is not None and stats.tpot.mean > 0:
        metrics.append(Metric(name=metric_name("interactivity", label), value=1.0 / stats.tpot.mean,
                              unit="tokens/s", iterations=stats.tpot.count, measured_seconds=seconds,
                              note="1 / mean TPOT", statistic="single"))
    return metrics


def _failed_fraction(stats: PointStats) -> Metric:
    share = stats.failed / stats.requests
    return Metric(name=metric_name("failed_fraction", stats.label), value=share, unit="fraction",
                  iterations=stats.requests, measured_seconds=stats.seconds,
                  note=f"failed / all timed requests (flagged above {FAILED_FLAG_FRACTION:.0%}: the p99 shown would "
                       "not be the load's)",
                  # A failed point's only warning (a measured point's is on its output_tokens_per_s, said once)
                  warning=(f"{stats.failed} of {stats.requests} requests failed"
                           + (f"; the first: {stats.first_error[:FIRST_ERROR_CHARS]}" if stats.first_error else "")
                           if stats.failed_point else None))


def failed_point_metrics(stats: PointStats) -> list[Metric]:
    """A point whose every timed request failed: its count and failed_fraction (1.0, the first error as its
    warning) only; no throughput, latency or goodput, so that it is never drawn as a point of the curve."""
    return [_count(metric_name("failed_requests", stats.label), stats.failed, stats.seconds,
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
                      statistic="single",
                      note="outputs equal to the reference (whitespace at the ends ignored)")]
    scores = rouge_scores([o for o, _ in scored], [r for _, r in scored])
    metrics += [Metric(name=metric_name(key, label), value=value, unit="F1", iterations=len(scored),
                       statistic="single",
                       note="rouge-score F1 (stemmed) of the outputs against the references, mean")
                for key, value in scores.items() if not math.isnan(value)]
    return metrics
