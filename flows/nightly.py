"""Nightly regression: evaluate a suite, record it in the history, judge each figure against its baseline.

evaluate (subflow) -> record_history -> judge_regressions -> (event per regression) -> fail if any
A regression emits the Prefect event `flagperf.regression.detected`; the automation in
deployments/automations/ turns it into an alert.

How a night ends, for a scheduler, an alert and a cron job alike (the state, nightly-<suite>.json in the results
folder and in the run folder, and `exit_code` in it):
  Completed                  every figure held its baseline (or had none yet)          exit 0
  Failed, named Regressed    some figure regressed                                     exit 5 (EXIT_REGRESSION)
  Failed                     the night failed: nothing judged; recorded as a failed night  exit 1
  Failed, "bad input: ..."   the form's input is wrong: no night (no run folder)       exit 2
  Unsupported / Partly ...   as the evaluation                                          exit 3 / 0
  (raises) "Interrupted"     stopped by Ctrl-C or SIGTERM while it measured: not judged; recorded as
                             interrupted; once measured: recorded with its figures all the same   128 + signal
                             and judged (exit 5 where a figure regressed)
trends.csv in the results folder has every figure's course after each night (flagperf.site.trends).
Nights of one suite may run at the same time into one results folder (a cron night and a rerun): the run folder's
nightly-<suite>.json is each night's own; the results folder's is the night started last that has published
(``_write_night``).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NONE
from prefect.events import emit_event
from prefect.exceptions import MissingContextError
from prefect.states import Completed, Failed, State
from sqlalchemy.exc import SQLAlchemyError

from flagperf.config.night import (
    BASELINE_RUNS,
    ROUNDS,
    SIGMA,
    new_night_run_id,
    read_verdict,
    started_later,
    verdict_file_name,
)
from flagperf.config.plan import PLAN_FILE, read_plan
from flagperf.errors import EXIT_UNSUPPORTED, EXIT_USER_ERROR, ConfigError, FlagperfError, redact_userinfo
from flagperf.paths import TREND_FILE, outermost_missing, remove_made, run_id_problem
from flagperf.results.history import (
    Verdict,
    check_history,
    check_run,
    history_engine,
    record_failed_night,
    record_interrupted_night,
    record_run,
)
from flagperf.results.schema import write_json_atomic
from flagperf.results.summary import SUMMARY_JSON
from flagperf.site.trends import write_trend_file
from flagperf.stopping import signals_noted
from flows.evaluate import (
    BAD_INPUT,
    PARTLY_UNSUPPORTED_STATE,
    UNSUPPORTED_STATE,
    SuiteName,
    VendorName,
    default_results_dir,
    evaluate,
    in_form_terms,
)
from tasks.analyze import replace_earlier_artifacts

REGRESSION_EVENT = "flagperf.regression.detected"
VERDICTS_ARTIFACT = "flagperf-regression-verdicts"
REGRESSED_STATE = "Regressed"  # a Failed state's name: a regression, not a night that could not measure
INTERRUPTED_STATE = "Interrupted"  # the verdict file's state of a night the operator stopped (no flow state: it raised)
EXIT_HELD, EXIT_NIGHT_FAILED, EXIT_REGRESSION = 0, 1, 5
RECORDING_LEFT = ("the interrupted night may be missing from the history and its verdict file; its run folder "
                  "stays")


@task(name="record_history", cache_policy=NONE)
def record_history(run_dir: Path, history_url: str | None, results_dir: str) -> int:
    count = record_run(history_engine(history_url, results_dir), run_dir)
    get_run_logger().info("recorded %d figures of %s in the history", count, run_dir.name)
    return count


@task(name="judge_regressions", cache_policy=NONE)
def judge_regressions(run_id: str, history_url: str | None, results_dir: str, baseline_runs: int,
                      sigma: float) -> list[Verdict]:
    logger = get_run_logger()
    verdicts = check_run(history_engine(history_url, results_dir), run_id, baseline_runs=baseline_runs, sigma=sigma)
    for verdict in verdicts:  # the run's one ERROR line names every regression; here each is a warning
        (logger.warning if verdict.status == "regression" else logger.info)(verdict.line())
    artifact = create_table_artifact(
        key=VERDICTS_ARTIFACT, description=f"{run_id}: each figure against its baseline",
        table=[{"case": v.case, "metric": v.metric, "value": f"{v.value:.4g} {v.unit}",
                "baseline": f"{v.baseline:.4g}" if v.baseline is not None else "-",
                "change": f"{v.change:+.1%}" if v.change is not None else "-",
                "allowed": v.allowed(),
                "history": v.history, "verdict": v.status, "changed": "; ".join(v.changes) or "-"}
               for v in verdicts])
    replace_earlier_artifacts([VERDICTS_ARTIFACT], [artifact])
    return verdicts


def failed(message: str, name: str = "Failed") -> State:
    """The nightly's end when it could not judge or found a regression: one ERROR line, no traceback."""
    _log(logging.ERROR, "%s", message)
    return Failed(message=message, name=name)


