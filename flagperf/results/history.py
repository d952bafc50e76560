"""A history of runs for baselines and regression verdicts.

SQLite by default (FLAGPERF_HISTORY_URL unset: results/history.sqlite); any SQLAlchemy URL otherwise,
e.g. postgresql+psycopg://user@host/flagperf for a team (the `postgres` extra; the password from PGPASSWORD
or ~/.pgpass, never the URL). The server's own postgresql+asyncpg:// URL is accepted and read with psycopg,
since the history is written synchronously.

Verdict for one figure of a run, against the same case, metric, vendor and device:
  baseline  = median of the last K earlier runs that measured it (K = baseline_runs)
  noise     = sqrt(history_cv^2 + run_cv^2): the history's run-to-run spread and this run's own
              round-to-round spread (coefficient of variation)
  threshold = max(sigma * noise, floor)
  change    = (value - baseline) / |baseline|; a regression when the figure moves the wrong way by more
              than the threshold (rates and capacities should rise, durations and losses fall).
So a metric that is noisy needs a larger drop to raise an alarm, and a steady one flags a real 5 % drop.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import (
    Column,
    DateTime,
    Engine,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    delete,
    insert,
    select,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from flagperf.errors import ConfigError, require
from flagperf.results.bounded import read_json_file
from flagperf.results.summary import summarize

DEFAULT_URL_ENV = "FLAGPERF_HISTORY_URL"

metadata = MetaData()
runs = Table(
    "runs", metadata,
    Column("run_id", String(128), primary_key=True),
    Column("recorded_at", DateTime(timezone=True), nullable=False),
    Column("vendor", String(64)),
    Column("device", String(256)),
    Column("suite", String(128)),
    Column("git_revision", String(64)),
    Column("counts", Text),
)
figures = Table(
    "figures", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(128), ForeignKey("runs.run_id", ondelete="CASCADE"), nullable=False, index=True),
    Column("case", String(128), nullable=False),
    Column("metric", String(128), nullable=False),
    Column("unit", String(32)),
    Column("value", Float, nullable=False),
    Column("spread_cv", Float),
    Column("rounds", Integer),
)


def history_engine(url: str | None = None, results_dir: str | Path = "results") -> Engine:
    url = url or os.environ.get(DEFAULT_URL_ENV) or f"sqlite:///{Path(results_dir).resolve() / 'history.sqlite'}"
    try:
        has_password = make_url(url).password is not None
    except ArgumentError:
        raise ConfigError("history_url", None, "not a database URL (postgresql+psycopg://user@host/db or "
                                               "sqlite:///path)") from None
    if has_password:  # a flow parameter is stored by Prefect, and run settings end up in files
        raise ConfigError("history_url", None, "holds a password: give it through PGPASSWORD or ~/.pgpass instead")
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    if url.startswith("postgresql+asyncpg://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql+asyncpg://")
    if url.startswith("postgresql+psycopg"):
        require("psycopg", needed_by="a history on PostgreSQL")
    engine = create_engine(url, pool_pre_ping=True)
    metadata.create_all(engine)
    return engine


def record_run(engine: Engine, run_dir: Path, recorded_at: datetime | None = None) -> int:
    """Store a run's headline figures (recording the same run again replaces it). Returns the count."""
    summary = summarize(run_dir)
    plan_file = run_dir / "plan.json"
    plan = read_json_file(plan_file, what="a run's plan") if plan_file.exists() or plan_file.is_symlink() else {}
    suite = plan.get("suite") if isinstance(plan, dict) else None
    ctx = summary.context
    with engine.begin() as conn:
        conn.execute(delete(figures).where(figures.c.run_id == summary.run_id))
        conn.execute(delete(runs).where(runs.c.run_id == summary.run_id))
        conn.execute(insert(runs).values(
            run_id=summary.run_id, recorded_at=recorded_at or datetime.now(timezone.utc), vendor=ctx.get("vendor"),
            device=ctx.get("device"), suite=suite, git_revision=ctx.get("git_revision"),
            counts=json.dumps(summary.counts)))
        rows = [{"run_id": summary.run_id, "case": e["case"], "metric": e["metric"], "unit": e["unit"],
                 "value": e["value"], "spread_cv": e["spread_cv"] if e["spread_over"] not in (None, "chunks") else None,
                 "rounds": e["rounds"]} for e in summary.headline]
        if rows:
            conn.execute(insert(figures), rows)
    return len(rows)


@dataclass(frozen=True)
class Verdict:
    case: str
    metric: str
    unit: str | None
    value: float
    baseline: float | None
    change: float | None
    threshold: float | None
    history: int
    status: Literal["regression", "improvement", "ok", "no-baseline"]

    def line(self) -> str:
        if self.baseline is None:
            return f"{self.case} {self.metric}: {self.value:.4g} {self.unit} (no baseline: {self.history} earlier runs)"
        return (f"{self.case} {self.metric}: {self.value:.4g} {self.unit} vs baseline {self.baseline:.4g} "
                f"({self.change:+.1%}, threshold ±{self.threshold:.1%} from {self.history} runs): {self.status}")


