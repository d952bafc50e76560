"""Each device's health as the vendor's health probe read it at the healthcheck, before the host's first round.

A vendor folder may name a ``health_module`` in vendor.yaml: ``device_health(settings) -> dict`` run on the host by
the probe (flagperf.hosts.probe), whose answer is recorded in the run folder, hosts/<host>.health.json, under
``probe.device_health`` (and under ``image_probes.<framework>.device_health`` where it ran in an image too). Its
fields are the vendor's, named as its monitor names its own (e.g. ``pcie_width_lanes_missing``, ``retirement_pending``),
so that the fleet diagnosis's ``health_field`` rules read every vendor alike. A field a device or driver does not
report is null, never 0; a reading that could not be made says why (``available: false``, ``reason``), and the
rules reading it then say "unknown" with that reason rather than pass.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from flagperf.errors import ConfigError
from flagperf.results.bounded import read_json_file

HEALTH_KEY = "device_health"  # the probe's key for the reading
MAX_DEVICES = 4096


class DeviceReading(BaseModel):
    """One device: its index (the vendor tool's, e.g. NVML's), its UUID where it has one, and numeric health
    fields (null: not reported); ``facts`` holds what is shown but never compared (names, bus ids, reason lists)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0)
    uuid: str | None = Field(default=None, max_length=200)
    fields: dict[str, float | None] = Field(default_factory=dict)
    facts: dict[str, Any] = Field(default_factory=dict)

    @field_validator("fields")
    @classmethod
    def _finite(cls, value: dict[str, float | None]) -> dict[str, float | None]:
        bad = next((k for k, v in value.items() if v is not None and not math.isfinite(v)), None)
        if bad is not None:
            raise ValueError(f"{bad}: not a finite number (null where the device does not report it)")
        return value


class HealthReading(BaseModel):
    """What a vendor's health probe answers for one host."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    available: bool
    source: str = Field(default="", max_length=200, description="what read it, e.g. NVML 550.54.15")
    reason: str | None = Field(default=None, max_length=2000, description="why nothing was read (available: false)")
    devices: list[DeviceReading] = Field(default_factory=list, max_length=MAX_DEVICES)


def unavailable(reason: str) -> dict[str, Any]:
    """The reading of a host where none could be made, in the probe's form."""
    return HealthReading(available=False, reason=reason).model_dump()


def checked_reading(value: Any, where: str) -> HealthReading:
    """A vendor module's answer (or a recorded one) checked; one ConfigError line naming ``where`` and the key."""
    try:
        return HealthReading.model_validate(value)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(str(part) for part in error["loc"]) or None
        raise ConfigError(where, key, error["msg"]) from None


def health_report_path(run_dir: Path, host: str) -> Path:
    """The host's health report in a run folder (written by the healthcheck: flagperf.hosts.health)."""
    return run_dir / "hosts" / f"{host}.health.json"


def recorded_reading(run_dir: Path, host: str) -> HealthReading | None:
    """The host's device-health reading from its health report: the host probe's, or, where that one read
    nothing, the first image probe's that did (a container host may have NVML's binding in its image only).
    None where the report or the reading is absent (a run from before readings, a vendor without a health
    probe); an unreadable report or reading is a reading that says so, never a pass."""
    path = health_report_path(run_dir, host)
    if not path.is_file():
        return None
    try:
        report = read_json_file(path, what="a host's health report")
        probes = [report.get("probe"), *(report.get("image_probes") or {}).values()]
        readings = [checked_reading(p[HEALTH_KEY], f"{path.name}: {HEALTH_KEY}")
                    for p in probes if isinstance(p, dict) and p.get(HEALTH_KEY) is not None]
    except (ConfigError, AttributeError) as exc:
        return HealthReading(available=False, reason=f"the health report cannot be read: {exc}")
    if not readings:
        return None
    return next((r for r in readings if r.available), readings[0])


def summary_line(reading: HealthReading) -> str:
    """The reading in a few words, for the healthcheck's line."""
    if not reading.available:
        return f"not read: {reading.reason or 'no reason given'}"
    return f"{len(reading.devices)} device(s) read through {reading.source or 'the vendor probe'}"
