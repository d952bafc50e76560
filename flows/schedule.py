"""The time zone the nightly's schedule is in: the one of the machine that makes the deployments (`prefect deploy`
from the project folder, as `flagperf server` does), so that the UI's schedule card ("At 02:00 AM") and its list
of upcoming runs (in the browser's zone, the lab's) say the same hour. prefect.yaml's nightly runs
``python3 -m flows.schedule`` as a build step and puts what it prints in the schedule's ``timezone``.

Only the standard library: the build step may run under any Python 3 of the machine.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from zoneinfo import available_timezones

TIMEZONE_ENV = "FLAGPERF_TIMEZONE"  # the admin's choice, over the machine's own
FALLBACK = "UTC"


def machine_timezone(environ: dict[str, str] | None = None, etc: Path = Path("/etc")) -> str:
    """FLAGPERF_TIMEZONE, else the machine's IANA zone (TZ, /etc/timezone, the /etc/localtime link), else UTC.
    Only names the schedule accepts (IANA names) are taken."""
    environ = dict(os.environ) if environ is None else environ
    known = available_timezones()
    chosen = environ.get(TIMEZONE_ENV, "")
    if chosen and chosen not in known:
        raise ValueError(f"{TIMEZONE_ENV}: {chosen!r} is not an IANA time zone name (e.g. Asia/Shanghai, UTC)")
    candidates = [chosen, environ.get("TZ", "").removeprefix(":")]
    with contextlib.suppress(OSError, UnicodeDecodeError):
        candidates.append((etc / "timezone").read_text(encoding="utf-8").strip())
    with contextlib.suppress(OSError):
        candidates.append(os.readlink(etc / "localtime").partition("zoneinfo/")[2])
    return next((name for name in candidates if name in known), FALLBACK)


if __name__ == "__main__":
    try:
        sys.stdout.write(machine_timezone() + "\n")
    except ValueError as exc:
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(2)
