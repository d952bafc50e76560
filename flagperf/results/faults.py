"""What went wrong or was bounded in a run, each said in one line of the report, never left to a log:
monitors that died or never wrote, rounds retried (and why), figures above their peak or above 100 % MFU
(an exact peak's: above an estimated peak, a lower bound, is no fault), figures that are bounds by design rather
than limits reached."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flagperf.errors import FlagperfError
from flagperf.results.analysis import read_monitors
from flagperf.results.bounded import read_end, read_json_file, read_start
from flagperf.results.operators import is_operation
from flagperf.results.schema import ATTEMPT_FAILURE_FILE, CASE_LOG_FILE, RESULT_FILE, RoundResult, read_result

BOUNDED_NOTE = "bounded by design"  # how a case says its figure is a bound it chose (capacity: max_gib, a share)


def expected_monitors(run_dir: Path) -> set[str]:
    """The monitors the run's vendor lists (plan.json), or none when the plan cannot be read."""
    try:  # bounded, and a FIFO in its place is refused, not waited on
        plan = read_json_file(run_dir / "plan.json", what="a run's plan")
        return {m["name"] for m in plan["vendor"]["manifest"]["monitors"]}
    except (FlagperfError, KeyError, TypeError):
        return set()


def monitor_faults(folder: Path, where: str, expected: set[str]) -> list[str]:
    monitors = read_monitors(folder)
    found = [f"{where}: monitor {name} left no samples file (it did not start, or its file was lost): "
             "no figures from it" for name in sorted(expected - {m.name for m in monitors})]
    for m in monitors:
        samples = len(m.samples)
        if m.footer is None:
            found.append(f"{where}: monitor {m.name} died during the round (no footer, {samples} samples): "
                         "its figures cover only the part of the round before it stopped")
        elif samples == 0 and m.unavailable():  # the vendor's tool is missing or failed: say why, not "one reading"
            reasons = "; ".join(f"{key}: {reason}" for key, reason in m.unavailable().items())
            found.append(f"{where}: monitor {m.name} took no samples, its source is unavailable ({reasons}): no "
                         "figures from it (`flagperf vendor check <vendor>` runs it on its own)")
        elif samples < 2:
            found.append(f"{where}: monitor {m.name} took {samples} sample(s): its averages and maxima are "
                         "one reading, not a profile of the round")
    return found


def attempt_faults(folder: Path, where: str) -> list[str]:
    """Earlier attempts of a round (kept under attempts/): each was a failure the round was retried after."""
    found = []
    attempts = sorted((folder / "attempts").glob("attempt*"), key=lambda p: int(p.name.removeprefix("attempt") or 0))
    for attempt in attempts:
        # Only what the line shows is read: a case's log may have grown to gigabytes.
        written = read_start(attempt / ATTEMPT_FAILURE_FILE, 4096)
        if written is not None:
            cause = " ".join(written.split())[:300]
        else:
            end = read_end(attempt / CASE_LOG_FILE, 64 * 1024) or ""
            tail = [line.strip() for line in end.splitlines() if line.strip()][-1:]
            cause = "cause not recorded" + (f"; {CASE_LOG_FILE} ends: {tail[0][:200]}" if tail else "")
        found.append(f"{where}: {attempt.name} failed and the round was retried: {cause}")
    return found


def rerun_faults(run_dir: Path) -> list[str]:
    """Rounds a retry of the flow run ran again: the failed attempt is kept under retries/attempt<K>/."""
    found = []
    for path in sorted((run_dir / "retries").glob(f"attempt*/*/round*/*_noderank*/{RESULT_FILE}")):
        try:
            earlier = read_result(path)
        except (OSError, ValueError):
            continue
        attempt = path.relative_to(run_dir / "retries").parts[0]
        cause = earlier.failure.message if earlier.failure else earlier.status
        found.append(f"{earlier.case} round {earlier.round} on {earlier.host}: run again by a retry of the flow "
                     f"run ({attempt} kept under retries/): {' '.join(cause.split())[:300]}")
    return found


def figure_faults(headline: list[dict[str, Any]], results: list[RoundResult]) -> list[str]:
    found = []
    above_by_operator: dict[tuple[str, str], list[dict[str, Any]]] = {}  # operation points: a line per operator
    for e in headline:
        label = f"{e['case']} / {e['metric']}"
        if e.get("above_peak") and is_operation(e):
            above_by_operator.setdefault((e["case"], e["metric"].split(":")[0]), []).append(e)
        elif e.get("above_peak"):
            found.append(f"{label}: measured {e['ratio']:.1%} of its peak: above the peak means the spec table's "
                         "peak is wrong for this machine (its source: report.md, 'How these numbers were made')")
        # Against an estimated peak (a lower bound of the real one) above 1 is the estimate being low, not a fault:
        # the report marks those figures as upper estimates instead (summary.ratio_cell, mfu_cell).
        if e.get("mfu") is not None and e["mfu"] > 1.0 and not e.get("mfu_estimated"):
            found.append(f"{label}: MFU {e['mfu']:.1%} is above 100 %: the case's FLOPs per item do not match "
                         "the model it ran, or the peak is too low; the figure is not an efficiency")
    for (case, operator), entries in above_by_operator.items():
        worst = max(entries, key=lambda e: e["ratio"])
        found.append(f"{case} / {operator}: {len(entries)} figure{'s' if len(entries) > 1 else ''} above the peak, "
                     f"up to {worst['ratio']:.1%} ({worst['metric']}): above the peak means the spec table's peak "
                     "is wrong for this machine (see its source in summary.csv)")
    bounds = {(r.case, m.name): m.note for r in results for m in r.metrics if m.note and BOUNDED_NOTE in m.note}
    found += [f"{case} / {metric}: {note}" for (case, metric), note in bounds.items()]
    return found


def find_faults(run_dir: Path, loaded: list[tuple[Path, RoundResult]], headline: list[dict[str, Any]]) -> list[str]:
    expected = expected_monitors(run_dir)
    found: list[str] = []
    for folder, r in loaded:
        where = f"{r.case} round {r.round} on {r.host}"
        found += monitor_faults(folder, where, expected)
        found += attempt_faults(folder, where)
    found += rerun_faults(run_dir)
    found += figure_faults(headline, [r for _, r in loaded])
    return list(dict.fromkeys(found))