def exit_code(state: State) -> int:
    """The night's outcome as a cron job's exit status (the module's docstring has the table)."""
    if state.name == REGRESSED_STATE:
        return EXIT_REGRESSION
    if state.is_failed():
        return EXIT_USER_ERROR if (state.message or "").startswith(BAD_INPUT) else EXIT_NIGHT_FAILED
    return EXIT_UNSUPPORTED if state.name == UNSUPPORTED_STATE else EXIT_HELD


def publish_night(results_dir: str, suite: str, run_dir: Path, state: State, verdicts: list[Verdict],
                  history: str | None) -> State:
    """The night's verdict as a file (nightly-<suite>.json in the results folder, the latest night, and in the
    run folder) and every figure's course (trends.csv): what a lab reads without the UI. Returns ``state``."""
    _write_night(results_dir, suite, run_dir, {
        "state": state.name, "exit_code": exit_code(state),
        "message": redact_userinfo(state.message) if state.message else state.message,
        "regressions": [v.line() for v in verdicts if v.status == "regression"],
        "verdicts": [asdict(v) for v in verdicts]}, history)
    return state


def _write_night(results_dir: str, suite: str, run_dir: Path, ending: dict[str, Any], history: str | None) -> None:
    """The night's verdict file in its run folder (its own: what `flagperf nightly` reads back), then the results
    folder's, the latest night's, and trends.csv.

    Nights of one suite can run at the same time into one results folder (a cron night and a manual rerun, two
    schedulers). The results folder's file is the verdict of the night that started last among those that have
    published, not of the one that finished last: a night that started earlier and ends later (a long rerun) leaves
    a later night's verdict there, and writes only its run folder's copy. The start order is the one the run ids
    name (run<UTC start time>-<12 hex digits>, new_night_run_id's form exactly: flagperf.config.night.started_later):
    already in every verdict file, older ones too, and the same for every machine writing into the folder (within
    their clocks), so no field or counter is added. It is to the second: nights started in the same second, a
    run_id given in the form in another shape (no time in it), and one whose time is still to come on this
    machine's clock (typed so, or from a host whose clock runs ahead: never trusted, or it would keep the file from
    every night until then) are in the order they publish. The check and the write (and trends.csv's, so that the
    last one written holds every night published) happen under a lock on the results folder (``_publishing``), so
    two nights ending together cannot both pass the check; each write is atomic (write_json_atomic)."""
    outcome = {"run_id": run_dir.name, "suite": suite, "finished_at": datetime.now(timezone.utc).isoformat(),
               **ending}
    latest = Path(results_dir) / verdict_file_name(suite)
    try:
        if run_dir.is_dir():
            write_json_atomic(run_dir / latest.name, outcome)
        with _publishing(Path(results_dir)):
            other = (read_verdict(latest) or {}).get("run_id")
            if isinstance(other, str) and started_later(other, run_dir.name):
                _log(logging.INFO, "%s keeps the verdict of %s, a night started after this one; this night's is in "
                                   "its run folder", latest, other)
            else:
                write_json_atomic(latest, outcome)
            write_trend_file(history_engine(history, results_dir), Path(results_dir) / TREND_FILE)
    except (OSError, FlagperfError, SQLAlchemyError) as exc:  # the state is the verdict; the files are a copy
        _warning("the night's verdict file or trends.csv could not be written: %s", exc)


