"""`flagperf diagnose RUN`: the run's figures, its rules file and its baseline (another run, or the history),
read and checked here, then held against each other by flagperf.results.diagnosis."""

from __future__ import annotations

import statistics
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from flagperf.config.models import load_model
from flagperf.errors import ConfigError
from flagperf.paths import PROJECT_ROOT, display_path
from flagperf.results.diagnosis import Diagnosis, Rules, diagnose, is_fleet, render_markdown, write_diagnosis
from flagperf.results.history import (
    figures,
    history_found,
    history_reader,
    not_a_file,
    resolved_url,
    runs,
    sqlite_files,
    unreadable,
)
from flagperf.results.summary import RunSummary, every_result_read, hosts_left_out, summarize

DEFAULT_RULES = PROJECT_ROOT / "deployments" / "diagnosis" / "rules.yaml"
HISTORY_RUNS = 5  # the history's baseline: the median of this many earlier runs of the same vendor and device


def load_rules(path: Path | None = None) -> Rules:
    """The rules file (default: deployments/diagnosis/rules.yaml); any error is one line naming file and key."""
    rules = load_model(path or DEFAULT_RULES, Rules)
    return rules


def run_folder(path: Path, option: str) -> Path:
    if not path.is_dir():
        raise ConfigError(option, None, f"{path}: not a folder")
    if not any(path.glob("*/round*/*_noderank*/result.json")):
        raise ConfigError(option, None, f"{path}: no <case>/round<N>/<host>_noderank<K>/result.json inside; "
                                        "not a run folder")
    return path


def all_readable(summary: RunSummary, run_dir: Path, option: str) -> RunSummary:
    """The summary of a run whose every result.json was read, else the diagnosis is refused (every_result_read)."""
    return every_result_read(summary, option, str(run_dir), "repair or remove it to diagnose the run")


def history_medians(summary: RunSummary, results_dir: Path, url: str | None = None) -> dict[tuple[str, str], float]:
    """(case, metric) -> the median of the last runs in the history with this run's vendor and device
    (this run itself left out)."""
    vendor, device = summary.context.get("vendor"), summary.context.get("device")
    not_a_file(sqlite_files(url, results_dir), "--history")
    engine = history_reader(url, results_dir)  # read only: a diagnosis never makes or changes the history
    found: dict[tuple[str, str], float] = {}
    if engine is None:
        return found
    where = resolved_url(url, results_dir)
    try:
        if not history_found(engine, where):
            return found
        with engine.connect() as conn:
            for entry in summary.headline:
                earlier = conn.execute(
                    select(figures.c.value).join(runs, runs.c.run_id == figures.c.run_id)
                    .where(figures.c.case == entry["case"], figures.c.metric == entry["metric"],
                           runs.c.vendor == vendor, runs.c.device == device, runs.c.run_id != summary.run_id)
                    .order_by(runs.c.recorded_at.desc()).limit(HISTORY_RUNS)).scalars().all()
                if earlier:
                    found[(entry["case"], entry["metric"])] = statistics.median(float(v) for v in earlier)
    except SQLAlchemyError as exc:  # one line (the CLI's error), no traceback
        raise unreadable(exc, where) from None
    finally:
        engine.dispose()
    return found


def diagnose_run(run_dir: Path, rules_file: Path | None = None, baseline: Path | None = None,
                 history: bool = False, history_url: str | None = None, summary: RunSummary | None = None
                 ) -> Diagnosis:
    """The run's diagnosis against the rules file, and against a baseline run or the history (not both)."""
    found = _diagnose_run(run_dir, rules_file, baseline, history, history_url, summary)
    found.rules = rules_source(rules_file)
    return found


def _diagnose_run(run_dir: Path, rules_file: Path | None, baseline: Path | None, history: bool,
                  history_url: str | None, summary: RunSummary | None) -> Diagnosis:
    if baseline is not None and history:
        raise ConfigError("flagperf diagnose", None, "give --baseline or --history, not both")
    run_folder(run_dir, "RUN")
    rules = load_rules(rules_file)
    summary = all_readable(summary or summarize(run_dir), run_dir, "RUN")
    # Host rounds with no figure (no result.json, a failed round) are judged by no rule: said, as compare says them
    left_out = [f"run {run_dir.name}: {line}"] if (line := hosts_left_out(run_dir, summary)) else []
    if baseline is not None:
        run_folder(baseline, "--baseline")
        base = all_readable(summarize(baseline), baseline, "--baseline")
        if line := hosts_left_out(baseline, base):
            left_out.append(f"baseline {baseline.name}: {line}")
        found = diagnose(run_dir, summary.rows, rules, baseline_rows=base.rows, baseline_name=f"run {baseline.name}")
    elif history:
        medians = history_medians(summary, run_dir.parent, history_url)
        found = diagnose(run_dir, summary.rows, rules, baseline_medians=medians,
                         baseline_name=f"history (median of up to {HISTORY_RUNS} earlier runs, "
                                       f"{len(medians)} figures found)")
    else:
        found = diagnose(run_dir, summary.rows, rules)
    found.notes[:0] = left_out
    return found


def rules_source(rules_file: Path | None) -> str:
    return display_path(rules_file or DEFAULT_RULES)


def fleet_diagnosis(run_dir: Path, summary: RunSummary) -> Diagnosis | None:
    """The diagnosis a run's report carries when the run has several hosts or devices (default rules, no
    baseline), also written to diagnosis.json and diagnosis.md; None for a one-device run."""
    if not is_fleet(summary.rows):
        return None
    diagnosis = diagnose_run(run_dir, summary=summary)
    write_diagnosis(run_dir, diagnosis)
    return diagnosis


def report_section(run_dir: Path, summary: RunSummary, found: list[Diagnosis] | None = None) -> str:
    """The report's "Fleet diagnosis" section (flagperf.results.report.build_report's section); a rules file
    that does not load is one line there, not a lost report. found: the diagnosis made, for the caller."""
    try:
        diagnosis = fleet_diagnosis(run_dir, summary)
    except ConfigError as exc:
        return f"## Fleet diagnosis\n\nnot made: {exc}\n"
    if diagnosis is None:
        return ""
    if found is not None:
        found.append(diagnosis)
    return render_markdown(diagnosis, heading="##")
