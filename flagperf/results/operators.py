"""The operation family in the run report: an operator x dtype x shape x implementation table (latency, speed-up
against native, TFLOPS or GB/s, share of the peak, of the roofline and of the measured base spec where the run
has one, correctness), the geometric-mean speed-up per dtype and implementation, the failed points with their
errors, and a plot of the speed-ups.

Reads the rounds' result.json files (RoundResult.operation, written by flagperf.operation.driver); a figure of
several rounds is their mean."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from flagperf.results.plotting import save_png
from flagperf.results.schema import RESULT_FILE, read_result

FAMILY = "operation"
BASELINE = "native"
# Base-spec figures an operator's figure is held against where the same run measured them (best first).
MEASURED_COMPUTE = ("gemm_{dtype}_max", "gemm_{dtype}")
MEASURED_MEMORY = ("memory_copy_bandwidth",)


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
    statuses: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    max_abs_error: float | None = None
    reference: str | None = None

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


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def collect_points(run_dir: Path) -> list[PointFigures]:
    figures: dict[tuple[str, ...], PointFigures] = {}
    for path in sorted(run_dir.glob(f"*/round*/*_noderank*/{RESULT_FILE}")):
        try:
            result = read_result(path)
        except (OSError, ValueError):
            continue  # the summary lists unreadable files already
        if result.family != FAMILY or result.operation is None:
            continue
        ratios = {m.name: m.ratio for m in result.metrics}
        for p in result.operation.points:
            shape = "x".join(f"{k}{v}" for k, v in p.shape.items())
            key = (result.case, p.operator, p.dtype, shape, p.implementation)
            entry = figures.setdefault(key, PointFigures(*key, source=p.source))
            entry.statuses.append(p.status)
            if p.error:
                entry.errors.append(p.error)
            if p.status == "passed" and p.latency_s is not None and p.value is not None:
                entry.latencies.append(p.latency_s)
                entry.values.append(p.value)
                entry.bound_unit = p.unit
                if p.metric and ratios.get(p.metric) is not None:
                    entry.ratios.append(float(ratios[p.metric]))  # type: ignore[arg-type]
                if p.roofline is not None:
                    entry.rooflines.append(p.roofline)
            if p.max_abs_error is not None:
                entry.max_abs_error = max(entry.max_abs_error or 0.0, p.max_abs_error)
            entry.reference = p.reference or entry.reference
    return list(figures.values())


def speedup(point: PointFigures, points: dict[tuple[str, ...], PointFigures]) -> float | None:
    """Native's latency / this implementation's, on the same case, operator, dtype and shape."""
    base = points.get((point.case, point.operator, point.dtype, point.shape, BASELINE))
    if base is None or base.latency is None or point.latency is None:
        return None
    return base.latency / point.latency


def geomean_speedups(collected: list[PointFigures]) -> list[dict[str, Any]]:
    """Per dtype and implementation (native excluded): the geometric mean of the speed-ups over the points
    both passed, with how many points that is and how many of the implementation's failed."""
    index = {(p.case, p.operator, p.dtype, p.shape, p.implementation): p for p in collected}
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for p in collected:
        if p.implementation == BASELINE:
            continue
        entry = groups.setdefault((p.dtype, p.implementation), {"dtype": p.dtype, "implementation": p.implementation,
                                                                "speedups": [], "failed": 0, "skipped": 0})
        if p.status == "failed":
            entry["failed"] += 1
        elif p.status == "skipped":
            entry["skipped"] += 1
        s = speedup(p, index)
        if s is not None and s > 0:
            entry["speedups"].append(s)
    rows = []
    for (dtype, impl), entry in sorted(groups.items()):
        values = entry["speedups"]
        rows.append({"dtype": dtype, "implementation": impl, "points": len(values),
                     "geomean": math.exp(statistics.fmean(math.log(v) for v in values)) if values else None,
                     "min": min(values) if values else None, "max": max(values) if values else None,
                     "failed": entry["failed"], "skipped": entry["skipped"]})
    return rows


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
    return "-" if value is None else f"{value:.{digits}g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


TABLE_HEADER = ["case", "operator", "dtype", "shape", "implementation", "correct", "latency ms", "speed-up",
                "figure", "% of peak", "% of roofline", "% of measured", "max abs error"]


