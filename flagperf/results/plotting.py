"""matplotlib, imported only where a plot is drawn: a host without it (a lean GPU image) still measures, writes
its results and its report, which then says that no plot was drawn and why."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

NOT_DRAWN = "plots not drawn: matplotlib is not installed (pip install matplotlib, then `flagperf report RUN`)"


def pyplot() -> ModuleType | None:
    """matplotlib.pyplot on the file-only Agg backend, or None where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def save_png(plt: Any, fig: Any, out: Path, *, title_inches: float = 0.0) -> Path:
    """Write the figure as out (laid out, 110 dpi) and close it; a full disk leaves no half-written PNG.
    title_inches: room kept at the top for the figure's suptitle, which tight_layout does not lay out."""
    from flagperf.results.schema import atomic_path

    height = fig.get_size_inches()[1]
    fig.tight_layout(rect=(0.0, 0.0, 1.0, max(0.5, 1.0 - title_inches / height)))
    try:
        with atomic_path(out) as tmp:
            fig.savefig(tmp, dpi=110, format="png")
    finally:
        plt.close(fig)
    return out
