"""The generate family in the run report: the per-point tables, the Pareto plot (output tokens/s per device
against tokens/s per user) and the latency-against-throughput plots. docs/serving-report.md explains them.

A point is a closed-loop concurrency (metrics ``<what>@c<C>``) or an open-loop request rate (``<what>@r<R>``);
the names are flagperf.generate.points' (serving engines) and flagperf.generate.metrics' (the batch engines
hf and vllm, ``@c<level>`` only). Per point, each figure is the mean over the rounds (and hosts) that measured
it; request counts (failed, truncated, empty, count mismatches) are summed, never averaged away; the SLO
verdict is met only where every round met it. Energy per output token comes from the summary rows (the
monitors' energy over the point's window / its output tokens). The server's own Prometheus figures are the
differences between the text scraped before and after the point (server_metrics/<label>.{before,after}.prom
in the round folder), where the engine exposes them.

A series is one case of one run (its engine and precision named beside it): one line in the plots.
Interactivity is 1 / mean TPOT (InferenceX's axis), taken from the ``interactivity`` metric, or computed from
``tpot_s`` for the batch engines; throughput per device is ``output_tokens_per_s_per_device``, or
``output_tokens_per_s`` for the batch engines (one device per case process).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from flagperf.errors import ConfigError
from flagperf.results.bounded import read_bounded, read_json_file
from flagperf.results.markup import md_text, percent
from flagperf.results.markup import number as figure_text
from flagperf.results.plotting import save_png
from flagperf.results.schema import RESULT_FILE, UPPER_ESTIMATE, read_result

POINT_METRIC = re.compile(r"^(?P<what>.+)@(?P<kind>[cr])(?P<level>[0-9][0-9.e+-]*)$")
FAMILY = "generate"
SERVER_METRICS = "server_metrics"  # flagperf.generate.serve writes the scrapes there (not imported: no torch here)
SERVING_FILE = "serving.json"  # flagperf.generate.serve's record of the round: its prompts, server, client
SETUP_BYTES = 1 << 20  # a serving.json is a few KiB; a bigger one is not read for the report's setup line
MAX_SCRAPE_BYTES = 16 << 20  # a server's metrics page is KiB to a few MiB
COUNTS = ("failed_requests", "truncated_requests", "empty_outputs", "token_count_mismatches")
# Above this share of failed timed requests a point is flagged: its percentiles are over the successful requests,
# and a failed request is mostly a slow one (a timeout, a refusal under load), so once more than 1 % failed the
# load's p99 lies among the failed ones and the p99 shown (the SLO's statistic) is not the load's p99.
FAILED_FLAG_FRACTION = 0.01
QUALITY = (("rougeL", "ROUGE-L"), ("exact_match", "exact match"))
# A prompts line's wording that changed over versions and says nothing of the work: a synthetic set's count (older
# records: "8 synthetic prompts"), and how the lengths are labelled (newer: "... tokens with the chat template").
SYNTHETIC_COUNT = re.compile(r"^\d+ (?=synthetic prompts)")
WORKLOAD_WORDING = re.compile(r" (with the chat template|before the chat template|with special tokens)(?=, )")
# What each point keeps of a figure, as the mean over rounds: p10 is a rate's slow tail (tokens_per_s_per_user).
FIGURE_KEYS = ("value", "p10", "p50", "p90", "p99", "mfu")
# The server's figures, by the part of a Prometheus sample's name after its engine prefix (vllm:, sglang:).
SERVER_COUNTERS = {"output_tokens": ("generation_tokens_total",), "prompt_tokens": ("prompt_tokens_total",),
                   "requests": ("request_success_total", "num_requests_total")}
SERVER_MEANS = {"ttft_s": ("time_to_first_token_seconds",),
                "tpot_s": ("request_time_per_output_token_seconds", "time_per_output_token_seconds",
                           "inter_token_latency_seconds"),
                "e2el_s": ("e2e_request_latency_seconds",)}


@dataclass
class ServingPoint:
    """One point of one case, over the rounds that measured it."""

    case: str
    kind: str  # "concurrency" or "rate"
    level: float
    label: str
    engine: str
    precision: str
    rounds: int = 0
    failed_rounds: int = 0  # rounds that stopped later (their finished points are kept) and say so
    figures: dict[str, dict[str, float | None]] = field(default_factory=dict)  # what -> value/p10/p50/p90/p99/mfu
    counts: dict[str, int] = field(default_factory=dict)  # summed over rounds
    requests: int | None = None  # timed requests, summed over rounds
    output_tokens: int | None = None  # output tokens of the successful timed requests, summed over rounds
    slo_met_rounds: int = 0
    slo_rounds: int = 0  # rounds that gave a verdict (serving engines)
    confident_rounds: int = 0  # rounds whose slo_p99_confident is 1 (MLPerf's early-stopping count met)
    confident_known: int = 0  # rounds that carry slo_p99_confident (results before it have none)
    slo: dict[str, Any] | None = None
    energy_per_token_j: float | None = None
    server: dict[str, float] = field(default_factory=dict)  # the server's Prometheus figures, mean over rounds
    mfu_estimated: bool = False  # the MFU is against a peak that is a lower bound: an upper estimate
    setup: dict[str, Any] = field(default_factory=dict)  # the first round's serving.json less its points
    failed_point_rounds: int = 0  # rounds in which every timed request of the point failed
    first_error: str | None = None  # of the first such round (its failed_fraction's warning)

    @property
    def failed_point(self) -> bool:
        """Every timed request failed in some round: left out of the curves, the frontier and goodput."""
        return self.failed_point_rounds > 0

    @property
    def failed_share(self) -> float | None:
        """Failed / all timed requests, over the rounds."""
        return None if not self.requests else self.counts.get("failed_requests", 0) / self.requests

    @property
    def flagged(self) -> bool:
        """Failed requests above FAILED_FLAG_FRACTION, or any truncated, empty or miscounted request."""
        return bool((self.failed_share or 0.0) > FAILED_FLAG_FRACTION
                    or any(self.counts.get(k) for k in COUNTS if k != "failed_requests"))

    @property
    def workload(self) -> str | None:
        """What was sent (the prompt set with its token lengths, and the API): two runs compare only where
        this is the same."""
        prompts = self.setup.get("prompts")
        return f"{prompts}; {self.setup.get('api', '?')} API" if isinstance(prompts, str) else None

    @property
    def workload_facts(self) -> dict[str, Any]:
        """What was sent, as two runs are compared on it (flagperf.results.compare.workloads_differ): the API;
        ``set``, from serving.json's prompt_set, where the prompts came from, the seed, and the mean token lengths of
        the text, asked out, and as the server counted them where it sent usage; ``line``, the prompts line with the
        wording that changed over versions taken out (a synthetic set's count, how its lengths are labelled);
        ``exact_output``, whether the requests forced max_new_tokens out. Each None where the round did not record
        it."""
        recorded = self.setup.get("prompt_set")
        prompts = self.setup.get("prompts")
        client = self.setup.get("client")
        # exact_output: the engine's fields that force max_new_tokens were sent (None there: it stopped at EOS)
        exact = (client["exact_output_fields"] is not None
                 if isinstance(client, dict) and "exact_output_fields" in client else None)
        facts: dict[str, Any] = {"api": self.setup.get("api"), "set": None, "exact_output": exact,
                                 "line": WORKLOAD_WORDING.sub("", SYNTHETIC_COUNT.sub("", prompts))
                                 if isinstance(prompts, str) else None}
        if isinstance(recorded, dict) and isinstance(recorded.get("source"), str):
            def mean(key: str) -> float | None:
                spread = recorded.get(key)
                value = spread.get("mean") if isinstance(spread, dict) else None
                return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

            facts["set"] = {"source": recorded["source"], "seed": recorded.get("seed"),
                            "input_tokens": mean("input_tokens"), "output_tokens_asked": mean("output_tokens_asked"),
                            "input_tokens_server": mean("input_tokens_server")}
        return facts

    @property
    def served_by(self) -> str | None:
        """The server: the command the round started (with its packages' versions), or the endpoint."""
        server, endpoint = self.setup.get("server"), self.setup.get("endpoint")
        if isinstance(server, dict) and isinstance(server.get("argv"), list):
            packages = server.get("packages") if isinstance(server.get("packages"), dict) else {}
            versions = ", ".join(f"{k} {v}" for k, v in packages.items() if v)
            # The engine folder's words on prefix caching ("on: ..."), its verdict only; none in older records.
            cache = server.get("prefix_cache")
            cached = f"; prefix cache {cache.split(':', 1)[0].strip()[:20]}" if isinstance(cache, str) and cache else ""
            return " ".join(str(w) for w in server["argv"]) + (f" ({versions})" if versions else "") + cached
        if isinstance(endpoint, dict):
            version = endpoint.get("version")
            shown = version.get("version") if isinstance(version, dict) else None
            return (f"endpoint {endpoint.get('base_url')}, model {endpoint.get('model')}"
                    + (f", version {shown}" if shown else ""))
        return None

    def figure(self, what: str, key: str = "value") -> float | None:
        return self.figures.get(what, {}).get(key)

    @property
    def at_endpoint(self) -> bool:
        """Measured at a running server: the engine is its API's dialect; its precision is the endpoint's, unknown."""
        return isinstance(self.setup.get("endpoint"), dict)

    @property
    def served_as(self) -> str:
        return f"{self.engine}'s API at an endpoint" if self.at_endpoint else f"{self.engine}, {self.precision}"

    @property
    def series(self) -> str:
        return f"{self.case} ({self.served_as})"

    @property
    def per_device(self) -> float | None:
        value = self.figure("output_tokens_per_s_per_device")
        return value if value is not None else self.figure("output_tokens_per_s")

    @property
    def interactivity(self) -> float | None:
        value = self.figure("interactivity")
        if value is not None:
            return value
        tpot = self.figure("tpot_s")
        return 1.0 / tpot if tpot else None

    @property
    def slo_met(self) -> bool | None:
        """Every round's p99 check met (None: no verdict recorded, e.g. a batch engine)."""
        return None if not self.slo_rounds else self.slo_met_rounds == self.slo_rounds

    @property
    def slo_confident(self) -> bool | None:
        """Every round had the requests MLPerf's early stopping needs for its p99 verdict; False where a round that
        says had too few; None where no round, or not every round, says (results before slo_p99_confident)."""
        if not self.confident_known:
            return None
        if self.confident_rounds < self.confident_known:
            return False
        return True if self.confident_known == self.slo_rounds else None

    @property
    def goodput(self) -> float | None:
        return self.figure("goodput_requests_per_s")


def parse_label(label: str) -> tuple[str, float]:
    kind, level = label[0], float(label[1:])
    return ("concurrency" if kind == "c" else "rate"), level


def _round_folders(run_dir: Path) -> Iterable[tuple[Path, Any]]:
    for path in sorted(run_dir.glob(f"*/round*/*_noderank*/{RESULT_FILE}")):
        try:
            result = read_result(path)
        except (OSError, ValueError):
            continue  # the summary lists unreadable files already
        if result.family == FAMILY:
            yield path.parent, result


def serving_points(run_dir: Path, rows: pd.DataFrame | None = None,
                   loaded: Iterable[tuple[Path, Any]] | None = None) -> list[ServingPoint]:
    """Every point of the run's generate cases, ordered by case, then concurrency points, then rates. loaded: the
    run's (round folder, result) pairs where the caller has read them already (else they are read here)."""
    points: dict[tuple[str, str], ServingPoint] = {}
    values: dict[tuple[str, str], dict[str, list[tuple[float | None, ...]]]] = {}
    servers: dict[tuple[str, str], list[dict[str, float]]] = {}
    rounds = _round_folders(run_dir) if loaded is None else ((f, r) for f, r in loaded if r.family == FAMILY)
    for folder, result in rounds:
        per_label: dict[str, list[Any]] = {}
        for m in result.metrics:
            match = POINT_METRIC.match(m.name)
            if match:
                per_label.setdefault(f"{match['kind']}{match['level']}", []).append((match["what"], m))
        for label, metrics in per_label.items():
            kind, level = parse_label(label)
            key = (result.case, label)
            point = points.setdefault(key, ServingPoint(
                case=result.case, kind=kind, level=level, label=label,
                engine=str(result.config.get("engine", "?")), precision=str(result.config.get("precision", "?")),
                slo=result.config.get("slo") if isinstance(result.config.get("slo"), dict) else None))
            point.rounds += 1
            point.failed_rounds += result.status != "success"
            if not point.setup:
                point.setup = round_setup(folder)
            figures = values.setdefault(key, {})
            counted_by_failed_fraction = any(w == "failed_fraction" for w, _ in metrics)
            for what, m in metrics:
                figures.setdefault(what, []).append(tuple(getattr(m, name) for name in FIGURE_KEYS))
                point.mfu_estimated = point.mfu_estimated or bool(m.mfu is not None and m.mfu_peak is not None
                                                                  and m.mfu_peak.estimated)
                if what == "output_tokens_per_s":
                    point.output_tokens = (point.output_tokens or 0) + m.iterations
                if what in COUNTS:
                    point.counts[what] = point.counts.get(what, 0) + int(m.value)
                elif what == "failed_fraction":  # its iterations are all timed requests
                    point.requests = (point.requests or 0) + m.iterations
                    if m.value >= 1.0:
                        point.failed_point_rounds += 1
                        point.first_error = point.first_error or m.warning
                elif what == "goodput_fraction" and not counted_by_failed_fraction:  # results before failed_fraction
                    point.requests = (point.requests or 0) + m.iterations
                elif what == "slo_p99_met":
                    point.slo_rounds += 1
                    point.slo_met_rounds += m.value >= 1.0
                elif what == "slo_p99_confident":
                    point.confident_known += 1
                    point.confident_rounds += m.value >= 1.0
            if not {"goodput_fraction", "failed_fraction"} & {w for w, _ in metrics}:  # a batch engine: all succeeded
                served = next((m.iterations for w, m in metrics if w == "requests_per_s"), None)
                if served is not None:
                    point.requests = (point.requests or 0) + served
            figures_of_server = server_figures(folder / SERVER_METRICS, label)
            if figures_of_server:
                servers.setdefault(key, []).append(figures_of_server)
    for key, point in points.items():
        for what, samples in values[key].items():
            point.figures[what] = {name: _mean(s[i] for s in samples) for i, name in enumerate(FIGURE_KEYS)}
        for scrape in servers.get(key, []):
            for name in scrape:
                point.server[name] = statistics.fmean(s[name] for s in servers[key] if name in s)
        if rows is not None and not rows.empty:
            mine = rows[(rows["case"] == point.case) & (rows["metric"] == f"output_tokens_per_s@{point.label}")]
            energy = pd.to_numeric(mine["energy_per_work"], errors="coerce").dropna()
            point.energy_per_token_j = float(energy.mean()) if len(energy) else None
    return sorted(points.values(), key=lambda p: (p.case, p.kind, p.level))


def serving_levels(run_dir: Path, rows: pd.DataFrame | None = None) -> list[dict[str, Any]]:
    """The concurrency points as plain dicts (case, concurrency, energy_per_token_j, figures by
    ``<what>.<value|p10|p50|p90|p99|mfu>``), for callers that read them as data."""
    out = []
    for p in serving_points(run_dir, rows):
        if p.kind == "concurrency":
            entry: dict[str, Any] = {"case": p.case, "concurrency": int(p.level), "rounds": p.rounds,
                                     "energy_per_token_j": p.energy_per_token_j}
            entry.update({f"{what}.{k}": v for what, fig in p.figures.items() for k, v in fig.items()})
            out.append(entry)
    return out


def round_setup(folder: Path) -> dict[str, Any]:
    """The round's serving.json without its points (what was sent, to which server, by which client), or {}."""
    try:  # a FIFO there would block the read: only a regular file is opened
        data = read_json_file(folder / SERVING_FILE, SETUP_BYTES, "a serving.json")
    except ConfigError:
        return {}
    return {k: v for k, v in data.items() if k != "points"} if isinstance(data, dict) else {}


PROMPTS_HEADER = ["case", "round", "host", "prompt stream positions", "first prompt", "requests planned",
                  "each sent once", "resent requests"]


def _position(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def round_prompts(run_dir: Path, loaded: Iterable[tuple[Path, Any]] | None = None) -> list[list[str]]:
    """A row per round of the run's generate cases (every round, not the first only): which prompts it sent, from its
    serving.json's prompt_set: the positions of its prompt stream it took (first to last), the prompt at its first
    (synthetic: the seed's sequence; a file: its entry), its planned requests, whether each was sent once, and how
    many resent a prompt. Rounds without a prompt_set (a failed round, an older record) are left out."""
    rows = []
    rounds = _round_folders(run_dir) if loaded is None else ((f, r) for f, r in loaded if r.family == FAMILY)
    for folder, result in rounds:
        recorded = round_setup(folder).get("prompt_set")
        if not isinstance(recorded, dict):
            continue
        first, taken = _position(recorded.get("first_position")), _position(recorded.get("positions_taken"))
        # none taken (a round whose every point failed before it sent): where it would have started
        span = "-" if first is None else (f"{first} to {first + taken - 1}" if taken else
                                          f"none (at {first})" if taken == 0 else f"from {first}")
        once = recorded.get("each_sent_once")
        host = result.host + (f" (node rank {result.node_rank})" if result.node_rank else "")
        index, planned, resent = (_position(recorded.get(key)) for key in (
            "first_index", "requests_planned", "repeated_requests"))
        rows.append([md_text(result.case), str(result.round), md_text(host), span,
                     "-" if index is None else str(index), "-" if planned is None else str(planned),
                     "-" if not isinstance(once, bool) else ("yes" if once else "no"),
                     "-" if resent is None else str(resent)])
    return sorted(rows, key=lambda r: (r[0], int(r[1]), r[2]))


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


# --- the server's own figures (Prometheus text) ---------------------------------------------------------------


def prometheus_totals(text: str) -> dict[str, float]:
    """Counter totals and histogram/summary sums and counts, summed over labels, by sample name without the
    engine's prefix (``vllm:generation_tokens_total`` -> ``generation_tokens_total``); gauges are left out
    (a value at one moment says nothing about the point)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.type not in ("counter", "histogram", "summary"):
            continue
        for sample in family.samples:
            if sample.name.endswith(("_total", "_sum", "_count")):
                name = sample.name.rsplit(":", 1)[-1]
                totals[name] = totals.get(name, 0.0) + float(sample.value)
    return totals


def server_figures(folder: Path, label: str) -> dict[str, float]:
    """The server's figures over one point: counter increases and histogram means between the scrapes taken
    before and after it. Nothing where the scrapes are missing or not Prometheus text."""
    try:
        # Bounded: a scrape larger than any metrics page (or a FIFO there) gives no figures, not a full memory.
        before = prometheus_totals(read_bounded(folder / f"{label}.before.prom", MAX_SCRAPE_BYTES).decode())
        after = prometheus_totals(read_bounded(folder / f"{label}.after.prom", MAX_SCRAPE_BYTES).decode())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    out: dict[str, float] = {}

    def delta(name: str) -> float | None:
        return after[name] - before.get(name, 0.0) if name in after else None

    for figure, names in SERVER_COUNTERS.items():
        found = next((d for d in (delta(n) for n in names) if d is not None), None)
        if found is not None:
            out[figure] = found
    for figure, names in SERVER_MEANS.items():
        for name in names:
            total, count = delta(f"{name}_sum"), delta(f"{name}_count")
            if total is not None and count:
                out[figure] = total / count
                break
    return out


# --- the SLO frontier -------------------------------------------------------------------------------------


def series_of(points: list[ServingPoint]) -> dict[str, list[ServingPoint]]:
    out: dict[str, list[ServingPoint]] = {}
    for p in points:
        out.setdefault(p.case, []).append(p)
    return out


def slo_frontier(points: list[ServingPoint]) -> ServingPoint | None:
    """The point of highest throughput per device among those meeting the SLO (every round's p99 check)."""
    met = [p for p in points if p.slo_met and p.per_device is not None and not p.failed_point]
    return max(met, key=lambda p: p.per_device or 0.0) if met else None


def slo_text(slo: dict[str, Any] | None) -> str:
    if not slo:
        return "no SLO recorded"
    text = f"p99 TTFT <= {slo.get('ttft_s'):g} s, p99 TPOT <= {slo.get('tpot_s'):g} s"
    if slo.get("e2el_s") is not None:
        text += f", p99 E2EL <= {slo['e2el_s']:g} s"
    return text + ", no failed request"


# --- the report section -----------------------------------------------------------------------------------


def _num(value: float | None, scale: float = 1.0, digits: int = 4) -> str:
    return "-" if value is None else figure_text(value * scale, digits)


def _ms(seconds: float | None) -> str:
    """Milliseconds as a reader compares them: whole from 100 ms (4460, never 4.46e+03), else 3 digits."""
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    return f"{ms:.0f}" if abs(ms) >= 100 else f"{ms:.3g}"


def _triple(point: ServingPoint, what: str) -> str:
    return " / ".join(_ms(point.figure(what, p)) for p in ("p50", "p90", "p99"))


def _where(point: ServingPoint) -> list[str]:
    return [point.case, f"{point.level:g}" if point.kind == "concurrency" else "-",
            f"{point.level:g}" if point.kind == "rate" else "-"]


def _requests(point: ServingPoint) -> str:
    base = "-" if point.requests is None else str(point.requests)
    problems = [f"{point.counts[k]} {word}" for k, word in (("failed_requests", "failed"),
                                                            ("truncated_requests", "truncated"),
                                                            ("empty_outputs", "empty"),
                                                            ("token_count_mismatches", "count mismatch"))
                if k in point.counts]
    if problems and point.counts.get("failed_requests") and point.failed_share is not None:
        problems[0] += f" = {percent(point.failed_share)}"  # the failed count comes first
    if point.failed_point:
        rounds = "" if point.failed_point_rounds == point.rounds else \
            f" in {point.failed_point_rounds} of {point.rounds} rounds"
        return f"{base} ({', '.join(problems)}) **failed point**{rounds}"
    if not problems:
        return base
    return f"{base} ({', '.join(problems)})" + (" **flagged**" if point.flagged else "")


def _per_user(point: ServingPoint) -> str:
    """Tokens/s per user: the mean, and its slow tail, p10, where the figure has one (results before it had none)."""
    p10 = point.figure("tokens_per_s_per_user", "p10")
    return _num(point.figure("tokens_per_s_per_user")) + (f" (p10 {_num(p10)})" if p10 is not None else "")


# A p99 met on fewer requests than MLPerf LoadGen's early stopping needs (slo_p99_confident 0): met, not publishable.
NOT_CONFIDENT = "not confident: fewer requests than MLPerf's early stopping needs"


def _verdict(point: ServingPoint) -> str:
    if point.failed_point:
        return "**failed**"
    if point.slo_met is None:
        return "-"
    word = "met" if point.slo_met else "**missed**"
    said = [] if point.slo_rounds == 1 else [f"{point.slo_met_rounds}/{point.slo_rounds} rounds"]
    if point.slo_met and point.slo_confident is False:  # a missed verdict needs no confidence to be read
        said.append(NOT_CONFIDENT)
    return word + (f" ({'; '.join(said)})" if said else "")


def _in_flight(point: ServingPoint) -> str:
    """What an open loop achieved: requests in flight on average, and at most (means over rounds); "-" elsewhere."""
    mean, peak = point.figure("mean_concurrency"), point.figure("peak_concurrency")
    if mean is None:
        return "-"
    return _num(mean) + (f" (peak {_num(peak)})" if peak is not None else "")


def _goodput(point: ServingPoint) -> str:
    if point.goodput is None:
        return "-"
    fraction = point.figure("goodput_fraction")
    return figure_text(point.goodput) + (f" ({percent(fraction)})" if fraction is not None else "")


def _quality(point: ServingPoint) -> str:
    parts = [f"{word} {point.figure(what):.3g}" for what, word in QUALITY if point.figure(what) is not None]
    return ", ".join(parts) or "-"


def _mfu(point: ServingPoint) -> str:
    mfu = point.figure("output_tokens_per_s", "mfu")
    if mfu is not None and point.mfu_estimated:  # against an estimated peak (a lower bound): an upper estimate
        return f"{UPPER_ESTIMATE}{percent(mfu)}" + (" (above 100 % of the estimated peak, a lower bound)"
                                                    if mfu > 1 else "")
    return percent(mfu) + (" (above 100 %: check the peak)" if mfu is not None and mfu > 1 else "")


def _rounds(point: ServingPoint) -> str:
    return str(point.rounds) + (f" ({point.failed_rounds} from a failed round)" if point.failed_rounds else "")


def is_serving_point(entry: dict[str, Any]) -> bool:
    """A summary headline entry of one generate point (``<what>@c4``): shown a row per point, not per figure."""
    return entry.get("family") == FAMILY and POINT_METRIC.match(str(entry.get("metric", ""))) is not None


CONSOLE_HEADER = ["case", "point", "requests completed/failed", "completed requests/s", "output tokens/s",
                  "TTFT ms p50/p99", "TPOT ms p50/p99", "goodput requests/s (fraction)"]


def console_rows(points: list[ServingPoint]) -> list[tuple[list[str], bool]]:
    """The console's compact view, one row per point (means over rounds, counts summed, as in the report);
    with whether the row is a failed or flagged point."""
    rows = []
    for p in points:
        failed = p.counts.get("failed_requests", 0)
        done = "-" if p.requests is None else f"{p.requests - failed}/{failed}"
        if p.failed_point:
            done += " failed point"
        elif p.flagged:
            done += " flagged"
        rows.append(([p.case, p.label, done, _num(p.figure("requests_per_s")), _num(p.figure("output_tokens_per_s")),
                      _p50_p99(p, "ttft_s"), _p50_p99(p, "tpot_s"), _goodput(p)], p.failed_point or p.flagged))
    return rows


DIGEST_TITLE = ("LLM serving, one row per point (cN: N requests in flight, closed loop; rR: R requests/s offered, "
                "open loop); means over rounds, request counts summed. Every figure of every point is in the LLM "
                "serving section below and in summary.csv.")


def serving_digest(points: list[ServingPoint]) -> list[str]:
    """The console's compact view as Markdown, for the report's head: a row per point instead of a headline row
    per figure (those have no peak); nothing when the run has no generate point."""
    if not points:
        return []
    rows = []
    for (case, label, done, *figures), marked in console_rows(points):  # a failed or flagged point in bold
        rows.append([md_text(case), md_text(label), f"**{done}**" if marked else done, *figures])
    return [DIGEST_TITLE, "", *_table(CONSOLE_HEADER, rows), ""]


def _p50_p99(point: ServingPoint, what: str) -> str:
    if point.figure(what, "p50") is None:
        return "-"
    return f"{_ms(point.figure(what, 'p50'))}/{_ms(point.figure(what, 'p99'))}"


# Every column says its unit; latencies are in ms here (summary.csv keeps the metrics' s: ttft_s, ...).
THROUGHPUT_HEADER = ["case", "concurrency (requests in flight)", "offered rate (requests/s)",
                     "requests (failed, truncated, empty, mismatched)", "output tokens/s",
                     "total tokens/s (input + output)", "output tokens/s per device",
                     "tokens/s per user", "interactivity (tokens/s per user: 1 / mean TPOT)", "completed requests/s",
                     "requests in flight, open loop: mean (peak)", "goodput requests/s (fraction)", "SLO p99",
                     "MFU (%)", "J per output token",
                     "quality (0 to 1)", "rounds"]
LATENCY_HEADER = ["case", "concurrency (requests in flight)", "offered rate (requests/s)", "TTFT ms p50/p90/p99",
                  "TPOT ms p50/p90/p99", "ITL ms p50/p90/p99", "E2EL ms p50/p90/p99"]
SERVER_HEADER = ["case", "concurrency (requests in flight)", "offered rate (requests/s)",
                 "output tokens per round: server (client)", "requests per round: server (client)",
                 "TTFT ms mean: server (client)", "TPOT ms mean: server (client)", "E2EL ms mean: server (client)"]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows)]


def _server_cells(p: ServingPoint) -> list[str]:
    """The server's figures beside the client's, per round (the server's are means over the rounds)."""
    def pair(server: float | None, client: float | None, scale: float = 1.0) -> str:
        return f"{_num(server, scale)} ({_num(client, scale)})"

    def per_round(total: int | None) -> float | None:
        return None if total is None or not p.rounds else total / p.rounds

    return [pair(p.server.get("output_tokens"), per_round(p.output_tokens)),
            pair(p.server.get("requests"), per_round(p.requests)),
            *(pair(p.server.get(what), p.figure(what), 1e3) for what in ("ttft_s", "tpot_s", "e2el_s"))]


def serving_markdown(run_dir: Path, rows: pd.DataFrame | None, loaded: Iterable[tuple[Path, Any]] | None = None
                     ) -> list[str]:
    """The report section for generate cases; nothing when the run has none. loaded: the run's (round folder, result)
    pairs where the caller has read them already (else they are read here, once)."""
    loaded = list(_round_folders(run_dir) if loaded is None else loaded)
    points = serving_points(run_dir, rows, loaded)
    if not points:
        return []
    lines = ["## LLM serving (generate)", "",
             "Per point (a closed-loop concurrency, or an open-loop request rate): output tokens/s of the "
             "server in all and per device, total tokens/s (input and output tokens of the successful requests "
             "per second, as vLLM's total token throughput, with the server's prompt token count: chat template "
             "included, so above vLLM's own figure), tokens/s each user saw (output tokens / E2EL: the "
             "mean, and p10, the most the slowest 10 % of users got), interactivity "
             "(1 / mean TPOT), goodput (requests meeting every SLO per second, and their fraction of all "
             "requests), the SLO verdict on p99 TTFT/TPOT with no failed request, energy per output token from "
             "the monitors over the point's window; MFU (batch engines) = the level's model FLOPs (prefill and "
             "decode, the convention of every family) / its time / peak. Figures are means over rounds; request "
             "counts are sums.", ""]
    for case, mine in series_of(points).items():
        first = mine[0]
        frontier = slo_frontier(mine)
        line = f"- **{case}**: engine {first.served_as}; SLO: {slo_text(first.slo)}"
        if frontier is not None:
            line += (f"; SLO frontier: {frontier.label}, {_num(frontier.per_device)} output tokens/s per device "
                     f"at {_num(frontier.interactivity)} tokens/s per user")
        elif any(p.slo_met is not None for p in mine):
            line += "; no point met the SLO"
        lines.append(line)
        if first.workload:  # text the case and its server control: shown as text, never as markup
            lines.append(f"  - prompts: {md_text(first.workload)}")
        if first.served_by:
            lines.append(f"  - server: {md_text(first.served_by)}")
    failed = [p for p in points if p.failed_point]
    if failed:
        lines += ["", "**Failed points** (every timed request failed; left out of the curves, the SLO frontier and "
                      "goodput):", "", *(f"- {p.case} {p.label}: {md_text(p.first_error or 'no error recorded')}"
                                         for p in failed)]
    flagged = [p for p in points if p.flagged and not p.failed_point]
    if flagged:
        lines += ["", f"Flagged points: more than {FAILED_FLAG_FRACTION:.0%} of the requests failed (the latency "
                      "percentiles are over the successful requests, and the load's p99 then lies among the failed "
                      "ones), or some were truncated, empty or miscounted; their figures count the successful "
                      "requests only: " + ", ".join(f"{p.case} {p.label}" for p in flagged) + "."]
    lines += ["", *_table(THROUGHPUT_HEADER, [
        # total tokens/s: "-" for a point recorded before the figure (and the batch engines', which have none)
        [*_where(p), _requests(p), _num(p.figure("output_tokens_per_s")), _num(p.figure("total_tokens_per_s")),
         _num(p.per_device), _per_user(p), _num(p.interactivity), _num(p.figure("requests_per_s")), _in_flight(p),
         _goodput(p), _verdict(p), _mfu(p), _num(p.energy_per_token_j), _quality(p), _rounds(p)] for p in points])]
    lines += ["", *_table(LATENCY_HEADER, [[*_where(p), _triple(p, "ttft_s"), _triple(p, "tpot_s"),
                                            _triple(p, "itl_s"), _triple(p, "e2el_s")] for p in points])]
    sent = round_prompts(run_dir, loaded)
    if sent:  # the prompts line above is the first round's; an endpoint's rounds each send others
        lines += ["", "The prompts each round sent (the positions of its prompt stream it took: at an endpoint, each "
                      "round starts after those the run's earlier rounds took; a resent request's prompt may have "
                      "been served from the server's prefix cache):", "", *_table(PROMPTS_HEADER, sent)]
    scraped = [p for p in points if p.server]
    if scraped:
        lines += ["", "The server's own figures (its Prometheus counters and histograms, after the point minus "
                      "before, per round) beside the client's:", "",
                  *_table(SERVER_HEADER, [[*_where(p), *_server_cells(p)] for p in scraped])]
    return [*lines, ""]


# --- plots --------------------------------------------------------------------------------------------------


def plot_pareto(plt: Any, points: list[ServingPoint], out: Path, title: str = "") -> Path | None:
    """Output tokens/s per device against interactivity, a line per series; filled markers meet the SLO,
    hollow ones miss it, a star marks the SLO frontier; a dotted line at each SLO's 1 / TPOT bound."""
    drawn = [p for p in points if p.per_device is not None and p.interactivity is not None and not p.failed_point]
    if not drawn:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for number, (name, mine) in enumerate(series_of(drawn).items()):
        mine = sorted(mine, key=lambda p: p.interactivity or 0.0)
        color = f"C{number % 10}"
        ax.plot([p.interactivity for p in mine], [p.per_device for p in mine], color=color, linewidth=1.2,
                label=mine[0].series)
        for p in mine:
            hollow = p.slo_met is False
            ax.plot(p.interactivity, p.per_device, marker="o", color=color,
                    markerfacecolor="white" if hollow else color, markersize=6)
            ax.annotate(p.label, (p.interactivity, p.per_device), textcoords="offset points", xytext=(4, 4),
                        fontsize=7)
        frontier = slo_frontier(mine)
        if frontier is not None:
            ax.plot(frontier.interactivity, frontier.per_device, marker="*", color=color, markersize=15,
                    markeredgecolor="black", linestyle="none", label=f"{name}: SLO frontier ({frontier.label})")
    bounds = sorted({p.slo["tpot_s"] for p in drawn if p.slo and p.slo.get("tpot_s")})
    for bound in bounds:
        ax.axvline(1.0 / bound, color="grey", linestyle=":", linewidth=1)
        ax.annotate(f"TPOT SLO {bound * 1e3:g} ms", (1.0 / bound, ax.get_ylim()[1]), fontsize=7, color="grey",
                    rotation=90, va="top", ha="right")
    ax.set_xlabel("interactivity: output tokens/s per user (1 / mean TPOT)")
    ax.set_ylabel("output tokens/s per device")
    ax.set_title(title or "serving Pareto: filled = SLO met, hollow = missed, star = SLO frontier", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return save_png(plt, fig, out)


def plot_latency(plt: Any, points: list[ServingPoint], out: Path) -> Path | None:
    """TTFT and TPOT (p50 solid, p99 dashed) against output tokens/s per device, the SLO bounds dotted."""
    drawn = [p for p in points if p.per_device is not None and p.figure("ttft_s", "p50") is not None
             and not p.failed_point]
    if not drawn:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, what, title, bound in ((axes[0], "ttft_s", "TTFT", "ttft_s"), (axes[1], "tpot_s", "TPOT", "tpot_s")):
        for number, mine in enumerate(series_of(drawn).values()):
            mine = sorted(mine, key=lambda p: p.per_device or 0.0)
            color = f"C{number % 10}"
            for key, style in (("p50", "-"), ("p99", "--")):
                shown = [p for p in mine if p.figure(what, key) is not None]
                if shown:
                    ax.plot([p.per_device for p in shown], [1e3 * (p.figure(what, key) or 0.0) for p in shown],
                            linestyle=style, marker="o", markersize=4, color=color,
                            label=f"{mine[0].series} {key}")
        for limit in sorted({p.slo[bound] for p in drawn if p.slo and p.slo.get(bound)}):
            ax.axhline(1e3 * limit, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("output tokens/s per device")
        ax.set_ylabel(f"{title} ms")
        ax.set_title(f"{title} against throughput (dotted: the SLO)", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    return save_png(plt, fig, out)


def serving_plots(plt: Any, run_dir: Path, plots_dir: Path, rows: pd.DataFrame | None = None
                  ) -> list[tuple[str, Path]]:
    """The report's serving plots (title, file); none when the run has no generate point."""
    points = serving_points(run_dir, rows)
    made = []
    for title, path in (
            ("LLM serving: output tokens/s per device against tokens/s per user (Pareto)",
             plot_pareto(plt, points, plots_dir / "serving_tradeoff.png")),
            ("LLM serving: TTFT and TPOT against throughput", plot_latency(plt, points,
                                                                            plots_dir / "serving_latency.png"))):
        if path is not None:
            made.append((title, path))
    return made
