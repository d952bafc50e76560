"""A `prefect deploy` held running, for the tests of a signal that comes while the deployments are made (by
`flagperf server`, or by create_deployments called here): a sitecustomize on the PYTHONPATH of the processes
under test makes their `prefect deploy` write its pid to a file and go no further, as one waiting on a slow
database would (a signal's default action ends it). Every other process goes on as it is."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import psutil

MARKER_ENV = "FLAGPERF_TEST_DEPLOY_HELD"
ROOT = Path(__file__).resolve().parents[2]
SITECUSTOMIZE = f"""\
import os, signal
with open("/proc/self/cmdline", "rb") as own:
    cmdline = own.read().split(b"\\0")
if cmdline[1:3] == [b"-m", b"prefect"] and b"deploy" in cmdline:
    marker = os.environ[{MARKER_ENV!r}]
    with open(marker + ".part", "w") as part:
        part.write(str(os.getpid()))
    os.replace(marker + ".part", marker)
    while True:
        signal.pause()
"""


def holding_env(folder: Path) -> tuple[dict[str, str], Path]:
    """The environment entries that hold `prefect deploy` (this project first on the path, as it is here), and
    the file its pid will be in."""
    site = folder / "hold-deploy"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    marker = folder / "deploy-held"
    return {"PYTHONPATH": f"{site}:{ROOT}", MARKER_ENV: str(marker)}, marker


def wait_held(marker: Path, still_going: Callable[[], bool], timeout_s: float = 240) -> int:
    """The pid of the held `prefect deploy`, once it runs; fails when ``still_going()`` turns false first (what
    should start it ended) or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not marker.is_file():
        assert still_going(), "what should run prefect deploy ended before it did"
        assert time.monotonic() < deadline, f"prefect deploy did not start within {timeout_s:.0f} s"
        time.sleep(0.2)
    return int(marker.read_text())


def running(process: psutil.Process | int) -> bool:
    """Whether ``process`` has not ended (a zombie has; a psutil.Process knows its pid used again for another)."""
    try:
        process = psutil.Process(process) if isinstance(process, int) else process
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
