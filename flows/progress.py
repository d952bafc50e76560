"""The console of `flagperf run`: a live view of the evaluation (cases x rounds x hosts, the stage each is in,
elapsed time) instead of a scroll of Prefect's log lines, and the full log in the run folder.

The view follows the run's own log records (each task run is named after its stage and round, e.g.
``run_case[computation-FP32/round1@local]``) and the round folders the collection writes; it asks nothing
of the server.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from flagperf.config.plan import PLAN_FILE
from flagperf.results.schema import RESULT_FILE, node_groups, read_result, round_dir

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
            groups = node_groups(case.config, hosts)  # the hosts its rounds run on, as the evaluation runs them
            for round_no in range(1, plan.rounds + 1):
                for group in groups:
                    for rank, host in enumerate(group):
                        self.rows[(case.name, round_no, host)] = {"stage": "waiting", "since": None, "ended": None,
                                                                  "rank": rank}

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
    claimed empty before the evaluation, which accepts it so (it refuses one with files), so lines wait in memory
    until the evaluation's plan is there.

    When the file cannot be written (a full or read-only results disk), the handler says so once on stderr
    and stops writing it: the console and the Prefect server still have the log, and the run goes on. It
    never reports through ``handleError``: inside a flow run Prefect turns ``print`` into log records, so a
    traceback printed for each failed record would come back here, record after record, until Python's
    recursion limit."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(level=logging.INFO)
        self.path = run_dir / CONTROLLER_LOG
        self.pending: list[bytes] = []
        self.file: Any = None
        self.written = 0  # bytes of this handler in the file: a file that got none is removed on failure
        self.broken: str | None = None  # why the file cannot be written, once it could not
        self._inside = threading.local()  # a record logged while this thread writes one is dropped
        self.setFormatter(RunFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        if self.broken or getattr(self._inside, "active", False):
            return
        self._inside.active = True
        try:
            line = (self.format(record) + "\n").encode("utf-8", "replace")
            if self.file is None and (self.path.parent / PLAN_FILE).is_file():
                self.file = self.path.open("ab", buffering=0)  # unbuffered: nothing left to fail at close
                self.pending, waiting = [], self.pending
                if self._ends_mid_line():  # a retry's log after the line a full disk cut short
                    waiting.insert(0, b"\n")
                for earlier in waiting:
                    self._write(earlier)
            if self.file is None:
                self.pending.append(line)
            else:
                self._write(line)
        except OSError as exc:
            self._give_up(exc)
        except Exception as exc:  # a record that cannot be formatted: say so in one line, keep going
            sys.stderr.write(f"warning: a log record could not be written to {self.path}: "
                             f"{type(exc).__name__}: {exc}\n")
        finally:
            self._inside.active = False

    def _ends_mid_line(self) -> bool:
        size = os.fstat(self.file.fileno()).st_size
        if size == 0:
            return False
        with self.path.open("rb") as earlier:
            earlier.seek(size - 1)
            return earlier.read(1) != b"\n"

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # a raw write may take part of the line (the last blocks of a disk) before it fails
            done = self.file.write(view)
            self.written += done
            view = view[done:]

    def _give_up(self, exc: OSError) -> None:
        self.broken = exc.strerror or str(exc) or type(exc).__name__
        self.pending.clear()
        self._close_file()
        with contextlib.suppress(OSError):
            if self.written == 0 and self.path.is_file() and self.path.stat().st_size == 0:
                self.path.unlink()  # no empty controller.log left behind
        sys.stderr.write(f"warning: cannot write the run's log to {self.path} ({self.broken}); it goes on "
                         "without it (the console and the Prefect server still have the log)\n")
        sys.stderr.flush()

    def _close_file(self) -> None:
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()
            self.file = None

    def close(self) -> None:
        self._close_file()
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