PUBLISH_WAIT_S = 60.0  # the longest a night waits for another night's publishing (its trends.csv) before going on
PUBLISH_POLL_S = 0.2  # how often it tries the lock meanwhile


@contextmanager
def _publishing(results: Path) -> Iterator[None]:
    """Held while a night publishes into ``results``: an advisory lock (flock) on the folder itself, so that no lock
    file is left among the results; released when the process ends, however it ends. Where the folder is not there
    yet (the write makes it) or its file system refuses the lock (NFS may, on a folder), the night publishes
    without it, as before. Another night holding it is waited for PUBLISH_WAIT_S at most: the holder writes
    trends.csv from the history, which may be a remote database that hangs, and one hung night must not hold every
    later one. The wait is a poll (a signal stops it, as any sleep)."""
    fd: int | None = None
    with suppress(OSError):
        fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        if fd is not None:
            _lock(fd, results)
        yield
    finally:
        if fd is not None:
            os.close(fd)


def _lock(fd: int, results: Path) -> None:
    """The publishing lock on ``fd``: taken, or given up (the file system refuses it; the deadline passed)."""
    deadline = time.monotonic() + PUBLISH_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:  # another night publishing: wait for it, a while
            pass
        except OSError:  # no locks on this file system
            return
        if time.monotonic() >= deadline:
            _warning("another night has been publishing into %s for %g s (its trends.csv from the history): this "
                     "night publishes without waiting for it", results, PUBLISH_WAIT_S)
            return
        _pause(PUBLISH_POLL_S)


_pause = time.sleep  # between two tries of the lock


def _interruption(exc: BaseException) -> tuple[int, str]:
    """The signal that stopped the night (SIGINT where none is known) and the reason the history keeps."""
    signum = getattr(exc, "signal", None) or signal.Signals.__members__.get(str(exc)) or (  # the CLI's: "SIGINT"
        signal.SIGINT if isinstance(exc, KeyboardInterrupt) else None)  # Python's own: a Ctrl-C
    name = signal.Signals(signum).name if signum else type(exc).__name__
    return int(signum or signal.SIGINT), f"interrupted ({name})"


def record_interruption(exc: BaseException, run_id: str, suite: str, vendor: str | None, history: str | None,
                        results_dir: str) -> None:
    """A night the operator stopped (Ctrl-C, SIGTERM, a cancelled flow run) while it measured is neither judged
    nor a failure: it goes into the history as interrupted, with its run id and no figures, and its verdict file
    and trends.csv say so, so that the trends tell it from a night that never ran. Best effort: the interrupt
    goes on. A further signal meanwhile is only noted (Prefect's own SIGTERM handler would raise again)."""
    with signals_noted(RECORDING_LEFT):
        _record_interruption(exc, run_id, suite, vendor, history, results_dir)


def _record_interruption(exc: BaseException, run_id: str, suite: str, vendor: str | None, history: str | None,
                         results_dir: str, lost: str | None = None) -> None:
    """``lost``: the night had measured, and this is what became of its figures (its verdict file says so)."""
    signum, reason = _interruption(exc)
    run_dir = Path(results_dir) / run_id
    with suppress(ConfigError, OSError):
        vendor = read_plan(run_dir).vendor.name
    try:
        record_interrupted_night(history_engine(history, results_dir), run_id, reason, suite=suite, vendor=vendor)
    except (FlagperfError, OSError, SQLAlchemyError) as error:
        _warning("the interrupted night could not be recorded in the history: %s", error)
        if lost is None:
            return
        lost = f"{lost}; nor as an interrupted night"
    _write_night(results_dir, suite, run_dir, {
        "state": INTERRUPTED_STATE, "exit_code": 128 + signum, "measured": lost is not None,
        "message": reason if lost is None else f"{reason} once measured: {lost}; its run folder has them",
        "regressions": [], "verdicts": []}, history)


