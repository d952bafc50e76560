"""Two runs side by side: ratios per case and metric, flagged where the difference exceeds the spread; for
operation cases one ratio per operator and implementation (the geometric mean over its points) instead of one
per point; for serving cases also their curves at equal interactivity and their goodput at the SLO
(docs/serving-report.md)."""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flagperf.results.markup import md_text
from flagperf.results.operators import UNCERTAINTY_METHOD, PointFigures, collect_points, geomean
from flagperf.results.serving import ServingPoint, serving_points, slo_text
from flagperf.results.summary import (
    RunSummary,
    every_result_read,
    fmt,
    headline_figures,
    hosts_left_out,
    summarize,
)


@dataclass(frozen=True)
class Comparison:
    case: str
    metric: str
    unit: str
    a: float | None
    b: float | None
    ratio: float | None  # b / a
    spread: float | None  # the larger coefficient of variation of the two runs
    spread_over: str | None
    flagged: bool
    note: str | None = None  # points failing or found in one run only (operation rows); a unit one run only states
    per_operator: bool = False  # an operation row: an operator and implementation over its points

    def cells(self) -> list[str]:
        ratio = f"{self.ratio:.3f}" if self.ratio is not None else "-"
        spread = f"±{self.spread:.1%} ({self.spread_over})" if self.spread is not None else "unknown"
        if self.a is None or self.b is None:
            verdict = self.note or "only in " + ("B" if self.a is None else "A")
        else:
            verdict = ("DIFFERENT" if self.flagged else "within spread") + (f"; {self.note}" if self.note else "")
        return [self.case, self.metric, self.unit, fmt(self.a), fmt(self.b), ratio, spread, verdict]


HEADER = ["case", "metric", "unit", "A", "B", "B/A", "spread (larger)", "verdict"]
SPREAD_NOTE = ("A difference is flagged when |B/A - 1| exceeds the larger spread (coefficient of variation across "
               "rounds, or across timed chunks for single-round runs) of the two runs.")
OPERATION_NOTE = ("Operation cases: one row per operator and implementation; A and B are the geometric means of "
                  "the figure over the dtype x shape points both runs passed, so B/A is the geometric mean of the "
                  "points' ratios; its spread is each point's relative uncertainty in A and in B in quadrature, "
                  "then their mean over the points (not divided by sqrt(points): a run's points share its clock "
                  "and thermal state, so their errors move together). A point's uncertainty in a run of two or "
                  "more rounds: " + UNCERTAINTY_METHOD + ", which includes how far the rounds drifted; in a "
                  "single round at least the iterations' spread, (p90 - p10) / (2 x median): a median's interval "
                  "says how well that round knew its median, not where the next run's lands (1-3% apart is "
                  "ordinary), so run both with 3 or more rounds to compare finer than one iteration's noise. A "
                  "point that passed in one run and failed in the other is flagged.")


def compare(a: RunSummary, b: RunSummary) -> list[Comparison]:
    """Per case and metric of the headline; operation points are compared per operator (compare_operations)."""
    index_a = {(e["case"], e["metric"]): e for e in headline_figures(a.headline)}
    index_b = {(e["case"], e["metric"]): e for e in headline_figures(b.headline)}
    out = []
    for key in [*index_a, *(k for k in index_b if k not in index_a)]:
        ea, eb = index_a.get(key), index_b.get(key)
        unit = (ea or eb or {}).get("unit", "")
        note, comparable = None, True
        if ea and eb and ea["unit"] != eb["unit"]:
            if ea["unit"] and eb["unit"]:  # two units: two quantities, no ratio
                unit, comparable = f"{ea['unit']} vs {eb['unit']}", False
            else:  # the same figure, its unit stated by one run only (a release that added it): B/A holds
                unit = ea["unit"] or eb["unit"]
                note = "unit now stated (A gave none)" if eb["unit"] else "unit stated in A only (B gives none)"
        va, vb = (ea or {}).get("value"), (eb or {}).get("value")
        ratio = vb / va if va and vb is not None and comparable else None
        spreads = [(e["spread_cv"], e["spread_over"]) for e in (ea, eb) if e and e["spread_cv"] is not None]
        spread, over = max(spreads, key=lambda s: s[0]) if spreads else (None, None)
        flagged = ratio is not None and spread is not None and abs(ratio - 1) > spread
        if ratio is not None and spread is None:
            flagged = not math.isclose(ratio, 1.0)
        out.append(Comparison(key[0], key[1], unit, va, vb, ratio, spread, over, flagged, note))
    return out


