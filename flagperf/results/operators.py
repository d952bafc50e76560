"""The operation family in the run report, grouped by operator as operator benchmarks read (TritonBench,
FlagGems' reports): one headline row per operator (implementations compared, points correct, geometric-mean
speed-up against native per implementation, best share of the roofline), then a section per operator with a
dtype x shape by implementation table (TFLOPS or GB/s, latency, share of the roofline and of the measured base
spec where the run has one, speed-up; a failed point is FAILED with its error, never a figure), the
geometric-mean speed-up per dtype and implementation, the skipped points with their reasons, and a plot of the
speed-ups.

Reads the rounds' result.json files (RoundResult.operation, written by flagperf.operation.driver); a figure of
several rounds is their mean, and a speed-up is taken over the rounds both implementations passed (paired).
Its uncertainty (speedup_uncertainty) is that of the medians, never one iteration's noise."""

from __future__ import annotations

import math
import re
import statistics
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from flagperf.results.markup import md_text, number, percent
from flagperf.results.metrics import coefficient_of_variation
from flagperf.results.plotting import save_png
from flagperf.results.schema import (
    NO_SAMPLE_SEPARATOR,
    NONE_DEFINED,
    RESULT_FILE,
    ROW_OVER_HOST_COPY,
    TOO_MANY_LOGITS,
    UPPER_ESTIMATE,
    RoundResult,
    is_no_sample_reason,
    read_result,
)

FAMILY = "operation"
BASELINE = "native"
# Base-spec figures an operator's figure is held against where the same run measured them (best first).
MEASURED_COMPUTE = ("gemm_{dtype}_max", "gemm_{dtype}")
MEASURED_MEMORY = ("memory_copy_bandwidth",)
# Student's t at 97.5% (a two-sided 95% interval) for 1 to 30 degrees of freedom; past 30, 1.96 + 2.4 / df
# (within 0.2% of it).
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
# A median is not known better than this, however tied its iterations (a clock that ticks in 0.5 us steps times a
# 3 us call identically 1000 times): the clock's rate and the device's own clocks are not that steady.
MIN_HALFWIDTH = 0.005
UNCERTAINTY_METHOD = ("95% confidence: each round's median from the order statistics of its iterations (the "
                      "distribution-free interval, ranks from Binomial(n, 1/2)), its relative half-width at least "
                      f"the clock's floor over the median and {MIN_HALFWIDTH:.1%}; their relative half-widths "
                      "combined in quadrature over the two implementations and divided by the rounds; with two or "
                      "more paired rounds, the larger of that and the rounds' t-interval of the mean")
RoundKey = tuple[int, str, int]  # round, host, node rank: one result.json


def t975(df: int) -> float:
    return T975[df - 1] if df <= len(T975) else 1.96 + 2.4 / df


@dataclass(frozen=True)
class RoundFigure:
    """A point's figures in one round that passed it."""

    latency: float  # the median over its iterations, device clock
    ci: tuple[float, float] | None  # the median's 95% confidence interval (None: a record from before it)
    host_latency: float | None  # host clock, per call back to back (None: a record from before it)
    clock_floor: float = 0.0  # what the round's clock measured for an empty interval

    @property
    def halfwidth(self) -> float | None:
        """The interval's half-width relative to the median, at least the clock's floor (a clock that ties
        every iteration gives an interval of width 0, which is its resolution, not a median known exactly) and
        MIN_HALFWIDTH."""
        if self.ci is None or self.latency <= 0:
            return None
        return max((self.ci[1] - self.ci[0]) / (2 * self.latency), self.clock_floor / self.latency, MIN_HALFWIDTH)


@dataclass
class PointFigures:
    """One case / operator / dtype / shape / implementation over the run's rounds."""

    case: str
    operator: str
    dtype: str
    shape: str
    implementation: str
    source: str
    bound_unit: str | None = None
    latencies: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    rooflines: list[float] = field(default_factory=list)
    roofline_estimated: bool = False  # against a peak that is a lower bound: the share is an upper estimate
    statuses: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    cvs: list[float] = field(default_factory=list)  # each passed round's metric cv over its timed iterations
    iteration_spreads: list[float] = field(default_factory=list)  # each passed round's (p90 - p10) / (2 x median)
    warmup_calls: list[int] = field(default_factory=list)
    clock_floors: list[float] = field(default_factory=list)
    near_clock_floor: bool = False  # some round's clock floor was over 10% of its median latency
    without_rewarm: bool = False  # some round timed it without the CPU's rewarm after each flush (no memory)
    max_abs_error: float | None = None
    reference: str | None = None
    reference_sample: str | None = None  # a large point's float64 host sample (which elements), or "none: why"
    references: list[tuple[str, str | None]] = field(default_factory=list)  # each distinct (reference, sample) of
    # the rounds that state one, in the order met: more than one where rounds checked the point differently
    formula: str | None = None  # the operator's FLOP and byte counting, as the round stated it
    by_round: dict[RoundKey, RoundFigure] = field(default_factory=dict)  # the rounds that passed it
    metric: str | None = None  # its metric's name among the rounds' metrics

    @property
    def status(self) -> str:
        for status in ("failed", "passed", "skipped"):
            if status in self.statuses:
                return status
        return "skipped"

    @property
    def latency(self) -> float | None:
        return statistics.fmean(self.latencies) if self.latencies and self.status == "passed" else None

    @property
    def value(self) -> float | None:
        return statistics.fmean(self.values) if self.values and self.status == "passed" else None

    @property
    def host_latency(self) -> float | None:
        """Host time per call back to back (the mean over the rounds that passed and recorded it)."""
        found = [r.host_latency for r in self.by_round.values() if r.host_latency is not None]
        return statistics.fmean(found) if found and self.latency is not None else None

    @property
    def uncertainty(self) -> float | None:
        """The relative 95% uncertainty of the latency (its mean over the rounds), by UNCERTAINTY_METHOD; None
        where a round has no interval recorded."""
        if self.latency is None or not self.by_round:
            return None
        rounds = list(self.by_round.values())
        return mean_uncertainty([r.halfwidth for r in rounds], [r.latency for r in rounds])

    @property
    def iteration_spread(self) -> float | None:
        """(p90 - p10) / (2 x median) of the timed iterations (the mean over the rounds that passed)."""
        return _mean(self.iteration_spreads) if self.value is not None else None

    @property
    def rounds_spread(self) -> float | None:
        """Coefficient of variation of the figure across the rounds that passed (None with fewer than two)."""
        return coefficient_of_variation(self.values) if self.value is not None else None

    @property
    def spread(self) -> float | None:
        """The figure's noise: across rounds where two or more passed, else across the timed iterations (their
        p10-p90 spread; the metric's cv for a record without percentiles)."""
        if self.value is None:
            return None
        for found in (self.rounds_spread, self.iteration_spread, _mean(self.cvs)):
            if found is not None:
                return found
        return None

    @property
    def spread_basis(self) -> str | None:
        if self.spread is None:
            return None
        if self.rounds_spread is not None:
            return "rounds"
        return "iterations p10-p90" if self.iteration_spreads else "iterations cv"


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def mean_uncertainty(halfwidths: list[float | None], values: list[float]) -> float | None:
    """The relative 95% uncertainty of the mean of ``values``, one per round, each with the relative half-width
    of its own interval: sqrt(sum of squares) / rounds, and with two or more rounds at least the rounds'
    t-interval (t x standard deviation / mean / sqrt(rounds)), since rounds may differ by more than their
    iterations say. None where a round has no half-width."""
    if not values or any(h is None for h in halfwidths):
        return None
    within = math.sqrt(sum(h * h for h in halfwidths)) / len(values)  # type: ignore[operator]
    cv = coefficient_of_variation(values)
    between = t975(len(values) - 1) * cv / math.sqrt(len(values)) if cv is not None else 0.0
    return max(within, between)


