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
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator, model_validator

from flagperf.errors import ConfigError
from flagperf.results.bounded import read_json_file

HEALTH_KEY = "device_health"  # the probe's key for the reading
MAX_DEVICES = 4096
MAX_REASON = 2000

# A vendor module's answer is recorded as JSON and read back by every later tool: JSON values only (no bytes, no
# objects of its library), each bounded, so that one odd value cannot stop the probe's output or swell the report.
Key = Annotated[str, StringConstraints(min_length=1, max_length=64)]
FactScalar = bool | int | Annotated[float, Field(allow_inf_nan=False)] | Annotated[str, Field(max_length=1000)] | None
FactValue = FactScalar | Annotated[list[FactScalar], Field(max_length=64)]


class DeviceReading(BaseModel):
    """One device: its index (the vendor tool's, e.g. NVML's), its UUID where it has one, and numeric health
    fields (null: not reported); ``facts`` holds what is shown but never compared (names, bus ids, reason lists).
    Strict: "yes" is no flag and "16" no number (an int is a number)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    index: int = Field(ge=0)
    uuid: str | None = Field(default=None, max_length=200)
    fields: dict[Key, float | None] = Field(default_factory=dict, max_length=64)
    facts: dict[Key, FactValue] = Field(default_factory=dict, max_length=32)

    @field_validator("fields")
    @classmethod
    def _finite(cls, value: dict[str, float | None]) -> dict[str, float | None]:
        bad = next((k for k, v in value.items() if v is not None and not math.isfinite(v)), None)
        if bad is not None:
            raise ValueError(f"{bad}: not a finite number (null where the device does not report it)")
        return value


class HealthReading(BaseModel):
    """What a vendor's health probe answers for one host."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    available: bool
    source: str = Field(default="", max_length=200, description="what read it, e.g. NVML 550.54.15")
    reason: str | None = Field(default=None, max_length=MAX_REASON,
                               description="why nothing was read (available: false)")
    devices: list[DeviceReading] = Field(default_factory=list, max_length=MAX_DEVICES)

    @model_validator(mode="after")
    def _consistent(self) -> HealthReading:
        if self.available and not self.devices:
            raise ValueError("an available reading lists at least one device (none read: available false, "
                             "with the reason)")
        if not self.available and (not self.reason or self.devices):
            raise ValueError("a reading that is not available says why (reason) and lists no device")
        for key, values in (("index", [d.index for d in self.devices]),
                            ("uuid", [d.uuid for d in self.devices if d.uuid is not None])):
            twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
            if twice is not None:
                raise ValueError(f"two devices with {key} {twice!r}")
        return self


def unavailable_reading(reason: str) -> HealthReading:
    """A reading that could not be made, saying why (cut to what the model keeps)."""
    reason = reason.strip() or "no reason given"
    cut = reason if len(reason) <= MAX_REASON else reason[:MAX_REASON - 3] + "..."
    return HealthReading(available=False, reason=cut)


def unavailable(reason: str) -> dict[str, Any]:
    """The reading of a host where none could be made, in the probe's form."""
    return unavailable_reading(reason).model_dump(mode="json")


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
        return unavailable_reading(f"the health report cannot be read: {exc}")
    if not readings:
        return None
    return next((r for r in readings if r.available), readings[0])


def summary_line(reading: HealthReading) -> str:
    """The reading in a few words, for the healthcheck's line."""
    if not reading.available:
        return f"not read: {reading.reason or 'no reason given'}"
    # A device with no figure at all was counted, not read (another job's, say): not "read" in the line.
    unread = sum(1 for d in reading.devices if all(v is None for v in d.fields.values()))
    read = len(reading.devices) - unread
    return f"{read} device(s) read through {reading.source or 'the vendor probe'}" + (
        f" ({unread} more counted, not read)" if unread else "")
