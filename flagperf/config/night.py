"""The nightly regression's numeric inputs and their bounds, defined once: the flow's form (flows.nightly) validates
its parameters with them, and `flagperf nightly` checks its options with them before prefect is imported
(flows.nightly_cli), so the two refuse the same values. Also the name of the night's verdict file, which the flow
writes and the command reads, and a night's run id, which the command chooses before the night starts (so that it
reads back its own verdict, never another night's). No prefect here."""

from __future__ import annotations

import json
import re
import secrets
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import Field

from flagperf.config.plan import new_run_id
from flagperf.results.bounded import read_bounded
from flagperf.results.limits import MAX_BASELINE_RUNS
from flagperf.results.schema import MAX_ROUNDS


@dataclass(frozen=True)
class Bound:
    """A closed range low..high, or (above_low) one that excludes low: sigma must be above 0."""

    low: float
    high: float
    above_low: bool = False

    def problem(self, value: float) -> str | None:
        """Why ``value`` is out of range, as a ConfigError's message; None when it is in it."""
        if self.above_low:
            if not self.low < value <= self.high:
                return f"must be above {self.low:g} and at most {self.high:g}, got {value}"
        elif not self.low <= value <= self.high:
            return f"must be between {self.low:g} and {self.high:g}, got {value}"
        return None

    def field(self) -> Any:
        """The same range as a pydantic constraint, for a flow parameter's Annotated type."""
        if self.above_low:
            return Field(gt=self.low, le=self.high)
        return Field(ge=self.low, le=self.high)


ROUNDS = Bound(1, MAX_ROUNDS)  # rounds per case in a night: the planner's limit
BASELINE_RUNS = Bound(1, MAX_BASELINE_RUNS)  # earlier good nights whose median is a figure's baseline
SIGMA = Bound(0, 100, above_low=True)  # the baseline's spreads a figure may move before it regresses


def verdict_file_name(suite: str) -> str:
    """nightly-<suite>.json: the latest night's verdict, in the results folder (and a copy in its run folder); no run
    id takes such a name (flagperf.paths.run_id_problem)."""
    return f"nightly-{suite}.json"


def new_night_run_id() -> str:
    """A night's run id: run<UTC start, to the second>-<12 hex digits> (NIGHT_RUN_ID). Six random bytes, not the usual
    two: nights of several suites sharing a results folder start in the same second by cron, and a refused night
    removes the run folder it made (never one it found). The start time in it orders the nights that publish the
    latest night's verdict file (flows.nightly)."""
    return new_run_id(secrets.token_hex(6))


# new_night_run_id's ids exactly: only these name a start time. A name typed in the nightly form in another shape
# (`mine`, `run99991231235959-mine`) names none.
NIGHT_RUN_ID = re.compile(r"run(\d{14})-[0-9a-f]{12}\Z")


def night_start(run_id: str) -> datetime | None:
    """When the night ``run_id`` started, to the second, as its run id names it; None for a run id not of
    new_night_run_id's form exactly (most run_ids given in the nightly form) or naming no valid time."""
    match = NIGHT_RUN_ID.match(run_id)
    with suppress(ValueError):
        return datetime.strptime(match[1], "%Y%m%d%H%M%S").replace(tzinfo=timezone.utc) if match else None
    return None


def started_later(run_id: str, than: str, now: datetime | None = None) -> bool:
    """Whether the night ``run_id`` started after the night ``than``, by the start times their run ids name. Not
    ordered (False): nights started in the same second, a run id that names no time, and one whose time is after
    ``now`` (this machine's clock): a typed run_id, or a night on a host whose clock runs ahead, would otherwise keep
    the latest night's verdict file from every night after it until that time."""
    start, other = night_start(run_id), night_start(than)
    return (start is not None and other is not None and other < start
            and start <= (now or datetime.now(timezone.utc)))


def read_verdict(path: Path) -> dict[str, Any] | None:
    """A verdict file as a dict; None where it is missing, not a regular file (never waited on), too large or no JSON
    object: a night that reads it back takes that as no verdict."""
    with suppress(OSError, ValueError):
        data = json.loads(read_bounded(path))
        return data if isinstance(data, dict) else None
    return None