def _operator_points(points: list[PointFigures]) -> dict[tuple[str, str, str], dict[tuple[str, str], PointFigures]]:
    """(case, operator, implementation) -> (dtype, shape) -> the point."""
    grouped: dict[tuple[str, str, str], dict[tuple[str, str], PointFigures]] = {}
    for p in points:
        grouped.setdefault((p.case, p.operator, p.implementation), {})[(p.dtype, p.shape)] = p
    return grouped


def _run_uncertainty(point: PointFigures) -> tuple[float, str] | None:
    """A point's relative uncertainty in one run, for a change between runs, and its basis: with two or more
    rounds its medians' intervals and the rounds' t-interval (point.uncertainty), which measure the drift
    between rounds; with one round at least its iterations' spread, since one round's median interval says
    how well that round knew its median, not how far the next run's lands (clocks, heat, neighbours: 1-3% is
    ordinary), and one iteration's spread is the run's own measure of how much its state moves. None where
    it has neither."""
    ci, spread = point.uncertainty, point.spread
    if len(point.by_round) >= 2:  # without intervals (under 6 iterations), the rounds' own spread
        found = ci if ci is not None else spread
        return (found, "rounds") if found is not None else None
    found = [u for u in (ci, spread) if u is not None]
    return (max(found), "single round") if found else None


def _geomean_uncertainty(pa: list[PointFigures], pb: list[PointFigures]) -> tuple[float, str] | None:
    """The relative uncertainty of B/A's geometric mean over these paired points, and what it is over: each
    point's uncertainty in A and in B (_run_uncertainty) in quadrature (two runs: independent), then their
    mean over the points, not divided by sqrt(points): the points of a run share its clock and thermal state,
    so their errors move together and a geometric mean does not average them away. None where a point has
    no uncertainty at all."""
    found = [(_run_uncertainty(a), _run_uncertainty(b)) for a, b in zip(pa, pb, strict=True)]
    if not found or any(ua is None or ub is None for ua, ub in found):
        return None
    total = statistics.fmean(math.hypot(ua[0], ub[0]) for ua, ub in found)  # type: ignore[index]
    bases = {basis for pair in found for _, basis in pair}  # type: ignore[misc]
    basis = ("medians' 95% CI and rounds" if bases == {"rounds"} else
             "single round: the larger of the medians' 95% CI and the iterations' spread" if bases == {"single round"}
             else "medians' 95% CI and rounds, or single round: the larger of it and the iterations' spread")
    return total, f"{basis}; mean over {len(found)} point{'s' if len(found) > 1 else ''}"


