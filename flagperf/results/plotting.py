"""matplotlib, imported only where a plot is drawn: a host without it (a lean GPU image) still measures, writes
its results and its report, which then says that no plot was drawn and why."""

from __future__ import annotations

from types import ModuleType

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
