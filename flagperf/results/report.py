"""The run report, generated from the result and monitor files (never hand-edited):
summary.csv, summary.json, report.md, report.html and plots/*.png. `flagperf report RUN` rebuilds it."""

from __future__ import annotations

import html
import re
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flagperf.results.analysis import read_monitors
from flagperf.results.markup import markdown_to_html, percent
from flagperf.results.operators import FAMILY as OPERATION
from flagperf.results.operators import collect_points, plot_speedups, speedups_left_out
from flagperf.results.plotting import NOT_DRAWN, pyplot, save_png
from flagperf.results.schema import read_result, write_text_atomic
from flagperf.results.serving import is_serving_point, serving_plots
from flagperf.results.summary import (
    REPORT_MD,
    ROUND_FOLDER,
    RunSummary,
    headline_figures,
    summarize,
    write_summary,
)

REPORT_HTML = "report.html"
PLOTS = "plots"
MAX_TIMELINES = 24  # per run: enough to see every round of a normal run, bounded for a huge one


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def plot_measured_vs_peak(plt: Any, summary: RunSummary, out: Path) -> Path | None:
    """A bar per headline figure; operation points have their own plot (a bar per operator and dtype)."""
    entries = [e for e in headline_figures(summary.headline) if e["ratio"] is not None]
    if not entries:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(entries) + 1.6))
    labels = [f"{e['case']}\n{e['metric']}" for e in entries]
    ratios = [100 * e["ratio"] for e in entries]
    estimated = [e.get("peak_bound") == "lower" for e in entries]  # an upper estimate: drawn apart, labelled ≤
    colours = ["tab:orange" if est else "tab:red" if r > 100 else "tab:blue" for r, est in zip(ratios, estimated,
                                                                                                  strict=True)]
    ax.barh(labels, ratios, color=colours)
    ax.axvline(100, color="black", linewidth=1)
    ax.set_xlim(0, max(115.0, max(ratios) * 1.12))
    for i, (r, est) in enumerate(zip(ratios, estimated, strict=True)):
        ax.text(r, i, f" {'≤ ' if est else ''}{percent(r / 100)}", va="center", fontsize=8)
    ax.set_xlabel("measured / peak (%)")
    legend = "red: above the spec table's peak" + ("; orange: against an estimated peak (a lower bound), an upper "
                                                     "estimate" if any(estimated) else "")
    ax.set_title("\n".join(textwrap.wrap(f"{summary.run_id}: measured vs peak ({legend})", 100)), fontsize=9)
    ax.invert_yaxis()
    save_png(plt, fig, out)
    return out


def plot_per_round(plt: Any, summary: RunSummary, out: Path) -> Path | None:
    """A panel per case and figure, a bar per round; operation points and generate points (tens of figures in a
    sweep) have their own plots."""
    rows = summary.rows[summary.rows["metric"].notna() & (summary.rows["family"] != OPERATION)]
    # .loc: a plain [] with an empty list (no figure at all) would select no columns, not no rows
    rows = rows.loc[[not is_serving_point(row) for row in rows[["family", "metric"]].to_dict("records")]]
    groups = list(rows.groupby(["case", "metric"], sort=False))
    if not groups:
        return None
    cols = min(3, len(groups))
    nrows = (len(groups) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 2.8 * nrows), squeeze=False)
    for ax, ((case, metric), group) in zip(axes.flat, groups, strict=False):
        labels = [f"r{r}\n{h}" if group["host"].nunique() > 1 else f"round {r}"
                  for r, h in zip(group["round"], group["host"], strict=True)]
        ax.bar(labels, group["value"], color="tab:blue")
        peak = group["peak"].dropna()
        if len(peak) and group["unit"].iloc[0] == group["peak_unit"].iloc[0]:
            ax.axhline(float(peak.iloc[0]), color="black", linestyle="--", linewidth=1, label="peak")
            ax.legend(fontsize=7)
        ax.set_title(f"{case} / {metric}", fontsize=8)
        ax.set_ylabel(unit_label(group["unit"].iloc[0]), fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    fig.suptitle(f"{summary.run_id}: each figure per round (its unit on the y axis)", fontsize=9)
    save_png(plt, fig, out, title_inches=0.35)
    return out


def unit_label(unit: object) -> str:
    """A y axis's label: the figure's unit, or that the case gave none (a bare number is no figure to read)."""
    return str(unit) if isinstance(unit, str) and unit else "no unit given by the case"


def plot_timeline(plt: Any, round_folder: Path, title: str, out: Path) -> Path | None:
    """Utilisation and power over a round, with the timed regions shaded."""
    monitors = [m for m in read_monitors(round_folder) if not m.samples.empty]
    if not monitors:
        return None
    try:
        windows = [m.window for m in read_result(round_folder / "result.json").metrics if m.window]
    except (OSError, ValueError):
        windows = []
    t_zero = min(float(m.samples["t"].iloc[0]) for m in monitors)
    fig, ax = plt.subplots(figsize=(8, 3))
    power_ax = None
    for mon in monitors:
        df = mon.samples
        t = df["t"] - t_zero
        util_cols = [c for c in df.columns if c == "cpu_percent" or c.endswith(".util_percent")]
        for col in util_cols:
            ax.plot(t, df[col], label=f"{mon.name}: {col}", linewidth=1)
        power_cols = [c for c in df.columns if c == "power_w" or c.endswith(".power_w")]
        for col in power_cols:
            if df[col].notna().any():
                power_ax = power_ax or ax.twinx()
                power_ax.plot(t, df[col], linestyle="--", linewidth=1, label=f"{mon.name}: {col}")
    for start, end in windows:
        ax.axvspan(start - t_zero, end - t_zero, color="tab:green", alpha=0.15, label="timed region")
    ax.set_xlabel("seconds since the first sample")
    ax.set_ylabel("utilisation (%)")
    ax.set_ylim(0, 105)
    if power_ax is not None:
        power_ax.set_ylabel("power (W)")
    handles, labels = ax.get_legend_handles_labels()
    if power_ax is not None:
        more = power_ax.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    unique = dict(zip(labels, handles, strict=True))
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="lower right")
    ax.set_title(title, fontsize=9)
    save_png(plt, fig, out)
    return out