def read_results(run_dir: Path) -> list[RoundResult]:
    results = []
    for path in sorted(run_dir.glob(f"*/round*/*_noderank*/{RESULT_FILE}")):
        try:
            results.append(read_result(path))
        except (OSError, ValueError):
            continue  # the summary lists unreadable files already
    return results


def collect_points(run_dir: Path) -> list[PointFigures]:
    return points_of(read_results(run_dir))


def method_lines(results: Iterable[RoundResult]) -> list[str]:
    """How each operation case was measured, as its rounds' result.json state it: the clock, warm-up and
    iterations, the cache flush, device graphs, each implementation (with its library's version), what the
    points were checked against, and why points have no share of the roofline. Rounds that state something
    differently (hosts with other caches) each add their wording."""
    results = list(results)
    cases: dict[str, dict[str, dict[str, None]]] = {}
    for result in results:
        if result.family != FAMILY or result.operation is None:
            continue
        op = result.operation
        found = cases.setdefault(result.case, {"timing": {}, "flush": {}, "graphs": {}, "impls": {}, "roofline": {},
                                               "iterations": {}, "warmup": {}, "energy": {}, "notes": {},
                                               "names": {}})
        found["timing"][op.timing] = None
        found["flush"][op.flush] = None
        found["graphs"][op.graphs] = None
        if op.energy:
            found["energy"][op.energy] = None
        for name, text in op.implementations.items():
            found["impls"][f"{name}: {text}"] = None
            found["names"][name] = None
        for point in op.points:
            found["names"][point.implementation] = None  # one whose every point was skipped: checked on none
            if point.status == "passed" and point.roofline is None and point.roofline_basis:
                found["roofline"][point.roofline_basis] = None
            if point.status == "passed" and point.note:  # what a passed point lacks (its host loop ran out of memory)
                shape = "x".join(f"{k}{v}" for k, v in point.shape.items())
                found["notes"][f"{point.operator} {point.dtype} {shape} @{point.implementation}: {point.note}"] = None
            if point.status == "passed":
                found["iterations"][point.iterations] = None
                if point.warmup_calls:
                    found["warmup"][point.warmup_calls] = None
    # the same count as each operator's headline (per point and implementation, its rounds merged), each kind's
    # split by implementation: one that skipped points (no form of a dtype, its library missing) was checked on fewer
    against: dict[str, dict[str, dict[str, int]]] = {}
    for figure in points_of(results):
        kinds = against.setdefault(figure.case, {})
        for kind, count in checked_counts([figure]).items():
            by_impl = kinds.setdefault(kind, {})
            by_impl[figure.implementation] = by_impl.get(figure.implementation, 0) + count
    lines = []
    for case, found in cases.items():
        counts = "".join(f"; {what} per point: {_count_range(list(found[key]))}"
                         for key, what in (("iterations", "timed iterations"), ("warmup", "warm-up calls"))
                         if found[key])
        lines.append(f"- **{md_text(case)}**: timing: {md_text('; '.join(found['timing']))}; cache flush: "
                     f"{md_text('; '.join(found['flush']))}; device graphs: {md_text('; '.join(found['graphs']))}"
                     + (f"; energy loop: {md_text('; '.join(found['energy']))}" if found["energy"] else "")
                     + counts)
        lines += [f"  - {md_text(impl)}" for impl in found["impls"]]
        if against.get(case):
            names = list(found["names"])
            lines.append("  - checked against: " + "; ".join(
                f"{md_text(kind)} ({_pairs(by_impl, names)})" for kind, by_impl in against[case].items()))
        lines += [f"  - % of roofline not computed: {md_text(why)}" for why in found["roofline"]]
        lines += [f"  - {md_text(note)}" for note in found["notes"]]
    return [*lines, ""] if lines else []


def _pairs(by_impl: dict[str, int], names: list[str]) -> str:
    """"8 point-implementation pairs: native 4, compile 4, flaggems 0": the count, then each implementation's share,
    every one of the case's (``names``) listed: one with none of this kind (its points skipped, or checked another
    way) says 0 rather than going unsaid."""
    count = sum(by_impl.values())
    every = sorted(dict.fromkeys([*names, *by_impl]), key=lambda n: n != BASELINE)
    shares = ", ".join(f"{md_text(name)} {by_impl.get(name, 0)}" for name in every)
    return f"{count} point-implementation pair{'s' if count != 1 else ''}: {shares}"


