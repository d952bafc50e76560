"""The nightly regression's numeric inputs and their bounds, defined once: the flow's form (flows.nightly) validates
its parameters with them, and `flagperf nightly` checks its options with them before prefect is imported
(flows.nightly_cli), so the two refuse the same values. Also the name of the night's verdict file, which the flow
writes and the command reads. No prefect here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field


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


ROUNDS = Bound(1, 100)  # rounds per case in a night
BASELINE_RUNS = Bound(1, 1000)  # earlier good nights whose median is a figure's baseline
SIGMA = Bound(0, 100, above_low=True)  # the baseline's spreads a figure may move before it regresses


def verdict_file_name(suite: str) -> str:
    """nightly-<suite>.json: the latest night's verdict, in the results folder (and a copy in its run folder)."""
    return f"nightly-{suite}.json"
