"""Run summary, generated from the result files alone (never hand-edited).

summary.csv   one row per case / round / host / metric (or per non-successful round)
summary.json  the headline table, round counts and unreadable files
report.md     the same for a person: measured vs peak with units, then how it was made
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import ValidationError

from flagperf.errors import ConfigError, FlagperfError, validation_message
from flagperf.results.analysis import (
    MonitorSeries,
    WindowEnergy,
    WindowStats,
    read_monitors,
    window_energy,
    window_stats,
    work_unit,
)
from flagperf.results.bounded import read_json_file
from flagperf.results.chipstate import CHIP_COLUMNS, headline_state, render_chip_section, window_columns
from flagperf.results.controller import controller_gone
from flagperf.results.faults import BOUNDED_NOTE, find_faults
from flagperf.results.limits import MAX_PLANNED_HOST_ROUNDS, MAX_ROUNDS
from flagperf.results.markup import md_text, number, percent, spreadsheet_cell
from flagperf.results.metrics import STATISTICS, coefficient_of_variation
from flagperf.results.operators import (
    is_operation,
    operation_markdown,
    operator_summaries,
    operator_table,
    points_of,
)
from flagperf.results.schema import (
    ESTIMATED_PEAK_LEGEND,
    RESULT_FILE,
    UPPER_ESTIMATE,
    Metric,
    RoundResult,
    node_groups,
    read_result,
    round_dir,
    write_json_atomic,
    write_text_atomic,
)
from flagperf.results.serving import (
    ServingPoint,
    is_serving_point,
    serving_digest,
    serving_markdown,
    serving_points,
)

SUMMARY_CSV = "summary.csv"
ROUND_FOLDER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*_noderank\d+")
CASE_FOLDER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
SUMMARY_JSON = "summary.json"
REPORT_MD = "report.md"
# What a headline's spread is over when it is a single round's own (its timed chunks, an operator point's
# iterations: PointFigures.spread_basis), not the run-to-run noise of rounds or hosts
WITHIN_ROUND = ("chunks", "iterations p10-p90", "iterations cv")
PLAN_JSON = "plan.json"
INTERRUPTED_FILE = "interrupted.json"  # written by the controller when a run is stopped by a signal
RETRIES_DIR = "retries"  # failed rounds of earlier attempts of the same flow run, set aside for a retry

# energy_per_work_samples: of the energy source, inside the window energy per work is over (2 or more, else no
# figure); energy_per_work_note: why a row with work has none
MONITOR_COLUMNS = ["power_avg_w", "power_max_w", "energy_j", "energy_source", "energy_per_work",
                   "energy_per_work_unit", "energy_per_work_samples", "energy_per_work_note", "cpu_percent_mean",
                   "mem_used_bytes_max",
                   "mem_total_bytes",
                   "case_rss_bytes_max", "case_pss_bytes_max", "case_uss_bytes_max",
                   "accel_util_percent_mean", "accel_mem_used_bytes_max",
                   "accel_mem_total_bytes"]
ROW_COLUMNS = ["case", "family", "round", "host", "node_rank", "device_index", "device_uuid", "nnodes",
               "nproc_per_node", "status", "metric", "value",
               "unit", "p50", "cv_chunks", "mfu", "warning",
               "peak", "peak_unit", "ratio", "convention", "statistic", "peak_source", "peak_bound",
               "peak_bound_reason", "peak_dense", "mfu_peak", "mfu_peak_bound", "message", "device",
               *MONITOR_COLUMNS,
               "note", "search", *CHIP_COLUMNS]


@dataclass
class RunSummary:
    run_id: str
    rows: pd.DataFrame
    headline: list[dict[str, Any]]
    not_measured: list[dict[str, Any]]
    counts: dict[str, int]
    problems: list[str] = field(default_factory=list)
    context: dict[str, Any] = field(default_factory=dict)
    monitor_notes: list[str] = field(default_factory=list)
    scaling: list[dict[str, Any]] = field(default_factory=list)
    progress: dict[str, Any] = field(default_factory=dict)
    retried: list[dict[str, Any]] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)  # what went wrong or was bounded (flagperf/results/faults.py)
    device_spread: list[dict[str, Any]] = field(default_factory=list)  # per host: min, median, max over devices
    # figures measured on several hosts: each host's own mean (the headline is the mean over them all)
    per_host: list[dict[str, Any]] = field(default_factory=list)
    # operation cases: one entry per operator (flagperf/results/operators.py), shown instead of a row per point
    operators: list[dict[str, Any]] = field(default_factory=list)
    # generate cases: one entry per point (flagperf/results/serving.py), shown compact instead of a row per figure
    serving: list[ServingPoint] = field(default_factory=list)
    # training cases: whether each round reached the case's target (FlagPerf's converged), a row per round
    convergence: list[dict[str, Any]] = field(default_factory=list)

    @property
    def all_succeeded(self) -> bool:
        return self.counts["rounds"] > 0 and self.counts["success"] == self.counts["rounds"] and not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "counts": self.counts, "headline": self.headline,
                "not_measured": self.not_measured, "problems": self.problems, "context": self.context,
                "monitor_notes": self.monitor_notes, "scaling": self.scaling, "faults": self.faults,
                "progress": self.progress, "retried": self.retried, "device_spread": self.device_spread,
                "per_host": self.per_host, "operators": self.operators, "convergence": self.convergence}


def load_results(run_dir: Path) -> tuple[list[tuple[Path, RoundResult]], list[str]]:
    """(round folder, result) for every readable result.json, and a line for each unreadable one."""
    results, problems = [], []
    for path in sorted(run_dir.glob(f"*/round*/*_noderank*/{RESULT_FILE}")):
        if not ROUND_FOLDER.fullmatch(path.parent.name):  # e.g. .<host>_noderank0.partial during collection
            continue
        if not path.is_file():  # a FIFO would block the read, /dev/zero never end it
            problems.append(f"{path.relative_to(run_dir)}: unreadable result (not a regular file)")
            continue
        try:
            results.append((path.parent, read_result(path)))
        except ValidationError as exc:  # which key, not "1 validation error for RoundResult"
            if unknown := newer_fields(exc):
                problems.append(f"{path.relative_to(run_dir)}: unreadable result ({unknown})")
                continue
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            problems.append(f"{path.relative_to(run_dir)}: unreadable result ({where + ': ' if where else ''}"
                            f"{validation_message(first)})")
        except (OSError, ValueError) as exc:
            problems.append(f"{path.relative_to(run_dir)}: unreadable result ({str(exc).splitlines()[0]})")
    return results, problems


NEWER_RELEASE = "written by a newer flagperf?"


def newer_fields(exc: ValidationError) -> str | None:
    """Where a result's only faults are fields this release does not know (result models forbid extra ones), the
    likely cause, a newer release that wrote it, with the fields (the first 3); None where anything else is wrong."""
    errors = exc.errors()
    if not errors or any(e["type"] != "extra_forbidden" for e in errors):
        return None
    names = [".".join(str(part) for part in e["loc"]) for e in errors]
    more = f" ({len(names) - 3} more)" if len(names) > 3 else ""
    return f"{NEWER_RELEASE} field{'s' if len(names) > 1 else ''} {', '.join(names[:3])}{more} not known to this one"


def every_result_read(summary: RunSummary, source: str, where: str | None, advice: str) -> RunSummary:
    """The summary of a run whose every result.json was read, else a ConfigError naming ``source`` (the run as the
    caller's user names it) and the first unreadable file (under ``where``, the run's folder as that user knows it;
    None: the file relative to the run alone) with ``advice``: a host whose result is unreadable would drop out of
    the run's figures unnoticed (a comparison or a diagnosis over other hosts than the run holds). A result a newer
    release wrote is said to be one, and not to be repaired."""
    if summary.problems:
        first = summary.problems[0]
        more = f" ({len(summary.problems) - 1} more)" if len(summary.problems) > 1 else ""
        then = "read it with the release that wrote it" if NEWER_RELEASE in first else advice
        raise ConfigError(source, None, f"{where + ': ' if where else ''}{first}{more}; {then}")
    return summary


# Why a planned host round has no result, in the report's words (progress_line): the kind run_progress gives it
# (measured, stopped, not_started) where the run was interrupted, else whether the run is finished
UNCOLLECTED = {"measured": "measured, kept on the host: a retry collects it",
               "stopped": "stopped while running (the run was interrupted)",
               "not_started": "not started (the run was interrupted)"}


def hosts_left_out(run_dir: Path, summary: RunSummary) -> str | None:
    """One line naming the host rounds a run's figures leave out, None where none is: a host's round folder with no
    result.json, a round the plan gave a host that has no folder, each with why where the run's records say it
    (measured and kept on the host, stopped or not started by an interrupt, a run not finished yet), and a result that
    is no success (failed or unsupported, as its report says). Said by compare and diagnose, which otherwise average
    or judge the other hosts as though they were all."""
    interrupted, kind = round_kinds(run_dir)
    # No interruption record and no summary.json (a run's last step writes it) of this attempt: the run may still be
    # going, so a round without a result may yet get one; with summary.json it ended, and one with no folder never
    # ran there
    written = summary_written(run_dir)
    # An empty record ({}) says no interruption, as the report reads it (its "interrupted" line is only for one)
    ended = not interrupted and written == "ended"
    # Neither, and the controller that ran it provably gone (killed hard: SIGKILL, a power cut; or ended on an error
    # before its summary, as its record says): it never will end
    gone = controller_gone(run_dir, run_dir / SUMMARY_JSON) if not interrupted and not ended else None

    def why(case: str, round_no: int, host: str, rank: int, folder: bool) -> str:
        if interrupted:  # a folder of a round not started is one the stop left without a result
            which = kind(case, round_no, host, rank)
            return f"no {RESULT_FILE}" if folder and which == "not_started" else UNCOLLECTED[which]
        if gone:
            died = (f"the run ended without its {SUMMARY_JSON}" if written == "none" else
                    f"the run's retry ended without its {SUMMARY_JSON} (the one there is an earlier attempt's)")
            return f"{f'no {RESULT_FILE}' if folder else 'not run'}: {died}, {gone.text}"
        unfinished = (f"the run is not finished (no {SUMMARY_JSON})" if written == "none" else
                      f"the run is not finished (a retry runs: its {SUMMARY_JSON} is an earlier attempt's)")
        if folder:  # an attempt's failure.txt is kept only for a round that was retried: nothing else to read
            return f"no {RESULT_FILE}" if ended else f"no {RESULT_FILE} (yet): {unfinished}"
        return "no folder, never run there" if ended else f"not run (yet): {unfinished}"

    found = []
    for folder in sorted(run_dir.glob("*/round*/*_noderank*")):
        if ROUND_FOLDER.fullmatch(folder.name) and folder.is_dir() and not os.path.lexists(folder / RESULT_FILE):
            host, _, rank = folder.name.rpartition("_noderank")
            case, round_name = folder.parent.parent.name, folder.parent.name
            round_no = int(round_name[5:]) if round_name[5:].isdigit() else -1
            found.append(f"{folder.name} ({case} {round_name}: {why(case, round_no, host, int(rank), True)})")
    # A round the plan gave a host that never got its folder (the run stopped, or its case failed before that host,
    # or it has not got there yet): the glob above cannot see what is not there. Only a plan naming its hosts says so.
    plan = planned_rounds(run_dir)
    if plan is not None and plan[3]:
        found += [f"{host}_noderank{rank} ({case} round{round_no}: {why(case, round_no, host, rank, False)})"
                  for case, round_no, host, rank in plan[0]
                  # names as a folder's (a plan.json is a run folder's file: never a path out of the run)
                  if ROUND_FOLDER.fullmatch(f"{host}_noderank{rank}") and CASE_FOLDER.fullmatch(case)
                  and not os.path.lexists(round_dir(run_dir, case, round_no, host, rank))]
    found += [f"{e['host']} ({e['case']} round{e['round']}: {e['status']})" for e in summary.not_measured]
    if not found:
        return None
    more = f" and {len(found) - 5} more" if len(found) > 5 else ""
    rounds = f"{len(found)} host round{'s' if len(found) > 1 else ''}"
    return f"{rounds} left out of the figures: {', '.join(found[:5])}{more}"


@dataclass(frozen=True)
class PerWork:
    """A row's energy per work, or why it has none (``why``: its energy_per_work_note; ``kind`` groups the rows of a
    round for its monitor note: "few" samples, "few-loop": few though operation's energy loop ran, "uncovered" window,
    "absent": the metric has no loop to take it over)."""

    value: float | None = None
    unit: str | None = None
    source: str | None = None
    samples: int | None = None
    why: str | None = None
    kind: str | None = None
    length: float | None = None  # the window's seconds ("few")


def per_work(stats: WindowStats, metric: Metric, seen: list[MonitorSeries]) -> PerWork:
    """Energy per work of ``metric``: the monitors' energy over its energy_window / energy_work where it has one
    (operation: a loop of the point's calls back to back; the mean power between the samples inside it, so none
    from outside enters), else over its window / work, from the source the energy beside it is of. None where that
    would not rest on the window's own samples (fewer than 2 inside: the energy would be interpolated, the average
    power of the interval around it) or where the monitors do not cover it, each with the reason."""
    own = metric.energy_window is not None
    work = metric.energy_work if own else metric.work
    which = "energy window" if own else "timed region"
    if metric.energy_per_work_absent:
        return PerWork(why=metric.energy_per_work_absent, kind="absent")
    if not work or math.isnan(work):
        return PerWork()
    window = metric.energy_window if own else metric.window
    source = stats.values.get("energy_source")
    prefer = source if isinstance(source, str) else None
    if window is None:  # no timed region: the whole round's energy, as beside the figure
        joules, samples = stats.values.get("energy_j"), stats.values.get("energy_samples")
        energy = WindowEnergy(joules if isinstance(joules, float) else None, prefer,
                              int(samples) if isinstance(samples, int | float) else 0, True)
        if energy.samples < 2:
            energy = replace(energy, joules=None)
    else:
        energy = window_energy(seen, (window[0], window[1]), prefer, own)
    if energy.source is None:  # no power or energy source: the round's notes say so
        return PerWork()
    if energy.joules is not None:
        return PerWork(energy.joules / work, f"J/{work_unit(metric.unit)}", energy.source, energy.samples)
    length = (window[1] - window[0]) if window else None
    if not energy.covered:  # the samples do not reach it: how many lie inside says nothing of the window
        return PerWork(source=energy.source, kind="uncovered",
                       why=f"the monitors' {energy.source} samples do not cover the {which} (a monitor started late "
                           "or stopped early)")
    why = (f"{energy.samples} sample(s) of the {energy.source} energy inside the "
           f"{f'{length:.3g} s ' if length is not None else ''}{which}, 2 needed")
    if own and metric.energy_intervals and metric.energy_loop_ran is False:  # asked, but over the host loop
        return PerWork(source=energy.source, kind="few-host", length=length,
                       why=f"{why}; operation: over the host loop, the energy loop (energy_intervals "
                           f"{metric.energy_intervals}) having not run for it (the point's note, or the round's "
                           "energy loop line where the round was not told the monitors' interval, says why)")
    if own and metric.energy_intervals:  # the energy loop ran: setting energy_intervals again changes nothing
        return PerWork(source=energy.source, kind="few-loop", length=length,
                       why=f"{why}; operation: the energy loop ran (energy_intervals {metric.energy_intervals}) and "
                           f"held {energy.samples} sample(s): a longer loop (more energy_intervals) or a "
                           "shorter --monitor-interval")
    return PerWork(source=energy.source, kind="few", length=length,
                   why=why + ("; operation: set energy_intervals" if own else ""))


def _monitor_columns(stats: WindowStats, work: PerWork | None = None) -> dict[str, Any]:
    """``work``: the row's energy per work (per_work); its source is the energy's beside it, or where the window
    beside the figure has none, the only one there is."""
    v = stats.values
    accel_util = [x for k, x in v.items() if k.endswith(".util_percent_mean") and isinstance(x, float)]
    accel_mem = [x for k, x in v.items() if k.endswith(".mem_used_bytes_max") and isinstance(x, float)]
    accel_total = [x for k, x in v.items() if k.endswith(".mem_total_bytes_max") and isinstance(x, float)]
    work = work or PerWork()
    return {
        "power_avg_w": v.get("power_avg_w"), "power_max_w": v.get("power_max_w"), "energy_j": v.get("energy_j"),
        "energy_source": v.get("energy_source") or (work.source if work.value is not None else None),
        "energy_per_work": work.value, "energy_per_work_unit": work.unit,
        "energy_per_work_samples": work.samples if work.value is not None else None,
        "energy_per_work_note": work.why,
        "cpu_percent_mean": v.get("cpu_percent_mean"), "mem_used_bytes_max": v.get("mem_used_bytes_max"),
        "mem_total_bytes": v.get("mem_total_bytes"),
        "accel_mem_total_bytes": max(accel_total) if accel_total else None,
        "case_rss_bytes_max": v.get("case_rss_bytes_max"),
        "case_pss_bytes_max": v.get("case_pss_bytes_max"), "case_uss_bytes_max": v.get("case_uss_bytes_max"),
        "accel_util_percent_mean": sum(accel_util) / len(accel_util) if accel_util else None,
        "accel_mem_used_bytes_max": max(accel_mem) if accel_mem else None,
    }


def _per_work_notes(notes: MonitorNotes, r: RoundResult, works: list[PerWork]) -> None:
    """The round's figures left without energy per work, counted by why (each row's energy_per_work_note says it)."""
    asked = [w for w in works if w.value is not None or w.kind]
    few = [w for w in works if w.kind == "few"]
    if few:
        shortest = min((w.length for w in few if w.length is not None), default=None)
        _note(notes, f"energy per work of {len(few)} of {len(asked)} figures left out (energy_per_work_note): fewer "
                     "than 2 samples of the energy source inside the window it is over"
                     + (f" ({shortest:.3g} s at the shortest)" if shortest is not None else "")
                     + ", whose energy would be the average power of the interval around it, not the window's own; "
                       "operation: set the case's energy_intervals (a loop of each point's calls over that many "
                       "monitor intervals); elsewhere sample faster (--monitor-interval, down to 0.1 s)", r)
    looped = [w for w in works if w.kind == "few-loop"]
    if looped:
        shortest = min((w.length for w in looped if w.length is not None), default=None)
        _note(notes, f"energy per work of {len(looped)} of {len(asked)} figures left out (energy_per_work_note): "
                     "operation's energy loop ran (energy_intervals) and still held fewer than 2 samples of the energy "
                     "source" + (f" ({shortest:.3g} s at the shortest)" if shortest is not None else "")
                     + " (its samples further apart than the monitors' interval): a longer loop (more "
                       "energy_intervals) or a shorter --monitor-interval", r)
    fallen = [w for w in works if w.kind == "few-host"]
    if fallen:
        _note(notes, f"energy per work of {len(fallen)} of {len(asked)} figures left out (energy_per_work_note): "
                     "fewer than 2 samples of the energy source inside the host loop they fell back to, their energy "
                     "loop (energy_intervals) not having run (each point's note, or the round's energy loop line where "
                     "the round was not told the monitors' interval, says why)", r)
    uncovered = [w for w in works if w.kind == "uncovered"]
    if uncovered:
        _note(notes, f"energy per work of {len(uncovered)} of {len(asked)} figures left out (energy_per_work_note): "
                     "the monitors' samples do not cover the window it is over (a monitor that started late or "
                     "stopped early)", r)
    absent: dict[str, int] = {}
    for w in works:
        if w.kind == "absent" and w.why:
            absent[w.why] = absent.get(w.why, 0) + 1
    for why, count in absent.items():
        _note(notes, f"energy per work of {count} of {len(asked)} figures left out: {why}", r)


# A monitor's note, and the rounds it came from: (case, host) -> round numbers, each in the order first seen.
MonitorNotes = dict[str, dict[tuple[str, str], dict[int, None]]]


def _note(notes: MonitorNotes, note: str, r: RoundResult) -> None:
    notes.setdefault(note, {}).setdefault((r.case, r.host), {})[r.round] = None


def placed_notes(notes: MonitorNotes) -> list[str]:
    """Each note once, said with where it came from ("c1 rounds 1, 2 on h1; c2 round 1 on h2: ..."): a lab that
    reads that a monitor had no samples or a figure unavailable knows which rounds and hosts to look at."""
    placed = []
    for note, where in notes.items():
        rounds = [f"{case} round{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))} on {host}"
                  for (case, host), numbers in where.items()]
        placed.append(f"{'; '.join(rounds)}: {note}")
    return placed


def _rows(results: list[tuple[Path, RoundResult]], notes: MonitorNotes) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for folder, r in results:
        base = {"case": r.case, "family": r.family, "round": r.round, "host": r.host, "node_rank": r.node_rank,
                "nnodes": int(r.config.get("nnodes", 1)), "nproc_per_node": int(r.config.get("nproc_per_node", 1)),
                "status": r.status, "device": r.device, "message": r.failure.message if r.failure else None}
        monitors = read_monitors(folder)
        if not monitors:
            _note(notes, "no monitor file", r)
        if not r.metrics:
            stats = window_stats(monitors, None)
            rows.append({**base, **_monitor_columns(stats)})
        works: list[PerWork] = []
        for m in r.metrics:
            seen = monitors if m.device is None else for_device(monitors, m.device)
            stats = window_stats(seen, tuple(m.window) if m.window else None)  # type: ignore[arg-type]
            works.append(per_work(stats, m, seen))
            rows.append({**base, "device_index": m.device, "device_uuid": device_uuid(monitors, m.device),
                         "metric": m.name, "value": m.value, "unit": m.unit, "p50": m.p50, "mfu": m.mfu,
                         "cv_chunks": m.cv, "peak": m.peak.value if m.peak else None,
                         "peak_unit": m.peak.unit if m.peak else None, "ratio": m.ratio,
                         "convention": m.convention, "statistic": m.statistic,
                         "peak_source": m.peak.source if m.peak else None,
                         "peak_bound": m.peak.bound if m.peak else None,
                         "peak_dense": m.peak.dense if m.peak else None,
                         "peak_bound_reason": m.peak.bound_reason if m.peak else None,
                         "mfu_peak": _mfu_peak(m), "mfu_peak_bound": m.mfu_peak.bound if m.mfu_peak else None,
                         "warning": m.warning,
                         **_monitor_columns(stats, works[-1]), "note": m.note,
                         "search": m.search.model_dump_json() if m.search else None,
                         **window_columns(seen, m.window)})
            for note in stats.notes:
                _note(notes, note, r)
        _per_work_notes(notes, r, works)
    frame = pd.DataFrame(rows, columns=ROW_COLUMNS)
    frame["device_index"] = frame["device_index"].astype("Int64")  # an index, not a float; empty where one device
    frame["energy_per_work_samples"] = frame["energy_per_work_samples"].astype("Int64")  # a count, not a float
    return frame


def for_device(monitors: list[MonitorSeries], index: int) -> list[MonitorSeries]:
    """The monitors as one device's row sees them: host-wide figures, and of the per-device ones only its own
    (a vendor monitor samples every device of the host; another device's power is not this one's)."""
    seen = []
    for series in monitors:
        others = [c for c in series.samples.columns if c.startswith("dev") and not c.startswith(f"dev{index}.")]
        header = dict(series.header)
        if isinstance(header.get("devices"), list):
            header["devices"] = [d for d in header["devices"] if isinstance(d, dict) and d.get("index") == index]
        seen.append(replace(series, header=header, samples=series.samples.drop(columns=others)))
    return seen


def device_uuid(monitors: list[MonitorSeries], index: int | None) -> str | None:
    """The device's UUID, where a vendor monitor's header gives it. Never its serial number in its place: the
    diagnosis matches health readings to measured devices by this UUID (a serial would match none, and make every
    device "not measured"), and GPUs on one board may share a serial."""
    if index is None:
        return None
    for series in monitors:
        for device in series.header.get("devices") or []:
            if isinstance(device, dict) and device.get("index") == index:
                found = device.get("uuid")
                if isinstance(found, str) and found:
                    return found
    return None


def spread_over_devices(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """Per case, metric, round and host measured on several devices: the host's min, median and max."""
    measured = rows[rows["metric"].notna() & rows["device_index"].notna() & (rows["status"] == "success")]
    table: list[dict[str, Any]] = []
    for (case, metric, round_no, host), group in measured.groupby(["case", "metric", "round", "host"], sort=False):
        values = group["value"].astype(float)
        lowest = group.loc[values.idxmin()]
        table.append({"case": case, "metric": metric, "round": int(round_no), "host": host,
                      "unit": group["unit"].iloc[0], "devices": len(group), "min": float(values.min()),
                      "median": float(values.median()), "max": float(values.max()),
                      "min_device": int(lowest["device_index"]), "min_device_uuid": _clean(lowest["device_uuid"]),
                      "per_device": {int(d): float(v) for d, v in zip(group["device_index"], values, strict=True)}})
    return table