def record_measured_interruption(exc: BaseException, run_dir: Path, suite: str, verdicts: list[Verdict] | None,
                                 history: str | None, results_dir: str, baseline_runs: int = 5,
                                 sigma: float = 3.0) -> None:
    """A night stopped once its evaluation had measured and collected every round (while the night was recorded,
    judged or published) keeps its measurement: its figures go into the history as a night like any other, in
    one transaction, unless record_history had stored them already. So they are a baseline for the nights after
    it, and trends.csv shows them judged as every night is. It is judged as any night (``verdicts``, else the
    history's read-only check now, with ``baseline_runs`` and ``sigma``): its verdict file says Interrupted with
    the verdicts, and a regression's exit code (5), so that a scheduler does not lose it; this sends no regression
    event (those sent before the signal stay sent). Where its figures cannot be recorded, it is recorded as an
    interrupted night. Best effort: the interrupt goes on. A further signal meanwhile is only noted: Prefect's own
    SIGTERM handler would raise again and undo the record's transaction."""
    with signals_noted(RECORDING_LEFT):
        _record_measured_interruption(exc, run_dir, suite, verdicts, history, results_dir, baseline_runs, sigma)


def _record_measured_interruption(exc: BaseException, run_dir: Path, suite: str, verdicts: list[Verdict] | None,
                                  history: str | None, results_dir: str, baseline_runs: int, sigma: float) -> None:
    signum, reason = _interruption(exc)
    try:
        engine = history_engine(history, results_dir)
        count = record_run(engine, run_dir, replace=False)
    except (FlagperfError, OSError, SQLAlchemyError) as error:
        _warning("the interrupted night's figures could not be recorded in the history: %s", error)
        # Not lost from sight: an interrupted night in the history where it can be written, and its verdict file
        _record_interruption(exc, run_dir.name, suite, None, history, results_dir,
                             f"its figures could not be recorded in the history ({error})")
        return
    if verdicts is None:  # stopped before it was judged: the history's check is read-only, judge it now
        try:
            verdicts = check_run(engine, run_dir.name, baseline_runs=baseline_runs, sigma=sigma)
        except (FlagperfError, SQLAlchemyError) as error:
            _warning("the interrupted night could not be judged: %s", error)
    judged = [] if verdicts is None else verdicts
    regressions = [v.line() for v in judged if v.status == "regression"]
    outcome = (f"judged: {len(regressions)} regression(s)" if verdicts is not None
               else "not judged (trends.csv judges them)")
    _write_night(results_dir, suite, run_dir, {
        "state": INTERRUPTED_STATE, "exit_code": EXIT_REGRESSION if regressions else 128 + signum, "measured": True,
        "message": f"{reason} once measured: its {count} figures are recorded in the history, {outcome}",
        "regressions": regressions, "verdicts": [asdict(v) for v in judged]}, history)


def _warning(message: str, *args: object) -> None:
    _log(logging.WARNING, message, *args)


def _log(level: int, message: str, *args: object) -> None:
    """A line in the flow run's log; in the process's where there is no run (a handler called alone)."""
    try:
        logger: logging.Logger | logging.LoggerAdapter[logging.Logger] = get_run_logger()
    except MissingContextError:
        logger = logging.getLogger(__name__)
    logger.log(level, message, *args)


def record_failure(run_id: str, reason: str, suite: str, vendor: str | None, history: str | None,
                   results_dir: str) -> None:
    """A failed night goes into the history as one (the trends show it; no baseline counts it)."""
    try:
        record_failed_night(history_engine(history, results_dir), run_id, reason, suite=suite, vendor=vendor)
    except (FlagperfError, OSError) as exc:
        get_run_logger().warning("the failed night could not be recorded in the history: %s", exc)


