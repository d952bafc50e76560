"""Each figure's course over time, drawn from the history: the values, the band each verdict allowed around its
baseline (a log band: see flagperf.results.history) and the regression and improvement markers, as check_run
judged each night.

Drawn with matplotlib's object API (no pyplot: the site draws in several threads at once); where matplotlib
is not installed the page says so and shows the table alone. The same course for every figure, as a file a lab
reads without the site: write_trend_file (the nightly writes trends.csv next to the history)."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from flagperf.paths import HISTORY_FILE
from flagperf.results.history import INTERRUPTED, TrendPoint, history_found, history_reader, trend_table
from flagperf.results.markup import spreadsheet_cell
from flagperf.results.schema import atomic_path

NO_MATPLOTLIB = "plot not drawn: matplotlib is not installed on the server (pip install matplotlib)"


# One engine (and its pool of connections) per team database the site reads, not one per request. A SQLite file is
# opened anew each time: it may not be there yet, or be made again.
_readers: dict[str, Engine] = {}
_readers_lock = threading.Lock()


def open_history(root: Path, url: str | None) -> Engine | None:
    """The history the nightly writes: ``url`` (a team's database) or the results folder's SQLite file, opened
    read-only (history_reader: reading never makes or changes it, only the night that records does); None when
    there is none yet. FlagperfError where an earlier version made it and no night has recorded since."""
    if not url:
        url = f"sqlite:///{root.resolve() / HISTORY_FILE}"
    with _readers_lock:
        engine = _readers.get(url) or history_reader(url, root)
        if engine is None:
            return None
        if engine.dialect.name != "sqlite":
            _readers[url] = engine
    return engine if history_found(engine, url) else None


def matplotlib_figure() -> type | None:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    return Figure


def trend_png(points: list[TrendPoint], title: str) -> bytes | None:
    """The plot as PNG bytes; None where matplotlib is not installed."""
    figure_class = matplotlib_figure()
    if figure_class is None:
        return None
    fig = figure_class(figsize=(9, 3.6))
    ax = fig.add_subplot()
    failed = [p for p in points if p.verdict is None]
    points = [p for p in points if p.verdict is not None]
    times = [p.recorded_at for p in points]
    values = [p.verdict.value for p in points]  # type: ignore[union-attr]
    ax.plot(times, values, color="tab:blue", linewidth=1.2, marker="o", markersize=4, label="value")
    labelled: set[str] = set()
    for p in failed:  # a night that measured nothing: a line where its point would be
        interrupted = p.outcome == INTERRUPTED
        ax.axvline(p.recorded_at, color="tab:gray" if interrupted else "tab:red", linestyle=":", linewidth=1.5,
                   label=f"{p.outcome} night" if p.outcome not in labelled else None)
        labelled.add(p.outcome)
    banded = [p for p in points if p.verdict.low is not None and p.verdict.high is not None]  # type: ignore[union-attr]
    if banded:
        low = [p.verdict.low for p in banded]  # type: ignore[union-attr]
        high = [p.verdict.high for p in banded]  # type: ignore[union-attr]
        ax.fill_between([p.recorded_at for p in banded], low, high, color="tab:gray", alpha=0.25, step="mid",
                        label="allowed band")
        ax.plot([p.recorded_at for p in banded], [p.verdict.baseline for p in banded], color="tab:gray",
                linewidth=1, linestyle="--", label="baseline")
    for status, colour, marker in (("regression", "tab:red", "v"), ("improvement", "tab:green", "^"),
                                   ("new-workload", "tab:orange", "s")):
        marked = [p for p in points if p.verdict.status == status]  # type: ignore[union-attr]
        if marked:
            ax.scatter([p.recorded_at for p in marked], [p.verdict.value for p in marked], color=colour,
                       marker=marker, s=90, zorder=3, label=status)
    unit = points[0].verdict.unit if points else None  # type: ignore[union-attr]
    ax.set_ylabel(unit or "value")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=100)
    return out.getvalue()


def write_trend_file(engine: Engine, path: Path, **judging: Any) -> int:
    """Every figure's course (history.trend_table) as CSV at ``path``, replaced whole (a reader never sees half
    of it). Returns the number of rows."""
    table = trend_table(engine, **judging)
    with atomic_path(path) as temporary:
        table.map(spreadsheet_cell).to_csv(temporary, index=False)
    return len(table)