def _mfu_peak(metric: Metric) -> str | None:
    """The peak an MFU is taken against, in words, for the report's line on how the figure was made."""
    peak = metric.mfu_peak
    if metric.mfu is None or peak is None or peak.value is None:
        return None
    estimated = f"; a lower bound: {peak.bound_reason}" if peak.estimated else ""
    return f"the {metric.mfu_peak_key} peak, {number(peak.value)} {peak.unit} ({peak.source}{estimated})"


def _clean(value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value.item() if hasattr(value, "item") else value


def _spread_over(group: pd.DataFrame) -> str:
    """What a headline's figures differ by: its rounds, and its hosts and devices where it has several (a fleet's
    spread is theirs too, not the rounds' alone)."""
    varied = [name for name, column in (("rounds", "round"), ("hosts", "host"), ("devices", "device_index"))
              if group[column].nunique() > 1]
    return ", ".join(varied) or "rounds"


def host_figures(case: str, metric: str, group: pd.DataFrame, mean: float) -> list[dict[str, Any]]:
    """A figure measured on several hosts, each host's own: the mean of its rounds (and devices), their spread,
    and the host against the mean over every host (the headline); [] for a figure of one host."""
    if group["host"].nunique() < 2:
        return []
    table: list[dict[str, Any]] = []
    for host, own in group.groupby("host", sort=True):
        values = [float(v) for v in own["value"]]
        value = sum(values) / len(values)
        cv = coefficient_of_variation(values)
        table.append({"case": case, "metric": metric, "unit": own["unit"].iloc[0], "host": host,
                      "rounds": int(own["round"].nunique()), "value": value, "spread_cv": cv,
                      "spread_over": _spread_over(own) if cv is not None else None,
                      "vs_mean": value / mean if mean else None})
    return table


def summarize(run_dir: Path) -> RunSummary:
    loaded, problems = load_results(run_dir)
    notes: MonitorNotes = {}  # the same note from every round once, with the rounds it came from
    rows = _rows(loaded, notes)
    results = [r for _, r in loaded]
    counts = {"rounds": len(results), "success": 0, "unsupported": 0, "failed": 0}
    for r in results:
        counts[r.status] += 1

    headline: list[dict[str, Any]] = []
    per_host: list[dict[str, Any]] = []
    operation_points = points_of(results)
    # An operator point's spread as its report cell gives it (the rounds', else its iterations' p10-p90), not the
    # iterations' standard deviation the metric's cv keeps
    point_spreads = {(p.case, p.metric): (p.spread, p.spread_basis) for p in operation_points
                     if p.metric and p.spread is not None}
    measured = one_figure_per_job(rows[rows["metric"].notna()])
    for (case, metric), group in measured.groupby(["case", "metric"], sort=False):
        values = [float(v) for v in group["value"]]
        mean = sum(values) / len(values)
        peak = _clean(group["peak"].iloc[0])
        cv_rounds = coefficient_of_variation(values)
        cv_chunks = _clean(group["cv_chunks"].iloc[0]) if len(values) == 1 else None
        spread_over = _spread_over(group) if cv_rounds is not None else ("chunks" if cv_chunks is not None else None)
        spread = cv_rounds if cv_rounds is not None else cv_chunks
        if (case, metric) in point_spreads and cv_rounds is None:
            spread, spread_over = point_spreads[(case, metric)]
        ratio = mean / peak if peak and group["unit"].iloc[0] == group["peak_unit"].iloc[0] and \
            group["ratio"].notna().all() else None
        # A peak that is a lower bound of the real one (a clock the device may exceed): the ratio is an upper
        # estimate, and above 1 it says the estimate is low, not that the figure or the peak's source is wrong.
        estimated = bool(group["peak_bound"].eq("lower").any())
        headline.append({
            "case": case, "metric": metric, "family": group["family"].iloc[0], "value": mean,
            "unit": group["unit"].iloc[0],
            "p50": _clean(pd.Series([p for p in group["p50"] if p is not None]).median()),
            "spread_cv": spread, "spread_over": spread_over,
            "rounds": int(group["round"].nunique()), "hosts": int(group["host"].nunique()),
            # the host rounds averaged: fewer than rounds x hosts where some host missed a round
            "figures": len(group[["round", "host"]].drop_duplicates()), "peak": peak,
            "peak_unit": _clean(group["peak_unit"].iloc[0]),
            "ratio": ratio, "above_peak": bool(ratio is not None and ratio > 1.0 and not estimated),
            "above_estimated_peak": bool(ratio is not None and ratio > 1.0 and estimated),
            "peak_bound": "lower" if estimated else ("exact" if peak is not None else None),
            # A sparse (2:4) datasheet figure: shown, but no ratio is formed against it; the report says so.
            "peak_sparse": bool(peak is not None and group["peak_dense"].eq(False).any()),
            "peak_bound_reason": _clean(group["peak_bound_reason"].dropna().iloc[0]) if estimated else None,
            "mfu_estimated": bool(group["mfu_peak_bound"].eq("lower").any()),
            "lower_bound": bool(group["note"].map(lambda n: isinstance(n, str) and BOUNDED_NOTE in n).any()),
            "convention": _clean(group["convention"].iloc[0]), "statistic": _clean(group["statistic"].iloc[0]),
            "peak_source": _clean(group["peak_source"].iloc[0]),
            "mfu": _mean(group["mfu"]), "mfu_peak": _clean(group["mfu_peak"].dropna().iloc[0])
            if group["mfu_peak"].notna().any() else None,
            "warnings": sorted({str(w) for w in group["warning"].dropna()}),
            "power_avg_w": _mean(group["power_avg_w"]), "power_max_w": _max(group["power_max_w"]),
            "energy_source": _clean(group["energy_source"].dropna().iloc[0]) if group["energy_source"].notna().any()
            else None,
            "energy_per_work": _mean(group["energy_per_work"]),
            "energy_per_work_unit": _clean(group["energy_per_work_unit"].dropna().iloc[0])
            if group["energy_per_work_unit"].notna().any() else None,
            "cpu_percent_mean": _mean(group["cpu_percent_mean"]),
            "mem_used_bytes_max": _max(group["mem_used_bytes_max"]),
            "mem_total_bytes": _max(group["mem_total_bytes"]),
            "accel_mem_total_bytes": _max(group["accel_mem_total_bytes"]),
            "case_rss_bytes_max": _max(group["case_rss_bytes_max"]),
            "case_pss_bytes_max": _max(group["case_pss_bytes_max"]),
            "case_uss_bytes_max": _max(group["case_uss_bytes_max"]),
            "accel_util_percent_mean": _mean(group["accel_util_percent_mean"]),
            "accel_mem_used_bytes_max": _max(group["accel_mem_used_bytes_max"]),
            "chip": headline_state(group["chip_state"]),
            "notes": list(dict.fromkeys(n for n in group["note"] if isinstance(n, str))),
            "search": _best_search(group),
        })
        per_host += host_figures(case, metric, group, mean)
    not_measured = [
        {"case": r.case, "round": r.round, "host": r.host, "status": r.status,
         "kind": r.failure.kind if r.failure else None, "message": r.failure.message if r.failure else ""}
        for r in results if r.status != "success"
    ]
    context: dict[str, Any] = {}
    if results:
        first = results[0]
        prov = first.provenance
        context = {"vendor": first.vendor, "device": next((r.device for r in results if r.device), None),
                   "hosts": sorted({r.host for r in results})}
        if prov:
            context.update({"engine_version": prov.engine_version, "git_revision": prov.git_revision,
                            "git_dirty": prov.git_dirty, "source_digest": prov.source_digest, "python": prov.python,
                            "torch": prov.libraries.get("torch"), "prefect": prov.libraries.get("prefect"),
                            "command": prov.command, "image": prov.image.get("status"),
                            "image_reason": prov.image.get("reason")})
    return RunSummary(run_id=run_dir.name, rows=rows, headline=headline, not_measured=not_measured,
                      counts=counts, problems=problems, context=context, monitor_notes=placed_notes(notes),
                      scaling=scaling_table(rows), faults=find_faults(run_dir, loaded, headline),
                      progress=run_progress(run_dir, results),
                      retried=retried_rounds(run_dir, results), device_spread=spread_over_devices(rows),
                      per_host=per_host,
                      operators=operator_summaries(operation_points), serving=serving_points(run_dir, rows, loaded),
                      convergence=convergence_rows(results))


def convergence_rows(results: list[RoundResult]) -> list[dict[str, Any]]:
    """A row per round that recorded whether its case converged (training), node rank 0's (the others hold the
    same run), in case and round order."""
    rows = [{"case": r.case, "round": r.round, "host": r.host, **r.convergence.model_dump()}
            for r in results if r.convergence is not None and r.node_rank == 0]
    return sorted(rows, key=lambda e: (e["case"], e["round"], e["host"]))


CONVERGENCE_HEADER = ["case", "round", "host", "target metric", "target", "reached", "converged", "epochs", "steps"]


def render_convergence(rows: list[dict[str, Any]]) -> list[str]:
    """FlagPerf's per-case verdict: the target reached within the case's budget, or not (a result, not a fault)."""
    if not rows:
        return []
    lines = ["## Convergence", "",
             "Whether each training round reached its case's target within the case's budget (FlagPerf's "
             "`converged`); not reaching it is a result of the run, shown, not a failed round.", "",
             "| " + " | ".join(CONVERGENCE_HEADER) + " |", "|" + "---|" * len(CONVERGENCE_HEADER)]
    for e in rows:
        reached = "-" if e["reached"] is None else f"{e['reached']:.4g}"
        verdict = "yes" if e["converged"] else "**no**"
        lines.append(f"| {md_text(e['case'])} | {e['round']} | {md_text(e['host'])} | {md_text(e['metric'])} | "
                     f"{e['target']:.4g} | {reached} | {verdict} | {e['epochs']} | {e['steps']} |")
    return [*lines, ""]


def planned_rounds(run_dir: Path) -> tuple[list[tuple[str, int, str, int]], int, list[int], bool] | None:
    """The host rounds plan.json plans (case, round, host, node rank: cases x rounds x hosts, an nnodes case on its
    first nnodes hosts, an endpoint's case on its client host: flagperf.results.schema.node_groups), its rounds,
    the hosts of one round of each case, and whether it names its hosts (else one host "local" is assumed); None
    where there is no plan, or it is not one."""
    planned: list[tuple[str, int, str, int]] = []
    hosts_per_case: list[int] = []  # the records of one round of each case: its hosts (an nnodes case's nodes)
    try:
        plan = read_json_file(run_dir / PLAN_JSON, what="a run's plan")  # bounded; a FIFO is refused, not read
        rounds = plan["rounds"]
        # A whole number the planner allows: 1e999 would overflow int(), 3,000,000 build a list of millions
        if isinstance(rounds, bool) or not isinstance(rounds, int) or not 1 <= rounds <= MAX_ROUNDS:
            return None
        # Names as this engine writes them, strings: a plan.json's whole number or true/false is no folder's name
        # (and would not join a path), so it is left out as a name the run never used
        named = [name for h in plan.get("hosts") or [] if isinstance(name := h["name"], str)]
        hosts = named or ["local"]
        for case in plan["cases"]:
            if not isinstance(case["name"], str):
                continue
            groups = node_groups(case.get("config") or {}, hosts)
            hosts_per_case.append(sum(len(group) for group in groups))
            if len(planned) + rounds * hosts_per_case[-1] > MAX_PLANNED_HOST_ROUNDS:
                return None
            for round_no in range(1, rounds + 1):
                planned += [(case["name"], round_no, host, rank) for group in groups
                            for rank, host in enumerate(group)]
    except (FlagperfError, KeyError, TypeError, ValueError, AttributeError, OverflowError):
        return None
    return planned, rounds, hosts_per_case, bool(named)


def summary_written(run_dir: Path) -> str:
    """Whether the run's summary.json says it ended: "ended"; "none" where there is none; "earlier" where it is an
    earlier attempt's, older than the latest folder a retry set aside into retries/ (a retry moves the interruption
    record and the rounds it runs again there, each move a fresh entry in a folder of it, but leaves summary.json,
    which the site's list of runs reads meanwhile, until its own last step writes it again)."""
    try:
        summary = os.stat(run_dir / SUMMARY_JSON)
    except (OSError, ValueError):
        return "none"
    if not stat.S_ISREG(summary.st_mode):
        return "none"
    retries = run_dir / RETRIES_DIR
    # attempt<K>/ gets the interruption record, attempt<K>/<case>/<round>/ a round's folder (names never patterns)
    folders = [retries, *retries.glob("attempt*"), *retries.glob("attempt*/*"), *retries.glob("attempt*/*/round*")]
    newest = 0
    for folder in folders:
        try:
            info = os.lstat(folder)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode):
            newest = max(newest, info.st_mtime_ns)
    return "ended" if summary.st_mtime_ns >= newest else "earlier"