HOST_SAMPLE_PREFIX = "float64 on cpu at "  # flagperf.operation.sampled: Sample.reference's description


@dataclass(frozen=True)
class Checked:
    """What one point was checked against, compactly (a point's reference and reference_sample): ``kind`` groups
    points in the operator's headline, ``elements`` the host sample's elements, ``why`` why it has none."""

    kind: str  # "float64 on cpu, whole output", "float32 on cuda + float64 host sample", "float32 on cuda only"
    elements: str | None = None  # "1024 of 29360128 output elements (16 of 2048 rows x 64 of 14336 columns)"
    why: str | None = None  # no host sample: why


def checked(reference: str | None, sample: str | None) -> Checked | None:
    """None: the point states no reference (skipped before one was computed, or a record from before)."""
    if not reference:
        return None
    if sample is None:  # the reference covers every element; float64 on the host where it is a small point
        return Checked(f"{reference}, whole output")
    if sample.startswith("none"):
        return Checked(f"{reference} only, no host sample", why=sample.removeprefix("none").lstrip(": ") or None)
    return Checked(f"{reference} + float64 host sample", elements=sample.removeprefix(HOST_SAMPLE_PREFIX))


def point_checked(point: PointFigures) -> Checked | None:
    """What a point was checked against over its rounds: where they checked it differently (another code's sample,
    a round whose host sample failed), each kind, said as such rather than the last round's."""
    found = [c for pair in point.references if (c := checked(*pair)) is not None]
    kinds = list(dict.fromkeys(c.kind for c in found))
    if len(kinds) > 1:  # by kind alone: the same kind with another reason (a shape's sizes) is no difference
        return Checked("rounds differ: " + " / ".join(kinds))
    return found[0] if found else checked(point.reference, point.reference_sample)  # its reason to the footnote


def checked_counts(points: Iterable[PointFigures]) -> dict[str, int]:
    """What the points that ran were checked against, by kind alone (why a host sample is missing is the operator
    table's footnote: a reason carries the shape's sizes, one label per shape), and how many point-implementation
    pairs, each once whatever its rounds: the operator's headline, summary.json's ``checked`` and the report's
    method lines."""
    counts: dict[str, int] = {}
    for p in points:
        found = point_checked(p) if p.status != "skipped" else None
        if found is not None:
            counts[found.kind] = counts.get(found.kind, 0) + 1
    return counts


def no_sample_reason(why: str) -> str:
    """Why a point has no host sample, in a few words the same for every shape (the part of its reference_sample
    before NO_SAMPLE_SEPARATOR): what the operator's headline counts, its footnote's first words. A record from
    before it had that part says its reason with the shape's sizes: the short reason its words name, else its first
    clause; the numbers as N either way. The new form is known by its reason, not by the separator alone: an older
    reason may hold "; " itself (a CUDA out-of-memory text's "(GPU 0; 11.17 GiB ...")."""
    reason, separator, _ = why.partition(NO_SAMPLE_SEPARATOR)
    if not (separator and is_no_sample_reason(reason)):
        # cross_entropy's two older texts share their first clause: their own words tell them apart
        none_defined = OLDER_NONE_DEFINED.match(why)
        reason = (f"{NONE_DEFINED}{none_defined.group(1)}" if none_defined else
                  next((short for words, short in OLDER_REASONS if words in why), why.split(", ")[0]))
    return NUMBER.sub("N", reason)


# An older record's cross_entropy text (before the short reasons) -> its short reason, by its distinguishing words
OLDER_REASONS = (("those are over the", TOO_MANY_LOGITS), ("one row of them", ROW_OVER_HOST_COPY))
# An older record of an operator without a host sample: its full text alone, the operator's name in it
OLDER_NONE_DEFINED = re.compile(r"no host sample is defined for (\w+)")
# A size (4096, 2.5, 3.1.0, each side of 4096x128256) or an address (0x7f3a...), not a word's digits (fp8_gemm,
# bf16, float64, M4096xN4096): a number after a letter other than the x of a product is part of a name
NUMBER = re.compile(r"(?<![\w.])0x[0-9a-fA-F]+|(?<![0-9A-Za-wyz_.])\d+(?:\.\d+)*")


def no_sample_counts(points: Iterable[PointFigures]) -> dict[str, dict[str, int]]:
    """Of the point-implementation pairs checked_counts counts, those without a host sample: kind -> short reason
    (no_sample_reason) -> pairs; summary.json's ``no_sample``, shown in the headline by checked_text."""
    counts: dict[str, dict[str, int]] = {}
    for p in points:
        found = point_checked(p) if p.status != "skipped" else None
        if found is not None and found.why:
            reasons = counts.setdefault(found.kind, {})
            reason = no_sample_reason(found.why)
            reasons[reason] = reasons.get(reason, 0) + 1
    return counts


def checked_text(counts: dict[str, int] | None, text: Callable[[object], str] = md_text,
                 reasons: dict[str, dict[str, int]] | None = None) -> str:
    """An operator's "checked against" in its headline (report.md, the site, the terminal summary): each kind's
    pairs and, for a kind without a host sample, how many for each reason (``reasons``: no_sample_counts)."""
    if not counts:
        return "-"  # nothing ran, or a summary.json written before it was kept
    parts = []
    for label, count in counts.items():
        why = (reasons or {}).get(label)
        parts.append(f"{text(label)}: {count}"
                     + (" (" + ", ".join(f"{text(reason)}: {n}" for reason, n in why.items()) + ")" if why else ""))
    return "; ".join(parts)


def _count_range(counts: list[int]) -> str:
    low, high = min(counts), max(counts)
    return str(low) if low == high else f"{low} to {high}"