def check_run(engine: Engine, run_id: str, *, baseline_runs: int = 5, min_history: int = 3, sigma: float = 3.0,
              floor: float = 0.01) -> list[Verdict]:
    with engine.connect() as conn:
        run = conn.execute(select(runs).where(runs.c.run_id == run_id)).mappings().first()
        if run is None:
            raise KeyError(f"run {run_id} is not in the history")
        current = conn.execute(select(figures).where(figures.c.run_id == run_id)).mappings().all()
        verdicts = []
        for fig in current:
            earlier = conn.execute(
                select(figures.c.value)
                .join(runs, runs.c.run_id == figures.c.run_id)
                .where(figures.c.case == fig["case"], figures.c.metric == fig["metric"],
                       runs.c.vendor == run["vendor"], runs.c.device == run["device"],
                       runs.c.recorded_at < run["recorded_at"])
                .order_by(runs.c.recorded_at.desc()).limit(baseline_runs)
            ).scalars().all()
            verdicts.append(_verdict(fig, list(earlier), min_history, sigma, floor))
    return verdicts


def higher_is_better(metric: str, unit: str | None) -> bool:
    """Rates and capacities are better higher; durations (unit s) and losses are better lower."""
    return not (unit == "s" or "loss" in metric)


def _verdict(fig: Any, history: list[float], min_history: int, sigma: float, floor: float) -> Verdict:
    value = float(fig["value"])
    if len(history) < max(min_history, 2):  # a spread needs two points
        return Verdict(fig["case"], fig["metric"], fig["unit"], value, None, None, None, len(history), "no-baseline")
    baseline = statistics.median(history)
    history_cv = statistics.stdev(history) / baseline if baseline else 0.0
    noise = math.hypot(history_cv, fig["spread_cv"] or 0.0)
    threshold = max(sigma * noise, floor)
    change = (value - baseline) / abs(baseline) if baseline else 0.0
    better = change if higher_is_better(fig["metric"], fig["unit"]) else -change
    status: Literal["regression", "improvement", "ok"] = (
        "regression" if better < -threshold else "improvement" if better > threshold else "ok")
    return Verdict(fig["case"], fig["metric"], fig["unit"], value, baseline, change, threshold, len(history), status)


def verdicts_as_rows(verdicts: list[Verdict]) -> list[dict[str, Any]]:
    return [asdict(v) for v in verdicts]


@dataclass(frozen=True)
class Series:
    """One figure's course: a case's metric on one vendor and device."""

    case: str
    metric: str
    unit: str | None
    vendor: str | None
    device: str | None
    points: int


@dataclass(frozen=True)
class TrendPoint:
    run_id: str
    recorded_at: datetime
    verdict: Verdict  # judged against the runs before it, as check_run judged it that night


def list_series(engine: Engine) -> list[Series]:
    """Every figure the history holds, per vendor and device, with how many runs measured it."""
    from sqlalchemy import func

    with engine.connect() as conn:
        rows = conn.execute(
            select(figures.c.case, figures.c.metric, func.max(figures.c.unit), runs.c.vendor, runs.c.device,
                   func.count())
            .join(runs, runs.c.run_id == figures.c.run_id)
            .group_by(figures.c.case, figures.c.metric, runs.c.vendor, runs.c.device)
            .order_by(runs.c.vendor, runs.c.device, figures.c.case, figures.c.metric)).all()
    return [Series(*row) for row in rows]


def figure_trend(engine: Engine, case: str, metric: str, vendor: str | None, device: str | None, *,
                 baseline_runs: int = 5, min_history: int = 3, sigma: float = 3.0, floor: float = 0.01
                 ) -> list[TrendPoint]:
    """The figure's value in each run, oldest first, each with the verdict against the runs before it (the
    baseline band is baseline ± threshold; a regression is a point below it for a rate, above for a duration)."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(figures, runs.c.recorded_at)
            .join(runs, runs.c.run_id == figures.c.run_id)
            .where(figures.c.case == case, figures.c.metric == metric,
                   runs.c.vendor.is_(None) if vendor is None else runs.c.vendor == vendor,
                   runs.c.device.is_(None) if device is None else runs.c.device == device)
            .order_by(runs.c.recorded_at)).mappings().all()
    points = []
    for i, row in enumerate(rows):
        earlier = [float(r["value"]) for r in reversed(rows[max(0, i - baseline_runs):i])]
        points.append(TrendPoint(row["run_id"], row["recorded_at"],
                                 _verdict(row, earlier, min_history, sigma, floor)))
    return points
