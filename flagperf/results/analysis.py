"""Monitor samples joined to results: power, energy, utilisation and memory over each timed region.

Monitor files are JSON lines (see flagperf.monitoring). Reading is forgiving: a malformed or truncated
line is counted and reported, never fatal; a missing file is reported as missing.

Energy over a timed region [t0, t1], by the best source available:
  1. a cumulative energy counter (NVML total energy, RAPL), read at t0 and t1 by linear interpolation;
  2. otherwise sampled power integrated with the trapezoid rule over [t0, t1] (edges interpolated).
Accelerator energy is preferred over the CPU packages' energy, which is preferred over whole-system power.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from flagperf.results.bounded import open_regular

MONITOR_GLOB = "monitor_*.jsonl"
# A monitor's file is read this far at most: a day of samples of a large node at 1 Hz, far below what would fill
# the controller's memory; a longer (or endless) file is cut there, and a line longer than a sample can be is
# skipped as malformed.
MAX_MONITOR_BYTES = 256 * 1024 * 1024
MAX_MONITOR_LINE_BYTES = 1024 * 1024


@dataclass
class MonitorSeries:
    name: str
    path: Path
    header: dict[str, Any] = field(default_factory=dict)
    samples: pd.DataFrame = field(default_factory=pd.DataFrame)
    malformed: int = 0
    footer: dict[str, Any] | None = None
    cut: str | None = None  # what of the file was not read (too large, not a regular file), in a few words

    def unavailable(self) -> dict[str, str]:
        """Sources the monitor declared unavailable, with the reason."""
        return {key: src.get("reason") or "unavailable"
                for key, src in (self.header.get("sources") or {}).items() if not src.get("available")}


def _flatten(record: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for key, value in record.items():
        if key == "devices" and isinstance(value, list):
            for device in value:
                if isinstance(device, dict):
                    index = device.get("index", 0)
                    for dkey, dvalue in device.items():
                        if dkey != "index" and (dvalue is None or isinstance(dvalue, int | float)):
                            row[f"dev{index}.{dkey}"] = dvalue
        elif key != "type" and (value is None or isinstance(value, int | float)) and not isinstance(value, bool):
            row[key] = value
    return row


def read_monitor(path: Path) -> MonitorSeries:
    name = path.stem.removeprefix("monitor_")
    series = MonitorSeries(name=name, path=path)
    rows: list[dict[str, Any]] = []
    handle = open_regular(path)  # never waits on a FIFO
    if handle is None:
        series.cut = "missing, unreadable or not a regular file; not read"
        return series
    with handle:
        size, done = os.fstat(handle.fileno()).st_size, 0
        while raw := handle.readline(MAX_MONITOR_LINE_BYTES + 1):
            done += len(raw)
            if done > MAX_MONITOR_BYTES:
                series.cut = f"{size} bytes; only its first {MAX_MONITOR_BYTES} bytes were read"
                break
            if len(raw) > MAX_MONITOR_LINE_BYTES:  # no sample is this long: skip to the line's end, unheld
                series.malformed += 1
                while raw and not raw.endswith(b"\n") and done <= MAX_MONITOR_BYTES:
                    raw = handle.readline(MAX_MONITOR_LINE_BYTES)
                    done += len(raw)
                continue
            line = raw.decode("utf-8", errors="replace")
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                series.malformed += 1
                continue
            kind = record.get("type") if isinstance(record, dict) else None
            if kind == "sample" and isinstance(record.get("t"), int | float):
                rows.append(_flatten(record))
            elif kind == "header":
                series.header = record
            elif kind == "footer":
                series.footer = record
            else:
                series.malformed += 1
    if rows:
        series.samples = pd.DataFrame(rows).sort_values("t", kind="stable").reset_index(drop=True)
    return series


def read_monitors(folder: Path) -> list[MonitorSeries]:
    return [read_monitor(p) for p in sorted(folder.glob(MONITOR_GLOB))]


def _column(df: pd.DataFrame, name: str) -> pd.Series | None:
    if name not in df.columns:
        return None
    col = pd.to_numeric(df[name], errors="coerce")
    valid = df["t"].notna() & col.notna()
    return col[valid] if valid.sum() >= 1 else None


def counter_delta(t: np.ndarray, counter: np.ndarray, t0: float, t1: float) -> float | None:
    """Increase of a cumulative counter between t0 and t1 (linear interpolation between samples)."""
    if len(t) < 2 or t0 < t[0] or t1 > t[-1] or t1 <= t0:
        return None
    return float(np.interp(t1, t, counter) - np.interp(t0, t, counter))


def integrate_power(t: np.ndarray, watts: np.ndarray, t0: float, t1: float) -> float | None:
    """Joules over [t0, t1] from power samples (trapezoid rule, edges interpolated, no extrapolation)."""
    if len(t) < 2 or t0 < t[0] or t1 > t[-1] or t1 <= t0:
        return None
    inside = (t > t0) & (t < t1)
    ts = np.concatenate([[t0], t[inside], [t1]])
    ws = np.concatenate([[np.interp(t0, t, watts)], watts[inside], [np.interp(t1, t, watts)]])
    return float(np.sum((ws[1:] + ws[:-1]) / 2 * np.diff(ts)))


def stopped_early(mon: MonitorSeries, region_end: float) -> str | None:
    """Why a monitor's samples end before the timed region does (its footer's reason, or no footer: it died), and
    how long before; None when they cover the region's end. A monitor is stopped after the round and takes a last
    sample then, so one whose samples end sooner stopped by itself (the process it watched exited, --max-seconds)
    or died."""
    if mon.samples.empty or float(mon.samples["t"].iloc[-1]) >= region_end:
        return None
    ended = (mon.footer or {}).get("stopped_at")
    if not isinstance(ended, int | float) or isinstance(ended, bool):
        ended = float(mon.samples["t"].iloc[-1])
    reason = str(mon.footer.get("reason") or "no reason given") if mon.footer else "no footer (killed or crashed)"
    return f"{reason}, {max(region_end - ended, 0.0):.1f} s before the timed region ended"


@dataclass
class WindowStats:
    values: dict[str, float | str | None]
    notes: list[str]


ENERGY_PREFERENCE = ("accelerators", "cpu packages", "whole system")


def _device_columns(df: pd.DataFrame) -> list[str]:
    return sorted({c.split(".", 1)[0] for c in df.columns if c.startswith("dev")})


def _power_sources(df: pd.DataFrame) -> list[tuple[str, str]]:
    """(power column, energy source group) of one monitor's samples."""
    return [*((f"{dev}.power_w", "accelerators") for dev in _device_columns(df)), ("power_w", "whole system")]