@flow(name="nightly-regression", log_prints=True, validate_parameters=True)
def nightly_regression(
    suite: SuiteName = "smoke",
    vendor: VendorName = "auto",
    rounds: Annotated[int, ROUNDS.field()] = 3,
    overrides: list[str] = [],  # noqa: B006 - Prefect's form needs a plain default; it is never changed
    inventory: str = "",
    results_dir: str = "",
    history_url: str = "",
    baseline_runs: Annotated[int, BASELINE_RUNS.field()] = 5,
    sigma: Annotated[float, SIGMA.field()] = 3.0,
    run_id: str = "",
) -> State:
    """Run the suite, add it to the history and fail (with an event) on a regression.

    The nightly deployment's form. It ends Completed when every figure held its baseline; Failed named
    Regressed with one line naming each regression (and the event flagperf.regression.detected per figure);
    Failed saying why the night measured nothing (recorded as a failed night); Unsupported or Partly
    unsupported as the evaluation did. nightly-<suite>.json in the results folder has the verdict.

    Args:
        suite: The suite to evaluate each night (deployments/suites/).
        vendor: The vendor folder under vendor_images/; auto: the inventory's VENDOR, else cpu.
        rounds: Rounds per case; the baseline compares each figure's median over them.
        overrides: Case configuration values, as KEY=VALUE or CASE.KEY=VALUE (flagperf run --set).
        inventory: An inventory or FlagPerf host.yaml, as a path on the worker's machine; empty: that machine.
        results_dir: The results folder on the worker's machine. Empty: the folder the server's results site
            serves (FLAGPERF_RESULTS_DIR, set by `flagperf server`), else `results` in the worker's folder.
        history_url: The history database (sqlite:///path or postgresql+psycopg://user@host/db, no password in
            it). Empty: FLAGPERF_HISTORY_URL, else history.sqlite in the results folder.
        baseline_runs: How many earlier runs of the same figure, vendor and device make its baseline.
        sigma: A figure regresses when it is worse than its baseline (the median of those runs) by more than
            this many times their spread (and by at least 1 %).
        run_id: The night's run folder in the results folder (letters, digits, '.', '_', '-'; a folder that exists
            is refused, as are the names the results folder gives its own files: history.sqlite, trends.csv ...).
            Empty: a new one, run<UTC start time>-<random>; `flagperf nightly` names it before the night starts, to
            read back this night's verdict and never another's.
    """
    results_dir = results_dir or default_results_dir()
    history = history_url or None
    if run_id and (problem := run_id_problem(run_id)):  # never a path out of the folder, nor a name it uses itself
        return failed(f"{BAD_INPUT}run_id: {problem}")
    # Only what this night made is ever removed again: the results folder (if it was not there) and its run folder.
    made_results, made = outermost_missing(Path(results_dir)), False
    try:  # a bad URL is said before a night of measuring, not after; a SQLite history is made when it records
        check_history(history, results_dir)
    except ConfigError as exc:
        return failed(f"{BAD_INPUT}{exc}")
    except FlagperfError as exc:  # a SQLite history that cannot be looked at (a link into a folder not entered)
        return failed(str(exc))
    except (OSError, SQLAlchemyError) as exc:  # one line, as `flagperf nightly` says it, not a crash's traceback
        first = (str(getattr(exc, "orig", None) or exc).splitlines() or [""])[0]
        return failed(f"the history cannot be opened: {type(exc).__name__}: {first}")
    run_id = run_id or new_night_run_id()
    run_dir = Path(results_dir) / run_id
    # The run folder is claimed before the night starts (mkdir: one night of two started together with one run_id
    # gets it).
    try:
        Path(results_dir).mkdir(parents=True, exist_ok=True)
        run_dir.mkdir()
        made = True
    except FileExistsError:
        if os.path.lexists(run_dir):
            remove_made(Path(results_dir), made_results)
            return failed(f"{BAD_INPUT}run_id: {run_id!r} is taken: {run_dir} exists")
    except OSError:  # a results folder that cannot be made or written: the evaluation says so, as for any night
        pass
    try:
        state = evaluate(suite=suite, vendor=None if vendor == "auto" else vendor, rounds=rounds,
                         overrides=list(overrides) or None, inventory=inventory or None, results_dir=results_dir,
                         run_id=run_id, return_state=True)
    except BaseException as exc:
        if not isinstance(exc, Exception):  # stopped by the operator: not judged, recorded as interrupted
            record_interruption(exc, run_id, suite, None if vendor == "auto" else vendor, history, results_dir)
        raise
    if state.is_failed() and (state.message or "").startswith(BAD_INPUT):
        if made and not (run_dir / SUMMARY_JSON).is_file() and _planned_by(run_dir, state):
            shutil.rmtree(run_dir, ignore_errors=True)  # refused before any round: no night (its plan, healthcheck)
            remove_made(Path(results_dir), made_results)
        return failed(in_form_terms(state.message or ""))

    def night_failed(reason: str, vendor_name: str | None) -> State:
        reason = redact_userinfo(reason)  # it quotes the evaluation's state, which may name a URL's password
        record_failure(run_id, reason, suite, vendor_name, history, results_dir)
        return publish_night(results_dir, suite, run_dir, failed(reason), [], history)

    plan_vendor = None if vendor == "auto" else vendor
    if not (run_dir / SUMMARY_JSON).is_file():
        return night_failed(f"the evaluation produced no summary: {state.message}", plan_vendor)
    try:
        vendor_name = read_plan(run_dir).vendor.name
    except ConfigError as exc:
        return night_failed(f"the run's plan cannot be read: {exc}", plan_vendor)
    if state.is_failed():  # a partial run is neither a baseline nor judged against one
        return night_failed(f"the evaluation failed, recorded as a failed night: {state.message}", vendor_name)
    verdicts: list[Verdict] | None = None  # once judged: an interrupt after it publishes them
    try:  # the night is measured: an interrupt from here on keeps it
        try:
            record_history(run_dir, history, results_dir)
            verdicts = judge_regressions(run_id, history, results_dir, baseline_runs, sigma)
        except FlagperfError as exc:
            return publish_night(results_dir, suite, run_dir, failed(f"the history could not be used: {exc}"), [],
                                 history)
        return _judged(run_id, run_dir, suite, vendor_name, state, verdicts, history, results_dir)
    except BaseException as exc:
        if not isinstance(exc, Exception):  # stopped by the operator: the measurement is recorded all the same
            record_measured_interruption(exc, run_dir, suite, verdicts, history, results_dir, baseline_runs, sigma)
        raise


