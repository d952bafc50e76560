"""The generate family in the run report: a table per concurrency level and the serving trade-off curve
(output tokens/s per user against output tokens/s per device, one point per level).

Reads the rounds' result.json files (metrics named <what>@c<concurrency>, see flagperf.generate.metrics) and
the summary rows (energy per output token, from the monitors over each level's window)."""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

import pandas as pd

from flagperf.results.schema import RESULT_FILE, atomic_path, read_result

LEVEL_METRIC = re.compile(r"^(?P<what>.+)@c(?P<level>\d+)$")
FAMILY = "generate"


def serving_levels(run_dir: Path, rows: pd.DataFrame | None = None) -> list[dict[str, Any]]:
    """One entry per (case, concurrency): each metric's value and percentiles, averaged over the rounds."""
    figures: dict[tuple[str, int], dict[str, list[tuple[float | None, ...]]]] = {}
    for path in sorted(run_dir.glob(f"*/round*/*_noderank*/{RESULT_FILE}")):
        try:
            result = read_result(path)
        except (OSError, ValueError):
            continue  # the summary lists unreadable files already
        if result.family != FAMILY or result.status != "success":
            continue
        for m in result.metrics:
            match = LEVEL_METRIC.match(m.name)
            if match:
                level = figures.setdefault((result.case, int(match["level"])), {})
                level.setdefault(match["what"], []).append((m.value, m.p50, m.p90, m.p99, m.mfu))
    levels = []
    for (case, concurrency), metrics in sorted(figures.items()):
        entry: dict[str, Any] = {"case": case, "concurrency": concurrency, "rounds": 0}
        for what, values in metrics.items():
            entry["rounds"] = max(entry["rounds"], len(values))
            for i, key in enumerate(("value", "p50", "p90", "p99", "mfu")):
                present = [v[i] for v in values if v[i] is not None]
                entry[f"{what}.{key}"] = statistics.fmean(present) if present else None
        entry["energy_per_token_j"] = None
        if rows is not None and not rows.empty:
            mine = rows[(rows["case"] == case) & (rows["metric"] == f"output_tokens_per_s@c{concurrency}")]
            energy = pd.to_numeric(mine["energy_per_work"], errors="coerce").dropna()
            entry["energy_per_token_j"] = float(energy.mean()) if len(energy) else None
        levels.append(entry)
    return levels


def _num(value: float | None, scale: float = 1.0, digits: int = 4) -> str:
    return "-" if value is None else f"{value * scale:.{digits}g}"


def _triple(entry: dict[str, Any], what: str) -> str:
    return " / ".join(_num(entry.get(f"{what}.{p}"), 1e3, 3) for p in ("p50", "p90", "p99"))


SERVING_HEADER = ["case", "concurrency", "output tokens/s", "tokens/s per user", "requests/s",
                  "TTFT ms p50/p90/p99", "TPOT ms p50/p90/p99", "ITL ms p50/p90/p99", "MFU", "J per token",
                  "ROUGE-L", "rounds"]


def serving_markdown(run_dir: Path, rows: pd.DataFrame | None) -> list[str]:
    """The report section for generate cases; nothing when the run has none."""
    levels = serving_levels(run_dir, rows)
    if not levels:
        return []
    lines = ["## LLM serving (generate)", "",
             "Per concurrency level: output tokens/s of the device, tokens/s each user saw (output tokens / "
             "request latency, mean), time to first token, time per output token after the first, every "
             "inter-token gap; MFU = the level's model FLOPs (prefill and decode, the convention of every family) "
             "/ its time / peak; energy per output token from the "
             "monitors over the level's window.", "",
             "| " + " | ".join(SERVING_HEADER) + " |", "|" + "---|" * len(SERVING_HEADER)]
    for e in levels:
        mfu = e.get("output_tokens_per_s.mfu")
        cells = [e["case"], str(e["concurrency"]), _num(e.get("output_tokens_per_s.value")),
                 _num(e.get("tokens_per_s_per_user.value")), _num(e.get("requests_per_s.value")),
                 _triple(e, "ttft_s"), _triple(e, "tpot_s"), _triple(e, "itl_s"),
                 "-" if mfu is None else f"{100 * mfu:.3g}%" + (" (above 100 %: check the peak)" if mfu > 1 else ""),
                 _num(e["energy_per_token_j"]), _num(e.get("rougeL.value"), 1.0, 3), str(e["rounds"])]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def plot_serving_curve(plt: Any, run_dir: Path, out: Path, rows: pd.DataFrame | None = None) -> Path | None:
    """Tokens/s per user (interactivity) against tokens/s per device (throughput), a line per case."""
    levels = [e for e in serving_levels(run_dir, rows) if e.get("output_tokens_per_s.value") is not None
              and e.get("tokens_per_s_per_user.value") is not None]
    if not levels:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for case in dict.fromkeys(e["case"] for e in levels):
        points = [e for e in levels if e["case"] == case]
        xs = [e["output_tokens_per_s.value"] for e in points]
        ys = [e["tokens_per_s_per_user.value"] for e in points]
        ax.plot(xs, ys, marker="o", label=case)
        for e, x, y in zip(points, xs, ys, strict=True):
            ax.annotate(f"c{e['concurrency']}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("output tokens/s per device")
    ax.set_ylabel("output tokens/s per user")
    ax.set_title("serving trade-off: each point a concurrency level", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    try:
        with atomic_path(out) as tmp:  # a full disk leaves no half-written PNG
            fig.savefig(tmp, dpi=110, format="png")
    finally:
        plt.close(fig)
    return out