def points_of(results: Iterable[RoundResult]) -> list[PointFigures]:
    """The operation points of these rounds, one entry per case / operator / dtype / shape / implementation."""
    figures: dict[tuple[str, ...], PointFigures] = {}
    for result in results:
        if result.family != FAMILY or result.operation is None:
            continue
        ratios = {m.name: m.ratio for m in result.metrics}
        cvs = {m.name: m.cv for m in result.metrics}
        counting = result.operation.counting
        for p in result.operation.points:
            shape = "x".join(f"{k}{v}" for k, v in p.shape.items())
            key = (result.case, p.operator, p.dtype, shape, p.implementation)
            entry = figures.setdefault(key, PointFigures(*key, source=p.source))
            entry.formula = entry.formula or counting.get(p.operator)
            entry.metric = entry.metric or p.metric
            entry.statuses.append(p.status)
            if p.error:
                entry.errors.append(p.error)
            if p.status == "passed" and p.latency_s is not None and p.value is not None:
                ci = (p.latency_ci_low_s, p.latency_ci_high_s)
                entry.by_round[(result.round, result.host, result.node_rank)] = RoundFigure(
                    p.latency_s, ci if None not in ci else None, p.host_latency_s,  # type: ignore[arg-type]
                    p.clock_floor_s or 0.0)
                entry.latencies.append(p.latency_s)
                entry.values.append(p.value)
                entry.bound_unit = p.unit
                if p.metric and ratios.get(p.metric) is not None:
                    entry.ratios.append(float(ratios[p.metric]))  # type: ignore[arg-type]
                if p.metric and cvs.get(p.metric) is not None:
                    entry.cvs.append(float(cvs[p.metric]))  # type: ignore[arg-type]
                spread = p.latency_spread
                if spread is None and p.latency_p10_s is not None and p.latency_p90_s is not None and p.latency_s > 0:
                    spread = (p.latency_p90_s - p.latency_p10_s) / (2 * p.latency_s)  # a record from before the field
                if spread is not None:
                    entry.iteration_spreads.append(spread)
                if p.warmup_calls:
                    entry.warmup_calls.append(p.warmup_calls)
                if p.clock_floor_s is not None:
                    entry.clock_floors.append(p.clock_floor_s)
                entry.near_clock_floor = entry.near_clock_floor or p.near_clock_floor
                entry.without_rewarm = entry.without_rewarm or p.rewarmed is False
                if p.roofline is not None:
                    entry.rooflines.append(p.roofline)
                    entry.roofline_estimated = entry.roofline_estimated or p.roofline_estimated
            if p.max_abs_error is not None:
                entry.max_abs_error = max(entry.max_abs_error or 0.0, p.max_abs_error)
            # a skipped point (no form of the operator) still states it; fp8 skipped on all none. A round that skipped
            # the point checked nothing: its reference neither replaces a checking round's nor differs from it.
            if p.reference and (p.status != "skipped" or not entry.references):
                entry.reference = p.reference
                entry.reference_sample = p.reference_sample
                if p.status != "skipped" and (p.reference, p.reference_sample) not in entry.references:
                    entry.references.append((p.reference, p.reference_sample))
    return list(figures.values())


def point_index(collected: list[PointFigures]) -> dict[tuple[str, ...], PointFigures]:
    return {(p.case, p.operator, p.dtype, p.shape, p.implementation): p for p in collected}


def baseline_of(point: PointFigures, points: dict[tuple[str, ...], PointFigures]) -> PointFigures | None:
    return points.get((point.case, point.operator, point.dtype, point.shape, BASELINE))


def paired_rounds(point: PointFigures, base: PointFigures | None) -> list[RoundKey]:
    """The rounds both passed: a speed-up compares them in the same rounds only (a round where native was
    skipped or failed leaves the implementation's figure of that round out too)."""
    if base is None or base.latency is None or point.latency is None:
        return []
    return [key for key in point.by_round if key in base.by_round]


def speedup(point: PointFigures, points: dict[tuple[str, ...], PointFigures], host: bool = False) -> float | None:
    """Native's latency / this implementation's, on the same case, operator, dtype and shape, each the mean
    over the rounds both passed; ``host``: of the host times per call back to back instead."""
    base = baseline_of(point, points)
    if base is None or base.latency is None or point.latency is None:
        return None
    if not point.by_round and not base.by_round:  # figures made by hand, without their rounds
        return None if host else base.latency / point.latency
    keys = paired_rounds(point, base)
    if host:
        keys = [k for k in keys if point.by_round[k].host_latency and base.by_round[k].host_latency]
    if not keys:
        return None

    def mean(p: PointFigures) -> float:
        return statistics.fmean((p.by_round[k].host_latency if host else p.by_round[k].latency)  # type: ignore[misc]
                                for k in keys)
    return mean(base) / mean(point)


def speedup_uncertainty(point: PointFigures, points: dict[tuple[str, ...], PointFigures]) -> float | None:
    """The relative 95% uncertainty of speedup() (UNCERTAINTY_METHOD), over its paired rounds: each round's
    two medians' half-widths in quadrature, and the paired rounds' own speed-ups for the t-interval."""
    base = baseline_of(point, points)
    keys = paired_rounds(point, base)
    if base is None or not keys:
        return None
    halfwidths: list[float | None] = []
    for key in keys:
        mine, theirs = point.by_round[key].halfwidth, base.by_round[key].halfwidth
        halfwidths.append(None if mine is None or theirs is None else math.hypot(mine, theirs))
    return mean_uncertainty(halfwidths, [base.by_round[k].latency / point.by_round[k].latency for k in keys])


def geomean(values: list[float]) -> float | None:
    """The geometric mean of positive values; None when there is none."""
    positive = [v for v in values if v > 0]
    return math.exp(statistics.fmean(math.log(v) for v in positive)) if positive else None


