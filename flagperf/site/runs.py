"""The runs of a results folder as the site shows them, and the few files of a run it serves.

A run is a folder directly under the results root, named like a run id, not a link, holding plan.json or
summary.json. Of a run, only these are served: report.html, report.md, summary.csv and plots/<name>.png|svg,
each a regular file reached without following a link and lying inside the root once resolved. Nothing else
(result.json, job.json, case.log, controller.log, history.sqlite, server logs) is reachable by any address.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from uuid import UUID

from flagperf.errors import ConfigError
from flagperf.paths import NAME_PATTERN
from flagperf.results.bounded import read_json_file
from flagperf.results.controller import ControllerGone, controller_gone
from flagperf.results.operators import is_operation
from flagperf.results.summary import INTERRUPTED_FILE, PLAN_JSON, SUMMARY_JSON, fmt

RUN_FILES = {"report.html": "text/html; charset=utf-8", "report.md": "text/markdown; charset=utf-8",
             "summary.csv": "text/csv; charset=utf-8"}
PLOTS = "plots"
# A served file is read whole into memory: one larger than this (no report or plot is) is not served.
MAX_SERVED_BYTES = 256 << 20
PLOT_TYPES = {".png": "image/png", ".svg": "image/svg+xml"}
PLOT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,200}\.(png|svg)$")
# The start time a generated run id carries (flagperf/config/plan.py: run%Y%m%d%H%M%S-suffix, UTC): a retry
# rewrites plan.json and summary.json, so their times are the retry's, not the run's.
RUN_ID_TIME = re.compile(r"^run(\d{14})-")
MAX_RUNS = 2000  # listed, newest first: a folder of years of nightlies stays one page the browser can show
HEADLINE_FIGURES = 3  # per run in the list


@dataclass
class RunInfo:
    run_id: str
    started: datetime
    outcome: str
    tone: str  # ok, warn, bad, none: the outcome's colour
    vendor: str = ""
    device: str = ""
    suite: str = ""
    figures: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    has_report: bool = False
    flow_run_id: str = ""  # the Prefect flow run that made it (plan.json), where one did


def _no_link_stat(path: Path) -> os.stat_result | None:
    try:
        return path.lstat()
    except OSError:
        return None


def run_folder(root: Path, run_id: str) -> Path | None:
    """The run folder of ``run_id`` under ``root``, or None when there is no such run (a bad name, a link,
    a folder that is no run)."""
    if not NAME_PATTERN.fullmatch(run_id) or run_id.startswith("."):
        return None
    folder = root / run_id
    info = _no_link_stat(folder)
    if info is None or not stat.S_ISDIR(info.st_mode):
        return None
    marks = [_no_link_stat(folder / name) for name in (PLAN_JSON, SUMMARY_JSON)]
    if not any(m is not None and stat.S_ISREG(m.st_mode) for m in marks):
        return None
    return folder


def read_served(root: Path, run_id: str, *parts: str) -> bytes | None:
    """A file of a run that the site serves, read without following any link; None when it is not one."""
    folder = run_folder(root, run_id)
    if folder is None:
        return None
    if parts in ((name,) for name in RUN_FILES) or (len(parts) == 2 and parts[0] == PLOTS
                                                     and PLOT_NAME.fullmatch(parts[1])):
        path = folder.joinpath(*parts)
    else:
        return None
    for step in (folder / parts[0], path):
        info = _no_link_stat(step)
        if info is None or stat.S_ISLNK(info.st_mode):
            return None
    if not path.resolve().is_relative_to(root.resolve()):
        return None
    try:  # O_NOFOLLOW: a link put in its place after the checks is refused too
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return None
        body = handle.read(MAX_SERVED_BYTES + 1)
    return body if len(body) <= MAX_SERVED_BYTES else None


def _read_json(path: Path) -> dict[str, Any]:
    info = _no_link_stat(path)
    if info is None or not stat.S_ISREG(info.st_mode):
        return {}
    try:  # bounded: a run folder's file may be anything a results root was given
        data = read_json_file(path)
    except ConfigError:
        return {}
    return data if isinstance(data, dict) else {}


def outcome_of(summary: dict[str, Any], interrupted: bool, gone: ControllerGone | None = None) -> tuple[str, str]:
    """The run's outcome in a few words, and its tone. ``gone``: its controller is gone (flagperf.results.controller),
    so a run with no summary will get none: killed without a word (SIGKILL, a power cut), or ended before it (an
    error, Ctrl-C before any round)."""
    counts = summary.get("counts") or {}
    rounds, success = int(counts.get("rounds", 0)), int(counts.get("success", 0))
    failed, unsupported = int(counts.get("failed", 0)), int(counts.get("unsupported", 0))
    if not summary:
        if gone is not None and not interrupted:
            return ("controller killed, no report" if gone.killed else "ended without a report"), "bad"
        return ("interrupted, no report" if interrupted else "no report yet"), "none"
    if interrupted:
        return f"interrupted ({success} of {rounds} rounds measured)", "bad"
    if failed:
        return f"failed ({failed} of {rounds} rounds)", "bad"
    if rounds == 0:
        return "nothing ran", "warn"
    if success == 0:
        return f"nothing measured ({unsupported} rounds unsupported)", "warn"
    retried = len(summary.get("retried") or [])
    again = f"; {retried} ran again in a retry" if retried else ""  # the report says which and why
    if unsupported or summary.get("problems"):
        return f"succeeded with gaps ({unsupported} unsupported, {len(summary.get('problems') or [])} problems" \
               f"{again})", "warn"
    return f"succeeded ({rounds} rounds{again})", "ok"


def started_at(run_id: str, stamps: list[float]) -> datetime:
    """When the run started: the time in its id where it has one, else its oldest file's."""
    found = RUN_ID_TIME.match(run_id)
    if found:
        try:
            return datetime.strptime(found.group(1), "%Y%m%d%H%M%S").replace(tzinfo=timezone.utc)
        except ValueError:  # digits that are no date: a name of someone's own
            pass
    return datetime.fromtimestamp(min(stamps), timezone.utc)


