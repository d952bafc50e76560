"""How the accelerator ran during a timed region, from the vendor monitor's samples: SM clock against its
maximum, power against the limit, and the share of samples under each clock-event (throttle) reason.

A figure below peak is read with this beside it: "power-capped 96 % of the timed region" is a chip held
at its power limit, not a slow chip or a slow harness. The monitor names its reason bits in its header
(``throttle_bits``: bit -> name), so this module knows no vendor; the words for NVML's names are here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from flagperf.results.analysis import MonitorSeries

# A reason active in at least this share of the timed region's samples is named and flagged.
FLAG_SHARE = 0.10
NOT_LIMITS = {"gpu_idle"}  # a state, not a limit on the clock: reported apart
WORDS = {
    "sw_power_cap": "power-capped",
    "hw_slowdown": "in hardware slowdown (power brake or over-temperature)",
    "sw_thermal_slowdown": "thermally throttled (driver)",
    "hw_thermal_slowdown": "thermally throttled (hardware)",
    "hw_power_brake_slowdown": "power-braked (external signal)",
    "applications_clocks_setting": "held by the application clocks setting",
    "sync_boost": "held down by sync boost (another GPU of the group)",
    "display_clock_setting": "held by the display clock setting",
    "gpu_idle": "SMs idle",
}


@dataclass
class ChipState:
    samples: int
    sm_clock_mean_mhz: float | None = None
    sm_clock_min_mhz: float | None = None
    sm_clock_max_mhz: float | None = None  # the device's maximum (monitor header)
    power_mean_w: float | None = None
    power_limit_w: float | None = None
    shares: dict[str, float] = field(default_factory=dict)  # reason -> share of samples; {} = none reported
    reasons_reported: bool = False

    @property
    def clock_ratio(self) -> float | None:
        if self.sm_clock_mean_mhz is None or not self.sm_clock_max_mhz:
            return None
        return self.sm_clock_mean_mhz / self.sm_clock_max_mhz

    @property
    def power_ratio(self) -> float | None:
        if self.power_mean_w is None or not self.power_limit_w:
            return None
        return self.power_mean_w / self.power_limit_w

    @property
    def limiters(self) -> list[tuple[str, float]]:
        """Limits on the clock active in FLAG_SHARE of the samples or more, the largest first."""
        return sorted(((r, s) for r, s in self.shares.items() if s >= FLAG_SHARE and r not in NOT_LIMITS),
                      key=lambda item: -item[1])

    @property
    def flagged(self) -> bool:
        return bool(self.limiters)

    def limiter_text(self) -> str:
        if not self.samples:
            return "no accelerator samples in the timed region"
        if not self.reasons_reported:
            return "throttle reasons not reported by the monitor"
        # Idle SMs are said but not flagged: expected in a host-device transfer, a starved loop in a GEMM.
        states = [(r, s) for r, s in self.shares.items() if r in NOT_LIMITS and s >= FLAG_SHARE]
        parts = [f"{WORDS.get(r, r)} {s:.0%} of the timed region".replace("%", " %") for r, s in
                 [*self.limiters, *states]]
        if not self.limiters:
            parts.insert(0, "not limited (no throttle reason in the timed region)")
        return "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "clock_ratio": self.clock_ratio, "power_ratio": self.power_ratio,
                "limiter": self.limiter_text(), "flagged": self.flagged}


def _devices(mon: MonitorSeries) -> list[str]:
    return sorted({c.split(".", 1)[0] for c in mon.samples.columns if c.startswith("dev") and
                   c.endswith(".sm_clock_mhz")})


def _header_device(mon: MonitorSeries, dev: str) -> dict[str, Any]:
    index = int(dev.removeprefix("dev"))
    devices = mon.header.get("devices")
    if isinstance(devices, list):
        return next((d for d in devices if isinstance(d, dict) and d.get("index") == index), {})
    return {}


def chip_state(monitors: list[MonitorSeries], window: tuple[float, float] | None) -> ChipState | None:
    """The state over ``window`` (the whole recording without one), combined over the monitored devices:
    mean clock and power averaged, minimum clock the lowest, each reason's share the worst device's.
    None when no monitor samples an accelerator's clock (a CPU host)."""
    states: list[ChipState] = []
    for mon in monitors:
        df = mon.samples
        if df.empty:
            continue
        bits = {int(b): str(n) for b, n in (mon.header.get("throttle_bits") or {}).items()}
        t0, t1 = window if window else (float(df["t"].iloc[0]), float(df["t"].iloc[-1]))
        inside = df[(df["t"] >= t0) & (df["t"] <= t1)]
        for dev in _devices(mon):
            head = _header_device(mon, dev)
            clock = pd.to_numeric(inside[f"{dev}.sm_clock_mhz"], errors="coerce").dropna()
            power = pd.to_numeric(inside.get(f"{dev}.power_w", pd.Series(dtype=float)), errors="coerce").dropna()
            mask = pd.to_numeric(inside.get(f"{dev}.clock_event_bits", pd.Series(dtype=float)),
                                 errors="coerce").dropna()
            state = ChipState(samples=len(clock),
                              sm_clock_mean_mhz=float(clock.mean()) if len(clock) else None,
                              sm_clock_min_mhz=float(clock.min()) if len(clock) else None,
                              sm_clock_max_mhz=_number(head.get("max_sm_clock_mhz")),
                              power_mean_w=float(power.mean()) if len(power) else None,
                              power_limit_w=_number(head.get("power_limit_w")),
                              reasons_reported=bool(len(mask)) and bool(bits))
            if state.reasons_reported:
                values = mask.astype("int64")
                state.shares = {name: float(((values & bit) != 0).mean()) for bit, name in bits.items()}
            states.append(state)
    return combine(states) if states else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def combine(states: list[ChipState]) -> ChipState:
    """Several devices (or rounds) as one: the worst share per reason, the lowest minimum clock."""

    def mean(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return sum(present) / len(present) if present else None

    def extreme(values: list[float | None], pick: Any) -> float | None:
        present = [v for v in values if v is not None]
        return pick(present) if present else None

    reported = [s for s in states if s.reasons_reported]
    names = {name for s in reported for name in s.shares}
    return ChipState(
        samples=sum(s.samples for s in states),
        sm_clock_mean_mhz=mean([s.sm_clock_mean_mhz for s in states]),
        sm_clock_min_mhz=extreme([s.sm_clock_min_mhz for s in states], min),
        sm_clock_max_mhz=extreme([s.sm_clock_max_mhz for s in states], max),
        power_mean_w=mean([s.power_mean_w for s in states]),
        power_limit_w=extreme([s.power_limit_w for s in states], max),
        shares={n: max(s.shares.get(n, 0.0) for s in reported) for n in sorted(names)},
        reasons_reported=bool(reported),
    )


def from_dict(data: dict[str, Any]) -> ChipState:
    keys = ChipState.__dataclass_fields__
    return ChipState(**{k: v for k, v in data.items() if k in keys})


def row_columns(state: ChipState | None) -> dict[str, Any]:
    """Flat columns of a summary row (summary.csv); ``chip_state`` keeps the whole state as JSON."""
    if state is None:
        return {c: None for c in CHIP_COLUMNS}
    return {"sm_clock_mean_mhz": state.sm_clock_mean_mhz, "sm_clock_min_mhz": state.sm_clock_min_mhz,
            "sm_clock_max_mhz": state.sm_clock_max_mhz, "accel_power_mean_w": state.power_mean_w,
            "power_limit_w": state.power_limit_w, "limiter": state.limiter_text(), "limited": state.flagged,
            "chip_state": json.dumps(asdict(state), sort_keys=True)}


def window_columns(monitors: list[MonitorSeries], window: list[float] | None) -> dict[str, Any]:
    """A summary row's chip columns for a metric's timed region ([start, end], or None: the whole round)."""
    return row_columns(chip_state(monitors, (window[0], window[1]) if window else None))


CHIP_COLUMNS = ["sm_clock_mean_mhz", "sm_clock_min_mhz", "sm_clock_max_mhz", "accel_power_mean_w", "power_limit_w",
                "limiter", "limited", "chip_state"]


def headline_state(column: pd.Series) -> dict[str, Any] | None:
    """One headline figure's chip state over its rounds (the ``chip_state`` column of its rows)."""
    states = [from_dict(json.loads(v)) for v in column if isinstance(v, str) and v]
    return combine(states).as_dict() if states else None


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}".replace("%", " %")


