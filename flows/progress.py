"""The console of `flagperf run`: a live view of the evaluation (cases x rounds x hosts, the stage each is in,
elapsed time) instead of a scroll of Prefect's log lines, and the full log in the run folder.

The view follows the run's own log records (each task run is named after its stage and round, e.g.
``run_case[computation-FP32/round1@local]``) and the round folders the collection writes; it asks nothing
of the server.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from flagperf.results.schema import RESULT_FILE, read_result, round_dir

CONTROLLER_LOG = "controller.log"  # the full log of a `flagperf run`, in its run folder
ROUND_TASK = re.compile(r"^(?P<stage>[a-z_]+)\[(?P<case>[^/\]]+)/round(?P<round>\d+)@(?P<host>[^#\]]+)")
HOST_TASK = re.compile(r"^(?P<stage>healthcheck|build_image|probe_image)\[(?P<host>[^\]]+)\]")
STAGE_WORDS = {"start_monitors": "starting monitors", "run_case": "running", "stop_monitors": "stopping monitors",
               "collect_logs": "collecting"}
STATUS_STYLE = {"success": "green", "unsupported": "yellow", "failed": "red"}


class Progress(logging.Handler):
    """A logging handler that keeps the stage of every planned round, and renders them as a table."""

    def __init__(self, plan: Any, hosts: list[str], run_dir: Path) -> None:
        super().__init__(level=logging.DEBUG)
        self.run_dir = run_dir
        self.started = time.monotonic()
        self._rows_lock = threading.Lock()
        self.phase = "starting Prefect"
        self.rows: dict[tuple[str, int, str], dict[str, Any]] = {}
        for case in plan.cases:
            nnodes = int(case.config.get("nnodes", 1))
            names = hosts[:nnodes] if nnodes > 1 else hosts
            for round_no in range(1, plan.rounds + 1):
                for rank, host in enumerate(names):
                    self.rows[(case.name, round_no, host)] = {"stage": "waiting", "since": None, "ended": None,
                                                              "rank": rank if nnodes > 1 else 0}

    def emit(self, record: logging.LogRecord) -> None:
        name = getattr(record, "task_run_name", None) or ""
        with self._rows_lock:
            if match := ROUND_TASK.match(name):
                row = self.rows.get((match["case"], int(match["round"]), match["host"]))
                if row is not None and row["ended"] is None:
                    row["stage"] = STAGE_WORDS.get(match["stage"], match["stage"])
                    row["since"] = row["since"] or time.monotonic()
                    self.phase = "running rounds"
            elif match := HOST_TASK.match(name):
                self.phase = f"{match['stage'].replace('_', ' ')} ({match['host']})"
            elif record.name == "prefect.flow_runs" and "Beginning" in record.getMessage():
                self.phase = "planning"

    def _refresh_done(self) -> None:
        for (case, round_no, host), row in self.rows.items():
            if row["ended"] is not None:
                continue
            path = round_dir(self.run_dir, case, round_no, host, row["rank"]) / RESULT_FILE
            if path.is_file():
                try:
                    row["stage"] = read_result(path).status
                except (OSError, ValueError):
                    continue
                row["ended"] = time.monotonic()
                row["since"] = row["since"] or row["ended"]

    def __rich__(self) -> RenderableType:
        with self._rows_lock:
            self._refresh_done()
            now = time.monotonic()
            table = Table("case", "round", "host", "stage", "elapsed", title_justify="left",
                          title=f"{escape(self.run_dir.name)}: {escape(self.phase)}, {now - self.started:.0f} s")
            for (case, round_no, host), row in self.rows.items():
                elapsed = f"{(row['ended'] or now) - row['since']:.0f} s" if row["since"] else "-"
                stage = Text(row["stage"], style=STATUS_STYLE.get(row["stage"], "cyan" if row["since"] else "dim"))
                table.add_row(escape(case), str(round_no), escape(host), stage, elapsed)
            done = sum(r["ended"] is not None for r in self.rows.values())
            footer = Text(f"{done} of {len(self.rows)} rounds done; full log: {self.run_dir / CONTROLLER_LOG}",
                          style="dim")
        return Group(table, footer)


class RunFolderLog(logging.Handler):
    """Every log line of the run (Prefect's and the core's, INFO and up) into the run folder. The folder is
    made by the evaluation (which refuses one that exists), so lines wait in memory until it is there."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(level=logging.INFO)
        self.path = run_dir / CONTROLLER_LOG
        self.pending: list[str] = []
        self.file: Any = None
        self.setFormatter(RunFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
            if self.file is None and self.path.parent.is_dir():
                self.file = self.path.open("a", encoding="utf-8")
                self.file.writelines(self.pending)
                self.pending.clear()
            if self.file is None:
                self.pending.append(line)
            else:
                self.file.write(line)
                self.file.flush()
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        super().close()


class RunFormatter(logging.Formatter):
    """Prefect's console format (which run logged it), without colour."""

    def format(self, record: logging.LogRecord) -> str:
        where = getattr(record, "task_run_name", None) or getattr(record, "flow_run_name", None) or record.name
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        text = f"{stamp}.{int(record.msecs):03d} | {record.levelname:<7} | {where} - {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def live_view(progress: Progress, console: Console) -> Live:
    return Live(progress, console=console, refresh_per_second=2, transient=False, redirect_stderr=False)