def round_kinds(run_dir: Path) -> tuple[dict[str, Any] | None, Callable[[str, int, str, int], str]]:
    """The run's interruption record (None where it was not interrupted, or the record is unreadable), and what a
    round with no result is by it: "measured" (kept on its host, a retry collects it), "stopped" (running when the
    run was stopped) or "not_started"."""
    try:
        interrupted = read_json_file(run_dir / INTERRUPTED_FILE, what="a run's interruption record")
    except FlagperfError:
        interrupted = None
    if not isinstance(interrupted, dict):
        interrupted = None
    running = interrupted.get("running") if interrupted else None  # [case, round] in flight at the stop
    running = tuple(running) if isinstance(running, list) else ()
    # Measured on their host but not collected when the run was stopped: a retry collects them, not lost.
    on_host = {tuple(r) for r in (interrupted or {}).get("measured_on_host") or ()
               if isinstance(r, list) and all(isinstance(v, str | int) for v in r)}

    def kind(case: str, round_no: int, host: str, rank: int) -> str:
        return ("measured" if (case, round_no, host, rank) in on_host
                else "stopped" if (case, round_no) == running else "not_started")
    return interrupted, kind


def run_progress(run_dir: Path, results: list[RoundResult]) -> dict[str, Any]:
    """Rounds planned (from plan.json: cases x rounds x hosts, an nnodes case on its first nnodes hosts, an endpoint's
    case on its client host: flagperf.results.schema.node_groups), done
    and not started, and the interruption if the run was stopped: a report of a stopped run says what it
    covers instead of reading as a small complete run."""
    plan = planned_rounds(run_dir)
    if plan is None or not plan[0]:  # no plan, or not one: counts alone
        return {}
    planned, rounds, hosts_per_case, _ = plan
    done = {(r.case, r.round, r.host, r.node_rank) for r in results}
    interrupted, kind = round_kinds(run_dir)
    progress: dict[str, Any] = {"planned": len(planned), "planned_as": _planned_as(rounds, hosts_per_case),
                                "done": sum(p in done for p in planned), "measured": [],
                                "kept_on": [], "stopped": [], "not_started": [], "interrupted": interrupted}
    for c, n, h, k in planned:
        if (c, n, h, k) not in done:
            which = kind(c, n, h, k)
            progress[which].append(f"{c} round {n} on {h}" + (f" (node {k})" if k else ""))
            if which == "measured" and h not in progress["kept_on"]:
                progress["kept_on"].append(h)
    return progress


