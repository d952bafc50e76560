"""`flagperf nightly`: the nightly regression flow from cron or a CI scheduler, without a deployment or the UI.

The input is checked first (nothing starts on bad input), then the flow runs in this process against the
configured Prefect server, else a temporary one, as `flagperf run` does; its verdict lines and outcome are
printed and its exit code (flows.nightly.exit_code) is the command's.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from flagperf.config.night import BASELINE_RUNS, ROUNDS, SIGMA, new_night_run_id, read_verdict, verdict_file_name
from flagperf.config.plan import available_suites, plan_run
from flagperf.errors import ConfigError, FlagperfError, unknown_name
from flagperf.hosts.capacity import check_capacity_here
from flagperf.hosts.docker import owner_labels
from flagperf.hosts.inventory import Inventory, load_inventory, local_inventory
from flagperf.paths import HISTORY_FILE, RESULTS_DIR_ENV, RESULTS_ROOT_ENV
from flagperf.results.history import DEFAULT_URL_ENV, Verdict, check_history
from flagperf.stopping import STOP_NOW_AT, stop_now, take


def default_results() -> Path:
    """The results folder the nightly deployment writes to (flows.evaluate.default_results_dir), found
    without importing prefect: its settings are read once, at import."""
    return Path(os.environ.get(RESULTS_DIR_ENV) or os.environ.get(RESULTS_ROOT_ENV) or "results")


@dataclass(frozen=True)
class Night:
    """A night's input, checked: what the flow is called with. ``run_id`` is chosen here, before the night starts,
    and handed to the flow: the night reads back its own verdict by it, never another night's of the same suite
    running at the same time."""

    suite: str
    vendor: str  # "auto": the inventory's VENDOR, else cpu (the flow resolves it)
    rounds: int
    overrides: list[str]
    inventory: Path | None
    results: Path
    history_url: str | None
    baseline_runs: int
    sigma: float
    run_id: str  # new_night_run_id()
    notes: list[str] = field(default_factory=list)

    @property
    def verdict_file(self) -> Path:
        """The latest night's verdict, in the results folder: this night's only where it names this night."""
        return self.results / verdict_file_name(self.suite)

    @property
    def run_dir(self) -> Path:
        return self.results / self.run_id


@dataclass(frozen=True)
class NightOutcome:
    code: int  # the flow's exit code (0 held, 1 night failed, 2 bad input, 3 unsupported, 5 regression)
    state: str  # the flow's final state's name
    message: str  # bad input (code 2): without the "bad input: " prefix
    verdicts: list[Verdict]
    run_dir: Path | None  # None: the night made no run folder (bad input found by the flow)
    verdict_file: Path | None  # this night's verdict (this_night); None: it published none


def check_bounds(*, rounds: int, baseline_runs: int, sigma: float) -> None:
    """The numbers the flow's form bounds (flagperf.config.night), refused as the flow would refuse them."""
    for option, value, bound in (("--rounds", rounds, ROUNDS), ("--baseline-runs", baseline_runs, BASELINE_RUNS),
                                 ("--sigma", sigma, SIGMA)):
        problem = bound.problem(value)
        if problem:
            raise ConfigError(option, None, problem)


def check_night(*, suite: str, vendor: str | None, rounds: int, overrides: list[str], inventory: Path | None,
                results: Path, history_url: str | None, baseline_runs: int, sigma: float) -> Night:
    """Everything the flow would refuse, refused here without side effects (ConfigError naming the option);
    the history's check opens it where it is there, so it comes after the results folder is made
    (``open_history``)."""
    owner_labels()  # a FLAGPERF_CONTAINER_OWNER no container can carry: before the local probe, not at a round
    suites = available_suites()
    if suite not in suites:
        raise ConfigError("--suite", None, unknown_name("suite", suite, suites, "flagperf list suites"))
    check_bounds(rounds=rounds, baseline_runs=baseline_runs, sigma=sigma)
    inv: Inventory = load_inventory(inventory) if inventory else local_inventory()
    plan = plan_run(suite=suite, vendor=inv.resolve_vendor(vendor), rounds=rounds, sets=overrides, results_dir=results,
                    hosts=[spec.model_dump(mode="json") for spec in inv.hosts], inventory_overrides=inv.case_overrides,
                    inventory_source=inv.source, inventory_endpoints=inv.endpoints)
    check_capacity_here(plan, inv.hosts)
    return Night(suite=suite, vendor=vendor or "auto", rounds=rounds, overrides=list(overrides),
                 inventory=inventory.resolve() if inventory else None, results=results,
                 history_url=history_url or None, baseline_runs=baseline_runs, sigma=sigma, run_id=new_night_run_id(),
                 notes=list(inv.notes))


def history_source(night: Night) -> str:
    """Where the night's history URL came from, for its errors: the option, the environment, or the default."""
    if night.history_url:
        return "--history-url"
    if os.environ.get(DEFAULT_URL_ENV):
        return DEFAULT_URL_ENV
    return f"the history ({HISTORY_FILE} in --results, the default)"


