"""Fleet diagnosis: every device and every host held against the fleet's median and a baseline, by rules.

Figures, from a run's summary rows (one per case, round, host, device and metric):
  device figure = the median of the device's rounds; host figure = the median of its devices' figures.
  fleet median  = the median over every device (for hosts: over every host's figure);
  spread        = the median absolute deviation (MAD) around it; a figure's robust distance is
                  (figure - median) / (1.4826 x MAD): standard deviations, were the figures normal, yet not
                  moved by the few bad devices it is there to find (a mean and standard deviation would be).
A rule names a figure (metric, optionally case) and its limits: a share of the fleet median, a robust distance,
a share of the baseline; or a monitor fact of each device: throttle reasons' share of the timed region, or a
per-device monitor field (ECC errors, XID events, retired pages) that must stay at or below a limit; or a field of
each device's health as the vendor's health probe read it at the healthcheck (a PCIe link below its width, rows
waiting for remapping). A device fails when it breaks a rule; a host fails when one of its devices does, or when
its own figure does.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from flagperf.results.analysis import read_monitors
from flagperf.results.devicehealth import DeviceReading, HealthReading, recorded_reading
from flagperf.results.markup import md_text
from flagperf.results.schema import RESULT_FILE, read_result, write_json_atomic, write_text_atomic

MAD_TO_SIGMA = 1.4826  # MAD x this = the standard deviation, for normally distributed figures
DIAGNOSIS_JSON, DIAGNOSIS_MD = "diagnosis.json", "diagnosis.md"
Status = Literal["pass", "fail", "unknown"]
# The built-in check every host gets besides the rules file's: a round of it that failed (a crash, a lost
# connection) fails the host, since a host with no figure would otherwise pass unnoticed.
MEASURED_RULE = "measured"
RULE_KINDS = ("metric", "throttle", "monitor_field", "health_field")
FIGURE_LIMITS = ("min_fleet_ratio", "max_fleet_ratio", "max_robust_z", "min_baseline_ratio", "max_baseline_ratio")


class Rule(BaseModel):
    """One rule of the rules file: a figure rule (metric), a throttle rule or a monitor-field rule."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=80)
    description: str = ""
    metric: str | None = Field(default=None, description="a metric name, or a pattern (fnmatch: gemm_*)")
    case: str | None = Field(default=None, description="only this case (or pattern); every case by default")
    min_fleet_ratio: float | None = Field(default=None, gt=0, description="figure / fleet median at least this")
    max_fleet_ratio: float | None = Field(default=None, gt=0, description="figure / fleet median at most this")
    max_robust_z: float | None = Field(default=None, gt=0, description="at most this many robust standard "
                                       "deviations (1.4826 x MAD) from the fleet median, either side")
    min_baseline_ratio: float | None = Field(default=None, gt=0, description="figure / baseline at least this")
    max_baseline_ratio: float | None = Field(default=None, gt=0, description="figure / baseline at most this")
    throttle: list[str] | None = Field(default=None, min_length=1, description="throttle (clock-event) reasons, "
                                       "as the vendor monitor names them")
    max_share: float | None = Field(default=None, ge=0, le=1, description="share of the timed region's samples "
                                    "under any of those reasons, at most")
    monitor_field: str | None = Field(default=None, description="a per-device field of the vendor monitor's "
                                      "samples (ecc_uncorrected, xid_events, retired_pages ...)")
    health_field: str | None = Field(default=None, description="a per-device field of the vendor's health probe, "
                                     "read at the healthcheck (pcie_width_lanes_missing, retirement_pending ...)")
    max: float | None = Field(default=None, description="the field's largest value in the round (a health field: "
                              "its value at the healthcheck), at most")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not value.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ValueError("letters, digits, '-', '_' and '.' only")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> Rule:
        kinds = [k for k in RULE_KINDS if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"give exactly one of {', '.join(RULE_KINDS[:-1])} and {RULE_KINDS[-1]}")
        limits = [k for k in FIGURE_LIMITS if getattr(self, k) is not None]
        if self.metric is not None and not limits:
            raise ValueError(f"a metric rule needs a limit: one of {', '.join(FIGURE_LIMITS)}")
        if self.metric is None and (limits or self.case is not None):
            raise ValueError(f"{', '.join(limits) or 'case'}: only for a metric rule")
        if (self.throttle is None) != (self.max_share is None):
            raise ValueError("throttle and max_share go together")
        if (self.monitor_field is None and self.health_field is None) != (self.max is None):
            raise ValueError("max goes with monitor_field or health_field, and each of them needs it")
        # Half the fleet lies at or below its median and half at or above: such a limit fails half of it always
        # (a percentage written for a share, 95 for 0.95, most often).
        if self.min_fleet_ratio is not None and self.min_fleet_ratio > 1:
            raise ValueError(f"min_fleet_ratio {self.min_fleet_ratio:g} is above 1: half the fleet would always "
                             "fail it; a share of the fleet median, e.g. 0.95")
        if self.max_fleet_ratio is not None and self.max_fleet_ratio < 1:
            raise ValueError(f"max_fleet_ratio {self.max_fleet_ratio:g} is below 1: half the fleet would always "
                             "fail it; a multiple of the fleet median, e.g. 1.05")
        return self

    @property
    def kind(self) -> str:
        return "metric" if self.metric else "throttle" if self.throttle else "monitor" if self.monitor_field \
            else "health"

    def applies(self, case: str, metric: str) -> bool:
        return bool(self.metric and fnmatch.fnmatchcase(metric, self.metric)
                    and (self.case is None or fnmatch.fnmatchcase(case, self.case)))