def _planned_as(rounds: int, hosts_per_case: list[int]) -> str:
    """What the planned count multiplies, where it is more than the rounds: a round of a case on each of its hosts is
    a record of its own, so 2 rounds on 2 hosts plan 4 ('2 rounds × 2 hosts'); '' for one case on one host. Cases on
    different numbers of hosts (an nnodes case on fewer) are grouped by it: '2 rounds × (2 cases × 3 hosts + 1 case
    × 2 hosts)' plans 16, the product of what it says."""
    cases, hosts = len(hosts_per_case), set(hosts_per_case)
    if cases <= 1 and hosts <= {1}:
        return ""
    of_rounds = f"{rounds} round{'s' if rounds != 1 else ''}"
    if len(hosts) > 1:
        groups = [f"{n} case{'s' if n != 1 else ''} × {h} host{'s' if h != 1 else ''}"
                  for h in sorted(hosts, reverse=True) for n in [hosts_per_case.count(h)]]
        return f"{of_rounds} × ({' + '.join(groups)})"
    parts = [f"{cases} cases"] if cases > 1 else []
    parts.append(of_rounds)
    if max(hosts) > 1:
        parts.append(f"{max(hosts)} hosts")
    return " × ".join(parts)


def progress_line(progress: dict[str, Any]) -> str:
    """How far an interrupted run got (the report's and the CLI's words): rounds measured but not yet collected
    are named apart from those stopped while running, with the command that collects them."""
    measured, kept_on = progress.get("measured") or [], progress.get("kept_on") or []  # older summaries: none
    retry = (progress.get("interrupted") or {}).get("retry") or "a retry of the run"
    on_host = (f"{len(measured)} measured, kept on host{'s' if len(kept_on) > 1 else ''} {', '.join(kept_on)} "
               f"({retry} collects {'them' if len(measured) > 1 else 'it'}), " if measured else "")
    return (f"{progress['done']} of {progress['planned']} planned rounds done, {on_host}{len(progress['stopped'])} "
            f"stopped while running, {len(progress['not_started'])} not started")


