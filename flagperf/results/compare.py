"""Two runs side by side: ratios per case and metric, flagged where the difference exceeds the spread."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flagperf.results.summary import RunSummary, fmt, summarize


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

    def cells(self) -> list[str]:
        ratio = f"{self.ratio:.3f}" if self.ratio is not None else "-"
        spread = f"±{self.spread:.1%} ({self.spread_over})" if self.spread is not None else "unknown"
        if self.a is None or self.b is None:
            verdict = "only in " + ("B" if self.a is None else "A")
        else:
            verdict = "DIFFERENT" if self.flagged else "within spread"
        return [self.case, self.metric, self.unit, fmt(self.a), fmt(self.b), ratio, spread, verdict]


HEADER = ["case", "metric", "unit", "A", "B", "B/A", "spread (larger)", "verdict"]


def compare(a: RunSummary, b: RunSummary) -> list[Comparison]:
    index_a = {(e["case"], e["metric"]): e for e in a.headline}
    index_b = {(e["case"], e["metric"]): e for e in b.headline}
    out = []
    for key in [*index_a, *(k for k in index_b if k not in index_a)]:
        ea, eb = index_a.get(key), index_b.get(key)
        unit = (ea or eb or {}).get("unit", "")
        if ea and eb and ea["unit"] != eb["unit"]:
            unit = f"{ea['unit']} vs {eb['unit']}"
        va, vb = (ea or {}).get("value"), (eb or {}).get("value")
        ratio = vb / va if va and vb is not None and unit == ea["unit"] else None  # type: ignore[index]
        spreads = [(e["spread_cv"], e["spread_over"]) for e in (ea, eb) if e and e["spread_cv"] is not None]
        spread, over = max(spreads, key=lambda s: s[0]) if spreads else (None, None)
        flagged = ratio is not None and spread is not None and abs(ratio - 1) > spread
        if ratio is not None and spread is None:
            flagged = not math.isclose(ratio, 1.0)
        out.append(Comparison(key[0], key[1], unit, va, vb, ratio, spread, over, flagged))
    return out


def render_markdown(a_dir: Path, b_dir: Path, rows: list[Comparison]) -> str:
    lines = [f"# Comparison: A = {a_dir.name}, B = {b_dir.name}", "",
             "A difference is flagged when |B/A - 1| exceeds the larger spread (coefficient of variation across "
             "rounds, or across timed chunks for single-round runs) of the two runs.", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def compare_runs(a_dir: Path, b_dir: Path) -> tuple[list[Comparison], dict[str, Any]]:
    a, b = summarize(a_dir), summarize(b_dir)
    return compare(a, b), {"a": a.context, "b": b.context}
