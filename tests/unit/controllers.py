"""A controller of a run folder in a child process, for tests of controller.lock (flagperf.results.controller): it
enters controller_record as a run does, says "held", then does what the test writes to its stdin: "return" (ends
the run without a summary), "summary" (writes summary.json, then returns), "raise" (an error in its checks),
"fork" (forks a child without exec, which says "child PID" and waits), or nothing (waits to be killed). Also
``contend``: a controller of a run started at once with another, many times over (multiprocessing, spawned)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from flagperf.paths import PROJECT_ROOT
from tests.unit.childio import Lines

SCRIPT = """
import os, sys
from pathlib import Path
from flagperf.results import controller
from flagperf.results.controller import controller_record
run = Path(sys.argv[1])
if sys.argv[2:]:  # the test's machine id: the machine this controller's record names
    controller.MACHINE_ID_FILES = (Path(sys.argv[2]),)
with controller_record(run, run / "summary.json", "flow-1"):
    print("held", flush=True)
    what = sys.stdin.readline().strip()
    if what == "summary":
        (run / "summary.json").write_text("{}", encoding="utf-8")
    elif what == "raise":
        raise LookupError("a host failed its healthcheck")
    elif what == "fork":
        if os.fork() == 0:
            print(f"child {os.getpid()}", flush=True)
            sys.stdin.read()
            os._exit(0)
        sys.stdin.read()
"""


def controller(run: Path, machine_id: Path | None = None) -> tuple[subprocess.Popen[str], Lines]:
    """A child process holding ``run``'s controller.lock, once it said so; ``machine_id``: the file its machine id
    is read from (else the machine's own)."""
    args = [sys.executable, "-c", SCRIPT, str(run), *([str(machine_id)] if machine_id else [])]
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    lines = Lines(proc.stdout)
    assert lines.next() == "held\n", lines.text()
    return proc, lines


def told(proc: subprocess.Popen[str], what: str) -> int:
    """The controller told ``what``, and its exit status once it ended."""
    assert proc.stdin is not None
    proc.stdin.write(f"{what}\n")
    proc.stdin.close()
    return proc.wait(timeout=120)


def contend(run: str, times: int, start: Any, outcomes: Any, release: Any) -> None:
    """``times`` over: start with the other contender (``start``), enter controller_record of ``run``, put "held" or
    "refused" in ``outcomes``, and wait for the test (``release``) before the holder lets go."""
    from flagperf.results.controller import RunHeld, controller_record

    for _ in range(times):
        start.wait()
        try:
            with controller_record(Path(run), Path(run) / "summary.json"):
                outcomes.put("held")
                release.wait()
        except RunHeld:
            outcomes.put("refused")
            release.wait()