def figure_text(entry: dict[str, Any]) -> str:
    return f"{entry.get('case')} {entry.get('metric')}: {fmt(entry.get('value'))} {entry.get('unit') or ''}".strip()


def operator_text(entry: dict[str, Any]) -> str:
    """An operator of an operation case in a few words: its implementations' geomean speed-ups against native,
    else how many of its points were correct."""
    speedups = [f"{impl} {s['geomean']:.3g}x" for impl, s in (entry.get("speedups") or {}).items()
                if isinstance(s, dict) and isinstance(s.get("geomean"), (int, float))]
    ran = int(entry.get("passed") or 0) + int(entry.get("failed") or 0)
    said = ", ".join(speedups) + " vs native" if speedups else f"{entry.get('passed') or 0} of {ran} points correct"
    failed = f", {entry['failed']} FAILED" if speedups and entry.get("failed") else ""
    return f"{entry.get('case')} {entry.get('operator')}: {said}{failed}"


def headline_texts(summary: dict[str, Any]) -> list[str]:
    """The run's first headline figures for the list of runs: a figure each, then an operator each (an
    operation run's points are summed up per operator, not listed)."""
    figures = [figure_text(e) for e in summary.get("headline") or [] if isinstance(e, dict) and not is_operation(e)]
    operators = [operator_text(e) for e in summary.get("operators") or [] if isinstance(e, dict)]
    return [*figures, *operators][:HEADLINE_FIGURES]


def run_info(folder: Path) -> RunInfo:
    summary = _read_json(folder / SUMMARY_JSON)
    plan = _read_json(folder / PLAN_JSON)
    stamps = [info.st_mtime for info in (_no_link_stat(folder / PLAN_JSON), _no_link_stat(folder / SUMMARY_JSON))
              if info is not None]
    interrupted = _no_link_stat(folder / INTERRUPTED_FILE) is not None
    # asked only of a run with no summary.json (not one unreadable: that run ended): one open and two lock tests
    gone = (controller_gone(folder, folder / SUMMARY_JSON)
            if _no_link_stat(folder / SUMMARY_JSON) is None and not interrupted else None)
    outcome, tone = outcome_of(summary, interrupted, gone)
    context = summary.get("context") or {}
    vendor = context.get("vendor") or plan.get("vendor") or ""
    if isinstance(vendor, dict):  # the plan keeps the resolved vendor as an object
        vendor = vendor.get("name", "")
    report = _no_link_stat(folder / "report.html")
    return RunInfo(
        run_id=folder.name, started=started_at(folder.name, stamps), outcome=outcome, tone=tone,
        vendor=str(vendor), device=str(context.get("device") or ""), suite=str(plan.get("suite") or ""),
        figures=headline_texts(summary),
        summary=summary, has_report=report is not None and stat.S_ISREG(report.st_mode),
        flow_run_id=flow_run_of(plan))


def flow_run_of(plan: dict[str, Any]) -> str:
    """The flow run id plan.json names, if it is one (it becomes part of an address)."""
    try:
        return str(UUID(str(plan.get("flow_run_id"))))
    except ValueError:
        return ""


def list_runs(root: Path) -> list[RunInfo]:
    """The runs under ``root``, newest first."""
    try:
        names = [entry.name for entry in os.scandir(root)]
    except OSError:
        return []
    folders = [f for f in (run_folder(root, name) for name in names) if f is not None]
    return sorted((run_info(f) for f in folders), key=lambda r: (r.started, r.run_id), reverse=True)[:MAX_RUNS]


def plot_names(folder: Path) -> list[str]:
    """The run's plots that read_served would serve, by name."""
    plots = folder / PLOTS
    info = _no_link_stat(plots)
    if info is None or not stat.S_ISDIR(info.st_mode):
        return []
    names = []
    for entry in sorted(os.scandir(plots), key=lambda e: e.name):
        if PLOT_NAME.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
            names.append(entry.name)
    return names