CHIP_HEADER = ["case", "metric", "SM clock mean / min / max MHz", "clock / max", "power mean / limit W",
               "power / limit", "limiter"]


def render_chip_section(headline: list[dict[str, Any]]) -> list[str]:
    """Markdown: how the chip ran beside every accelerator figure, the limiter in words, flagged in bold."""
    entries = [e for e in headline if e.get("chip")]
    if not entries:
        return []
    lines = ["## How the chip ran in each timed region", "",
             "From the vendor monitor's samples inside the timed region (all rounds). A throttle reason active in "
             f"{FLAG_SHARE:.0%} of the samples or more is named; the figure beside it is the chip's at that limit.",
             "", "| " + " | ".join(CHIP_HEADER) + " |", "|" + "---|" * len(CHIP_HEADER)]
    for e in entries:
        c = e["chip"]
        limiter = f"**{c['limiter']}**" if c["flagged"] else c["limiter"]
        lines.append(f"| {e['case']} | {e['metric']} | {_fmt(c['sm_clock_mean_mhz'])} / {_fmt(c['sm_clock_min_mhz'])}"
                     f" / {_fmt(c['sm_clock_max_mhz'])} | {_pct(c['clock_ratio'])} | {_fmt(c['power_mean_w'])} / "
                     f"{_fmt(c['power_limit_w'])} | {_pct(c['power_ratio'])} | {limiter} |")
    lines.append("")
    flagged = [e for e in entries if e["chip"]["flagged"]]
    if flagged:
        lines += [f"- **{e['case']} / {e['metric']}: {e['chip']['limiter']}**" for e in flagged] + [""]
    return lines