def make_plots(run_dir: Path, summary: RunSummary) -> list[tuple[str, Path]] | None:
    """The report's plots; None where matplotlib is not installed."""
    plt = pyplot()
    if plt is None:
        return None
    plots_dir = run_dir / PLOTS
    plots_dir.mkdir(exist_ok=True)
    made: list[tuple[str, Path]] = []
    for title, fn, name in (("Measured vs peak", plot_measured_vs_peak, "measured_vs_peak.png"),
                            ("Each figure per round", plot_per_round, "throughput_per_round.png")):
        path = fn(plt, summary, plots_dir / name)
        if path:
            made.append((title, path))
    made += serving_plots(plt, run_dir, plots_dir, summary.rows)
    operation_points = collect_points(run_dir)
    speedups = plot_speedups(plt, operation_points, plots_dir / "operator_speedups.png")
    if speedups:
        left_out = speedups_left_out(operation_points)
        made.append(("Operators: speed-up against native" + (f" ({left_out})" if left_out else ""), speedups))
    folders = sorted(p.parent for p in run_dir.glob("*/round*/*_noderank*/result.json")
                     if ROUND_FOLDER.fullmatch(p.parent.name))
    for folder in folders[:MAX_TIMELINES]:
        case, round_name, host = folder.parts[-3], folder.parts[-2], folder.parts[-1]
        title = f"{case} {round_name} {host}: utilisation and power"
        path = plot_timeline(plt, folder, title, plots_dir / f"timeline_{_safe(case)}_{round_name}_{_safe(host)}.png")
        if path:
            made.append((title, path))
    return made


HTML_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }}
th:first-child, td:first-child, th:nth-child(2), td:nth-child(2) {{ text-align: left; }}
th {{ background: #f3f3f3; }} img {{ max-width: 100%; }} code {{ background: #f6f6f6; }}
</style></head><body>
{body}
</body></html>
"""


def build_report(run_dir: Path, section: Callable[[Path, RunSummary], str] | None = None
                 ) -> tuple[RunSummary, dict[str, Path]]:
    """Summarise a run folder and write every report file; safe to run again on the same folder. section: a
    further Markdown section from a layer above (the fleet diagnosis, which reads a rules file)."""
    summary = summarize(run_dir)
    plots = make_plots(run_dir, summary)
    paths = write_summary(run_dir, summary, NOT_DRAWN if plots is None
                          else [(title, path.relative_to(run_dir)) for title, path in plots])
    extra = section(run_dir, summary) if section is not None else ""
    if extra:  # before the plots, which a fleet has per host and round: hundreds would bury it at the end
        text = paths["markdown"].read_text(encoding="utf-8")
        head, plots, tail = text.partition("\n## Plots\n")
        write_text_atomic(paths["markdown"], f"{head}\n{extra}{plots}{tail}" if plots else f"{text}\n{extra}")
    # The report is text: a '<' or a link in a failure message is shown, never interpreted (markup.py).
    body = markdown_to_html((run_dir / REPORT_MD).read_text(encoding="utf-8"))
    html_path = run_dir / REPORT_HTML
    write_text_atomic(html_path, HTML_PAGE.format(title=html.escape(f"FlagPerf {summary.run_id}"), body=body))
    paths["html"] = html_path
    paths["plots"] = run_dir / PLOTS
    return summary, paths