def open_history(night: Night) -> None:
    """The history the night will write, checked now (flagperf.results.history.check_history): a bad URL
    (ConfigError) or one that cannot be reached or made (FlagperfError) is said before a night of measuring, not
    after it. A SQLite history is not made here but when the night records: a night refused or stopped before
    then leaves none."""
    try:
        check_history(night.history_url, night.results)
    except ConfigError as exc:
        raise ConfigError(history_source(night), None, exc.message) from None
    except (SQLAlchemyError, OSError) as exc:
        first = (str(getattr(exc, "orig", None) or exc).splitlines() or [""])[0]
        raise FlagperfError(f"the history cannot be opened: {type(exc).__name__}: {first}") from None


def _verdict(data: dict[str, Any]) -> Verdict:
    known = {f.name for f in fields(Verdict)}
    return Verdict(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known})


def this_night(night: Night) -> tuple[dict[str, Any], Path | None]:
    """This night's verdict as it published it, and the file to name for it; ({}, None) where it published none,
    whatever another night of the suite published meanwhile. Read from its run folder's copy, else (a night stopped
    before its run folder was made) the results folder's; either only where it names this night's run id. The file
    named: the results folder's where it holds this verdict, else (a night started later published there since)
    the run folder's."""
    own_file = night.run_dir / night.verdict_file.name
    own, latest = read_verdict(own_file), read_verdict(night.verdict_file)
    for published, path in ((own, own_file), (latest, night.verdict_file)):
        if published is not None and published.get("run_id") == night.run_id:
            return published, night.verdict_file if latest == published else path
    return {}, None


NOT_JUDGED = "interrupted; the night is not judged"


def interrupted_line(night: Night) -> str:
    """What `flagperf nightly` says when it was interrupted (``interrupted_outcome``'s line)."""
    return interrupted_outcome(night)[0]


def interrupted_outcome(night: Night) -> tuple[str, int | None]:
    """What `flagperf nightly` says when it was interrupted, and the exit code of a night whose outcome stands
    (None: exit 128 + the signal): the flow's own account of a night it had measured (its figures recorded in
    the history all the same); a night that was judged and published before the signal (Regressed: exit 5)
    keeps its outcome and exit code, so that cron does not lose a regression; else the night is not judged."""
    published, path = this_night(night)
    state, code = published.get("state"), published.get("exit_code")
    if isinstance(state, str) and state != "Interrupted" and isinstance(code, int) and not isinstance(code, bool):
        return f"interrupted as the night ended; its outcome stands: {state} (exit {code}); verdict: {path}", code
    if published.get("measured") is True and isinstance(published.get("message"), str):
        # judged as it was recorded: a regression's exit code (5) stands; else 128 + the signal
        regressed = code if isinstance(code, int) and not isinstance(code, bool) and code < 128 else None
        return f"{published['message']}; verdict: {path}", regressed
    return NOT_JUDGED, None


def run_night(night: Night, stopping: list[int], drain: Callable[[], None]) -> NightOutcome:
    """Run the nightly flow here, under a temporary Prefect server when none is configured. ``stopping``: the
    signals received (the temporary server's start gives up on them); ``drain`` sends the last logs and
    events while the server is still there. An interrupt (KeyboardInterrupt, Prefect's TerminationSignal)
    propagates, after the server is stopped."""
    from flows.server import TemporaryServer, configured_api_url

    if configured_api_url() is not None:  # a team server: its sign-in from the credentials file, if not set
        from flagperf.site.auth import use_client_credentials

        use_client_credentials()
    server: TemporaryServer | None = None
    try:
        if configured_api_url() is None:  # before prefect is imported: it reads its settings once, then
            server = TemporaryServer()
            os.environ["PREFECT_API_URL"] = server.start(stopping)
        from flows.evaluate import BAD_INPUT
        from flows.nightly import exit_code, nightly_regression

        state = nightly_regression(suite=night.suite, vendor=night.vendor, rounds=night.rounds,
                                   overrides=night.overrides, inventory=str(night.inventory or ""),
                                   results_dir=str(night.results), history_url=night.history_url or "",
                                   baseline_runs=night.baseline_runs, sigma=night.sigma, run_id=night.run_id,
                                   return_state=True)
        published, verdict_file = this_night(night)
        return NightOutcome(code=exit_code(state), state=state.name or "",
                            message=(state.message or "").removeprefix(BAD_INPUT),
                            verdicts=[_verdict(v) for v in published.get("verdicts", [])],
                            run_dir=night.run_dir if night.run_dir.is_dir() else None, verdict_file=verdict_file)
    finally:
        def note(signum: int, _frame: object) -> None:  # clean-up is not cut short by a second signal
            stopping.append(signum)
            # a third in all (the command's and its clean-up blocks'): the way out of one that hangs
            if max(take(signum), len(stopping)) >= STOP_NOW_AT:
                stop_now(signum, "the night's last logs may not have reached the Prefect server (a temporary one "
                                 "stops by itself)")

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, note)
        if "prefect" in sys.modules:
            drain()
        if server is not None:  # its log goes with the night's run folder, an interrupted night's too
            server.stop(keep_log_in=night.run_dir)  # (kept only where that folder is there)