def geomean_speedups(collected: list[PointFigures]) -> list[dict[str, Any]]:
    """Per dtype and implementation (native excluded): the geometric mean of the speed-ups over the points
    both passed, with how many points that is and how many of the implementation's failed."""
    index = point_index(collected)
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for p in collected:
        if p.implementation == BASELINE:
            continue
        entry = groups.setdefault((p.dtype, p.implementation), {"dtype": p.dtype, "implementation": p.implementation,
                                                                "speedups": [], "host": [], "failed": 0, "skipped": 0})
        if p.status == "failed":
            entry["failed"] += 1
        elif p.status == "skipped":
            entry["skipped"] += 1
        s = speedup(p, index)
        if s is not None and s > 0:
            entry["speedups"].append(s)
        h = speedup(p, index, host=True)
        if h is not None and h > 0:
            entry["host"].append(h)
    rows = []
    for (dtype, impl), entry in sorted(groups.items()):
        values = entry["speedups"]
        rows.append({"dtype": dtype, "implementation": impl, "points": len(values), "geomean": geomean(values),
                     "host_geomean": geomean(entry["host"]), "host_points": len(entry["host"]),
                     "min": min(values) if values else None, "max": max(values) if values else None,
                     "failed": entry["failed"], "skipped": entry["skipped"]})
    return rows


def by_operator(collected: list[PointFigures]) -> dict[tuple[str, str], list[PointFigures]]:
    """(case, operator) -> its points, in the order the rounds measured them."""
    grouped: dict[tuple[str, str], list[PointFigures]] = {}
    for p in collected:
        grouped.setdefault((p.case, p.operator), []).append(p)
    return grouped


def implementations_of(points: list[PointFigures]) -> list[str]:
    """The implementations among ``points``: native first, then as measured."""
    names = list(dict.fromkeys(p.implementation for p in points))
    return sorted(names, key=lambda name: name != BASELINE)


def operator_summaries(collected: list[PointFigures]) -> list[dict[str, Any]]:
    """One entry per case and operator, for the headline: the implementations compared, the dtype x shape
    points, how many point x implementation pairs passed, failed and were skipped, the geometric-mean
    speed-up against native per implementation (over the points both passed) and the best share of the
    roofline any implementation reached."""
    index = point_index(collected)
    entries = []
    for (case, operator), points in by_operator(collected).items():
        impls = implementations_of(points)
        speedups: dict[str, dict[str, Any]] = {}
        for impl in impls:
            if impl == BASELINE:
                continue
            own = [p for p in points if p.implementation == impl]
            found = [s for p in own if (s := speedup(p, index)) is not None]
            host = [s for p in own if (s := speedup(p, index, host=True)) is not None]
            # The points a geomean leaves out are said beside it: a failed point is no speed-up, never a 1x.
            speedups[impl] = {"geomean": geomean(found), "points": len(found),
                              "host_geomean": geomean(host), "host_points": len(host),
                              "of": sum(p.status != "skipped" for p in own),
                              "failed": sum(p.status == "failed" for p in own)}
        spreads = [s for p in points if (s := p.iteration_spread) is not None]
        best = max((p for p in points if p.rooflines and p.status == "passed"),
                   key=lambda p: _mean(p.rooflines) or 0.0, default=None)
        entries.append({
            "case": case, "operator": operator,
            "unit": next((p.bound_unit for p in points if p.bound_unit), None),
            "implementations": impls, "dtypes": list(dict.fromkeys(p.dtype for p in points)),
            "shapes": len({(p.dtype, p.shape) for p in points}),
            "passed": sum(p.status == "passed" for p in points), "failed": sum(p.status == "failed" for p in points),
            "skipped": sum(p.status == "skipped" for p in points), "speedups": speedups,
            "best_roofline": _mean(best.rooflines) if best else None,
            "best_roofline_at": f"{best.implementation} {best.dtype} {best.shape}" if best else None,
            "best_roofline_estimated": bool(best and best.roofline_estimated),
            "iteration_spread": statistics.median(spreads) if spreads else None,
            "iteration_spread_max": max(spreads) if spreads else None,
            "near_clock_floor": sum(p.near_clock_floor for p in points if p.status == "passed"),
            "checked": checked_counts(points), "no_sample": no_sample_counts(points),
            "conventions": SUMMARY_CONVENTIONS,
            "points": [point_json(p, index) for p in points]})
    return entries


SUMMARY_CONVENTIONS = {
    "latency_s": "device clock (events on an accelerator, the host clock on a CPU; what inference calls compute "
                 "latency): the median over the timed iterations, each call timed alone after the cache flush "
                 "(mean over rounds)",
    "host_latency_s": "host clock, FlagPerf's cputime convention: wall time per call of as many calls back to back, "
                      "no flush, one synchronisation at the end, Python wrapper and dispatch included; with the host "
                      "queueing ahead that is the larger of the host's and the device's time per call (an inverse "
                      "throughput, caches warm), not inference's per-batch latency, which synchronises each batch "
                      "(mean over rounds)",
    "latency_spread": "(p90 - p10) / (2 x median) of the iterations: one iteration's noise (mean over rounds)",
    "rounds_spread": "coefficient of variation of the figure across the rounds that passed",
    "latency_uncertainty": "relative uncertainty of latency_s: " + UNCERTAINTY_METHOD,
    "speedup": "native's latency_s / this implementation's, over the rounds both passed",
    "speedup_uncertainty": "relative uncertainty of speedup: " + UNCERTAINTY_METHOD,
    "host_speedup": "native's host_latency_s / this implementation's, over the rounds both passed",
    "without_rewarm": "some round timed the point without the call after each flush that rewarms the host's "
                      "caches (the CPU; no memory for its copy of the inputs): its figure is of a colder call",
    "reference": "what the output was checked against, whole (dtype, device); a large point's is the device's own "
                 "kernels",
    "reference_sample": "a large point's float64 host reference of a sample of its output (which elements), or "
                        "'none: why'; null where the reference is the whole output's in float64 on the host",
}


def point_json(point: PointFigures, index: dict[tuple[str, ...], PointFigures]) -> dict[str, Any]:
    """One point and implementation as summary.json keeps it (SUMMARY_CONVENTIONS say what each figure is)."""
    native = point.implementation == BASELINE
    return {"dtype": point.dtype, "shape": point.shape, "implementation": point.implementation,
            "status": point.status, "value": point.value, "unit": point.bound_unit, "latency_s": point.latency,
            "host_latency_s": point.host_latency, "latency_spread": point.iteration_spread,
            "rounds_spread": point.rounds_spread, "latency_uncertainty": point.uncertainty,
            "rounds": len(point.by_round), "without_rewarm": point.without_rewarm,
            "speedup": None if native else speedup(point, index),
            "speedup_uncertainty": None if native else speedup_uncertainty(point, index),
            "host_speedup": None if native else speedup(point, index, host=True),
            "reference": point.reference, "reference_sample": point.reference_sample}