def operation_markdown(run_dir: Path, rows: pd.DataFrame | None = None) -> list[str]:
    """The report section for operation cases; nothing when the run has none."""
    collected = collect_points(run_dir)
    if not collected:
        return []
    index = {(p.case, p.operator, p.dtype, p.shape, p.implementation): p for p in collected}
    base = measured_base(rows)
    lines = ["## Operators (operation)", "",
             "Each implementation's output is checked against the operator computed in higher precision before it "
             "is timed: a wrong result is a failed point, never a figure. Latency is the median over the timed "
             "iterations (mean over rounds); speed-up = native's latency / the implementation's; the figure is "
             "TFLOPS for compute-bound operators and GB/s for memory-bound ones, counted as each round's "
             "result.json states; % of roofline = max(FLOPs / peak FLOP/s, bytes / peak bandwidth) / latency; "
             "% of measured = against the same run's base spec (GEMM max-achievable or copy bandwidth).", ""]
    summary = geomean_speedups(collected)
    if summary:
        lines += ["### Geometric-mean speed-up against native", "",
                  "| dtype | implementation | geomean | min | max | points | failed | skipped |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {s['dtype']} | {s['implementation']} | {_num(s['geomean'], 3)} | {_num(s['min'], 3)} | "
                  f"{_num(s['max'], 3)} | {s['points']} | {s['failed']} | {s['skipped']} |" for s in summary]
        lines.append("")
    lines += ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    for p in collected:
        measured = share_of_measured(p, base)
        correct = {"passed": "yes", "failed": "**no**", "skipped": "skipped"}[p.status]
        latency = "-" if p.latency is None else f"{p.latency * 1e3:.4g}"
        figure = "-" if p.value is None else f"{p.value:.4g} {p.bound_unit}"
        cells = [p.case, p.operator, p.dtype, p.shape, p.implementation, correct, latency,
                 _num(speedup(p, index), 3), figure, _pct(_mean(p.ratios)), _pct(_mean(p.rooflines)),
                 "-" if measured is None else f"{_pct(measured[0])} of {measured[1]}", _num(p.max_abs_error, 3)]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines.append("")
    failed = [p for p in collected if p.status == "failed"]
    if failed:
        lines += ["### Failed points (wrong result or error: no figure)", ""]
        lines += [f"- {p.case} / {p.operator} {p.dtype} {p.shape} @{p.implementation}: {_cell(p.errors[0])}"
                  for p in failed]
        lines.append("")
    reasons: dict[tuple[str, str], int] = {}
    for p in collected:
        if p.status == "skipped" and p.errors:
            reasons[(p.implementation, p.errors[0])] = reasons.get((p.implementation, p.errors[0]), 0) + 1
    if reasons:
        lines += ["### Skipped (not run, and why)", ""]
        lines += [f"- @{impl}: {_cell(why)} ({count} point{'s' if count > 1 else ''})"
                  for (impl, why), count in sorted(reasons.items())]
        lines.append("")
    return lines


def plot_speedups(plt: Any, run_dir: Path, out: Path) -> Path | None:
    """Speed-up against native per operator and dtype (geometric mean over shapes), a bar per implementation."""
    collected = collect_points(run_dir)
    index = {(p.case, p.operator, p.dtype, p.shape, p.implementation): p for p in collected}
    bars: dict[tuple[str, str], dict[str, list[float]]] = {}
    for p in collected:
        s = speedup(p, index)
        if p.implementation != BASELINE and s is not None and s > 0:
            bars.setdefault((p.operator, p.dtype), {}).setdefault(p.implementation, []).append(s)
    if not bars:
        return None
    labels = [f"{op}\n{dtype}" for op, dtype in bars]
    impls = sorted({impl for per in bars.values() for impl in per})
    width = 0.8 / len(impls)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(labels) + 2), 4))
    for i, impl in enumerate(impls):
        heights = [math.exp(statistics.fmean(math.log(v) for v in per[impl])) if impl in per else 0.0
                   for per in bars.values()]
        ax.bar([x + i * width for x in range(len(labels))], heights, width, label=impl)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xticks([x + width * (len(impls) - 1) / 2 for x in range(len(labels))])
    ax.set_xticklabels(labels, fontsize=6, rotation=90)
    ax.set_ylabel("speed-up against native (geomean over shapes)")
    ax.set_title("operators: speed-up against native (above 1: faster)", fontsize=9)
    ax.legend(fontsize=7)
    return save_png(plt, fig, out)