def retried_rounds(run_dir: Path, results: list[RoundResult]) -> list[dict[str, Any]]:
    """Rounds that a retry of the flow run ran again: what each earlier attempt ended as, and what the round
    is now."""
    now = {(r.case, r.round, r.host, r.node_rank): r.status for r in results}
    retried = []
    for path in sorted((run_dir / RETRIES_DIR).glob(f"attempt*/*/round*/*_noderank*/{RESULT_FILE}")):
        try:
            earlier = read_result(path)
        except (OSError, ValueError):
            continue
        attempt = path.relative_to(run_dir / RETRIES_DIR).parts[0]
        retried.append({"case": earlier.case, "round": earlier.round, "host": earlier.host,
                        "node_rank": earlier.node_rank, "attempt": attempt, "was": earlier.status,
                        "message": earlier.failure.message if earlier.failure else "",
                        "now": now.get((earlier.case, earlier.round, earlier.host, earlier.node_rank), "not run"),
                        "kept_in": path.parent.relative_to(run_dir).as_posix()})
    return retried


def one_figure_per_job(rows: pd.DataFrame) -> pd.DataFrame:
    """Training figures are global (all-reduced) and every node reports them: keep node rank 0's, so a
    2-node job is one value per round, not two. Base specs are per host and all count."""
    return rows[(rows["family"] != "training") | (rows["node_rank"] == 0)]