OPERATOR_HEADER = ["case", "operator", "unit", "implementations", "dtype x shape", "correct",
                   "geomean speed-up vs native, device clock, host (points in it of those run)", "best % of roofline",
                   "checked against (point-implementation pairs)", "± per iteration (median, max over points)"]


def _speedup_text(impl: str, found: dict[str, Any], shown: Callable[[object], str] = md_text) -> str:
    text = f"{shown(impl)} " + ("-" if found["geomean"] is None else f"{found['geomean']:.3g}x")
    if found.get("host_geomean") is not None:
        text += f", host {found['host_geomean']:.3g}x"
        if found.get("host_points") is not None and found["host_points"] != found["points"]:
            text += f" (over {found['host_points']})"  # older rounds recorded no host time
    if "of" not in found:  # a summary.json written before the counts
        return text + f" ({found['points']})"
    text += f" ({found['points']} of {found['of']}"
    return text + (f"; **{found['failed']} FAILED**)" if found.get("failed") else ")")


def _spread_text(entry: dict[str, Any]) -> str:
    if entry.get("iteration_spread") is None:
        return "-"
    text = f"{_pct(entry['iteration_spread'], '±')} (max {_pct(entry['iteration_spread_max'], '±')})"
    floor = entry.get("near_clock_floor")
    return text + (f"; **{floor} near the clock's floor**" if floor else "")


def operator_cells(entry: dict[str, Any], text: Callable[[object], str] = md_text) -> list[str]:
    """One operator's headline row (an entry of operator_summaries, also as summary.json keeps it); ``text`` shows
    what a case controls: md_text in Markdown, markup.plain where none renders (the site, the CLI)."""
    ran = entry["passed"] + entry["failed"]
    correct = f"{entry['passed']} of {ran}" + (f"; **{entry['failed']} FAILED**" if entry["failed"] else "") \
        + (f"; {entry['skipped']} skipped" if entry["skipped"] else "")
    speedups = ", ".join(_speedup_text(impl, s, text) for impl, s in entry["speedups"].items()) or "-"
    best = "-" if entry["best_roofline"] is None else \
        f"{_estimate(entry.get('best_roofline_estimated'))}{_pct(entry['best_roofline'])} " \
        f"({text(entry['best_roofline_at'])})"
    return [text(entry["case"]), text(entry["operator"]), entry["unit"] or "-",
            text(", ".join(entry["implementations"])), f"{entry['shapes']} ({', '.join(entry['dtypes'])})",
            correct, speedups, best, checked_text(entry.get("checked"), text, entry.get("no_sample")),
            _spread_text(entry)]


def operator_table(entries: list[dict[str, Any]]) -> list[str]:
    """The headline's operator table: one row per operator, Markdown."""
    if not entries:
        return []
    return ["| " + " | ".join(OPERATOR_HEADER) + " |", "|" + "---|" * len(OPERATOR_HEADER),
            *["| " + " | ".join(operator_cells(e)) + " |" for e in entries], ""]


def is_operation(entry: dict[str, Any]) -> bool:
    """A headline entry of an operation point (grouped by operator in the reports, not a row each)."""
    return entry.get("family") == FAMILY


def measured_base(rows: pd.DataFrame | None) -> dict[str, tuple[str, float]]:
    """Base-spec figures of the same run (metric name -> (the metric, mean value)) for the operators' shares."""
    if rows is None or rows.empty:
        return {}
    base = rows[(rows["family"] == "base") & rows["metric"].notna() & (rows["status"] == "success")]
    found: dict[str, tuple[str, float]] = {}
    for metric, group in base.groupby("metric"):
        values = pd.to_numeric(group["value"], errors="coerce").dropna()
        if len(values):
            found[str(metric)] = (f"{group['case'].iloc[0]} / {metric}", float(values.mean()))
    return found


def share_of_measured(point: PointFigures, base: dict[str, tuple[str, float]]) -> tuple[float, str] | None:
    if point.value is None:
        return None
    names = MEASURED_MEMORY if point.bound_unit == "GB/s" else [n.format(dtype=point.dtype) for n in MEASURED_COMPUTE]
    for name in names:
        if name in base and base[name][1] > 0:
            return point.value / base[name][1], base[name][0]
    return None


def _num(value: float | None, digits: int = 4) -> str:
    return number(value, digits)


def _pct(value: float | None, sign: str = "") -> str:
    return percent(value, sign=sign)


def _estimate(estimated: bool | None) -> str:
    """The mark of a share of an estimated peak (a lower bound of the real one): an upper estimate."""
    return UPPER_ESTIMATE if estimated else ""


CONVENTION = ("Each implementation's output is checked against the operator computed in higher precision before "
              "it is timed: a wrong result is a FAILED point, never a figure. Latency is the device's clock "
              "(events on an accelerator, the host clock on a CPU: inference's compute latency), the median over "
              "the timed iterations, each call timed alone after the cache flush (mean over rounds), after the "
              "warm-up calls the case states; 'host' beside it is the host clock's wall time per call of as many "
              "calls back to back with one synchronisation at the end and no flush (FlagPerf's cputime: the "
              "Python wrapper and dispatch included, which the device clock leaves out); ± beside it is the "
              "iterations' spread, (p90 - p10) / (2 x median) (mean over rounds; with several rounds the rounds' "
              "coefficient of variation is given too); 'no rewarm' marks a CPU point timed without the call after "
              "each flush that rewarms the host's caches (no memory for it), and a speed-up between points timed "
              "with and without it says 'cache conditions differ'; a latency marked 'near the clock's floor' is "
              "within 10x of "
              "what the clock measures for an empty interval, so up to that share of it is the timer's own cost; "
              "speed-up = native's latency / the implementation's over the rounds both passed, then 'host' the "
              "same of the host times (one back-to-back loop per round: a single sample, no uncertainty); "
              "'(within ±x%)' where the speed-up is within its uncertainty, "
              + UNCERTAINTY_METHOD + ", so no change to read; the "
              "figure is TFLOPS (1e12 FLOP/s) for compute-bound operators and GB/s (1e9 bytes/s; each input "
              "read once and each output written once, as the base specs' memory_copy_bandwidth counts a copy's "
              "read and write) for memory-bound ones, counted as each operator's table states; % of roofline = "
              "max(FLOPs / peak FLOP/s, bytes / peak bandwidth) / latency; % of measured = against the same "
              "run's base spec (GEMM max-achievable or copy bandwidth); % of peak per point is in summary.csv (ratio).")