def _planned_by(run_dir: Path, state: State) -> bool:
    """Whether the run folder this night made holds no plan, or the plan of its own evaluation (``state``'s flow
    run): another evaluation given the same run id may have planned into the empty folder meanwhile."""
    if not (run_dir / PLAN_FILE).exists():
        return True
    try:
        return read_plan(run_dir).flow_run_id == str(state.state_details.flow_run_id)
    except ConfigError:
        return False


def _judged(run_id: str, run_dir: Path, suite: str, vendor_name: str, state: State, verdicts: list[Verdict],
            history: str | None, results_dir: str) -> State:
    """The night's end once it is recorded and judged: an event per regression, the verdict published."""
    regressions = [v for v in verdicts if v.status == "regression"]
    for v in regressions:
        emit_event(
            event=REGRESSION_EVENT,
            resource={"prefect.resource.id": f"flagperf.figure.{vendor_name}.{v.case}.{v.metric}",
                      "prefect.resource.name": f"{v.case} {v.metric} on {vendor_name}"},
            payload={"run_id": run_id, "case": v.case, "metric": v.metric, "value": v.value, "unit": v.unit,
                     "baseline": v.baseline, "change": v.change, "allowed": v.allowed(), "low": v.low, "high": v.high,
                     "baseline_runs": list(v.baseline_runs), "changes": list(v.changes)},
        )
    if regressions:
        message = f"{len(regressions)} regression(s) in {run_id}: " + "; ".join(v.line() for v in regressions)
        return publish_night(results_dir, suite, run_dir, failed(message, REGRESSED_STATE), verdicts, history)
    outcome = {"run_id": run_id, "verdicts": {f"{v.case}/{v.metric}": v.status for v in verdicts}}
    if state.name in (UNSUPPORTED_STATE, PARTLY_UNSUPPORTED_STATE):
        return publish_night(results_dir, suite, run_dir,
                             Completed(name=state.name, message=state.message, data=outcome), verdicts, history)
    statuses = [v.status for v in verdicts]
    counted = ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses))
    return publish_night(results_dir, suite, run_dir, Completed(message=f"no regression: {counted or 'no figures'}",
                                                                data=outcome), verdicts, history)