def _energy_columns(df: pd.DataFrame) -> list[tuple[str | None, str | None, str]]:
    """(energy counter column, power column, ENERGY_PREFERENCE group) of one monitor's samples."""
    return [*((f"{dev}.energy_j", f"{dev}.power_w", "accelerators") for dev in _device_columns(df)),
            ("energy_j", None, "cpu packages"), (None, "power_w", "whole system")]


def _add_energies(energies: dict[str, float], samples: dict[str, int], df: pd.DataFrame, t0: float, t1: float
                  ) -> None:
    """Add one monitor's joules over [t0, t1] to ``energies`` per source group (a counter's difference, else power
    integrated), and to ``samples`` the fewest samples inside [t0, t1] of a column a group's figure came from:
    under 2, the figure is interpolated from samples around the window, their interval's average power."""
    t = df["t"].to_numpy(dtype=float)
    for counter_name, power_name, group in _energy_columns(df):
        joules, inside = None, 0
        for name, measure in ((counter_name, counter_delta), (power_name, integrate_power)):
            if joules is None and name and (col := _column(df, name)) is not None:
                times = t[col.index]
                joules = measure(times, col.to_numpy(dtype=float), t0, t1)
                inside = int(((times >= t0) & (times <= t1)).sum())
        if joules is not None:
            energies[group] = energies.get(group, 0.0) + joules
            samples[group] = min(samples.get(group, inside), inside)


@dataclass(frozen=True)
class WindowEnergy:
    """The energy over a window, for energy per work: None where it would not rest on the window's own samples."""

    joules: float | None  # None: no source, fewer than 2 samples inside, or samples that do not cover the window
    source: str | None  # the ENERGY_PREFERENCE group the figure is of (None: no column of any)
    samples: int  # the fewest samples inside the window of a column the figure is taken from
    covered: bool  # every such column has samples at or before the window's start and at or after its end


def _column_energy(times: np.ndarray, values: np.ndarray, counter: bool, t0: float, t1: float, steady: bool
                   ) -> tuple[float | None, int, bool]:
    """(joules over [t0, t1] or None, samples inside, covered) of one column. Under 2 samples inside, None: the
    energy would be interpolated between samples around the window, their interval's average power. ``steady``
    (a loop of the same call back to back): the mean power between the first and last samples inside x the
    window's length, so that no sample from outside it (another point's set-up, the flushed timed loop) enters."""
    inside = (times >= t0) & (times <= t1)
    count = int(inside.sum())
    covered = bool(len(times)) and times[0] <= t0 and times[-1] >= t1
    if count < 2:
        return None, count, covered
    if steady:
        ts, vs = times[inside], values[inside]
        span = float(ts[-1] - ts[0])
        if span <= 0:
            return None, count, covered
        joules = float(vs[-1] - vs[0]) if counter else float(np.sum((vs[1:] + vs[:-1]) / 2 * np.diff(ts)))
        return joules / span * (t1 - t0), count, covered
    measure = counter_delta if counter else integrate_power
    return measure(times, values, t0, t1), count, covered