def compare_operations(a: list[PointFigures], b: list[PointFigures]) -> list[Comparison]:
    """Per case, operator and implementation of either run: B/A of the geometric mean of the figure over the
    dtype x shape points both runs passed, flagged where it is farther from 1 than its uncertainty (that of the
    points' medians, _geomean_uncertainty), or where a point passed in one run and failed in the other."""
    groups_a, groups_b = _operator_points(a), _operator_points(b)
    out = []
    for key in [*groups_a, *(k for k in groups_b if k not in groups_a)]:
        case, operator, impl = key
        pa, pb = groups_a.get(key, {}), groups_b.get(key, {})
        both = [k for k in pa if k in pb]
        shared = [k for k in both if (pa[k].value or 0) > 0 and (pb[k].value or 0) > 0]
        unit = next((p.bound_unit for p in [*pa.values(), *pb.values()] if p.bound_unit), None) or "-"
        fail_in_b = sum(pa[k].status == "passed" and pb[k].status == "failed" for k in both)
        fail_in_a = sum(pa[k].status == "failed" and pb[k].status == "passed" for k in both)
        notes = [f"{n} point{'s' if n > 1 else ''} failing only in {run}"
                 for n, run in ((fail_in_b, "B"), (fail_in_a, "A")) if n]
        notes += [f"{n} point{'s' if n > 1 else ''} only in {run}"
                  for n, run in ((len(pa) - len(both), "A"), (len(pb) - len(both), "B")) if n and pa and pb]
        failing_in_both = sum(pa[k].status == "failed" and pb[k].status == "failed" for k in both)
        if failing_in_both:  # not in the geomean: said, so that the ratio is not read as over every point
            notes.append(f"{failing_in_both} point{'s' if failing_in_both > 1 else ''} failing in both")
        metric = f"{operator} @{impl}: geomean over {len(shared)} of {len(set(pa) | set(pb))} points"
        if not pa or not pb or not shared:
            # the cells read "only in B" wherever A has no value: say which run measured it
            notes.insert(0, "no point passed in both" if pa and pb else f"only in {'A' if pa else 'B'}")
            out.append(Comparison(case, metric, unit, None, None, None, None, None, bool(fail_in_a or fail_in_b),
                                  "; ".join(notes) or None, per_operator=True))
            continue
        va = geomean([pa[k].value for k in shared])  # type: ignore[misc]
        vb = geomean([pb[k].value for k in shared])  # type: ignore[misc]
        ratio = vb / va if va and vb is not None else None
        found = _geomean_uncertainty([pa[k] for k in shared], [pb[k] for k in shared])
        spread, over = found if found is not None else (None, None)
        if ratio is None:
            differs = False
        elif spread is None:
            differs = not math.isclose(ratio, 1.0)
        else:
            differs = abs(ratio - 1) > spread
        out.append(Comparison(case, metric, unit, va, vb, ratio, spread, over,
                              differs or bool(fail_in_a or fail_in_b), "; ".join(notes) or None, per_operator=True))
    return out


def render_markdown(a_dir: Path, b_dir: Path, rows: list[Comparison],
                    serving: list[CurveComparison] | None = None, left_out: list[str] | None = None) -> str:
    lines = [f"# Comparison: A = {a_dir.name}, B = {b_dir.name}", "", SPREAD_NOTE, ""]
    lines += [*(md_text(line) for line in left_out or []), *([""] if left_out else [])]
    if any(r.per_operator for r in rows):
        lines += [OPERATION_NOTE, ""]
    lines += ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    if serving:
        lines += ["", *serving_comparison_markdown(serving)]
    return "\n".join(lines) + "\n"


CLI_NAMES = ("RUN_A", "RUN_B")
CLI_ADVICE = "repair or remove it to compare the run"


def compare_runs(a_dir: Path, b_dir: Path, *, names: tuple[str, str] = CLI_NAMES,
                 shown: tuple[str | None, str | None] | None = None, advice: str = CLI_ADVICE
                 ) -> tuple[list[Comparison], dict[str, Any]]:
    """Both runs compared, each refused where a result.json of it is unreadable (every_result_read), named as the
    caller's user knows it: ``names`` (the CLI's arguments; the site's runs), ``shown`` (the folders as given; the
    default: a_dir and b_dir; None for one: its file relative to the run alone) and ``advice``."""
    shown_a, shown_b = shown if shown is not None else (str(a_dir), str(b_dir))
    a = every_result_read(summarize(a_dir), names[0], shown_a, advice)
    b = every_result_read(summarize(b_dir), names[1], shown_b, advice)
    rows = compare(a, b) + compare_operations(collect_points(a_dir), collect_points(b_dir))
    # Host rounds neither mean holds (no result.json, a failed round): said, not refused, as diagnose says them
    left_out = [f"{which}: {line}" for which, run_dir, summary in (("A", a_dir, a), ("B", b_dir, b))
                if (line := hosts_left_out(run_dir, summary))]
    return rows, {"a": a.context, "b": b.context, "left_out": left_out}


# --- serving curves ---------------------------------------------------------------------------------------