def point_cell(point: PointFigures | None, base: dict[str, tuple[str, float]]) -> str:
    """One implementation's figure at one dtype and shape: the figure with its unit, latency and shares."""
    if point is None:
        return "-"
    if point.status == "failed":
        return "**FAILED**"
    if point.status == "skipped" or point.value is None or point.latency is None:
        return "skipped"
    latency = f"{number(point.latency * 1e3)} ms"
    if point.iteration_spread is not None:
        latency += f" {_pct(point.iteration_spread, '±')}"
    if point.rounds_spread is not None:
        latency += f" (rounds {_pct(point.rounds_spread, '±')})"
    parts = [f"{number(point.value)} {point.bound_unit}", latency]
    if point.host_latency is not None:
        parts.append(f"host {number(point.host_latency * 1e3)} ms")
    if point.without_rewarm:
        parts.append("**no rewarm** (timed without the call after each flush: its code and state cold too)")
    if point.near_clock_floor:
        floor = max(point.clock_floors, default=0.0)
        parts.append(f"**near the clock's floor** ({floor * 1e6:.3g} us, {_pct(floor / point.latency)} of it)")
    if point.rooflines:
        parts.append(f"{_estimate(point.roofline_estimated)}{_pct(_mean(point.rooflines))} roofline")
    measured = share_of_measured(point, base)
    if measured is not None:
        parts.append(f"{_pct(measured[0])} of measured")
    return " · ".join(parts)


def _checked_cell(points: list[PointFigures], reasons: dict[str, int]) -> str:
    """What a dtype x shape's output was checked against (the same for each implementation: one reference per
    point): the whole reference, and a large point's float64 host sample with its elements, or a numbered note
    (under the table, ``reasons``) saying why it has none."""
    found = next((c for p in points if (c := point_checked(p)) is not None), None)
    if found is None:
        return "-"
    if found.elements:
        return f"{md_text(found.kind)}: {md_text(found.elements)}"
    if found.why:
        number = reasons.setdefault(found.why, len(reasons) + 1)
        return f"{md_text(found.kind)} [{number}]"
    return md_text(found.kind)


def _within_noise(ratio: float, point: PointFigures, index: dict[tuple[str, ...], PointFigures]) -> str:
    """' (within ±x%)' where a speed-up is inside its uncertainty (speedup_uncertainty): no change to read. A
    record without the medians' intervals (written before them, or under 6 iterations) falls back, as compare
    does, to the two points' spreads in quadrature."""
    uncertainty = speedup_uncertainty(point, index)
    base = baseline_of(point, index)
    if uncertainty is None and base is not None and point.spread is not None and base.spread is not None:
        uncertainty = math.hypot(point.spread, base.spread)
    return f" (within {_pct(uncertainty, '±')})" if uncertainty is not None and abs(ratio - 1) <= uncertainty else ""


def speedup_cell(point: PointFigures | None, index: dict[tuple[str, ...], PointFigures]) -> str:
    """An implementation's speed-up against native at one point: the device clock's, then the host's."""
    ratio = speedup(point, index) if point is not None else None
    if point is None or ratio is None:
        return "-"
    host = speedup(point, index, host=True)
    base = baseline_of(point, index)
    mixed = ""
    if base is not None and base.without_rewarm != point.without_rewarm:  # one side's call was colder
        mixed = (f"; **cache conditions differ** ({BASELINE if base.without_rewarm else md_text(point.implementation)}"
                 " timed without the rewarm)")
    # one back-to-back loop per round and implementation: no interval to hold it against, so never 'within'
    return f"{ratio:.3g}x" + _within_noise(ratio, point, index) \
        + (f"; host {host:.3g}x (single sample)" if host is not None else "") + mixed