def window_energy(monitors: list[MonitorSeries], window: tuple[float, float], prefer: str | None = None,
                  steady: bool = False) -> WindowEnergy:
    """The energy over ``window`` for energy per work, from ``prefer``'s source where the monitors have it (the
    source the energy beside the figure is of), else the preferred one (ENERGY_PREFERENCE). Every column of the
    source must have 2 samples or more inside the window (and, unless ``steady``, samples around it): else no
    figure, with the count and the coverage for saying why."""
    t0, t1 = window
    found: dict[str, list[tuple[float | None, int, bool]]] = {}
    for mon in monitors:
        df = mon.samples
        if df.empty:
            continue
        t = df["t"].to_numpy(dtype=float)
        for counter_name, power_name, group in _energy_columns(df):
            for name, counter in ((counter_name, True), (power_name, False)):
                if name and (col := _column(df, name)) is not None:  # a counter where there is one
                    found.setdefault(group, []).append(
                        _column_energy(t[col.index], col.to_numpy(dtype=float), counter, t0, t1, steady))
                    break
    group = prefer if prefer in found else next((g for g in ENERGY_PREFERENCE if g in found), None)
    if group is None:
        return WindowEnergy(None, None, 0, False)
    columns = found[group]
    parts = [joules for joules, _, _ in columns]
    joules = sum(parts) if all(p is not None for p in parts) else None  # type: ignore[misc]
    return WindowEnergy(joules, group, min(n for _, n, _ in columns), all(c for _, _, c in columns))


def window_stats(monitors: list[MonitorSeries], window: tuple[float, float] | None) -> WindowStats:
    """Power, energy, utilisation and memory for one timed region (or the whole round without one)."""
    values: dict[str, float | str | None] = {}
    notes: list[str] = []
    energies: dict[str, float] = {}
    samples: dict[str, int] = {}
    powers: dict[str, tuple[float, float]] = {}
    for mon in monitors:
        df = mon.samples
        if mon.malformed:
            notes.append(f"{mon.path.name}: {mon.malformed} malformed line(s) skipped")
        if mon.cut:
            notes.append(f"{mon.path.name}: {mon.cut}")
        if df.empty:
            notes.append(f"{mon.path.name}: no samples")
            continue
        t0, t1 = window if window else (float(df["t"].iloc[0]), float(df["t"].iloc[-1]))
        in_window = df[(df["t"] >= t0) & (df["t"] <= t1)]
        early = stopped_early(mon, t1) if window else None
        if early:  # sampling faster would not help: say why it ended instead
            notes.append(f"{mon.path.name}: {len(in_window)} sample(s) inside the {t1 - t0:.1f} s timed region; "
                         f"the monitor stopped early: {early}")
        elif window and len(in_window) < 2:
            notes.append(f"{mon.path.name}: {len(in_window)} sample(s) inside the {t1 - t0:.1f} s timed region; "
                         "sample faster (--monitor-interval) for power and utilisation over short regions")
        if isinstance(mon.header.get("mem_total_bytes"), int | float):
            values["mem_total_bytes"] = float(mon.header["mem_total_bytes"])
        for name, how in (("cpu_percent", "mean"), ("mem_used_bytes", "max"), ("case_rss_bytes", "max"),
                          ("case_pss_bytes", "max"), ("case_uss_bytes", "max")):
            col = _column(in_window, name)
            if col is not None and len(col):
                values[f"{name}_{how}"] = float(col.mean() if how == "mean" else col.max())
        for dev in _device_columns(df):
            for name, how in (("util_percent", "mean"), ("mem_used_bytes", "max"), ("mem_total_bytes", "max"),
                              ("temp_c", "max")):
                col = _column(in_window, f"{dev}.{name}")
                if col is not None and len(col):
                    values[f"{dev}.{name}_{how}"] = float(col.mean() if how == "mean" else col.max())
        _add_energies(energies, samples, df, t0, t1)
        for power_name, group in _power_sources(df):
            if (col := _column(in_window, power_name)) is not None and len(col):
                mean, peak = powers.get(group, (0.0, 0.0))
                powers[group] = (mean + float(col.mean()), peak + float(col.max()))
        for key, reason in mon.unavailable().items():
            notes.append(f"{mon.name} monitor: {key} unavailable: {reason}")
    for group in ENERGY_PREFERENCE:
        if group in energies:
            duration = (window[1] - window[0]) if window else None
            values["energy_j"] = energies[group]
            values["energy_source"] = group
            values["energy_samples"] = samples[group]
            if duration:
                values["power_avg_w"] = energies[group] / duration
            if group in powers:
                values["power_max_w"] = powers[group][1]
            break
    if "energy_j" not in values:
        notes.append("energy: no power or energy source on this host")
    return WindowStats(values=values, notes=notes)


def work_unit(rate_unit: str) -> str:
    """The unit of work behind a rate unit: TFLOPS -> TFLOP, GB/s -> GB, samples/s -> samples."""
    if rate_unit.endswith("/s"):
        return rate_unit[:-2]
    if rate_unit.endswith("PS"):
        return rate_unit[:-1]
    return f"{rate_unit}*s"