def pareto_frontier(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points (interactivity, throughput per device) no other point beats on both axes, by interactivity:
    a point of a sweep that a neighbour dominates (past saturation) is not part of the curve."""
    frontier: list[tuple[float, float]] = []
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):  # at equal interactivity the higher one first
        if not frontier or y > frontier[-1][1]:
            frontier.append((x, y))
    return frontier[::-1]


def interpolate(frontier: list[tuple[float, float]], x: float) -> float | None:
    """Throughput at interactivity ``x``: linear between the frontier's neighbours, None outside it."""
    if not frontier or not frontier[0][0] <= x <= frontier[-1][0]:
        return None
    for (x0, y0), (x1, y1) in itertools.pairwise(frontier):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return frontier[0][1]  # a single point, at exactly its interactivity


@dataclass(frozen=True)
class CurvePoint:
    interactivity: float
    a: float
    b: float

    @property
    def ratio(self) -> float:
        return self.b / self.a


@dataclass(frozen=True)
class CurveComparison:
    """One serving case in both runs: throughput per device at equal interactivity, goodput at the SLO."""

    case: str
    a_series: str
    b_series: str
    a_range: tuple[float, float] | None  # interactivity each curve covers
    b_range: tuple[float, float] | None
    rows: list[CurvePoint]
    a_best: ServingPoint | None  # the best goodput among the points meeting the SLO
    b_best: ServingPoint | None
    a_slo: str
    b_slo: str
    a_workload: str | None = None  # the prompt set with its token lengths, and the API (None: not recorded)
    b_workload: str | None = None
    workloads_differ: bool = False  # by the recorded prompt sets (workloads_differ), not the lines' wording
    a_failed: tuple[str, ...] = ()  # points left out: every request failed in some round
    b_failed: tuple[str, ...] = ()

    @property
    def goodput_ratio(self) -> float | None:
        if self.a_best is None or self.b_best is None or not self.a_best.goodput or self.b_best.goodput is None:
            return None
        return self.b_best.goodput / self.a_best.goodput

    @property
    def geomean_ratio(self) -> float | None:
        if not self.rows or any(r.a <= 0 or r.b <= 0 for r in self.rows):
            return None
        return math.exp(sum(math.log(r.ratio) for r in self.rows) / len(self.rows))


# Mean token lengths within 1 % are one workload: a synthetic set's mean moves a little with how many prompts were made.
WORKLOAD_TOLERANCE = 0.01


def workloads_differ(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two runs sent different work (ServingPoint.workload_facts): the API, exact_output where both recorded
    it, and where both recorded a prompt set its source and seed and the mean token lengths (the text's, asked out,
    and the server's count where both have it) within WORKLOAD_TOLERANCE, else their prompts lines with the wording
    normalised. Nothing recorded on either side: not said to differ (unknown)."""
    if a["api"] is not None and b["api"] is not None and a["api"] != b["api"]:
        return True
    # max_new_tokens forced out or stopped at end of sequence: other work with the same tokens asked
    if a.get("exact_output") is not None and b.get("exact_output") is not None \
            and a["exact_output"] != b["exact_output"]:
        return True
    sa, sb = a["set"], b["set"]
    if sa is not None and sb is not None:
        if (sa["source"], sa["seed"]) != (sb["source"], sb["seed"]):
            return True
        return any(sa[k] is not None and sb[k] is not None
                   and not math.isclose(sa[k], sb[k], rel_tol=WORKLOAD_TOLERANCE)
                   for k in ("input_tokens", "output_tokens_asked", "input_tokens_server"))
    return a["line"] is not None and b["line"] is not None and a["line"] != b["line"]


def best_goodput(points: list[ServingPoint]) -> ServingPoint | None:
    met = [p for p in points if p.slo_met and p.goodput is not None and not p.failed_point]
    return max(met, key=lambda p: p.goodput or 0.0) if met else None


def _curve(points: list[ServingPoint]) -> list[tuple[float, float]]:
    # A point that failed in one round keeps the other rounds' figures, but they are not the load's: left out
    return pareto_frontier([(p.interactivity, p.per_device) for p in points
                            if p.interactivity is not None and p.per_device is not None and not p.failed_point])


def compare_serving(a: list[ServingPoint], b: list[ServingPoint]) -> list[CurveComparison]:
    """Per serving case in both runs: B's and A's throughput per device at every interactivity either curve
    has a point at, within the range both cover (never extrapolated), and B's best goodput meeting the SLO
    over A's."""
    by_case_a: dict[str, list[ServingPoint]] = {}
    by_case_b: dict[str, list[ServingPoint]] = {}
    for p in a:
        by_case_a.setdefault(p.case, []).append(p)
    for p in b:
        by_case_b.setdefault(p.case, []).append(p)
    out = []
    for case in [c for c in by_case_a if c in by_case_b]:
        pa, pb = by_case_a[case], by_case_b[case]
        ca, cb = _curve(pa), _curve(pb)
        rows: list[CurvePoint] = []
        if ca and cb:
            low, high = max(ca[0][0], cb[0][0]), min(ca[-1][0], cb[-1][0])
            for x in sorted({x for x, _ in ca + cb if low <= x <= high}):
                ya, yb = interpolate(ca, x), interpolate(cb, x)
                if ya is not None and yb is not None and ya > 0:
                    rows.append(CurvePoint(x, ya, yb))
        out.append(CurveComparison(
            case=case, a_series=pa[0].series, b_series=pb[0].series,
            a_range=(ca[0][0], ca[-1][0]) if ca else None, b_range=(cb[0][0], cb[-1][0]) if cb else None,
            rows=rows, a_best=best_goodput(pa), b_best=best_goodput(pb), a_slo=slo_text(pa[0].slo),
            b_slo=slo_text(pb[0].slo), a_workload=pa[0].workload, b_workload=pb[0].workload,
            workloads_differ=workloads_differ(pa[0].workload_facts, pb[0].workload_facts),
            a_failed=tuple(p.label for p in pa if p.failed_point),
            b_failed=tuple(p.label for p in pb if p.failed_point)))
    return out


def compare_serving_runs(a_dir: Path, b_dir: Path) -> list[CurveComparison]:
    return compare_serving(serving_points(a_dir), serving_points(b_dir))


def _range(r: tuple[float, float] | None) -> str:
    return "no point with both figures" if r is None else f"{r[0]:.4g}-{r[1]:.4g}"


def _goodput_line(c: CurveComparison) -> str:
    def best(point: ServingPoint | None) -> str:
        return "no point met the SLO" if point is None else f"{point.goodput:.4g} requests/s at {point.label}"

    line = f"goodput at the SLO (the best among the points meeting it): A {best(c.a_best)}, B {best(c.b_best)}"
    ratio = c.goodput_ratio
    line += f"; **B/A = {ratio:.3f}**" if ratio is not None else "; no ratio"
    if c.a_slo != c.b_slo:
        line += f" (the SLOs differ: A {c.a_slo}; B {c.b_slo})"
    return line


def serving_comparison_markdown(comparisons: list[CurveComparison]) -> list[str]:
    lines = ["## Serving curves at equal interactivity", "",
             "Output tokens/s per device of each run's Pareto curve (points no other point beats on both axes), "
             "linear between its points, at every interactivity (1 / mean TPOT) where either run has a point "
             "inside the range both cover; nothing is extrapolated."]
    for c in comparisons:
        lines += ["", f"### {c.case}: A {c.a_series}, B {c.b_series}", ""]
        if c.workloads_differ:
            # Throughput at equal interactivity depends on the prompt and output lengths: a ratio across two
            # workloads measures the workloads as much as the systems.
            lines.append(f"- **the workloads differ**, so the ratios compare different work: "
                         f"A {md_text(c.a_workload or 'not recorded')}; B {md_text(c.b_workload or 'not recorded')}")
        lines += [f"- interactivity covered: A {_range(c.a_range)}, B {_range(c.b_range)} tokens/s per user",
                  f"- {_goodput_line(c)}"]
        if c.a_failed or c.b_failed:
            lines.append("- **failed points left out** (every request failed in some round): "
                         f"A {', '.join(c.a_failed) or 'none'}; B {', '.join(c.b_failed) or 'none'}")
        if not c.rows:
            lines.append("- the curves share no interactivity: no throughput ratio")
            continue
        geomean = c.geomean_ratio
        if geomean is not None:
            lines.append(f"- throughput per device B/A over the shared range: geometric mean {geomean:.3f}, "
                         f"from {min(r.ratio for r in c.rows):.3f} to {max(r.ratio for r in c.rows):.3f}")
        lines += ["", "| interactivity (tokens/s per user) | A tokens/s per device | B tokens/s per device | B/A |",
                  "|---|---|---|---|"]
        lines += [f"| {r.interactivity:.4g} | {r.a:.4g} | {r.b:.4g} | {r.ratio:.3f} |" for r in c.rows]
    return lines