def operator_section(case: str, operator: str, points: list[PointFigures], index: dict[tuple[str, ...], PointFigures],
                     base: dict[str, tuple[str, float]]) -> list[str]:
    """A table per operator: a row per dtype and shape, a column per implementation (and its speed-up), the
    failed points' errors under it."""
    impls = implementations_of(points)
    unit = next((p.bound_unit for p in points if p.bound_unit), None)
    lines = [f"### {md_text(case)} / {md_text(operator)}" + (f" ({unit})" if unit else ""), ""]
    formula = next((p.formula for p in points if p.formula), None)
    if formula:
        lines += [f"Counting: {md_text(formula)}", ""]
    header = ["dtype", "shape (from)", "checked against"]
    for impl in impls:
        header += [md_text(impl)] if impl == BASELINE else [md_text(impl), f"{md_text(impl)} vs native"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    rows = list(dict.fromkeys((p.dtype, p.shape, p.source) for p in points))
    reasons: dict[str, int] = {}  # why a point has no host sample -> its footnote's number
    for dtype, shape, source in rows:
        here = [p for p in points if (p.dtype, p.shape) == (dtype, shape)]
        cells = [dtype, f"{shape} ({md_text(source)})", _checked_cell(here, reasons)]
        for impl in impls:
            point = index.get((case, operator, dtype, shape, impl))
            cells.append(point_cell(point, base))
            if impl != BASELINE:
                cells.append(speedup_cell(point, index))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if reasons:
        lines += [f"- [{number}] no float64 host sample: {md_text(why)}" for why, number in reasons.items()]
        lines.append("")
    failed = [p for p in points if p.status == "failed"]
    if failed:
        lines += [f"- **FAILED** {p.dtype} {p.shape} @{md_text(p.implementation)}: "
                  f"{md_text(p.errors[0] if p.errors else 'no error recorded')}" for p in failed]
        lines.append("")
    return lines


def operation_markdown(run_dir: Path, rows: pd.DataFrame | None = None) -> list[str]:
    """The report section for operation cases (nothing when the run has none): how the figures are made
    (once), the geometric-mean speed-up per dtype and implementation, a section per operator with every
    point, and the skipped points' reasons."""
    results = read_results(run_dir)
    collected = points_of(results)
    if not collected:
        return []
    index = point_index(collected)
    base = measured_base(rows)
    lines = ["## Operators (operation)", "", CONVENTION, "", *method_lines(results)]
    summary = geomean_speedups(collected)
    if summary:
        lines += ["### Geometric-mean speed-up against native, over every operator", "",
                  "| dtype | implementation | geomean speed-up (x) | min (x) | max (x) | points "
                  "| geomean host speed-up (x, single samples) | host points | failed | skipped |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {s['dtype']} | {md_text(s['implementation'])} | {_num(s['geomean'], 3)} | "
                  f"{_num(s['min'], 3)} | {_num(s['max'], 3)} | {s['points']} | {_num(s['host_geomean'], 3)} | "
                  f"{s['host_points']} | {s['failed']} | {s['skipped']} |" for s in summary]
        lines.append("")
    for (case, operator), points in by_operator(collected).items():
        lines += operator_section(case, operator, points, index, base)
    reasons: dict[tuple[str, str], int] = {}
    for p in collected:
        if p.status == "skipped" and p.errors:
            reasons[(p.implementation, p.errors[0])] = reasons.get((p.implementation, p.errors[0]), 0) + 1
    if reasons:
        lines += ["### Skipped (not run, and why)", ""]
        lines += [f"- @{md_text(impl)}: {md_text(why)} ({count} point{'s' if count > 1 else ''})"
                  for (impl, why), count in sorted(reasons.items())]
        lines.append("")
    return lines


def speedup_bars(collected: list[PointFigures]) -> dict[tuple[str, str], dict[str, list[float]]]:
    """(operator, dtype) -> implementation -> its speed-ups against native over the shapes both passed; every
    (operator, dtype) an implementation other than native ran is there, with no speed-up where none passed."""
    index = point_index(collected)
    bars: dict[tuple[str, str], dict[str, list[float]]] = {}
    for p in collected:
        if p.implementation == BASELINE or p.status == "skipped":
            continue
        found = bars.setdefault((p.operator, p.dtype), {}).setdefault(p.implementation, [])
        s = speedup(p, index)
        if s is not None and s > 0:
            found.append(s)
    return bars


def failed_everywhere(collected: list[PointFigures], key: tuple[str, str], implementation: str) -> bool:
    """Every point the implementation ran at this (operator, dtype) failed."""
    ran = [p.status for p in collected if (p.operator, p.dtype) == key and p.implementation == implementation
           and p.status != "skipped"]
    return bool(ran) and all(status == "failed" for status in ran)


def speedups_left_out(collected: list[PointFigures]) -> str | None:
    """What the speed-up plot leaves out and why, in words (None: nothing): the points that failed (per
    implementation), those whose native run failed (no speed-up to take) and those skipped."""
    index = point_index(collected)
    failed: dict[str, int] = {}
    no_native = skipped = 0
    for p in collected:
        if p.implementation == BASELINE:
            continue
        if p.status == "failed":
            failed[p.implementation] = failed.get(p.implementation, 0) + 1
        elif p.status == "skipped":
            skipped += 1
        elif speedup(p, index) is None:
            no_native += 1
    parts = []
    if failed:
        count = sum(failed.values())
        parts.append(f"{count} failed point{'s' if count > 1 else ''} ("
                     + ", ".join(f"{impl} {n}" for impl, n in sorted(failed.items())) + ")")
    if no_native:
        parts.append(f"{no_native} point{'s' if no_native > 1 else ''} whose native run failed or was skipped")
    if skipped:
        parts.append(f"{skipped} skipped (not run)")
    return f"left out: {'; '.join(parts)}; each is listed in the report's Operators section" if parts else None


def plot_speedups(plt: Any, collected: list[PointFigures], out: Path) -> Path | None:
    """Speed-up against native per operator and dtype (geometric mean over shapes), a bar per implementation;
    an implementation with no speed-up at an operator and dtype is marked there (failed, or no native), and what
    the plot leaves out is said under it."""
    bars = speedup_bars(collected)
    if not any(values for per in bars.values() for values in per.values()):
        return None
    labels = [f"{op}\n{dtype}" for op, dtype in bars]
    impls = sorted({impl for per in bars.values() for impl in per})
    width = 0.8 / len(impls)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(labels) + 2), 4.4))
    for i, impl in enumerate(impls):
        xs = [x + i * width for x in range(len(labels))]
        heights = [geomean(per.get(impl) or []) for per in bars.values()]
        ax.bar(xs, [h if h is not None else 0.0 for h in heights], width, label=impl)
        for x, height, key in zip(xs, heights, bars, strict=True):
            if height is None and impl in bars[key]:  # ran there, but no speed-up: never a bar of 0
                mark = "FAILED" if failed_everywhere(collected, key, impl) else "no speed-up"
                ax.text(x, 0.02, mark, rotation=90, fontsize=6, ha="center", va="bottom", color="tab:red")
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xticks([x + width * (len(impls) - 1) / 2 for x in range(len(labels))])
    ax.set_xticklabels(labels, fontsize=6, rotation=90)
    ax.set_ylabel("speed-up against native (x, geomean over shapes)")
    note = speedups_left_out(collected)
    ax.set_xlabel("operator, dtype" + ("\n" + "\n".join(textwrap.wrap(note, 110)) if note else ""), fontsize=7,
                  color="tab:red" if note else "black")
    ax.set_title("operators: speed-up against native (above 1: faster)", fontsize=9)
    ax.legend(fontsize=7)
    return save_png(plt, fig, out)