def scaling_table(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """DLPerf-style scaling (1 -> N devices or nodes) for every throughput (a rate: .../s, FLOPS, TOPS)
    measured at several sizes.

    Throughput at a size is the sum over its hosts for base specs (each host measures its own devices) and
    the job's global figure for training (every node reports the all-reduced total), averaged over rounds;
    speed-up is against the smallest size measured, efficiency = speed-up / (devices / smallest).
    """
    is_rate = rows["unit"].map(lambda u: isinstance(u, str) and (u.endswith("/s") or u.endswith("PS"))).astype(bool)
    measured = one_figure_per_job(rows[rows["metric"].notna() & (rows["status"] == "success") & is_rate]).copy()
    if measured.empty:
        return []
    measured["devices"] = measured["nnodes"] * measured["nproc_per_node"]
    table: list[dict[str, Any]] = []
    for (case, metric), group in measured.groupby(["case", "metric"], sort=False):
        if group["devices"].nunique() < 2:
            continue
        per_round = group.groupby(["devices", "nnodes", "nproc_per_node", "round"])["value"].sum()
        sizes = per_round.groupby(level=["devices", "nnodes", "nproc_per_node"]).mean().sort_index()
        (base_devices, _, _), base = sizes.index[0], float(sizes.iloc[0])
        for (devices, nnodes, nproc), value in sizes.items():
            speedup = float(value) / base if base else None
            table.append({"case": case, "metric": metric, "unit": group["unit"].iloc[0], "nnodes": int(nnodes),
                          "nproc_per_node": int(nproc), "devices": int(devices), "throughput": float(value),
                          "speedup": speedup,
                          "efficiency": speedup / (devices / base_devices) if speedup is not None else None})
    return table


def _mean(series: pd.Series) -> float | None:
    values = pd.to_numeric(series, errors="coerce").dropna()
    return float(values.mean()) if len(values) else None


def _max(series: pd.Series) -> float | None:
    values = pd.to_numeric(series, errors="coerce").dropna()
    return float(values.max()) if len(values) else None


def fmt(value: Any, digits: int = 4) -> str:
    """A figure to ``digits`` significant digits, written out (24540, never 2.454e+04) from 1e-4 up to 1e15."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return number(value, digits)
    return str(value)


def fmt_pct(value: float | None) -> str:
    """A share (of a peak, of a figure) as the reports print every percentage (markup.percent)."""
    return percent(value)


def headline_cells(entry: dict[str, Any], text: Callable[[object], str] = md_text) -> list[str]:
    """A headline row's cells; ``text`` shows what a case controls (a metric, a unit): md_text in Markdown,
    markup.plain where none renders (the site, the CLI, a table artifact)."""
    spread = f"{percent(entry['spread_cv'], sign='±')} ({entry['spread_over']})" if entry["spread_cv"] is not None \
        else "-"
    peak = f"{fmt(entry['peak'])} {entry['peak_unit']}" if entry["peak"] is not None else peak_missing(entry)
    if entry.get("peak_sparse"):
        peak += " (sparse)"
    measured = ("≥ " if entry.get("lower_bound") else "") + fmt(entry["value"])  # a bound by design, said
    return [text(entry["case"]), text(entry["metric"]), measured, unit_cell(entry["unit"], text), fmt(entry["p50"]),
            spread, peak,
            ratio_cell(entry, text), mfu_cell(entry.get("mfu"), estimated=bool(entry.get("mfu_estimated"))),
            rounds_cell(entry), entry.get("statistic") or "-"]


def rounds_cell(entry: dict[str, Any]) -> str:
    """How many figures a headline averages: its rounds, times its hosts where several measured it (2 hosts x 1
    round are 2 figures, not 1), and where some host missed a round the count, with how many are missing (h1
    rounds 1 and 2, h2 round 1: "3 (2 rounds × 2 hosts, 1 missing)")."""
    hosts, rounds = int(entry.get("hosts") or 1), int(entry["rounds"])
    if hosts < 2:
        return str(rounds)
    full = rounds * hosts
    figures = int(entry.get("figures") or full)  # a summary.json from before it was counted: all there
    return f"{rounds} × {hosts} hosts" if figures >= full else \
        f"{figures} ({rounds} rounds × {hosts} hosts, {full - figures} missing)"


PEAK_UNITS = ("TFLOPS", "TOPS", "GB/s")  # the units a spec table gives peaks in (GiB: capacity, with its source)


def peak_missing(entry: dict[str, Any]) -> str:
    """The peak cell of a figure without one: "unknown" where a peak was looked for (its source says why none) or
    the unit is one a spec table has peaks in; "-" where none applies (a latency, a time, an accuracy, items/s,
    whose MFU has its own peak)."""
    return "unknown" if entry.get("peak_source") or entry.get("unit") in PEAK_UNITS else "-"


NO_UNIT = "(none given)"


def unit_cell(unit: Any, text: Callable[[object], str] = md_text) -> str:
    """A figure's unit as the tables show it; a case that gave none is said to have (a bare number is no figure)."""
    return text(unit) if isinstance(unit, str) and unit else NO_UNIT


def ratio_cell(entry: dict[str, Any], text: Callable[[object], str] = md_text) -> str:
    """measured / peak: against an exact peak above 100 % is flagged (the peak is wrong); against an estimated
    one (a lower bound) the ratio is an upper estimate, and above 100 % says the estimate is low, and why."""
    if entry["ratio"] is None:
        return "- (sparse peak: none)" if entry.get("peak_sparse") else "-"
    if entry.get("peak_bound") == "lower":
        above = (f" (above the estimated peak; a lower bound: {text(entry.get('peak_bound_reason') or '')})"
                 if entry.get("above_estimated_peak") else "")
        return UPPER_ESTIMATE + fmt_pct(entry["ratio"]) + above
    return fmt_pct(entry["ratio"]) + (" (above peak!)" if entry["above_peak"] else "")


def mfu_cell(mfu: float | None, *, estimated: bool = False) -> str:
    """An MFU above 100 % of an exact peak is an error in the FLOPs per item or the peak, shown as one (the faults
    section says more), never as a plain figure. Against an estimated peak (a lower bound) the MFU is an upper
    estimate, marked as the ratio is."""
    if mfu is not None and estimated:
        return UPPER_ESTIMATE + fmt_pct(mfu) + (" (above 100 % of the estimated peak, a lower bound)"
                                                 if mfu > 1.0 else "")
    if mfu is not None and mfu > 1.0:
        return f"**error**: {fmt_pct(mfu)}, FLOPs per item or peak wrong (above 100%!)"
    return fmt_pct(mfu)


def estimated_peak_lines(figures: list[dict[str, Any]]) -> list[str]:
    """Under the headline table where a ratio or MFU is against an estimated peak: what ≤ means, and why each
    peak is only an estimate (one line per reason, naming its figures)."""
    reasons: dict[str, list[str]] = {}
    for e in figures:
        if e.get("peak_bound") == "lower" and e.get("ratio") is not None:
            reasons.setdefault(e.get("peak_bound_reason") or "not said", []).append(f"{e['case']} / {e['metric']}")
    if not reasons and not any(e.get("mfu_estimated") and e.get("mfu") is not None for e in figures):
        return []
    lines = [ESTIMATED_PEAK_LEGEND, ""]
    lines += [f"- {md_text(', '.join(names))}: the peak is an estimate, a lower bound ({md_text(reason)})"
              for reason, names in reasons.items()]
    return [*lines, ""] if reasons else lines


# What to do about a warning, by what it says (the first that matches); a warning no entry knows gets the last.
WARNING_STEPS = (
    ("outlying chunks", "a few slow or fast chunks dominate the total: look at the round's utilisation plot for "
                        "another load on the host, then run again with more rounds (--rounds) or a longer measuring "
                        "window (--set CASE.KEY=VALUE, the case's config.yaml names its keys) on an idle host"),
    ("requests", "requests failed, were truncated or miscounted: the LLM serving section lists the points and the "
                 "first error; each request is in the round's requests.jsonl, the server's log in case.log"),
    ("MFU", "the MFU is not to be read plainly: check the case's FLOPs per item and the peak it is against "
            "(How these numbers were made)"),
    # flagperf.generate.points.PER_CHUNK_ITL: how the server streams, not a fault of the run
    ("per chunk", "the ITL is per chunk, not per token: compare other tools' per-token ITL with tpot_s (its note "
                  "says the tokens per chunk); nothing to run again"),
)
OTHER_WARNING_STEP = "the round's case.log (in its round folder) says more; run the case again once it is explained"


def render_warnings(summary: RunSummary) -> list[str]:
    """Figures a reader should not take plainly (the case said why: headline far from the median, MFU), and what
    to do about each kind."""
    warned = [(e, str(w)) for e in summary.headline for w in e.get("warnings", [])]
    if not warned:
        return []
    # One line per case and warning: a sweep's points that all say the same (the server bundles tokens per chunk)
    # are named together, not one line each
    grouped: dict[tuple[str, str], list[str]] = {}
    for e, w in warned:
        grouped.setdefault((str(e["case"]), w), [])
        if str(e["metric"]) not in grouped[str(e["case"]), w]:
            grouped[str(e["case"]), w].append(str(e["metric"]))
    lines = [f"- {case} / {', '.join(md_text(m) for m in metrics)}: {md_text(w)}"
             for (case, w), metrics in grouped.items()]
    steps = dict.fromkeys(next((step for key, step in WARNING_STEPS if key in w), OTHER_WARNING_STEP)
                          for _, w in warned)
    return ["## Warnings", "", *lines, "", "Next steps:", "", *[f"- {step}" for step in steps], ""]


HEADLINE_HEADER = ["case", "metric", "measured", "unit", "p50", "spread (CV)", "peak", "measured/peak", "MFU",
                   "rounds", "statistic"]
OPERATORS_INTRO = ("Operators (operation cases), one row each; correct = points that passed the correctness check "
                   "of those run; every point is in the report's Operators section.")


def headline_figures(headline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The headline entries shown a row each: every family's but the operation points, which the reports show
    a row per operator (RunSummary.operators) and a table per operator."""
    return [e for e in headline if not is_operation(e)]


def headline_rows(headline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The headline table's rows: headline_figures less the generate points' figures without a known peak (a
    sweep has tens of them, each "unknown"), which the reports show a row per point (serving_digest) and in
    full in the LLM serving section; summary.csv and summary.json keep every figure."""
    return [e for e in headline_figures(headline) if not is_serving_point(e) or e["peak"] is not None]


SERVING_MONITOR_FIGURE = "output_tokens_per_s@"  # a point's figures share its window: one row per point, per token


def monitor_entries(headline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The power and memory table's rows: a row per figure, but a generate point's once (its output tokens/s,
    whose energy per work is J per output token), not once per figure over the same window."""
    return [e for e in headline_figures(headline)
            if not is_serving_point(e) or str(e["metric"]).startswith(SERVING_MONITOR_FIGURE)]


def operation_monitor_entries(headline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Power, energy and memory of the operation cases: one entry per case over all its operator figures
    (mean of the means, largest of the maxima); energy per work is per figure, so not combined."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for e in headline:
        if is_operation(e):
            grouped.setdefault(e["case"], []).append(e)
    combined = []
    for case, entries in grouped.items():
        def mean(key: str, entries: list[dict[str, Any]] = entries) -> float | None:
            values = [e[key] for e in entries if e.get(key) is not None]
            return sum(values) / len(values) if values else None

        def largest(key: str, entries: list[dict[str, Any]] = entries) -> float | None:
            values = [e[key] for e in entries if e.get(key) is not None]
            return max(values) if values else None

        combined.append({
            "case": case, "metric": f"all {len(entries)} operator figures", "power_avg_w": mean("power_avg_w"),
            "power_max_w": largest("power_max_w"), "energy_per_work": None, "energy_per_work_unit": None,
            "energy_source": next((e["energy_source"] for e in entries if e.get("energy_source")), None),
            "cpu_percent_mean": mean("cpu_percent_mean"), "mem_used_bytes_max": largest("mem_used_bytes_max"),
            "mem_total_bytes": largest("mem_total_bytes"), "case_rss_bytes_max": largest("case_rss_bytes_max"),
            "case_pss_bytes_max": largest("case_pss_bytes_max"), "case_uss_bytes_max": largest("case_uss_bytes_max"),
            "accel_util_percent_mean": mean("accel_util_percent_mean"),
            "accel_mem_used_bytes_max": largest("accel_mem_used_bytes_max"),
            "accel_mem_total_bytes": largest("accel_mem_total_bytes")})
    return combined


def render_markdown(summary: RunSummary, plots: list[tuple[str, Path]] | str | None = None, *,
                    monitor_table: bool = True) -> str:
    """The report as Markdown. monitor_table=False leaves out the eleven-column power/energy/memory table (for
    narrow viewers such as the Prefect UI's artifact page; the HTML report and summary.csv keep it). ``plots``
    is the drawn plots, or a line saying why none was drawn."""
    ctx = summary.context
    c = summary.counts
    lines = [f"# FlagPerf evaluation {summary.run_id}", ""]
    if ctx:
        git = (ctx.get("git_revision") or "unknown")[:12] + (" (modified)" if ctx.get("git_dirty") else "")
        if ctx.get("source_digest"):
            git += f", source {ctx['source_digest']}"
        # what a probe or a case reported (a device's name), shown as text, never as markup or a link
        lines += [f"- vendor **{md_text(ctx['vendor'])}**, device {md_text(ctx.get('device') or 'unknown')}, "
                  f"hosts {md_text(', '.join(ctx['hosts']))}",
                  f"- engine {md_text(ctx.get('engine_version') or 'unknown')} at git {md_text(git)}; python "
                  f"{md_text(ctx.get('python') or 'unknown')}, torch {md_text(ctx.get('torch') or 'unknown')}, "
                  f"prefect {md_text(ctx.get('prefect') or '-')}; image {md_text(ctx.get('image') or 'not recorded')}"
                  + (f" ({md_text(ctx['image_reason'])})" if ctx.get("image_reason") else ""),
                  f"- command: `{(ctx.get('command') or '-').replace('`', chr(39))}`"]
    progress = summary.progress
    stopped = progress.get("interrupted") if progress else None
    if stopped:
        lines += [f"- **interrupted** ({stopped.get('reason', 'stopped')}) at {stopped.get('at', '?')}: "
                  f"{progress_line(progress)}"]
    planned_as = f"{progress['planned_as']}; " if progress and progress.get("planned_as") else ""  # older: none
    lines += [f"- rounds: {c['rounds']}" + (f" of {progress['planned']} planned" if progress else "")
              + f" ({planned_as}{c['success']} succeeded, {c['unsupported']} unsupported, {c['failed']} failed)", ""]
    figures = headline_figures(summary.headline)
    shown = headline_rows(summary.headline)
    if shown:
        lines += ["| " + " | ".join(HEADLINE_HEADER) + " |", "|" + "---|" * len(HEADLINE_HEADER)]
        lines += ["| " + " | ".join(headline_cells(e)) + " |" for e in shown]
        lines.append("")
    lines += serving_digest(summary.serving)
    lines += estimated_peak_lines(figures)
    if summary.operators:
        lines += [OPERATORS_INTRO, "", *operator_table(summary.operators)]
        if any(e.get("best_roofline_estimated") for e in summary.operators):
            lines += [ESTIMATED_PEAK_LEGEND, ""]
    lines += render_warnings(summary)
    lines += render_chip_section([e for e in summary.headline
                                  if not is_operation(e) or (e.get("chip") or {}).get("flagged")])
    lines += render_max_achievable(summary.headline)
    if monitor_table:
        lines += render_monitor_section(summary)
    elif summary.headline:
        lines += ["Power, energy and memory over each timed region: in the HTML report and summary.csv.", ""]
    if summary.scaling:
        lines += ["## Scaling", "", "| case | metric | nodes | devices per node | devices | throughput | speed-up | "
                  "efficiency |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {s['case']} | {s['metric']} | {s['nnodes']} | {s['nproc_per_node']} | {s['devices']} | "
                  f"{fmt(s['throughput'])} {s['unit']} | {fmt(s['speedup'], 3)} | {fmt_pct(s['efficiency'])} |"
                  for s in summary.scaling]
        lines.append("")
    lines += render_convergence(summary.convergence)
    lines += render_hosts(summary.per_host, summary.headline)
    lines += render_devices(summary.device_spread)
    if any(e["above_peak"] for e in figures):  # operation points: a line per operator in the faults
        lines += ["**A measurement above its peak means the peak is wrong for this machine** (for example a "
                  "CPU that boosts above the clock the spec table could see); see the peak sources below.", ""]
    if summary.not_measured:
        lines += ["## Not measured", ""]
        lines += [f"- {e['case']} round {e['round']} on {e['host']}: **{e['status']}**"
                  f"{' (' + e['kind'] + ')' if e['kind'] and e['kind'] != e['status'] else ''}: "
                  f"{md_text(e['message'])}"
                  for e in summary.not_measured]
        lines.append("")
    if stopped and progress.get("measured"):
        lines += ["## Measured, not yet collected (the run was interrupted)", "",
                  f"Not lost: kept on {', '.join(progress['kept_on'])}; {stopped.get('retry') or 'a retry of the run'}"
                  f" stores {'them' if len(progress['measured']) > 1 else 'it'} without measuring again.", ""]
        lines += [f"- {label}" for label in progress["measured"]] + [""]
    if stopped and progress["stopped"]:
        lines += ["## Stopped while running (the run was interrupted)", ""]
        lines += [f"- {label}" for label in progress["stopped"]] + [""]
    if stopped and progress["not_started"]:
        lines += ["## Not started (the run was interrupted)", ""]
        lines += [f"- {label}" for label in progress["not_started"]] + [""]
    lines += render_faults(summary)
    if summary.problems:
        lines += ["## Unreadable result files", ""] + [f"- {p}" for p in summary.problems] + [""]
    if figures:
        used = [s for s in STATISTICS if any(e.get("statistic") == s for e in figures)]
        lines += ["## How these numbers were made", "", how_made(figures), "",
                  *[f"- statistic **{s}**: {STATISTICS[s]}" for s in used], *([""] if used else [])]
        lines += [*method_lines(figures), ""]
    if isinstance(plots, str):
        lines += ["## Plots", "", plots, ""]
    elif plots:
        lines += ["## Plots", ""]
        for title, path in plots:
            lines += [f"### {title}", "", f"![{title}]({path.as_posix()})", ""]
    return "\n".join(lines)


def how_made(figures: list[dict[str, Any]]) -> str:
    """What the headline's measured and spread are: over rounds, and over hosts too where several measured."""
    if not any(int(e.get("hosts") or 1) > 1 for e in figures):
        return ("Measured = the mean over rounds of each round's figure, formed as its statistic says (the table's "
                "last column; docs: What a run gives you, Conventions); spread = coefficient of variation across "
                "rounds, or across chunks for a single round.")
    return ("Measured = the mean over rounds and hosts of each host's figure in each round (rounds: rounds × hosts "
            "where several hosts measured it, the count of figures where some host missed a round; each host's own "
            "in Every host), formed as its statistic says (the "
            "table's last column; docs: What a run gives you, Conventions); spread = coefficient of variation "
            "across those figures, and the column names what they differ by (rounds, hosts, devices), or across "
            "chunks for a single round on one host.")


# Where a case stated no convention for a figure: what the figure is by its statistic, in the glossary's words.
NO_CONVENTION = {
    "rate": "no counting convention stated by the case; a throughput as docs/results.md (Conventions) defines it",
    "mean": "no counting convention stated by the case; a latency or mean over events as docs/results.md "
            "(Conventions) defines it",
    "single": "one measurement, or one figure derived from others (no counting convention needed)",
    "": "no counting convention stated by the case",
}


def method_lines(figures: list[dict[str, Any]]) -> list[str]:
    """Each figure's convention and peak source, a line each; a generate case's points share one line per
    figure ("ttft_s at c1, c2, r4"), as its figures are counted alike at every point."""
    grouped: dict[tuple[str, ...], list[str]] = {}
    for e in figures:
        peak = e["peak_source"] or (f"none in {e['unit']}" if isinstance(e["unit"], str) and e["unit"] else "none")
        if e.get("peak_bound") == "lower":
            peak += f"; an estimate, a lower bound of the real peak: {e['peak_bound_reason']}"
        mfu = f"; MFU against {e['mfu_peak']}" if e.get("mfu_peak") else ""
        metric, point = str(e["metric"]), None
        if is_serving_point(e):
            metric, point = metric.rsplit("@", 1)
        convention = e["convention"] or NO_CONVENTION.get(str(e.get("statistic")), NO_CONVENTION[""])
        key = (str(e["case"]), metric, str(point is not None), md_text(convention), md_text(peak + mfu))
        grouped.setdefault(key, [])
        if point is not None:
            grouped[key].append(point)
    return [f"- {md_text(case)} / {md_text(metric)}" + (f" at {', '.join(points)}" if points else "")
            + f": {convention}; peak: {peak}" for (case, metric, _, convention, peak), points in grouped.items()]


def render_hosts(per_host: list[dict[str, Any]], headline: list[dict[str, Any]]) -> list[str]:
    """Every host's own figure, for the headline's figures several hosts measured: a lab comparing hosts reads them
    here (the headline is their mean; a fleet's verdicts are in the diagnosis)."""
    shown = {(e["case"], e["metric"]) for e in headline_rows(headline)}
    entries = [e for e in per_host if (e["case"], e["metric"]) in shown]
    if not entries:
        return []
    lines = ["## Every host", "", "Each host's figure: the mean of its rounds; vs all hosts = the host's figure / the "
             "headline (the mean of every host's figures: a host that measured more rounds weighs more).", "",
             "| case | metric | unit | host | rounds | measured | spread (CV) | vs all hosts |",
             "|---|---|---|---|---|---|---|---|"]
    for e in entries:
        spread = f"{percent(e['spread_cv'], sign='±')} ({e['spread_over']})" if e["spread_cv"] is not None else "-"
        lines.append(f"| {e['case']} | {md_text(e['metric'])} | {unit_cell(e['unit'])} | {md_text(e['host'])} | "
                     f"{e['rounds']} | {fmt(e['value'])} | {spread} | {fmt_pct(e['vs_mean'])} |")
    return [*lines, ""]


def render_devices(spread: list[dict[str, Any]]) -> list[str]:
    """Every device of every host: the host's min, median and max per metric, and each device's figure."""
    if not spread:
        return []
    lines = ["## Every device", "", "Each host's devices measured one process each; min names the lowest device.",
             "", "| case | metric | unit | round | host | devices | min (device) | median | max | per device |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for e in spread:
        uuid = f", {e['min_device_uuid']}" if e["min_device_uuid"] else ""
        lowest = f"{fmt(e['min'])} (device {e['min_device']}{uuid})"
        each = ", ".join(f"{d}: {fmt(v)}" for d, v in sorted(e["per_device"].items()))
        lines.append(f"| {e['case']} | {md_text(e['metric'])} | {md_text(e['unit'])} | {e['round']} | {e['host']} | "
                     f"{e['devices']} | {lowest} | {fmt(e['median'])} | {fmt(e['max'])} | {each} |")
    return [*lines, ""]


def render_faults(summary: RunSummary) -> list[str]:
    if not summary.faults:
        return []
    return ["## Faults and bounds", "", *[f"- {md_text(fault)}" for fault in summary.faults], ""]


def _best_search(group: pd.DataFrame) -> dict[str, Any] | None:
    """The shape search of the round with the highest figure (max-achievable metrics only)."""
    searched = group[group["search"].notna()]
    if searched.empty:
        return None
    return json.loads(searched.loc[searched["value"].astype(float).idxmax(), "search"])


def render_max_achievable(headline: list[dict[str, Any]]) -> list[str]:
    """Max-achievable figures (a shape search's, ``<metric>_max``) beside their fixed-shape figures."""
    fixed = {(e["case"], e["metric"]): e for e in headline}
    pairs = [(fixed.get((e["case"], e["metric"].removesuffix("_max"))), e) for e in headline if e.get("search")]
    if not pairs:
        return []
    lines = ["## Max-achievable (shape search) beside the fixed shape", "",
             "| case | fixed shape | measured | max-achievable shape | measured | max / fixed |",
             "|---|---|---|---|---|---|"]
    for base, best in pairs:
        base_value = f"{fmt(base['value'])} {base['unit']}" if base else "-"
        gain = fmt_pct(best["value"] / base["value"]) if base and base["value"] else "-"
        lines.append(f"| {best['case']} | {'; '.join(base['notes']) if base else '-'} | {base_value} | "
                     f"{'; '.join(best['notes'])} | {fmt(best['value'])} {best['unit']} | {gain} |")
    return [*lines, ""]


MONITOR_HEADER = ["case", "figures (those of one timed region share a row)", "avg power W", "max power W",
                  "energy per work", "energy source", "CPU util %", "peak host memory GiB (of total)",
                  "peak case memory GiB", "accel util %", "peak accel memory GiB (of total)"]


def _gib(value: float | None, total: float | None = None) -> str:
    if value is None:
        return "-"
    return f"{value / 2**30:.3g}" + (f" ({total / 2**30:.3g})" if total else "")


def monitor_cells(e: dict[str, Any]) -> list[str]:
    per_work = f"{fmt(e['energy_per_work'])} {e['energy_per_work_unit']}" if e["energy_per_work"] is not None else "-"
    return [e["case"], e["metric"], fmt(e["power_avg_w"]), fmt(e["power_max_w"]), per_work,
            e["energy_source"] or "-", fmt(e["cpu_percent_mean"], 3),
            _gib(e["mem_used_bytes_max"], e["mem_total_bytes"]), case_memory_cell(e),
            fmt(e["accel_util_percent_mean"], 3),
            _gib(e["accel_mem_used_bytes_max"], e["accel_mem_total_bytes"])]


def case_memory_cell(e: dict[str, Any]) -> str:
    """The case's peak memory, saying which measure: PSS (shared pages split between the processes that map
    them) where the monitor had it, else summed RSS (which counts a forked worker's shared pages again)."""
    if e.get("case_pss_bytes_max") is not None:
        uss = f", USS {_gib(e['case_uss_bytes_max'])}" if e.get("case_uss_bytes_max") is not None else ""
        return f"PSS {_gib(e['case_pss_bytes_max'])}{uss}"
    if e.get("case_rss_bytes_max") is not None:
        return f"RSS (summed) {_gib(e['case_rss_bytes_max'])}"
    return "-"


def monitor_rows(entries: list[dict[str, Any]]) -> list[list[str]]:
    """The power and memory table's rows: a case's figures measured over the same region (the same cells: a
    round's one-off times, a family's figures timed together) share one row that names them all."""
    grouped: dict[tuple[str, ...], list[str]] = {}
    for e in entries:
        case, metric, *rest = monitor_cells(e)
        grouped.setdefault((case, *rest), []).append(md_text(metric))
    return [[case, ", ".join(metrics), *rest] for (case, *rest), metrics in grouped.items()]


def render_monitor_section(summary: RunSummary) -> list[str]:
    lines = ["## Power, energy and memory over each timed region", ""]
    lines += ["| " + " | ".join(MONITOR_HEADER) + " |", "|" + "---|" * len(MONITOR_HEADER)]
    lines += ["| " + " | ".join(cells) + " |"
              for cells in monitor_rows([*monitor_entries(summary.headline),
                                         *operation_monitor_entries(summary.headline)])]
    lines.append("")
    if summary.monitor_notes:
        lines += [f"- {note}" for note in summary.monitor_notes] + [""]
    return lines if summary.headline else []


# Every abbreviation and unit symbol the report may use (a pattern that finds it, and what it means): the report
# ends with those it used, so that a reader outside the lab reads each the same way (docs/results.md, Conventions).
ABBREVIATIONS = (
    (r"\bCV\b", "CV", "coefficient of variation: standard deviation / mean, across rounds (or timed chunks)"),
    (r"\bp(?:10|50|90|95|99)\b", "p10, p50, p90, p99", "percentiles: p50 is the median, p99 the value 99 % of the "
                                                     "events are at or below"),
    (r"\bMFU\b", "MFU", "model FLOPs utilisation: the model's FLOPs per second on one device / that device's dense "
                        "peak for the precision"),
    (r"\bFLOPs?\b|\bTFLOPS\b", "FLOP, TFLOPS", "floating-point operations (a multiply-add counts 2); TFLOPS = "
                                                  "10^12 FLOP per second"),
    (r"\bTOPS\b", "TOPS", "10^12 integer operations per second"),
    (r"\bGB/s\b", "GB/s", "10^9 bytes per second"),
    (r"\bGiB\b", "GiB", "2^30 bytes"),
    (r"\bms\b|\bus\b", "ms, us", "milliseconds, microseconds (a figure's unit column says which it is in)"),
    (r"\bW\b|\bJ\b", "W, J", "watts (power), joules (energy)"),
    (r"\bPSS\b|\bUSS\b|\bRSS\b", "PSS, USS, RSS", "proportional set size (memory shared between processes "
                                                   "split between them), unique set size (the processes' own), "
                                                   "resident set size (shared pages counted in every process)"),
    (r"\bTTFT\b", "TTFT", "time to first token: from sending a request to its first output token"),
    (r"\bTPOT\b", "TPOT", "time per output token: a request's (E2EL - TTFT) / (output tokens - 1)"),
    (r"\bITL\b", "ITL", "inter-token latency: every gap between two output tokens, pooled over the requests"),
    (r"\bE2EL\b", "E2EL", "end-to-end latency: from sending a request to its last output token"),
    (r"\bSLO\b", "SLO", "service-level objective: the p99 TTFT and TPOT bounds a serving point must meet, with no "
                         "failed request"),
    (r"\bc\d+\b|\br\d[0-9.]*\b", "cN, rR", "a serving point: N requests in flight (closed loop), or R requests "
                                          "per second offered (open loop)"),
    (r"\b(?:fp|bf)(?:64|32|16|8)\b|\btf32\b|\bint8\b", "fp32, fp16, bf16, tf32, fp8, int8",
     "number formats: IEEE floats of 32 and 16 bits, bfloat16, TensorFloat-32, 8-bit floats, 8-bit integers"),
    (r"\bdtype\b", "dtype", "the number format an operator ran in"),
    (r"\d(?:\.\d+)?x\b", "x (after a number)", "a speed-up factor: native's latency / the implementation's"),
    (r"noderank\d", "HOST_noderankK", "a round's folder and plots: the host, and its node rank K in a multi-node "
                                     "job (0 on one host)"),
)


def abbreviation_lines(text: str) -> list[str]:
    """The glossary of the abbreviations and unit symbols ``text`` uses; nothing when it uses none."""
    used = [f"- **{name}**: {meaning}" for pattern, name, meaning in ABBREVIATIONS if re.search(pattern, text)]
    return ["## Abbreviations and units", "", *used, ""] if used else []


def write_summary(run_dir: Path, summary: RunSummary, plots: list[tuple[str, Path]] | str | None = None
                  ) -> dict[str, Path]:
    paths = {"csv": run_dir / SUMMARY_CSV, "json": run_dir / SUMMARY_JSON, "markdown": run_dir / REPORT_MD}
    write_text_atomic(paths["csv"], summary.rows.map(spreadsheet_cell).to_csv(index=False))
    write_json_atomic(paths["json"], summary.to_json())
    text = render_markdown(summary, plots) + "\n".join(["", *serving_markdown(run_dir, summary.rows),
                                                         *operation_markdown(run_dir, summary.rows)])
    write_text_atomic(paths["markdown"], "\n".join([text, *abbreviation_lines(text)]))
    return paths


def read_summary_json(run_dir: Path) -> dict[str, Any]:
    return read_json_file(run_dir / SUMMARY_JSON, what="a run's summary")