class Rules(BaseModel):
    """The rules file (deployments/diagnosis/rules.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    min_fleet: int = Field(default=3, ge=2, description="fewer figures than this (devices, or hosts): no fleet "
                                                        "verdict, since a median of so few says little")
    rules: list[Rule] = Field(min_length=1)

    @field_validator("rules")
    @classmethod
    def _unique(cls, value: list[Rule]) -> list[Rule]:
        names = [r.name for r in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"rule {twice[0]!r} is given twice")
        return value


@dataclass(frozen=True)
class Check:
    """One rule applied to one figure."""

    rule: str
    what: str  # the figure, in words: "gemm_bf16 (computation-BF16)", "throttle hw_slowdown"
    value: float | None
    reference: float | None  # the fleet median, the baseline, or the limit
    ratio: float | None
    limit: str  # the limit in words: ">= 0.95 x fleet median"
    status: Status
    threshold: float | None = None  # the limit's number, for a ratio check

    def line(self, text: Callable[[str], str] = str) -> str:
        """In words; ``text`` renders the figure's names (a case's metric and unit: md_text in Markdown)."""
        if self.rule == MEASURED_RULE:
            return f"{self.rule}: {text(self.what)}, needs {self.limit}: {self.status}"
        value = "-" if self.value is None else f"{self.value:.4g}"
        ratio = f" = {ratio_text(self.ratio, self.threshold)}" if self.ratio is not None else ""
        ref = f" of {self.reference:.4g}" if self.reference is not None and self.ratio is not None else ""
        return f"{self.rule}: {text(self.what)} {value}{ratio}{ref}, needs {self.limit}: {self.status}"


def ratio_text(ratio: float, threshold: float | None) -> str:
    """A ratio to 3 decimals, or to as many more as it takes not to read as its threshold (0.94998 against
    >= 0.95 is 0.94998, not 0.950, which would look like a pass that failed)."""
    for digits in range(3, 9):
        shown = f"{ratio:.{digits}f}"
        if threshold is None or ratio == threshold or shown != f"{threshold:.{digits}f}":
            return shown
    return f"{ratio!r}"


@dataclass
class Verdict:
    """A device's (device set) or a host's (device None) verdict: every check, and the status they give."""

    host: str
    device: int | None
    uuid: str | None = None
    checks: list[Check] = field(default_factory=list)
    devices_passed: int = 0  # a host's devices that passed a rule: a host too few to compare with others passes

    @property
    def status(self) -> Status:
        if any(c.status == "fail" for c in self.checks):
            return "fail"
        return "pass" if self.devices_passed or any(c.status == "pass" for c in self.checks) else "unknown"

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def label(self) -> str:
        """The host, or one of its devices (a round that measured one device: the host's name alone)."""
        if self.device is None or self.device < 0:
            return self.host
        return f"{self.host} device {self.device}" + (f" ({self.uuid})" if self.uuid else "")


@dataclass
class Diagnosis:
    run_id: str
    baseline: str | None
    devices: list[Verdict]
    hosts: list[Verdict]
    fleet: list[dict[str, Any]]  # per case and metric: median, MAD, devices, hosts
    notes: list[str] = field(default_factory=list)
    rules: str | None = None  # the rules file, as shown to its reader
    min_fleet: int = 3  # the rules' min_fleet: fewer figures than this give no fleet verdict

    @property
    def failed_hosts(self) -> list[Verdict]:
        return [h for h in self.hosts if h.status == "fail"]

    @property
    def unjudged_hosts(self) -> list[Verdict]:
        """Hosts no rule could judge (too few hosts for a fleet verdict, no baseline, no rule for their figures):
        neither passed nor failed, and never to be read as passed."""
        return [h for h in self.hosts if h.status == "unknown"]

    def unjudged_reason(self) -> str | None:
        """Why no host could be judged, in one phrase; None when some host was."""
        if not self.hosts or len(self.unjudged_hosts) < len(self.hosts):
            return None
        if not any(f["rules"] for f in self.fleet):
            return "no rule of the rules file applies to a figure of this run"
        if len(self.hosts) < self.min_fleet:
            return (f"fewer than min_fleet = {self.min_fleet} hosts for a fleet verdict"
                    + ("" if self.baseline else ", and no baseline (--baseline RUN or --history)"))
        return "no rule had a figure to compare (the notes say which)"

    def to_json(self) -> dict[str, Any]:
        def verdict(v: Verdict) -> dict[str, Any]:
            device = None if v.device is None or v.device < 0 else v.device
            return {"host": v.host, "device": device, "uuid": v.uuid, "status": v.status,
                    "checks": [c.__dict__ for c in v.checks]}
        return {"run_id": self.run_id, "rules": self.rules, "baseline": self.baseline, "min_fleet": self.min_fleet,
                "failed_hosts": [h.host for h in self.failed_hosts],
                "unjudged_hosts": [h.host for h in self.unjudged_hosts], "unjudged_reason": self.unjudged_reason(),
                "hosts": [verdict(v) for v in self.hosts], "devices": [verdict(v) for v in self.devices],
                "fleet": self.fleet, "notes": self.notes}


def median_absolute_deviation(values: list[float]) -> float:
    """The median of |x - median(x)|: a spread that the outliers themselves cannot inflate."""
    centre = statistics.median(values)
    return statistics.median([abs(v - centre) for v in values])


def robust_z(value: float, centre: float, mad: float) -> float | None:
    """(value - centre) / (1.4826 x MAD); None when the MAD is 0 (half the fleet agrees exactly)."""
    return (value - centre) / (MAD_TO_SIGMA * mad) if mad > 0 else None


def _ratio(value: float, reference: float | None) -> float | None:
    return value / reference if reference else None


def figure_checks(rule: Rule, what: str, value: float, fleet: list[float] | None, baseline: float | None,
                  min_fleet: int) -> list[Check]:
    """A figure rule on one figure, against the fleet's figures (None or too few: no fleet verdict) and the
    baseline (None: none)."""
    checks: list[Check] = []
    enough = fleet is not None and len(fleet) >= min_fleet
    centre = statistics.median(fleet) if enough and fleet else None
    mad = median_absolute_deviation(fleet) if enough and fleet else None

    def limit_check(limit: float | None, reference: float | None, above: bool, against: str) -> None:
        if limit is None:
            return
        words = f"{'<=' if above else '>='} {limit:g} x {against}"
        if reference is None:
            checks.append(Check(rule.name, what, value, None, None, words, "unknown"))
            return
        ratio = _ratio(value, reference)
        ok = ratio is not None and (ratio <= limit if above else ratio >= limit)
        checks.append(Check(rule.name, what, value, reference, ratio, words, "pass" if ok else "fail", limit))

    limit_check(rule.min_fleet_ratio, centre, False, "fleet median")
    limit_check(rule.max_fleet_ratio, centre, True, "fleet median")
    limit_check(rule.min_baseline_ratio, baseline, False, "baseline")
    limit_check(rule.max_baseline_ratio, baseline, True, "baseline")
    if rule.max_robust_z is not None:
        words = f"|robust z| <= {rule.max_robust_z:g}"
        z = robust_z(value, centre, mad) if centre is not None and mad is not None else None
        if centre is None:
            status: Status = "unknown"
        elif z is None:  # MAD 0: any figure off the common value is as far out as can be
            status = "pass" if value == centre else "fail"
        else:
            status = "pass" if abs(z) <= rule.max_robust_z else "fail"
        checks.append(Check(rule.name, f"{what} robust z", z, centre, None, words, status))
    return checks


def device_figures(rows: pd.DataFrame) -> pd.DataFrame:
    """Per case, metric, host and device: the median over rounds (the device of a one-device round is -1)."""
    measured = rows[rows["metric"].notna() & (rows["status"] == "success")].copy()
    if measured.empty:
        return pd.DataFrame(columns=["case", "metric", "unit", "host", "device", "uuid", "value"])
    measured["device"] = measured["device_index"].astype("Int64").fillna(-1).astype(int)
    measured["value"] = measured["value"].astype(float)
    grouped = measured.groupby(["case", "metric", "host", "device"], sort=True)
    figures = grouped.agg(unit=("unit", "first"), value=("value", "median"),
                          uuid=("device_uuid", lambda s: next((v for v in s if isinstance(v, str)), None)))
    return figures.reset_index()


def monitor_facts(run_dir: Path, fields: set[str]) -> dict[tuple[str, int], dict[str, float]]:
    """Per host and device: the largest value each named per-device monitor field took in the run's rounds
    (a device of a one-device round is -1 and gets the monitor's only device)."""
    facts: dict[tuple[str, int], dict[str, float]] = {}
    if not fields:
        return facts
    for path in sorted(run_dir.glob(f"*/round*/*_noderank*/{RESULT_FILE}")):
        try:
            result = read_result(path)
        except (OSError, ValueError):
            continue
        devices = sorted({m.device for m in result.metrics if m.device is not None}) or [-1]
        for series in read_monitors(path.parent):
            for device in devices:
                prefix = "dev0." if device == -1 else f"dev{device}."
                for name in fields:
                    column = f"{prefix}{name}"
                    if column in series.samples.columns:
                        values = pd.to_numeric(series.samples[column], errors="coerce").dropna()
                        if len(values):
                            slot = facts.setdefault((result.host, device), {})
                            slot[name] = max(slot.get(name, -math.inf), float(values.max()))
    return facts


def throttle_shares(rows: pd.DataFrame) -> dict[tuple[str, int], dict[str, float]]:
    """Per host and device: each throttle reason's largest share of a timed region (the rows' chip state)."""
    shares: dict[tuple[str, int], dict[str, float]] = {}
    for _, row in rows[rows["chip_state"].notna()].iterrows():
        try:
            state = json.loads(row["chip_state"])
        except (TypeError, ValueError):
            continue
        if not state.get("reasons_reported"):
            continue
        device = -1 if pd.isna(row["device_index"]) else int(row["device_index"])
        slot = shares.setdefault((row["host"], device), {})
        for reason, share in (state.get("shares") or {}).items():
            slot[reason] = max(slot.get(reason, 0.0), float(share))
    return shares


def diagnose(run_dir: Path, rows: pd.DataFrame, rules: Rules, *, baseline_rows: pd.DataFrame | None = None,
             baseline_medians: dict[tuple[str, str], float] | None = None, baseline_name: str | None = None
             ) -> Diagnosis:
    """Every device's and host's verdict. baseline_rows: another run's summary rows (a device's own figure
    there when it has one, else that run's fleet median); baseline_medians: (case, metric) -> the history's."""
    figures = device_figures(rows)
    base_figures = device_figures(baseline_rows) if baseline_rows is not None else None
    notes: list[str] = []
    verdicts: dict[tuple[str, int], Verdict] = {}
    hosts: dict[str, Verdict] = {h: Verdict(h, None) for h in sorted(set(rows["host"].dropna()))}
    fleet_table: list[dict[str, Any]] = []
    for (case, metric), group in figures.groupby(["case", "metric"], sort=True):
        rules_here = [r for r in rules.rules if r.applies(str(case), str(metric))]
        values = [float(v) for v in group["value"]]
        host_values = group.groupby("host")["value"].median()
        fleet_table.append({"case": case, "metric": metric, "unit": group["unit"].iloc[0], "devices": len(values),
                            "median": statistics.median(values), "mad": median_absolute_deviation(values),
                            "hosts": len(host_values), "host_median": float(host_values.median()),
                            "host_mad": median_absolute_deviation([float(v) for v in host_values]),
                            "rules": [r.name for r in rules_here]})
        if not rules_here:
            continue
        if len(values) < rules.min_fleet:
            notes.append(f"{case} / {metric}: {len(values)} device figure(s), fewer than min_fleet = "
                         f"{rules.min_fleet}: no fleet verdict for devices")
        if len(host_values) < rules.min_fleet and len(host_values) > 1:
            notes.append(f"{case} / {metric}: {len(host_values)} hosts, fewer than min_fleet = {rules.min_fleet}: "
                         "no fleet verdict for hosts")
        base_here = _baseline_lookup(base_figures, baseline_medians, str(case), str(metric))
        what = f"{metric} ({case}, {group['unit'].iloc[0]})"
        for _, row in group.iterrows():
            key = (str(row["host"]), int(row["device"]))
            verdict = verdicts.setdefault(key, Verdict(key[0], key[1], row["uuid"]))
            for rule in rules_here:
                verdict.checks += figure_checks(rule, what, float(row["value"]), values, base_here(key),
                                                rules.min_fleet)
        host_list = [float(v) for v in host_values]
        for host, value in host_values.items():
            for rule in rules_here:
                hosts[str(host)].checks += figure_checks(rule, f"host median {what}", float(value), host_list,
                                                         base_here((str(host), None)), rules.min_fleet)
    unmatched = [r for r in rules.rules if r.metric and not any(
        r.applies(str(f["case"]), str(f["metric"])) for f in fleet_table)]
    if unmatched and fleet_table:  # a misspelt metric or case would otherwise pass every host unnoticed
        notes.append("no figure of this run matches rule(s) " + ", ".join(
            f"{r.name} ({r.metric}{f', case {r.case}' if r.case else ''})" for r in unmatched)
            + "; its metrics: " + ", ".join(sorted({f"{f['metric']} ({f['case']})" for f in fleet_table})))
    _fact_checks(run_dir, rows, rules, verdicts)
    for host in sorted(hosts):
        _health_checks(run_dir, host, rules, verdicts, hosts[host])
    devices = [verdicts[k] for k in sorted(verdicts)]
    figure_rules = {r.name for r in rules.rules if r.metric}
    for verdict in devices:  # a host with a failing device fails, naming the device, the rule and the figure
        host = hosts.setdefault(verdict.host, Verdict(verdict.host, None))
        host.devices_passed += verdict.status == "pass"
        for check in verdict.failed:
            if verdict.device == -1 and check.rule in figure_rules:
                continue  # a one-device host: its own figure is the device's, checked above already
            host.checks.append(Check(check.rule, f"{verdict.label}: {check.what}", check.value, check.reference,
                                     check.ratio, check.limit, "fail", check.threshold))
    for (case, round_no, host_name), group in rows[rows["status"] == "failed"].groupby(
            ["case", "round", "host"], sort=True):  # a host that measured nothing is the fleet's first suspect
        message = next((str(m) for m in group["message"] if isinstance(m, str) and m), "no message")
        hosts.setdefault(str(host_name), Verdict(str(host_name), None)).checks.append(Check(
            MEASURED_RULE, f"{case} round {round_no} failed ({_shorten(message)})", None, None, None,
            "every round measured", "fail"))
    return Diagnosis(run_id=run_dir.name, baseline=baseline_name, devices=devices,
                     hosts=[hosts[h] for h in sorted(hosts)], fleet=fleet_table, notes=notes, min_fleet=rules.min_fleet)


def _shorten(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _baseline_lookup(base_figures: pd.DataFrame | None, medians: dict[tuple[str, str], float] | None,
                     case: str, metric: str) -> Any:
    """key (host, device; device None for the host's figure) -> the baseline figure, or None."""
    if medians is not None:
        value = medians.get((case, metric))
        return lambda key: value
    if base_figures is None:
        return lambda key: None
    mine = base_figures[(base_figures["case"] == case) & (base_figures["metric"] == metric)]
    if mine.empty:
        return lambda key: None
    own = {(str(h), int(d)): float(v) for h, d, v in zip(mine["host"], mine["device"], mine["value"], strict=True)}
    host_own = {str(h): float(v) for h, v in mine.groupby("host")["value"].median().items()}
    fleet = statistics.median([float(v) for v in mine["value"]])

    def lookup(key: tuple[str, int | None]) -> float:
        if key[1] is None:
            return host_own.get(key[0], fleet)
        return own.get((key[0], key[1]), fleet)
    return lookup


def _fact_checks(run_dir: Path, rows: pd.DataFrame, rules: Rules, verdicts: dict[tuple[str, int], Verdict]) -> None:
    fields = {r.monitor_field for r in rules.rules if r.monitor_field}
    facts = monitor_facts(run_dir, {f for f in fields if f})
    shares = throttle_shares(rows)
    measured = rows[rows["metric"].notna() & (rows["status"] == "success")]
    uuids: dict[tuple[str, int], str | None] = {}
    for host, device, uuid in zip(measured["host"], measured["device_index"], measured["device_uuid"], strict=True):
        key = (str(host), -1 if pd.isna(device) else int(device))
        uuids[key] = uuids.get(key) or (uuid if isinstance(uuid, str) else None)
    for key in sorted(uuids):
        verdict = verdicts.setdefault(key, Verdict(key[0], key[1], uuids[key]))
        for rule in rules.rules:
            if rule.throttle is not None and rule.max_share is not None:
                seen = shares.get(key)
                share = max((seen.get(r, 0.0) for r in rule.throttle), default=0.0) if seen is not None else None
                words = f"<= {rule.max_share:.0%} of the timed region"
                status: Status = "unknown" if share is None else ("pass" if share <= rule.max_share else "fail")
                verdict.checks.append(Check(rule.name, f"throttle {'/'.join(rule.throttle)} share", share, None,
                                            None, words, status))
            elif rule.monitor_field is not None and rule.max is not None:
                value = facts.get(key, {}).get(rule.monitor_field)
                status = "unknown" if value is None else ("pass" if value <= rule.max else "fail")
                verdict.checks.append(Check(rule.name, f"monitor {rule.monitor_field}", value, None, None,
                                            f"<= {rule.max:g}", status))


HEALTH_LIMIT = "at the healthcheck"  # the end of a health check's limit in words: how the report tells them apart
_NOT_READ = re.compile(r"health \S+ \(not read: (?P<reason>.*)\)", re.DOTALL)


def reading_checks(rule: Rule, reading: HealthReading) -> list[tuple[DeviceReading | None, Check]]:
    """A health rule on a host's reading: per device, its field against the rule's max (unknown where the device
    or the vendor's probe does not report it); one unknown check naming why where nothing was read."""
    field_name, limit = str(rule.health_field), rule.max
    words = f"<= {limit:g} {HEALTH_LIMIT}"
    if not reading.available:
        return [(None, Check(rule.name, f"health {field_name} (not read: {_shorten(reading.reason or '-', 160)})",
                             None, None, None, words, "unknown"))]
    found: list[tuple[DeviceReading | None, Check]] = []
    for device in reading.devices:
        value = device.fields.get(field_name)
        if value is None:
            what = f"health {field_name} (" + ("not reported by this device" if field_name in device.fields
                                               else "not read by the vendor's health probe") + ")"
            found.append((device, Check(rule.name, what, None, None, None, words, "unknown")))
            continue
        status: Status = "pass" if limit is not None and value <= limit else "fail"
        found.append((device, Check(rule.name, f"health {field_name}", value, None, None, words, status)))
    return found


def health_findings(reading: HealthReading, rules: Rules) -> list[str]:
    """What the rules' health checks fail on a host's reading, one phrase per device and rule (the healthcheck's
    line: the run goes on, and the diagnosis names them again against the host's figures)."""
    lines: list[str] = []
    for rule in rules.rules:
        if rule.health_field is None:
            continue
        for device, check in reading_checks(rule, reading):
            if check.status == "fail" and device is not None:
                lines.append(f"{_device_label(device)}: {check.line()}")
    return lines


def _device_label(device: DeviceReading) -> str:
    return f"device {device.index}" + (f" ({device.uuid})" if device.uuid else "")


def match_readings(reading: HealthReading, measured: dict[int, Verdict]) -> dict[int, tuple[int | None, str]]:
    """Each reading device's measured device (the key of ``measured``; None: none) and how it was matched (or why
    not), in words.
    Where the rounds name their devices by UUID, by UUID alone: a reading without one, or with one no round
    measured, is no measured device (an index would name another GPU where visible devices were narrowed). Else by
    index (the first device for a round that measured one), said so. Two readings on one measured device match
    neither."""
    by_uuid = {v.uuid: key for key, v in measured.items() if v.uuid}
    found: dict[int, tuple[int | None, str]] = {}
    for device in reading.devices:
        if by_uuid:
            found[device.index] = (by_uuid.get(device.uuid) if device.uuid else None, "")
        else:
            key = device.index if device.index in measured else -1 if device.index == 0 and -1 in measured else None
            found[device.index] = (key, " (matched by index)")
    taken = Counter(key for key, _ in found.values() if key is not None)
    return {index: (None, f" (one of {taken[key]} readings of the same measured device: matched to none)")
            if key is not None and taken[key] > 1 else (key, how if key is not None else " (not measured)")
            for index, (key, how) in found.items()}


def _health_checks(run_dir: Path, host: str, rules: Rules, verdicts: dict[tuple[str, int], Verdict],
                   host_verdict: Verdict) -> None:
    """The health rules on the host's reading at its healthcheck (hosts/<host>.health.json), each device's checks
    on the measured device it matches (match_readings); a failure of a device the rounds did not measure, and a
    reading that could not be made (unknown, with its reason), on the host."""
    health_rules = [r for r in rules.rules if r.health_field is not None]
    reading = recorded_reading(run_dir, host) if health_rules else None
    if reading is None:
        return
    measured = {key[1]: v for key, v in verdicts.items() if key[0] == host}
    matched = match_readings(reading, measured)
    for rule in health_rules:
        for device, check in reading_checks(rule, reading):
            if device is None:  # nothing read: every health rule unknown on the host, naming why
                host_verdict.checks.append(check)
                continue
            key, how = matched[device.index]
            if key is not None:
                measured[key].checks.append(replace(check, what=check.what + how))
            elif check.status == "fail":  # a device no round measured: its failure is the host's all the same
                host_verdict.checks.append(replace(check, what=f"{_device_label(device)}{how}: {check.what}"))


def not_read_text(checks: list[Check]) -> str:
    """The health rules a host's reading could not judge, with the reason (one phrase; empty where none)."""
    found: dict[str, list[str]] = {}
    for check in checks:
        match = _NOT_READ.fullmatch(check.what) if check.status == "unknown" else None
        if match is not None and check.limit.endswith(HEALTH_LIMIT):
            found.setdefault(match["reason"], []).append(md_text(check.rule))
    return "; ".join(f"unknown: {', '.join(rules)} (device health not read: {md_text(reason)})"
                     for reason, rules in found.items())


def render_markdown(diagnosis: Diagnosis, heading: str = "#") -> str:
    """The diagnosis for a person: hosts first (failing ones named with the rule and figure), then devices."""
    sub = heading + "#"
    failed = diagnosis.failed_hosts
    lines = [f"{heading} Fleet diagnosis", "",
             f"- run {diagnosis.run_id}; rules: {md_text(diagnosis.rules or '-')}; "
             f"baseline: {diagnosis.baseline or 'none'}",
             f"- hosts: {len(diagnosis.hosts)}, {len(failed)} failing" + (
                 f" (**{', '.join(h.host for h in failed)}**)" if failed else "") + judged_text(diagnosis), ""]
    if diagnosis.fleet:
        lines += [f"{sub} Fleet", "", "| case | metric | devices | median | MAD | hosts | host median | rules |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {f['case']} | {md_text(f['metric'])} | {f['devices']} | {f['median']:.4g} {md_text(f['unit'])} "
                  f"| {f['mad']:.3g} | {f['hosts']} | {f['host_median']:.4g} | {', '.join(f['rules']) or '-'} |"
                  for f in diagnosis.fleet]
        lines.append("")
    lines += [f"{sub} Hosts", "", "| host | verdict | why |", "|---|---|---|"]
    for host in diagnosis.hosts:
        not_read = not_read_text(host.checks)  # said whatever the verdict: "every rule passed" alone would hide it
        others = [c for c in host.checks if not (not_read and _NOT_READ.fullmatch(c.what))]
        why = "; ".join(c.line(md_text) for c in host.failed) or (
            "every rule passed" if host.status == "pass" else unknown_text(others)
            if any(c.status == "unknown" for c in others) else "no rule applied" if not not_read else "")
        why = "; ".join(part for part in (why, not_read) if part)
        lines.append(f"| {host.host} | **{host.status}** | {why} |" if host.status == "fail"
                     else f"| {host.host} | {host.status} | {why} |")
    lines += ["", f"{sub} Devices", "", "| host | device | verdict | checks |", "|---|---|---|---|"]
    for device in diagnosis.devices:
        checks = "; ".join(c.line(md_text) for c in (device.failed or [c for c in device.checks
                                                                        if c.status == "pass"]))
        if not device.failed and any(c.status == "unknown" for c in device.checks):
            checks += ("; " if checks else "") + unknown_text(device.checks)
        checks = checks or "-"
        uuid = f" ({md_text(device.uuid)})" if device.uuid else ""  # from the monitor's file, as the host wrote it
        index = "-" if device.device == -1 else f"{device.device}{uuid}"
        lines.append(f"| {device.host} | {index} | {device.status} | {checks} |")
    if diagnosis.notes:
        lines += ["", *[f"- {md_text(note)}" for note in diagnosis.notes]]
    return "\n".join(lines) + "\n"


def judged_text(diagnosis: Diagnosis) -> str:
    """How many hosts were judged, where not all were: "0 failing" of hosts nobody judged is no pass."""
    unjudged = diagnosis.unjudged_hosts
    if not unjudged:
        return ""
    judged = len(diagnosis.hosts) - len(unjudged)
    reason = diagnosis.unjudged_reason()
    if reason:
        return f", {judged} judged: **no host could be judged** ({md_text(reason)})"
    return f", {judged} judged (not judged: {', '.join(h.host for h in unjudged)})"


def unknown_text(checks: list[Check]) -> str:
    """The checks that had nothing to go on, by rule, in one phrase (each in full is in diagnosis.json)."""
    names: list[str] = []
    for check in checks:
        if check.status != "unknown":
            continue
        against = next((f" vs {ref}" for ref in ("baseline", "fleet median") if check.limit.endswith(ref)), "")
        name = md_text(check.rule) + against
        if name not in names:
            names.append(name)
    return "unknown (no figure, or nothing to compare it with): " + ", ".join(names)


def write_diagnosis(run_dir: Path, diagnosis: Diagnosis) -> dict[str, Path]:
    paths = {"json": run_dir / DIAGNOSIS_JSON, "markdown": run_dir / DIAGNOSIS_MD}
    write_json_atomic(paths["json"], diagnosis.to_json())
    write_text_atomic(paths["markdown"], render_markdown(diagnosis))
    return paths


def verdict_line(run_dir: Path) -> tuple[str, bool] | None:
    """The run's diagnosis (diagnosis.json, as the run's report or `flagperf diagnose` wrote it) in one line for
    the console, naming the failing hosts, and whether some host failed; None where the run has none (one
    device) or it cannot be read."""
    try:
        found = json.loads((run_dir / DIAGNOSIS_JSON).read_text(encoding="utf-8"))
        hosts, failed = len(found["hosts"]), [str(h) for h in found["failed_hosts"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    rules = found.get("rules") or "the default rules"
    if not failed and found.get("unjudged_reason"):
        return (f"fleet diagnosis: no host of {hosts} could be judged ({found['unjudged_reason']}; {rules}); "
                f"{DIAGNOSIS_MD}", False)
    if not failed:
        return f"fleet diagnosis: no host of {hosts} failed a rule ({rules}); {DIAGNOSIS_MD}", False
    return (f"fleet diagnosis: {len(failed)} of {hosts} hosts fail ({', '.join(failed)}) by {rules}: {DIAGNOSIS_MD} "
            "names the rule and figure; `flagperf diagnose RUN --rules FILE` holds the run against rules of yours",
            True)


def is_fleet(rows: pd.DataFrame) -> bool:
    """A run worth a diagnosis in its report: several hosts, or several devices of one."""
    measured = rows[rows["metric"].notna()]
    return measured["host"].nunique() > 1 or measured["device_index"].nunique() > 1
