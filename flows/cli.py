"""The `flagperf` command: run an evaluation, validate config files, list what is available, start a server.

Exit codes of `flagperf run`: 0 every round succeeded; 1 some round failed; 2 bad input (nothing ran);
3 nothing failed but some rounds were unsupported on this device; 128 + the signal (130 for Ctrl-C, 143 for
SIGTERM) when it was interrupted (the report of what was done is still written).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shlex
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

# Only what every command needs is imported here: each command imports the rest itself, so that `--help`, `list`
# and `validate` start without pandas, paramiko or the report's Markdown (bench/cli_startup.py measures it).
from flagperf.errors import (
    ConfigError,
    FlagperfError,
    error_line,
    findings,
    gathered,
    left_out_line,
    redact_userinfo,
)
from flagperf.paths import (
    SERVER_LOGS,
    StartFolderGone,
    display_path,
    outermost_missing,
    pin_search_paths,
    remove_made,
    run_id_problem,
)
from flagperf.results.limits import MAX_BASELINE_RUNS, MAX_MONITOR_INTERVAL_S, MAX_ROUNDS, MIN_MONITOR_INTERVAL_S
from flagperf.stopping import STOP_NOW_AT, put_back, stop_now, take
from flagperf.stopping import reset as reset_signals_taken

if TYPE_CHECKING:
    from flagperf.config.cases import CaseDef
    from flagperf.hosts.inventory import Inventory

EXIT_FAILED, EXIT_BAD_INPUT, EXIT_UNSUPPORTED_ONLY = 1, 2, 3

# The click that typer runs on (its own copy from typer 0.2x, the click package before): its usage errors.
_CLICK_ERRORS = sys.modules[typer.BadParameter.__module__]
_HELP_ERRORS = tuple(getattr(_CLICK_ERRORS, name) for name in ("NoArgsIsHelpError",) if hasattr(_CLICK_ERRORS, name))


@contextmanager
def _one_line_usage_errors() -> Iterator[None]:
    """A mistyped option or argument is bad input like any other: one line and exit 2, not a usage box."""
    try:
        yield
    except _HELP_ERRORS:
        raise  # `flagperf` alone: the help is the answer
    except _CLICK_ERRORS.UsageError as exc:
        where = f" (see {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
        raise _fail(" ".join(exc.format_message().split()) + where) from None


class _ShortHelps(TyperGroup):
    """A command's line in the help's command list is its docstring's first paragraph as one paragraph: typer's
    rich mode keeps the docstring's line breaks there, which broke each description mid-sentence at the source's
    wrap."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None and not command.short_help and command.help:
            command.short_help = " ".join(command.help.split("\n\n")[0].split())
        return command


class _OneLineErrors(_ShortHelps):
    """Click reports bad options while making a command's context and choosing the command. Every command runs
    under one interrupt handler (``Interrupt``, armed: the first SIGINT or SIGTERM stops it at once, later ones
    are ignored so that its clean-up is not cut short) and ends an interrupt in one line (``_told_interrupts``);
    typer alone would end it in a silent exit 130, and SIGTERM would end it with no clean-up at all."""

    def main(self, *args: Any, **extra: Any) -> Any:
        # A relative FLAGPERF_CASE_PATH entry is the user's folder's: fixed here, before a command or anything it
        # starts (a round in the project, a server's worker) reads it from another working folder.
        try:
            pin_search_paths()
        except StartFolderGone as exc:  # a relative entry from a folder since removed: one line, exit 2
            _fail(str(exc))
            sys.exit(EXIT_BAD_INPUT)
        with _interrupt_handler():
            return super().main(*args, **extra)

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        with _one_line_usage_errors(), _told_interrupts():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: Any) -> Any:
        with _one_line_usage_errors(), _told_interrupts():
            return super().invoke(ctx)


app = typer.Typer(cls=_OneLineErrors, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="AI-hardware evaluation engine (FlagPerf's base specs, inference, training, LLM serving and "
                       "operator cases) as "
                       "Prefect workflows: run it here or on an inventory of hosts, read measured vs peak with "
                       "power, energy and provenance, compare runs, serve it to a team.")
# Piped or captured output has no terminal width; keep the summary table readable there too. That width would also
# wrap a long one-line message (a deep path, a long name) onto two lines where it is piped (grep, a CI log): every
# line that says one thing is printed with soft_wrap=True (never wrapped), tables and multi-line blocks without it.
console = Console(width=None if Console().is_terminal else 160)
err_console = Console(stderr=True, width=None if Console(stderr=True).is_terminal else 160)


def _stood(message: str, code: int) -> typer.Exit:
    """An interrupted command's line on stderr: an error where it exits non-zero, a plain note where the outcome
    that stands is a success (a night that held, exit 0)."""
    if code:
        return _fail(message, code)
    err_console.print(escape(message), highlight=False, soft_wrap=True)
    return typer.Exit(0)


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _fail_all(exc: FlagperfError, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    """Every finding an error carries, each its own line, then how many were left out (as validate says them): the
    first alone hid the others, e.g. a --set typo said beside a broken engine.yaml that is put first."""
    for finding in findings(exc):
        _fail(str(finding))
    if more := left_out_line(exc):
        _fail(more)
    return typer.Exit(code)


def _prepare_prefect_environment(verbose: bool) -> None:
    """Before prefect is imported: it reads these once."""
    # A temporary server on a small machine takes 20-30 s to start; Prefect's default gives up sooner.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    # The core's own loggers (config rules, hosts) show in the flow's logs too.
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "flagperf")
    # Nothing leaves the machine: no usage telemetry from the temporary server.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if not verbose:  # the live view replaces the log scroll; the full log goes to the run folder and the UI
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")


class Interrupt:
    """SIGINT and SIGTERM stop a command the same way: the first raises KeyboardInterrupt (named after the
    signal) where the command is (Prefect turns a SIGTERM inside a flow run into its own TerminationSignal
    first), so that what it started is stopped by the code that started it (a run's cases' process groups and
    monitors; its report is written, its temporary server stopped); later signals are noted and ignored, so that
    clean-up is not cut short, until a third stops at once (``flagperf.stopping``). The app arms one for every
    command; while disarmed (a run sets up what it will stop in order, outside any handler) a signal is only
    noted, and arming again raises it."""

    def __init__(self) -> None:
        self.signals: list[int] = []
        self.armed = False
        # What a third signal leaves (it stops at once, without more clean-up): the command says so where it knows.
        self.left = "what the command was writing or stopping may be left half done"

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.signals.append(signum)
        taken = take(signum)  # counted with those the clean-up blocks noted (flagperf.stopping)
        if len(self.signals) == 1 and self.armed:
            raise KeyboardInterrupt(signal.Signals(signum).name)
        if taken >= STOP_NOW_AT:  # the way out of a clean-up that hangs (a database not answering)
            stop_now(signum, self.left)

    def arm(self) -> None:
        """From here the first signal raises where the controller is; one noted before raises now."""
        self.armed = True
        if self.signals:
            raise KeyboardInterrupt(signal.Signals(self.signals[0]).name)

    def disarm(self) -> None:
        """From here a signal is only noted (``arm`` raises it), while the command sets up what it will stop."""
        self.armed = False

    def exit_code(self, exc: BaseException | None = None) -> int:
        signum = self.signals[0] if self.signals else getattr(exc, "signal", None) or signal.Signals.__members__.get(
            str(exc), signal.SIGINT)  # a KeyboardInterrupt of this class is named after its signal
        return 128 + int(signum)


P = ParamSpec("P")
R = TypeVar("R")
# The handler of the command this thread runs (an outer one's where commands nest). Per context, not per process:
# a thread starts with a context of its own, so a command called as a function in a worker thread while another
# runs gets a handler and a count of its own, and its steps that only note signals (``_noted_only``) leave the
# other command armed. Signals arrive on the main thread only, and count for the command whose handler is installed
# there: the one the main thread runs. A command in another thread installs none, so no signal counts for it (the
# code that started its thread stops it).
_COMMAND_INTERRUPT: ContextVar[Interrupt | None] = ContextVar("flagperf_command_interrupt", default=None)


@contextmanager
def _interrupt_handler() -> Iterator[Interrupt]:
    """An armed ``Interrupt`` for the command, and the signal handlers of before put back after it (the process
    goes on where the app is called in-process, as in tests). Signal handlers exist in the main thread only."""
    interrupt = Interrupt()
    interrupt.armed = True
    main_thread = threading.current_thread() is threading.main_thread()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} if main_thread else {}
    if main_thread:
        reset_signals_taken()
        interrupt.install()
    token = _COMMAND_INTERRUPT.set(interrupt)
    try:
        yield interrupt
    finally:
        _COMMAND_INTERRUPT.reset(token)
        put_back(before)


def _interrupt() -> Interrupt:
    """The running command's interrupt handler (the app's, or ``_own_handler``'s for a command called alone).
    Outside both (a helper called by itself) an armed one that installs nothing, so it leaves no trace."""
    interrupt = _COMMAND_INTERRUPT.get()
    if interrupt is None:
        interrupt = Interrupt()
        interrupt.armed = True
    return interrupt


def _own_handler(command: Callable[P, R]) -> Callable[P, R]:
    """A command called as a function, outside the app (a library, a test), runs under an interrupt handler of
    its own as under the app's, and the process's handlers of before are put back when it returns or raises."""
    @functools.wraps(command)
    def with_handler(*args: P.args, **kwargs: P.kwargs) -> R:
        if _COMMAND_INTERRUPT.get() is not None:  # the app's (or an outer command's) in this thread
            return command(*args, **kwargs)
        with _interrupt_handler():
            return command(*args, **kwargs)
    return with_handler


def _is_interrupt(exc: BaseException) -> bool:
    """Ctrl-C or SIGTERM as it arrives: a KeyboardInterrupt (``Interrupt`` raises one named after the signal),
    or Prefect's TerminationSignal (a SIGTERM inside a flow run: no Exception, a ``signal``)."""
    return isinstance(exc, KeyboardInterrupt) or (not isinstance(exc, Exception)
                                                  and isinstance(getattr(exc, "signal", None), int))


NOTHING_WRITTEN = "interrupted; nothing was written"


@contextmanager
def _if_interrupted(said: str | Callable[[], str]) -> Iterator[None]:
    """An interrupt inside the block ends the command with exit 128 + the signal and this one line (or what the
    function returns then): what was stopped and what was kept. A command says it around everything it
    writes; outside every such block an interrupt is told by the app as NOTHING_WRITTEN."""
    try:
        yield
    except BaseException as exc:
        if not _is_interrupt(exc):
            raise
        raise _fail(said() if callable(said) else said, _interrupt().exit_code(exc)) from None


@contextmanager
def _noted_only() -> Iterator[None]:
    """A short step that makes and removes again (a results folder checked by writing there) is not cut in two:
    a signal inside it is only noted, and raised at its end."""
    interrupt = _interrupt()
    armed = interrupt.armed
    interrupt.disarm()
    try:
        yield
    finally:
        if armed:
            interrupt.arm()


@contextmanager
def _told_interrupts() -> Iterator[None]:
    """The app's one handler of an interrupt no command told (a command that writes nothing there)."""
    with _if_interrupted(NOTHING_WRITTEN):
        yield


def _drain_prefect() -> None:
    """Send the last logs and events while the server is still there (otherwise Prefect retries them
    against a stopped server for a minute at exit)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (APILogWorker, EventsWorker):
        with suppress(Exception):  # best effort: the run's outcome is already decided and on disk
            service.drain_all(timeout=5)


@app.command()
@_own_handler
def run(
    # flagperf.config.plan's DEFAULT_SUITE, written out: the help is made without importing the planner (a test
    # holds the two together).
    suite: Annotated[str | None, typer.Option(help="suite name or YAML file (default: smoke)")] = None,
    cases: Annotated[str | None, typer.Option(help="comma-separated case names, instead of a suite")] = None,
    vendor: Annotated[str | None, typer.Option(
        help="vendor folder under vendor_images/ (default: the inventory's VENDOR, else cpu)")] = None,
    rounds: Annotated[int | None, typer.Option(help="rounds per case (default: the suite's)")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="[CASE.]KEY=VALUE: override a case configuration value for this run (repeatable)")] = None,
    results: Annotated[Path | None, typer.Option(
        help="results folder (default: FLAGPERF_LOG_PATH of a --host-config, else results)")] = None,
    monitor_interval: Annotated[float, typer.Option(
        help=f"seconds between monitor samples ({MIN_MONITOR_INTERVAL_S:g}-{MAX_MONITOR_INTERVAL_S:g})")] = 1.0,
    inventory: Annotated[Path | None, typer.Option(
        help="hosts to run on: a native inventory (YAML); default: this machine")] = None,
    host_config: Annotated[Path | None, typer.Option(
        "--host-config", help="hosts to run on, as FlagPerf's host.yaml (HOSTS, VENDOR, CASES ...)")] = None,
    test_conf: Annotated[Path | None, typer.Option(
        "--test-conf", help="FlagPerf training's test_conf.py (VENDOR, CASES ...; read, never run)")] = None,
    cluster_conf: Annotated[Path | None, typer.Option(
        "--cluster-conf", help="FlagPerf training's cluster_conf.py (HOSTS ...); default: the one beside "
                               "--test-conf")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="the full log on the console instead of the "
                                                                   "live view")] = False,
    retry: Annotated[Path | None, typer.Option(
        help="continue this run folder (with the options it was started with) after it stopped, e.g. on a full "
             "results disk: rounds kept on the hosts are collected, completed ones kept, the rest run")] = None,
    run_id: Annotated[str | None, typer.Option(
        "--run-id", help="the run folder's name in the results folder (default: run<UTC start time>-<random>); "
                         "one that is there is refused")] = None,
) -> None:
    """Run an evaluation and print measured vs peak. Without a PREFECT_API_URL a temporary server is used.

    The console shows a live view of the rounds; the full log is in the run folder (controller.log), in the
    Prefect UI when a server is used, and on the console with -v."""
    from flagperf.config.models import looks_like_suite
    from flagperf.config.plan import PLAN_FILE, new_run_id, plan_run
    from flagperf.config.yamlio import load_yaml_mapping
    from flagperf.hosts.capacity import check_capacity_here
    from flagperf.hosts.docker import owner_labels
    from flagperf.hosts.flagperf_training import default_cluster_conf, open_inventory
    from flagperf.hosts.inventory import load_inventory, local_inventory
    from flagperf.results.controller import CONTROLLER_FILE, held_by, run_held
    from flagperf.results.summary import SUMMARY_JSON, read_summary_json

    case_list = [c.strip() for c in cases.split(",") if c.strip()] if cases is not None else None
    if cases is not None and not case_list:
        raise _fail("--cases: no case names given")
    if not MIN_MONITOR_INTERVAL_S <= monitor_interval <= MAX_MONITOR_INTERVAL_S:
        raise _fail(f"--monitor-interval: must be between {MIN_MONITOR_INTERVAL_S:g} and {MAX_MONITOR_INTERVAL_S:g} "
                    f"seconds, got {monitor_interval}")
    if sum(option is not None for option in (inventory, host_config, test_conf)) > 1:
        raise _fail("give one of --inventory, --host-config and --test-conf")
    if cluster_conf and not test_conf:
        raise _fail("--cluster-conf goes with --test-conf")
    if run_id is not None and retry is not None and run_id != retry.name:  # the same: the retry of that command
        raise _fail(f"--run-id {run_id}: a retry continues its run folder's id ({retry.name}); give that one or "
                    "leave --run-id out")
    inventory_file = inventory or host_config or test_conf
    if test_conf and not cluster_conf:
        cluster_conf = default_cluster_conf(test_conf)
    # Everything is checked before anything is made: the results folder only once the input is good.
    try:
        # a FLAGPERF_CONTAINER_OWNER no container can carry: said first (before the local probe), not at a round's
        # start
        owner_labels()
        with _held_core_warnings() as warnings:
            if host_config and "HOSTS" not in (given := load_yaml_mapping(host_config)):  # before it is read as one
                looks = "this looks like a suite file; " if looks_like_suite(given) else ""
                raise ConfigError(display_path(host_config), "HOSTS", f"required key is missing ({looks}--host-config "
                                                                      "takes FlagPerf's host.yaml)")
            inv = open_inventory(inventory_file, cluster_conf) if test_conf else (
                load_inventory(inventory_file) if inventory_file else local_inventory())
            rounds = rounds if rounds is not None else inv.rounds
            vendor = inv.resolve_vendor(vendor)
            if not suite and not case_list and inv.cases:
                case_list = list(inv.cases)
            results, results_source = _results_folder(results or (retry.parent if retry else None), inv,
                                                      host_config or test_conf)
            if retry and (results.resolve() != retry.parent.resolve() or not (retry / PLAN_FILE).is_file()):
                raise ConfigError("--retry", None, f"{retry}: not a run folder of {results} (no {PLAN_FILE} there)")
            # A run still going: refused before any server starts or anything is written to its folder (its
            # controller.log, its prefect-server.log); the flow refuses it again where it starts (a UI retry)
            if retry and (holder := held_by(retry / CONTROLLER_FILE)) is not None:
                raise ConfigError("--retry", None, str(run_held(retry, holder)))
            if run_id is not None and (problem := run_id_problem(run_id)):  # nor a name the folder uses itself
                raise ConfigError("--run-id", None, problem)
            if run_id is not None and retry is None and os.path.lexists(results / run_id):
                raise ConfigError("--run-id", None, _run_id_taken(run_id, results))
            plan = plan_run(suite=suite, cases=case_list, vendor=vendor, rounds=rounds, sets=set_ or [],
                            results_dir=results, hosts=[spec.model_dump(mode="json") for spec in inv.hosts],
                            inventory_overrides=inv.case_overrides, inventory_source=inv.source,
                            inventory_endpoints=inv.endpoints,
                            run_id=retry.name if retry else run_id, resume=retry is not None)
            check_capacity_here(plan, inv.hosts)  # before any server starts
        interrupt = _interrupt()
        interrupt.disarm()  # from here a signal is noted, and raised once the run can be stopped in order
        made = _make_results_folder(results, *results_source)
        if retry is None:  # the run folder is this run's from here: another run given its id is refused
            while not _claimed(plan.run_dir, results, made):
                if run_id is not None:
                    remove_made(results, made)
                    raise ConfigError("--run-id", None, _run_id_taken(run_id, results))
                plan = plan.model_copy(update={"run_id": new_run_id()})  # a chosen name that another run chose too
    except FlagperfError as exc:
        raise _fail_all(exc) from None
    except KeyboardInterrupt as exc:  # Ctrl-C while the input is checked (the probe takes seconds): nothing started
        raise _fail("interrupted before anything started", _interrupt().exit_code(exc)) from None
    run_dir = plan.run_dir
    try:  # the run folder is claimed: until the run begins, whatever stops it gives the folder back
        for note in [*inv.notes, *warnings]:
            err_console.print(f"[yellow]note[/] {escape(note)}", highlight=False, soft_wrap=True)
        console.print(f"[bold]run {plan.run_id}[/]: {len(plan.cases)} cases x {plan.rounds} rounds, vendor "
                      + escape(plan.vendor.name + (f", suite {plan.suite}" if plan.suite else "")
                               + f", {len(inv.hosts)} host(s) from {inv.source}"), soft_wrap=True)
        _prepare_prefect_environment(verbose)
        from flows.progress import Progress, RunFolderLog, live_view
        from flows.server import TemporaryServer, configured_api_url

        if configured_api_url() is not None:  # a team server: its sign-in from the credentials file, if not set
            from flagperf.site.auth import use_client_credentials

            use_client_credentials()
        progress = Progress(plan, [spec.name for spec in inv.hosts], run_dir)
        handlers = [RunFolderLog(run_dir), progress]
    except BaseException as exc:
        # Else the empty folder stays, and every later `--run-id ID` is refused as taken.
        _release(run_dir, retry)
        remove_made(results, made)
        if isinstance(exc, FlagperfError):
            raise _fail_all(exc) from None
        if isinstance(exc, Exception):  # error_line: a server's error names its URL, a password in it masked
            raise _fail(f"the evaluation could not run: {error_line(exc)}", EXIT_FAILED) from None
        raise

    server: TemporaryServer | None = None
    outcome: BaseException | None = None
    root = logging.getLogger()
    state = None
    try:
        interrupt.arm()
        if configured_api_url() is None:
            # Our own temporary server rather than Prefect's: its address is in PREFECT_API_URL for every
            # process of the run (so an inference case's steps nest under this evaluation), and it is
            # stopped here, or by its watcher if this process is killed.
            server = TemporaryServer()
            os.environ["PREFECT_API_URL"] = server.start(interrupt.signals)
        for handler in handlers:
            root.addHandler(handler)
        from flows.evaluate import BAD_INPUT, RUN_STOPPED, evaluate  # Prefect once the input is known good

        with live_view(progress, console) if not verbose else nullcontext():
            state = evaluate(suite=suite, cases=case_list, vendor=vendor, rounds=rounds, overrides=set_ or [],
                             inventory=str(inventory_file.resolve()) if inventory_file else None,
                             cluster_conf=str(cluster_conf.resolve()) if cluster_conf else None,
                             results_dir=str(results), run_id=plan.run_id, monitor_interval_s=monitor_interval,
                             command=shlex.join(["flagperf", *sys.argv[1:]]), resume=retry is not None,
                             return_state=True)
    except (KeyboardInterrupt, Exception) as exc:  # Exception: the API cannot be reached, the server did not start
        outcome = exc
    except BaseException as exc:  # Prefect's TerminationSignal (a SIGTERM inside the flow run)
        if not hasattr(exc, "signal"):
            raise
        outcome = exc
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM) if threading.current_thread() is threading.main_thread() else ():
            signal.signal(sig, lambda signum, _frame: interrupt.signals.append(signum))
        if not verbose:
            console.line()  # the live view's last frame ends without one
        if "prefect" in sys.modules:
            _drain_prefect()
        if server is not None:  # its log is the run's once the run began (the folder is claimed before)
            server.stop(keep_log_in=run_dir if (run_dir / PLAN_FILE).is_file() else None)
        for handler in handlers:
            root.removeHandler(handler)
            handler.close()
    interrupted = interrupt.signals or (outcome is not None and not isinstance(outcome, Exception))
    if interrupted:
        if (run_dir / SUMMARY_JSON).is_file():
            summary = read_summary_json(run_dir)
            if summary["headline"]:
                _print_summary(summary, run_dir)
            if made := summary.get("progress"):
                from flagperf.results.summary import progress_line

                console.print(escape(f"interrupted: {progress_line(made)} (report.md)"), highlight=False,
                              soft_wrap=True)  # one line: it may name the retry command, whatever its length
            raise _fail(f"interrupted; the report of what was done is in {run_dir}", interrupt.exit_code(outcome))
        if not (run_dir / PLAN_FILE).is_file():  # the flow had not begun (e.g. the temporary server was starting)
            _release(run_dir, retry)
            remove_made(results, made)  # only folders this invocation made, and only while empty
            raise _fail("interrupted before anything started", interrupt.exit_code(outcome))
        # Stopped before or while the report was written (its files are written whole or not at all).
        raise _fail(f"interrupted before the report was written; `flagperf report {run_dir}` writes it",
                    interrupt.exit_code(outcome))
    if outcome is not None:
        if not (run_dir / PLAN_FILE).is_file():  # the flow had not begun (e.g. the server did not start)
            _release(run_dir, retry)
            remove_made(results, made)
        raise _fail(f"the evaluation could not run: {error_line(outcome)}", EXIT_FAILED)
    assert state is not None
    if not (run_dir / SUMMARY_JSON).is_file():
        # a state's message names a client's error whole (Prefect's format_exception): a URL's password masked
        message = redact_userinfo(state.message or "the evaluation stopped before its summary")
        if message.startswith(BAD_INPUT):  # found by the flow before any round ran (e.g. a size that cannot fit)
            if retry is None:  # this run's own folder; a retried run's is the earlier attempts' too, kept as it was
                _remove_rejected_run(run_dir, results, made)
            raise _fail(message.removeprefix(BAD_INPUT))
        if not (run_dir / PLAN_FILE).is_file():  # stopped before it planned: nothing to see there
            _release(run_dir, retry)
            remove_made(results, made)
            raise _fail(message, EXIT_FAILED)
        raise _fail(f"{message} (see {run_dir})", EXIT_FAILED)
    summary = read_summary_json(run_dir)
    _print_summary(summary, run_dir)
    counts = summary["counts"]
    failed = bool(counts["failed"] or summary["problems"] or state.is_failed())
    report_html, folder = escape(str(run_dir / "report.html")), escape(str(run_dir))
    console.print(f"next: {report_html}'s Faults and bounds says why each failed round failed; the same command "
                  f"with --retry {folder} runs only what did not complete" if failed else
                  f"next: open {report_html}; change one thing (--set KEY=VALUE) and run again, then "
                  f"`flagperf compare {folder} <new run>`", highlight=False, soft_wrap=True)
    if failed:
        if state.is_failed() and RUN_STOPPED in (state.message or ""):  # stopped early: what to free, how to go on
            raise _fail(state.message or "", EXIT_FAILED)
        raise typer.Exit(EXIT_FAILED)
    if counts["unsupported"]:
        raise typer.Exit(EXIT_UNSUPPORTED_ONLY)


@contextmanager
def _held_core_warnings() -> Iterator[list[str]]:
    """The core's warnings while the input is checked, held back: notes once the input is good, dropped
    when it is not (the error is one line; a warning that led to it would be a second)."""
    held: list[str] = []

    class Hold(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            held.append(record.getMessage())

    logger = logging.getLogger("flagperf")
    handler = Hold(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield held
    finally:
        logger.removeHandler(handler)


def _results_folder(results: Path | None, inv: Inventory, host_config: Path | None
                    ) -> tuple[Path, tuple[str, str | None]]:
    """The results folder and where it was given (source, key), for an error about it."""
    if results or not inv.results_dir:
        return results or Path("results"), ("--results", None)
    return Path(inv.results_dir), (display_path(host_config) if host_config else inv.source, "FLAGPERF_LOG_PATH")


def _make_results_folder(folder: Path, source: str, key: str | None) -> Path | None:
    """Make the results folder if missing and check it by writing to it (exit 2 otherwise); returns the
    outermost folder this made (None: it was there), so that a run refused later leaves nothing behind."""
    from flagperf.results.schema import folder_problem

    made = outermost_missing(folder)
    try:
        problem = folder_problem(folder)
    except BaseException:  # interrupted: what this made goes again
        remove_made(folder, made)
        raise
    if problem:
        remove_made(folder, made)
        raise ConfigError(source, key, f"{folder}: {problem}")
    return made


def _run_id_taken(run_id: str, results: Path) -> str:
    return f"{run_id!r} is taken: {results / run_id} exists; results are never overwritten"


def _claimed(run_dir: Path, results: Path, made: Path | None) -> bool:
    """Claim the run folder for this run: made here (an exclusive mkdir), so that of two runs given one run id at
    the same time one gets it and the other is refused, before either writes there. False: it is there."""
    try:
        run_dir.mkdir()
    except FileExistsError:
        return False
    except OSError as exc:  # the results folder was checked by writing there: changed since
        remove_made(results, made)
        raise ConfigError("--results", None, f"{run_dir}: cannot be made: {exc.strerror or exc}") from None
    return True


def _release(run_dir: Path, retry: Path | None) -> None:
    """The run folder this run claimed, given back while it is empty: a run that did not begin leaves nothing."""
    if retry is None:
        from flagperf.results.controller import CONTROLLER_FILE

        with suppress(OSError):
            # the flow's record of its controller, where it was stopped between that and its plan: this run's own
            (run_dir / CONTROLLER_FILE).unlink(missing_ok=True)
            run_dir.rmdir()


def _remove_rejected_run(run_dir: Path, results: Path, made: Path | None) -> None:
    """A new run refused as bad input by the flow (a size no host can hold) leaves no run folder behind: it holds
    nothing measured (this invocation claimed it empty), only the plan and the healthcheck. Never a retry's."""
    shutil.rmtree(run_dir, ignore_errors=True)
    remove_made(results, made)


def _print_summary(summary: dict[str, Any], run_dir: Path) -> None:
    from flagperf.results.faults import BOUNDED_NOTE
    from flagperf.results.markup import plain
    from flagperf.results.operators import OPERATOR_HEADER, operator_cells
    from flagperf.results.serving import CONSOLE_HEADER, console_rows, serving_points
    from flagperf.results.summary import (
        ESTIMATED_PEAK_LEGEND,
        HEADLINE_HEADER,
        OPERATORS_INTRO,
        headline_cells,
        headline_figures,
        headline_rows,
    )

    ctx = summary.get("context") or {}
    table = Table(title=f"{summary['run_id']}: measured vs peak"
                  + (f" on {ctx.get('device')}" if ctx.get("device") else ""), title_justify="left")
    for name in HEADLINE_HEADER:
        table.add_column(name, justify="right" if name not in ("case", "metric", "unit") else "left")
    # Generate points get a row each below (every figure is in report.md); a figure of theirs only beside its peak.
    for entry in headline_rows(summary["headline"]):
        # Plain text (no Markdown renders here), escaped for rich; the report's bold marks dropped.
        table.add_row(*[escape(c.replace("**", "")) for c in headline_cells(entry, plain)])
    points = serving_points(run_dir)
    if table.rows or not (summary.get("operators") or points):
        console.print(table)
    if points:
        serving = Table(*CONSOLE_HEADER, title="LLM serving, one row per point (cN: N requests in flight; rR: R "
                        "requests/s offered; report.md has every figure)", title_justify="left")
        for cells, marked in console_rows(points):
            serving.add_row(*[escape(c) for c in cells], style="red" if marked else None)
        console.print(serving)
    if summary.get("operators"):  # operation cases: a row per operator, not per point (report.md has them all)
        operators = Table(*OPERATOR_HEADER, title=OPERATORS_INTRO, title_justify="left")
        for entry in summary["operators"]:
            operators.add_row(*[escape(c.replace("**", "")) for c in operator_cells(entry, plain)],
                              style="red" if entry["failed"] else None)
        console.print(operators)
    for entry in summary["not_measured"]:
        colour = "yellow" if entry["status"] == "unsupported" else "red"
        console.print(f"[{colour}]{entry['status']}[/] {entry['case']} round {entry['round']} on {entry['host']}: "
                      f"{escape(entry['message'])}", highlight=False, soft_wrap=True)
    for problem in summary["problems"]:
        console.print(f"[red]problem[/] {escape(problem)}", highlight=False, soft_wrap=True)
    for fault in summary.get("faults", []):  # a bound the case chose (capacity's max_gib) is no fault: said as such
        label = "[cyan]bound[/]" if BOUNDED_NOTE in fault else "[yellow]fault[/]"
        console.print(f"{label} {escape(fault)}", highlight=False, soft_wrap=True)
    if any(e["above_peak"] for e in summary["headline"]):
        console.print("[yellow]a measurement above its peak means the spec table's peak is too low for this "
                      "machine; see report.md for the peak sources[/]")
    if any(e.get("peak_bound") == "lower" or e.get("mfu_estimated") for e in headline_figures(summary["headline"])) \
            or any(e.get("best_roofline_estimated") for e in summary.get("operators") or []):
        console.print(escape(ESTIMATED_PEAK_LEGEND) + " Why each peak is an estimate: report.md.", highlight=False,
                      soft_wrap=True)
    c = summary["counts"]
    progress = summary.get("progress") or {}  # a round on each host is a record of its own: said where it counts
    planned = f" of {progress['planned']} planned ({progress['planned_as']})" if progress.get("planned_as") else ""
    console.print(f"{c['rounds']} rounds{planned}: {c['success']} succeeded, {c['unsupported']} unsupported, "
                  f"{c['failed']} failed", soft_wrap=True)
    from flagperf.results.diagnosis import verdict_line

    if (diagnosed := verdict_line(run_dir)) is not None:
        console.print(escape(diagnosed[0]), style="red" if diagnosed[1] else None, highlight=False, soft_wrap=True)
    console.print(f"run directory: [bold]{escape(str(run_dir))}[/] (report.html, report.md, summary.csv, "
                  "summary.json)",
                  highlight=False, soft_wrap=True)


def _run_folder(path: Path, option: str) -> Path:
    if not path.is_dir():
        raise _fail(f"{option} {path}: not a folder")
    if not any(path.glob("*/round*/*_noderank*/result.json")):
        # results/ rather than a run in it; run ids sort by their start
        runs = sorted({p.parents[3] for p in path.glob("*/*/round*/*_noderank*/result.json")})
        if runs:
            from flagperf.results.summary import SUMMARY_JSON

            finished = [run for run in runs if (run / SUMMARY_JSON).is_file()]  # a run's last step writes it
            example = f"{finished[-1]}" if finished else f"{runs[-1]} (unfinished: no {SUMMARY_JSON} yet)"
            raise _fail(f"{option} {path}: not a run folder but a folder of runs; give one of them, e.g. {example}")
        raise _fail(f"{option} {path}: no <case>/round<N>/<host>_noderank<K>/result.json inside; not a run folder")
    return path


@app.command()
@_own_handler
def report(run_dir: Annotated[Path, typer.Argument(help="a run folder, results/<run-id>")]) -> None:
    """Regenerate a run's summary, report (Markdown, HTML) and plots from its files."""
    from flagperf.config.plan import PLAN_FILE
    from flagperf.results.report import build_report
    from flagperf.results.summary import read_summary_json

    if not (run_dir / PLAN_FILE).is_file():  # a run stopped before its first round was stored still has its plan
        _run_folder(run_dir, "RUN")
    from flagperf.config.diagnose import report_section

    try:
        with _if_interrupted(f"interrupted while the report of {run_dir} was written: its rounds' records are "
                             "untouched and each report file is whole (some may be the earlier ones); `flagperf "
                             f"report {run_dir}` writes them all again"):
            _, paths = build_report(run_dir, report_section)
    except OSError as exc:
        raise _fail(f"{run_dir}: the report cannot be written: {exc.strerror or exc}", EXIT_FAILED) from None
    with _if_interrupted(f"interrupted; the report of {run_dir} was written whole ({paths['html']})"):
        _print_summary(read_summary_json(run_dir), run_dir)
        console.print(f"report: {escape(str(paths['html']))}, {escape(str(paths['markdown']))}", highlight=False,
                      soft_wrap=True)


@app.command()
@_own_handler
def compare(
    run_a: Annotated[Path, typer.Argument(help="baseline run folder (A)")],
    run_b: Annotated[Path, typer.Argument(help="run folder to compare with it (B)")],
    out: Annotated[Path | None, typer.Option(help="also write the comparison as Markdown here")] = None,
) -> None:
    """Put two runs side by side: B/A per case and metric, flagged where it exceeds the rounds' spread; serving
    cases also at equal interactivity, with their goodput at the SLO."""
    from flagperf.results.compare import (
        HEADER,
        compare_runs,
        compare_serving_runs,
        render_markdown,
        serving_comparison_markdown,
    )
    from flagperf.results.schema import atomic_path

    # Bad input is refused before anything is said.
    if out is not None and (problem := _out_file_problem(out, (run_a, run_b))):
        raise _fail(f"--out {out}: {problem}")
    try:
        rows, context = compare_runs(_run_folder(run_a, "RUN_A"), _run_folder(run_b, "RUN_B"))
        serving = compare_serving_runs(run_a, run_b)
    except FlagperfError as exc:
        raise _fail(str(exc)) from None
    table = Table(*HEADER, title=f"A = {run_a.name}, B = {run_b.name}", title_justify="left")
    for row in rows:
        cells = row.cells()
        style = "red" if row.flagged else None
        table.add_row(*[escape(c) for c in cells], style=style)
    console.print(table)
    flagged = sum(r.flagged for r in rows)
    console.print(f"{flagged} of {len(rows)} figures differ by more than their spread")
    for line in context["left_out"]:
        console.print(escape(line), highlight=False, soft_wrap=True)
    if serving:
        console.print(escape("\n".join(["", *serving_comparison_markdown(serving)])), highlight=False)
    if out is not None:
        try:
            with _if_interrupted(f"interrupted; --out {out} was not written (one there before is as it was)"), \
                    atomic_path(out) as partial:  # whole or not at all
                partial.write_text(render_markdown(run_a, run_b, rows, serving, context["left_out"]), encoding="utf-8")
        except OSError as exc:
            raise _fail(f"--out {out}: {exc.strerror or exc}") from None
        with _if_interrupted(f"interrupted; --out {out} was written whole"):
            console.print(f"written to {escape(str(out))}", highlight=False, soft_wrap=True)


def _out_file_problem(out: Path, runs: tuple[Path, ...] = ()) -> str | None:
    """Why a file cannot be written at ``out`` (None: it can, as far as can be told before writing): the folder
    is the user's to make, and it must be writable, and in no run folder (one of ``runs``, or any with a plan)."""
    from flagperf.config.plan import PLAN_FILE

    folder = out.parent
    if out.is_dir():
        return "is a folder; give the file to write"
    if out.exists() and not out.is_file():  # the write renames over it: /dev/full would become a file of ours
        return "not a regular file (a device, a FIFO or a socket); give a file to write"
    if not folder.is_dir():
        return f"folder {folder} does not exist" if not (folder.exists() or folder.is_symlink()) else \
            f"{folder} is not a folder"
    # A run folder (its plan.json says so) is that run's record: its summary.json or report.md written over, or a
    # file added that `flagperf report` does not know, would change what the run says it measured.
    given = {run.resolve() for run in runs}
    run = next((where for where in (folder.resolve(), *folder.resolve().parents)
                if where in given or (where / PLAN_FILE).is_file()), None)
    if run is not None:
        return f"is inside run folder {display_path(run)}, whose files are that run's record; write it elsewhere"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"folder {folder} is not writable"
    return None


EXIT_HOST_FAILED = 4  # flagperf diagnose: some host failed a rule
EXIT_NOT_JUDGED = 6  # flagperf diagnose: no host failed, but some (or every) host could not be judged: not a pass


@app.command()
@_own_handler
def diagnose(
    run_dir: Annotated[Path, typer.Argument(help="a run folder, results/<run-id>")],
    baseline: Annotated[Path | None, typer.Option(help="a run folder to hold every figure against")] = None,
    history: Annotated[bool, typer.Option("--history", help="hold figures against the history's baseline "
                                                            "(median of the last runs of this vendor and device)")
                       ] = False,
    rules: Annotated[Path | None, typer.Option(help="the rules file (default deployments/diagnosis/rules.yaml)")
                     ] = None,
) -> None:
    """Name the outlier devices and hosts: each figure against the fleet median (robust spread: MAD) and a
    baseline, by the rules file. Writes diagnosis.json and diagnosis.md into the run folder. Exit 0: every
    host passed; 4: some host failed a rule; 6: none failed, but some host could not be judged (fewer hosts
    than the rules' min_fleet and no baseline, or no rule for its figures): a check of nothing is no pass;
    2: bad input."""
    from flagperf.config.diagnose import diagnose_run
    from flagperf.results.diagnosis import render_markdown, write_diagnosis

    try:
        found = diagnose_run(run_dir, rules, baseline, history)
        with _if_interrupted(f"interrupted while the diagnosis of {run_dir} was written: diagnosis.json and "
                             "diagnosis.md are each whole (either may be the earlier one); run the command again"):
            write_diagnosis(run_dir, found)
    except FlagperfError as exc:
        raise _fail(str(exc)) from None
    except OSError as exc:
        raise _fail(f"{run_dir}: the diagnosis cannot be written: {exc.strerror or exc}", EXIT_FAILED) from None
    with _if_interrupted(f"interrupted; the diagnosis of {run_dir} was written whole (diagnosis.md)"):
        console.print(render_markdown(found), markup=False, highlight=False, soft_wrap=True)
    if found.failed_hosts:
        raise typer.Exit(EXIT_HOST_FAILED)
    if found.unjudged_hosts:
        raise typer.Exit(EXIT_NOT_JUDGED)


@app.command()
@_own_handler
def nightly(
    suite: Annotated[str, typer.Option(help="the suite to evaluate (a name from `flagperf list suites`)")] = "smoke",
    rounds: Annotated[int, typer.Option(help=f"rounds per case (1-{MAX_ROUNDS}); each figure's median over them is "
                                             "judged")] = 3,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="[CASE.]KEY=VALUE: override a case configuration value, as `flagperf run --set` "
                      "(repeatable); a changed value starts a new baseline")] = None,
    results: Annotated[Path | None, typer.Option(
        help="results folder (default: $FLAGPERF_RESULTS_DIR, else results); nightly-SUITE.json and trends.csv "
             "are written there")] = None,
    history_url: Annotated[str | None, typer.Option(
        help="history database, sqlite:///PATH or postgresql+psycopg://USER@HOST/DB without a password (default: "
             "$FLAGPERF_HISTORY_URL, else history.sqlite in the results folder)")] = None,
    baseline_runs: Annotated[int, typer.Option(help="earlier good nights whose median is a figure's baseline "
                                                    f"(1-{MAX_BASELINE_RUNS})")] = 5,
    sigma: Annotated[float, typer.Option(help="a figure regresses beyond this many times its baseline's "
                                              "spread (on the log scale, at least 1 %)")] = 3.0,
    vendor: Annotated[str | None, typer.Option(
        help="vendor folder under vendor_images/ (default: the inventory's VENDOR, else cpu)")] = None,
    inventory: Annotated[Path | None, typer.Option(
        help="hosts to run on: a native inventory or FlagPerf's host.yaml; default: this machine")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="the flow's full log on the console (else its "
                                                                   "warnings and errors, on stderr)")] = False,
) -> None:
    """Run the nightly regression once, here, for cron or a CI scheduler: evaluate the suite, record it in the
    history, judge each figure against its baseline, print each verdict and the outcome. Without a
    PREFECT_API_URL a temporary server is used.

    Exit 0: every figure held its baseline (or has none yet); 1: the night failed (recorded as a failed night);
    2: bad input, nothing measured; 3: unsupported on this device; 5: a regression; 128 + signal: interrupted.
    The verdict is also in nightly-SUITE.json in the night's run folder and in the results folder (with its
    exit_code); there, a night of the suite started later than this one keeps its own. This command reads back
    only its own night's."""
    from flows.nightly_cli import check_night, default_results, interrupted_outcome, open_history, run_night

    results = results or default_results()
    interrupt = _interrupt()
    try:
        with _held_core_warnings() as warnings:
            night = check_night(suite=suite, vendor=vendor, rounds=rounds, overrides=set_ or [], inventory=inventory,
                                results=results, history_url=history_url, baseline_runs=baseline_runs, sigma=sigma)
    except FlagperfError as exc:
        raise _fail_all(exc) from None
    except KeyboardInterrupt as exc:  # Ctrl-C while the input is checked (the probe takes seconds): nothing started
        raise _fail("interrupted before anything started", interrupt.exit_code(exc)) from None
    made: Path | None = None
    try:
        interrupt.disarm()  # the folder is made whole and known here: a signal meanwhile is raised just after
        made = _make_results_folder(results, "--results", None)
        interrupt.arm()
        open_history(night)  # a database that is slow to answer can be interrupted
        interrupt.disarm()  # before the header: a Ctrl-C as soon as it shows is noted, then raised in order
    except FlagperfError as exc:
        remove_made(results, made)
        raise _fail_all(exc, EXIT_BAD_INPUT if isinstance(exc, ConfigError) else EXIT_FAILED) from None
    except KeyboardInterrupt as exc:
        remove_made(results, made)
        raise _fail("interrupted before anything started", interrupt.exit_code(exc)) from None
    for note in [*night.notes, *warnings]:
        err_console.print(f"[yellow]note[/] {escape(note)}", highlight=False, soft_wrap=True)
    console.print(f"[bold]nightly {escape(suite)}[/]: {rounds} rounds per case, results in {escape(str(results))}",
                  highlight=False, soft_wrap=True)
    _prepare_prefect_environment(verbose)

    def discard_made() -> None:  # a night that did not begin (or was refused) leaves nothing this made
        # (its history is made only when it records: see open_history)
        remove_made(results, made)  # only while empty

    interrupt.left = ("the interrupted night may be missing from the history and its verdict file; its run folder "
                      "stays")
    try:
        interrupt.arm()
        outcome = run_night(night, interrupt.signals, _drain_prefect)
    except BaseException as exc:  # Exception: the server did not start, the API cannot be reached
        if not (_is_interrupt(exc) or isinstance(exc, Exception)):
            raise
        discard_made()  # what an interrupted night recorded stays: only an empty history or folder goes
        if not interrupt.signals and isinstance(exc, Exception):
            raise _fail(f"the night could not run: {error_line(exc)}", EXIT_FAILED) from None
        # Stopped while it measured: not judged. Once measured: recorded all the same, as the flow says. Once
        # judged and published (a regression: exit 5): that outcome and its exit code stand.
        line, judged_code = interrupted_outcome(night)
        raise _stood(line, interrupt.exit_code(exc) if judged_code is None else judged_code) from None
    if outcome.code == EXIT_BAD_INPUT:  # found by the flow (a size an SSH host cannot hold): no night
        discard_made()
        raise _fail(outcome.message)
    for verdict in outcome.verdicts:
        colour = {"regression": "red", "improvement": "green"}.get(verdict.status)
        console.print(escape(verdict.line()), style=colour, highlight=False, soft_wrap=True)
    console.print(f"{escape(outcome.state)}: {escape(outcome.message)} (exit {outcome.code})", highlight=False,
                  soft_wrap=True, style="red" if outcome.code else None)
    if outcome.run_dir is not None:
        verdict = f"; verdict: {escape(str(outcome.verdict_file))}" if outcome.verdict_file else ""
        console.print(f"run directory: {escape(str(outcome.run_dir))}{verdict}", highlight=False, soft_wrap=True)
    if interrupt.signals:  # once the flow had ended (its temporary server stopping): the night and its outcome stand
        # with its exit code, so that cron does not lose a regression to the signal's 128 + N
        raise _stood(f"interrupted as the night ended; its outcome above (exit {outcome.code}) stands", outcome.code)
    raise typer.Exit(outcome.code)


@app.command()
@_own_handler
def server(
    database_url: Annotated[str | None, typer.Option(
        help="postgresql+asyncpg://user@host:port/db (default: $PREFECT_API_DATABASE_CONNECTION_URL)")] = None,
    host: Annotated[str, typer.Option(help="address the server listens on (0.0.0.0: every interface, which "
                                           "needs a sign-in: see --auth-file)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port of the API and UI")] = 4200,
    public_url: Annotated[list[str] | None, typer.Option(
        help="the address browsers use, e.g. http://perf-lab:4200 (default: from --host and --port); repeatable: "
             "the first is the one the banner and the UI use, each one more (a TLS alias behind a proxy, "
             "https://perf-lab.example.org) is a name and an origin the server also answers")] = None,
    results: Annotated[Path, typer.Option(help="results folder the worker's runs write to, shown on the results "
                                               "site so reports open from the UI")] = Path("results"),
    results_port: Annotated[int | None, typer.Option(help="port of the results site (default: --port + 1)")] = None,
    results_public_url: Annotated[str | None, typer.Option(
        help="the address browsers use for the results site, e.g. https://results.perf-lab (default: the "
             "public URL's host with --results-port)")] = None,
    auth_file: Annotated[Path | None, typer.Option(
        help="file holding user:password for the sign-in (mode 600, outside the project; default: "
             "$FLAGPERF_AUTH_FILE, $PREFECT_SERVER_API_AUTH_STRING, then ~/.config/flagperf/server-auth)")] = None,
    pool: Annotated[str, typer.Option(help="process work pool to create and serve (one per database: servers "
                                           "sharing one share its deployments)")] = "flagperf",
    worker: Annotated[bool, typer.Option(help="also start a worker for the pool")] = True,
    deploy: Annotated[bool, typer.Option(help="create the deployments of prefect.yaml (else the banner prints "
                                              "the command)")] = True,
    log_dir: Annotated[Path | None, typer.Option(
        help=f"where the server and worker write their logs (default: {SERVER_LOGS}/ in the --results folder, "
             "whose site never serves it)")] = None,
    server_name: Annotated[list[str] | None, typer.Option(
        "--server-name", metavar="NAME",
        help="another name browsers reach the server by (a DNS alias; repeatable): besides --host's, "
             "--public-url's and this machine's, the only names it answers")] = None,
) -> None:
    """Start a lasting Prefect server on PostgreSQL with a process worker, the deployments and the results site,
    behind one sign-in: the set-up for a team (docs/team-server.md)."""
    # paths.SERVER_LOGS, the name the results folder keeps for it (no run may take it): one source of truth.
    log_dir = log_dir if log_dir is not None else results / SERVER_LOGS
    # Until serve installs its own handler: from there a signal stops all it started, in order. The logs folder
    # it makes first goes again (while empty), so that "nothing" is true.
    log_dir_made = [folder for folder in (log_dir, *log_dir.parents) if not folder.exists()]

    def nothing_started() -> str:
        for folder in log_dir_made:  # deepest first
            with suppress(OSError):
                folder.rmdir()
        if log_dir_made and log_dir_made[-1].exists():
            return f"interrupted before the server started; nothing was started (its logs folder {log_dir} stays)"
        return "interrupted before the server started; nothing was started"

    with _if_interrupted(nothing_started):
        from flows.server import DATABASE_URL_ENV, check_database_url, serve, server_credentials

        for option, address in [*(("--public-url", url) for url in public_url or ()),
                                ("--results-public-url", results_public_url)]:
            if address is not None and not _scheme_host_port(address):
                raise _fail(f"{option} {address}: give scheme, host and port only, e.g. http://perf-lab:4200")
        try:
            url = check_database_url(database_url or os.environ.get(DATABASE_URL_ENV))
            credentials = server_credentials(host, auth_file, {"--public-url": public_url,
                                                               "--results-public-url": results_public_url})
        except FlagperfError as exc:
            raise _fail(str(exc)) from None
        for option, value in (("--port", port), ("--results-port", results_port)):
            if value is not None and not 1 <= value <= 65535:
                raise _fail(f"{option} {value}: not a port number")
        if results_port == port:
            raise _fail(f"--results-port {results_port}: the server already uses it")
        for name in server_name or ():
            if not re.fullmatch(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]", name):
                raise _fail(f"--server-name {name}: give a host name or address only, e.g. perf-lab.example.org")
        try:
            code = serve(url, host, port, pool, worker, log_dir, results_dir=results, results_port=results_port,
                         public_urls=tuple(public_url or ()), results_public_url=results_public_url,
                         credentials=credentials,
                         deploy=deploy, extra_names=tuple(server_name or ()))
        except FlagperfError as exc:  # a setting to change (another server's --pool on this database)
            raise _fail(str(exc)) from None
        except RuntimeError as exc:
            raise _fail(f"{exc} (logs in {log_dir})", EXIT_FAILED) from None
    if code > 128:
        raise _fail(f"interrupted while the server started; all it had started is stopped (logs in {log_dir})", code)
    raise typer.Exit(code)


_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"  # "_": internal names (my_host) browsers reach
# http(s)://, a DNS name (a trailing dot allowed: localhost.), an IPv4 address or an IPv6 one in brackets, an
# optional port, an optional "/" and nothing more (no user, path, query, fragment, backslash).
_PUBLIC_URL = re.compile(rf"https?://(?P<host>(?:{_LABEL}\.)*{_LABEL}\.?|\[(?P<ipv6>[0-9a-f:.]+)\])"
                         r"(?::(?P<port>[0-9]{1,5}))?/?", re.IGNORECASE)


def _scheme_host_port(url: str) -> bool:
    """Whether ``url`` is http(s)://HOST[:PORT][/] and nothing more: HOST a DNS name, an IPv4 address or an IPv6 one
    in brackets, PORT 1-65535."""
    import ipaddress

    found = _PUBLIC_URL.fullmatch(url)
    if found is None or not 1 <= int(found["port"] or 80) <= 65535:
        return False
    try:
        if found["ipv6"] is not None:
            ipaddress.IPv6Address(found["ipv6"])
        elif found["host"].rstrip(".").rsplit(".", 1)[-1].isdigit():  # numbers last: an IPv4 address, no name
            ipaddress.IPv4Address(found["host"].rstrip("."))
    except ValueError:
        return False
    return True


def _validate_file(path: Path) -> str:
    """Validate one config file by what it is; returns its kind. The core's warnings about it are notes when
    the file is good, and dropped when it is not (the error is its one line)."""
    notes: list[str] = []  # what run would say of the file beside the core's warnings (FlagPerf keys not used ...)
    with _held_core_warnings() as warnings:
        kind = _check_file(path, notes)
    for note in [*notes, *warnings]:
        err_console.print(f"[yellow]note[/] {escape(note)}", highlight=False, soft_wrap=True)
    return kind


def _refuse_shadowed(path: Path, folder: Path, name: str) -> None:
    """``path``, a file of the vendor folder ``folder``, when another folder of the same name shadows it: read by
    no run, so said rather than passed."""
    from flagperf.config.vendors import shadowed_by, shadowed_message

    winner = shadowed_by(folder, name)
    if winner is not None:
        raise ConfigError(display_path(path), None, "never read: " + shadowed_message(folder, winner, name))


def _check_vendor_kept_file(path: Path, kept: tuple[Path, str, str], scale: re.Match[str] | None,
                            notes: list[str]) -> str:
    """A file of a vendor folder's cases/<family>/<case>/ (``kept``: the vendor folder, family, case), where a vendor
    kept outside the project keeps its files of a case: read as a run of that vendor reads it."""
    from flagperf.config import adaptation
    from flagperf.config.cases import available_cases, load_case, resolve_case_config
    from flagperf.config.vendorlayout import (
        misnamed_overrides,
        misplaced_adaptation_file,
        overrides_name,
        scale_file_problem,
        stray_entry_problem,
        vendor_case_problem,
    )
    from flagperf.config.vendors import MANIFEST, available_vendors, load_vendor_manifest
    from flagperf.hosts.vendorcheck import README_NAME, links_out_of_vendor_folder  # the round's link scan

    home, family, name = kept
    folder = home / adaptation.VENDOR_CASES_FOLDER / family / name
    known = available_cases()
    problem = vendor_case_problem(family, name, known)
    if problem:
        raise ConfigError(display_path(folder), None, problem)
    case = load_case(name, known)
    manifest = load_vendor_manifest(home / MANIFEST)
    _refuse_shadowed(path, home, manifest.name)
    # a folder --vendor does not find (not installed here): its own engines judge the file, as vendor check's do
    found_here = available_vendors().get(manifest.name)
    installed = found_here is not None and found_here.resolve() == home.resolve()
    # By an absolute path, or relative and out of the vendor folder (the round's scan of it refuses those too).
    links = adaptation.absolute_links(home, folder) + links_out_of_vendor_folder(
        home, f"{adaptation.VENDOR_CASES_FOLDER}/{family}/{name}")
    if links:  # each link one line; a run would find it only in a container, once the round starts
        raise gathered(links)
    if path.parent == folder and path.name.endswith((".yaml", ".yml")) and not scale:
        misnamed = dict(misnamed_overrides(case.folder, family, manifest.name, home))
        if path in misnamed:
            raise ConfigError(display_path(path), None, misnamed[path])
        if path.name == overrides_name(family, manifest.name):
            resolve_case_config(case, vendor=manifest.name, run_overrides=[], hardware=manifest.hardware,
                                vendor_folder=home, check_vendor=installed)
            return f"vendor overrides of {name} (vendor {manifest.name}'s folder)"
    if scale and path.parent == folder:
        problem = scale_file_problem(path.name, family, manifest.name, str(manifest.hardware))
        if problem:
            raise ConfigError(display_path(path), None, problem)
        sizes = {"nnodes": int(scale.group(2)), "nproc_per_node": int(scale.group(3))}
        resolve_case_config(case, vendor=manifest.name, run_overrides=[(str(path), sizes)], hardware=scale.group(1),
                            vendor_folder=home, check_vendor=installed)
        return f"training scale overrides of {name} (vendor {manifest.name}'s folder)"
    if path.name in (adaptation.ENV_FILE, adaptation.REQUIREMENTS_FILE, adaptation.EXTERN_HOOKS_FILE,
                     adaptation.CSRC_SETUP):
        misplaced = misplaced_adaptation_file(path, folder, shown_from=home)
        if misplaced:
            raise ConfigError(display_path(path), None, misplaced)
        adaptation.read_adaptation(case.folder, name, case.family, manifest.name, home)
        return f"vendor {manifest.name}'s adaptation of {name} (in its folder)"
    entry = folder / path.relative_to(folder).parts[0]  # what vendor check names: the entry of the folder
    stray = stray_entry_problem(entry, family, manifest.name)
    if stray:
        raise ConfigError(display_path(entry), None, stray)
    if path.parent == folder and README_NAME.fullmatch(path.name):
        return _check_adaptation_readme(path, family, str(manifest.hardware), notes,
                                        f"vendor {manifest.name}'s adaptation of {name} (in its folder)")
    raise ConfigError(display_path(path), None, f"not a file `flagperf validate` reads: a vendor's folder of a case "
                      f"holds {overrides_name(family, manifest.name)}, {adaptation.ENV_FILE}, "
                      f"{adaptation.REQUIREMENTS_FILE}, {adaptation.CSRC_FOLDER}/{adaptation.CSRC_SETUP}, "
                      f"{adaptation.EXTERN_FOLDER}/{adaptation.EXTERN_HOOKS_FILE}, "
                      "config_<hw>x<nnodes>x<nproc>.yaml|.py and a README (README.md, README_CN.md ...: validate one "
                      "of those)")


def _check_case_vendors(case: CaseDef, notes: list[str]) -> None:
    """Each vendor's files of the case as a run with `--vendor <it>` reads them: its settings file (vendor/<vendor>.yaml
    or <vendor>_configurations.yaml, or the same name in the vendor folder's cases/<family>/<case>/), the training
    scale file of the case's default scale, and its adaptation folder, listed by vendor check's rules (every scale
    file read); every vendor's findings at once. Read, never imported nor run (the .py scale files are read as
    literals). A vendor not installed here has its files read all the same, but without what needs its vendor.yaml
    (its <hw>: each scale file is read with its own) and its engines (check_vendor=False)."""
    from flagperf.config.adaptation import VENDOR_CASES_FOLDER
    from flagperf.config.files import is_present
    from flagperf.config.models import check_name
    from flagperf.config.vendorlayout import overrides_vendor
    from flagperf.config.vendors import available_vendors
    from flagperf.paths import skipped_in_source

    problems: list[ConfigError] = []
    adapting: set[str] = set()
    vendors = case.folder / "vendor"
    unlisted = False
    try:
        entries = sorted(vendors.iterdir()) if os.path.isdir(vendors) else []
    except OSError as exc:
        entries, unlisted = [], True
        problems.append(ConfigError(display_path(vendors), None, f"cannot be listed: {exc.strerror or exc}"))
    for entry in entries:
        # An editor's lock link (.#nvidia.yaml), macOS's ._cpu.yaml, .ipynb_checkpoints/: none of the case's files,
        # by the source digest's rule; a run never looks for them.
        if skipped_in_source(entry.name):
            continue
        # os.path's, not Path's: a vendor/ that can be listed but not entered makes Path.is_dir raise
        if os.path.isdir(entry):
            name = entry.name  # its vendor/<vendor>/ folder
        elif entry.name.endswith((".yaml", ".yml")) or os.path.islink(entry):  # its settings file, by any name
            name = overrides_vendor(entry.name)
        else:
            continue
        try:
            check_name(name, "vendor")
        except ValueError as exc:
            problems.append(ConfigError(display_path(entry), None, f"never read: not a vendor name ({exc})"))
            continue
        adapting.add(name)
    homes = available_vendors()
    # and each vendor that keeps its files of the case in its own folder (cases/<family>/<case>/)
    adapting |= {name for name, home in homes.items()
                 if is_present(home / VENDOR_CASES_FOLDER / case.family / case.name)}
    for name in sorted(adapting):
        try:
            problems += _case_vendor_problems(case, name, homes, notes)
        except OSError as exc:  # a file or folder on the way that cannot be read (its mode): one line naming it
            where = Path(os.fsdecode(exc.filename)) if exc.filename is not None else vendors
            if not unlisted or vendors not in where.parents:  # an unlistable vendor/ is said once, above
                problems.append(ConfigError(display_path(where), None, f"cannot be read: {exc.strerror or exc}"))
    if problems:
        raise gathered(problems)


def _case_vendor_problems(case: CaseDef, name: str, homes: dict[str, Path], notes: list[str]) -> list[ConfigError]:
    """What _check_case_vendors finds in one vendor's files of the case; ``homes``: the vendors installed here."""
    from flagperf.config.adaptation import adaptation_place, read_adaptation
    from flagperf.config.cases import resolve_case_config
    from flagperf.config.vendorlayout import adaptation_listing, misnamed_overrides
    from flagperf.config.vendors import MANIFEST as VENDOR_MANIFEST
    from flagperf.config.vendors import load_vendor_manifest
    from flagperf.errors import nearest

    installed = name in homes
    hardware = None  # the vendor's <hw> picks its scale file, as in a run; without its manifest, its name
    if installed:
        with suppress(FlagperfError):  # a broken vendor.yaml is that file's error (validate it), not the case's
            hardware = str(load_vendor_manifest(homes[name] / VENDOR_MANIFEST).hardware)
    else:
        close = nearest(name, homes)
        typo = f"; did you mean {' or '.join(close)}?" if close else ""
        notes.append(f"{display_path(case.manifest_path)}: vendor {name} is not installed here (flagperf list "
                     "vendors): its settings file and every scale file of its folder of the case are read, each "
                     "scale file with its own <hw> (its vendor.yaml's hardware is not known here); not checked: "
                     f"what needs its vendor folder (its engines, implementations and toolkits){typo}")
    problems: list[ConfigError] = [ConfigError(display_path(file), None, why)
                                   for file, why in misnamed_overrides(case.folder, case.family, name)]  # never read
    try:
        resolve_case_config(case, vendor=name, run_overrides=[], hardware=hardware, check_vendor=installed)
    except ConfigError as exc:
        problems.append(exc)
    try:
        read_adaptation(case.folder, case.name, case.family, name)
    except ConfigError as exc:
        problems.append(exc)
    if installed and hardware is None:  # its vendor.yaml is broken: that file's error, its <hw> unknown
        return problems
    try:  # the vendor's folder of the case, listed as vendor check lists it
        place = adaptation_place(case.folder, name)
    except ConfigError:  # in both places: resolve_case_config said so
        return problems
    return problems + adaptation_listing(case, name, hardware, place, homes.get(name), check_vendor=installed)[1]


def _check_file(path: Path, notes: list[str]) -> str:
    # Each kind of file imports its own checks (the planner, FlagPerf training's reader: only where they are used).
    from flagperf.config.cases import load_case, load_case_manifest, resolve_case_config
    from flagperf.config.vendorlayout import vendor_cases_entry
    from flagperf.config.vendors import MANIFEST as VENDOR_MANIFEST
    from flagperf.config.vendors import available_vendors, load_vendor, load_vendor_manifest

    if not os.path.lexists(path):  # a file named by where it would be read from (vendor/<v>.yaml) is no file
        raise ConfigError(display_path(path), None, "file not found")
    plugin = _check_plugin_manifest(path)
    if plugin:
        return plugin
    if path.name == "case.yaml":
        manifest = load_case_manifest(path)
        case = load_case(manifest.name, {manifest.name: path.parent})
        resolve_case_config(case, vendor="", run_overrides=[])  # the defaults alone must be valid
        _check_case_vendors(case, notes)
        return "case"
    inference = _validate_inference_file(path)
    if inference:
        return inference
    if path.parent.name == "vendor" and (path.parent.parent / "case.yaml").is_file():
        from flagperf.config.vendorlayout import misnamed_overrides, overrides_vendor

        case_yaml = load_case_manifest(path.parent.parent / "case.yaml")
        misnamed = dict(misnamed_overrides(path.parent.parent, case_yaml.family, overrides_vendor(path.name)))
        if path in misnamed:
            raise ConfigError(display_path(path), None, misnamed[path])
        if path.suffix != ".yaml":
            raise ConfigError(display_path(path), None, "vendor override files are named <vendor>.yaml; "
                                                        "this one would never be read")
        case_dir = path.parent.parent
        manifest = load_case_manifest(case_dir / "case.yaml")
        case = load_case(manifest.name, {manifest.name: case_dir})
        resolve_case_config(case, vendor=path.stem, run_overrides=[])
        return f"vendor overrides of {manifest.name}"
    if path.name == "config_common.py" and ((path.parent.parent.name == "vendor" and (
            path.parent.parent.parent / "case.yaml").is_file()) or vendor_cases_entry(path.parent)):
        # read only through the scale files beside it
        beside = sorted(p for p in path.parent.glob("config_*.py") if re.fullmatch(r"config_.+x\d+x\d+\.py", p.name))
        if not beside:
            raise ConfigError(display_path(path), None, "never read: no config_<hw>x<nnodes>x<nproc>.py beside it "
                                                        "(it is read through their `from config_common import *`)")
        return "; ".join(_check_file(scale_path, notes) for scale_path in beside) + ", with config_common.py"
    scale = re.fullmatch(r"config_([A-Za-z0-9_.-]+)x(\d+)x(\d+)\.(yaml|py)", path.name)
    kept = vendor_cases_entry(path.parent) or vendor_cases_entry(path.parent.parent) \
        or vendor_cases_entry(path.parent.parent.parent)  # a file of a vendor's own folder of a case
    if kept is not None:
        return _check_vendor_kept_file(path, kept, scale, notes)
    if scale and path.parent.parent.name == "vendor" and (path.parent.parent.parent / "case.yaml").is_file():
        case_dir = path.parent.parent.parent
        manifest = load_case_manifest(case_dir / "case.yaml")
        case = load_case(manifest.name, {manifest.name: case_dir})
        sizes = {"nnodes": int(scale.group(2)), "nproc_per_node": int(scale.group(3))}
        if path.parent.name in available_vendors():  # a scale file of another <hw> than the vendor's is never read
            from flagperf.config.vendorlayout import scale_file_problem

            hardware = str(load_vendor(path.parent.name).manifest.hardware)
            problem = scale_file_problem(path.name, manifest.family, path.parent.name, hardware)
            if problem:
                raise ConfigError(display_path(path), None, problem)
        resolve_case_config(case, vendor=path.parent.name, run_overrides=[(str(path), sizes)],
                            hardware=scale.group(1))
        return f"training scale overrides of {manifest.name}"
    from flagperf.config.vendorlayout import CASE_FILES

    adapted = next((parent for parent in path.parents[:3] if parent.parent.name == "vendor"
                    and any((parent.parent.parent / name).is_file() for name in CASE_FILES)), None)
    if adapted is not None:  # a file of the case's vendor/<vendor>/ folder (or below it)
        from flagperf.config import adaptation
        from flagperf.config.vendorlayout import misplaced_adaptation_file, stray_entry_problem
        from flagperf.hosts.vendorcheck import README_NAME

        case_dir = adapted.parent.parent
        case = load_case(case_dir.name, {case_dir.name: case_dir})
        if path.name in (adaptation.ENV_FILE, adaptation.REQUIREMENTS_FILE, adaptation.EXTERN_HOOKS_FILE,
                         adaptation.CSRC_SETUP):
            misplaced = misplaced_adaptation_file(path, adapted)
            if misplaced:
                raise ConfigError(display_path(path), None, misplaced)
            # a file of a vendor's adaptation: the whole folder is read
            adaptation.read_adaptation(case_dir, case.name, case.family, adapted.name)
            return f"vendor {adapted.name}'s adaptation of {case.name}"
        entry = adapted / path.relative_to(adapted).parts[0]  # what vendor check names: the entry of the folder
        stray = stray_entry_problem(entry, case.family, adapted.name)
        if stray:
            raise ConfigError(display_path(entry), None, stray)
        if path.parent == adapted and README_NAME.fullmatch(path.name):
            vendors = available_vendors()  # its scale files are those of the vendor's <hw>
            hardware = str(load_vendor(adapted.name).manifest.hardware) if adapted.name in vendors else None
            return _check_adaptation_readme(path, case.family, hardware, notes,
                                            f"vendor {adapted.name}'s adaptation of {case.name}")
    if path.name == "datasheets.yaml" and (path.parent / VENDOR_MANIFEST).is_file():
        from flagperf.hosts.vendorcheck import datasheet_findings

        found = datasheet_findings(path.parent)  # read, as vendor check reads it; spec.py, which uses it, is not run
        if found:
            raise gathered(found)
        return "vendor datasheets"
    if path.name == VENDOR_MANIFEST:
        from flagperf.config.adaptation import vendor_folder_links
        from flagperf.hosts.vendorcheck import links_out_of_vendor_folder

        manifest = load_vendor_manifest(path)
        _refuse_shadowed(path, path.parent, manifest.name)
        # By an absolute path, or relative and out of the folder (the round's own scan of it refuses those).
        links = vendor_folder_links(path.parent) + links_out_of_vendor_folder(path.parent)
        if links:  # each one line; a run would meet it only in a round's container, which has the folder elsewhere
            raise gathered(links)
        return "vendor"
    located = _packages_dockerfile(path)
    if located is not None:
        return _check_packages_file(*located, notes)
    image = _image_file_dockerfile(path)
    if image is not None:  # a Dockerfile vendor check checks, or an install script beside one
        what = (f"vendor image {display_path(image[1])}" if Path(os.path.abspath(path)) == image[1] else
                f"install script of {display_path(image[1])}")
        return _check_packages_file(*image, notes, what=what)
    if path.match("*install*.sh") or _dockerfile_name(path.name):  # no YAML: read as one, it says nothing
        raise ConfigError(display_path(path), None, _image_file_without_vendor(path))
    if path.suffix == ".py":  # FlagPerf training's test_conf.py, or its cluster_conf.py: checked together
        from flagperf.config.plan import plan_run
        from flagperf.hosts.flagperf_training import CLUSTER_CONF, load_training_conf

        test_conf = path.with_name("test_conf.py") if path.name == CLUSTER_CONF else path
        inv = load_training_conf(test_conf)
        notes += inv.notes
        # Planned as run plans it: the cases' scale files (config_<hw>x<n>x<p>.py) and adaptations are read too.
        plan_run(cases=list(inv.cases), vendor=inv.resolve_vendor(None), rounds=inv.rounds,
                 results_dir=Path("/nonexistent-results-for-validation"),
                 hosts=[spec.model_dump(mode="json") for spec in inv.hosts], inventory_overrides=inv.case_overrides,
                 inventory_source=inv.source, inventory_endpoints=inv.endpoints)
        if inv.results_dir:  # checked as run checks it, by writing there; what this made is removed again
            folder = Path(inv.results_dir)
            with _noted_only():
                remove_made(folder, _make_results_folder(folder, display_path(test_conf), "FLAGPERF_LOG_PATH"))
        return f"FlagPerf training test_conf.py + cluster_conf.py, {len(inv.hosts)} host(s)"
    from flagperf.config.models import looks_like_suite
    from flagperf.config.yamlio import load_yaml_mapping

    data = load_yaml_mapping(path)
    if looks_like_suite(data):
        from flagperf.config.plan import plan_run

        plan_run(suite=str(path), results_dir=Path("/nonexistent-results-for-validation"))
        return "suite"
    if "hosts" in data or "HOSTS" in data:
        from flagperf.hosts.inventory import load_inventory

        inv = load_inventory(path)
        notes += inv.notes
        if inv.results_dir:  # checked as run checks it, by writing there; what this made is removed again
            folder = Path(inv.results_dir)
            with _noted_only():
                remove_made(folder, _make_results_folder(folder, display_path(path), "FLAGPERF_LOG_PATH"))
        return f"{'FlagPerf host.yaml' if 'HOSTS' in data else 'inventory'}, {len(inv.hosts)} host(s)"
    raise ConfigError(display_path(path), None, "not a case.yaml, vendor/<vendor>.yaml, vendor.yaml, engine.yaml, "
                                                "toolkit.yaml, suite, inventory or host.yaml file")


def _check_adaptation_readme(readme: Path, family: str, hardware: str | None, notes: list[str], what: str) -> str:
    """A README of a vendor's folder of a case: each scale file of the vendor's <hw> it names is in the folder, as
    vendor check says (the same function); only a training case's folder has scale files."""
    from flagperf.hosts.vendorcheck import Findings, readme_scale_findings

    if family != "training":
        return f"README of {what} (a {family} case reads no scale files: nothing in it to check)"
    if hardware is None:  # the vendor is not installed here: whose <hw> its names are is unknown
        notes.append(f"{display_path(readme)}: the scale files it names are not checked (no vendor "
                     f"{readme.parent.name} here to say its hardware)")
        return f"README of {what}"
    found = Findings()
    errors = readme_scale_findings(readme.parent, hardware, found, only=readme)
    notes += found.notes + found.not_checkable
    if errors:
        raise gathered(errors)
    return f"README of {what}"


def _packages_dockerfile(path: Path) -> tuple[Path, Path] | None:
    """(the vendor folder, the Dockerfile) whose packages/ folder (FlagPerf's, beside it) ``path`` lies in: the vendor
    folder is the first one up with vendor.yaml, and the Dockerfile one vendor check checks (container.dockerfile or
    a <framework>/Dockerfile); None for any other file."""
    from flagperf.config.files import is_present
    from flagperf.config.vendors import load_vendor_manifest
    from flagperf.hosts.vendorcheck import PACKAGES_FOLDER, image_dockerfiles
    from flagperf.paths import VENDOR_MANIFEST

    given = Path(os.path.abspath(path))  # as written: a link's own place, not where it leads
    if PACKAGES_FOLDER not in given.parent.parts:
        return None  # no packages/ folder on the way: no manifest is read
    home = next((folder for folder in given.parents if is_present(folder / VENDOR_MANIFEST)), None)
    if home is None:
        return None
    manifest = load_vendor_manifest(home / VENDOR_MANIFEST)
    for dockerfile in image_dockerfiles(home, manifest.container.dockerfile):
        if dockerfile.parent / PACKAGES_FOLDER in given.parents:
            return home, dockerfile
    return None


def _image_file_dockerfile(path: Path) -> tuple[Path, Path] | None:
    """(the vendor folder, the Dockerfile) where ``path`` is a Dockerfile vendor check checks (container.dockerfile or
    a <framework>/Dockerfile) or an install script beside one (*install*.sh); None for any other file. The vendor
    folder is the first one up with vendor.yaml; no manifest is read for a file of neither name."""
    from flagperf.config.files import is_present
    from flagperf.config.vendors import load_vendor_manifest
    from flagperf.hosts.vendorcheck import image_dockerfiles
    from flagperf.paths import VENDOR_MANIFEST

    given = Path(os.path.abspath(path))  # as written: a link's own place, not where it leads
    script = given.match("*install*.sh")
    if not script and not _dockerfile_name(given.name):
        return None
    home = next((folder for folder in given.parents if is_present(folder / VENDOR_MANIFEST)), None)
    if home is None:
        return None
    manifest = load_vendor_manifest(home / VENDOR_MANIFEST)
    for dockerfile in image_dockerfiles(home, manifest.container.dockerfile):
        if given == dockerfile or (script and given.parent == dockerfile.parent):
            return home, dockerfile
    return None


# A Dockerfile's name: Dockerfile, Dockerfile.dev, cuda.Dockerfile (any case); not dockerfiles.yaml, nor a page or a
# script about one (Dockerfile.md, dockerfile.py).
DOCKERFILE_NAME = re.compile(r"(?:.+\.)?dockerfile(?:\.(?!(?:ya?ml|json|md|rst|txt|py|sh)$)[^.]+)*", re.IGNORECASE)


def _dockerfile_name(name: str) -> bool:
    return DOCKERFILE_NAME.fullmatch(name) is not None


def _image_file_without_vendor(path: Path) -> str:
    """Why a Dockerfile or an install script _image_file_dockerfile found no vendor image for is not checked: it is
    checked with its vendor folder, which it has none of, or it is none of the Dockerfiles vendor check checks."""
    from flagperf.config.files import is_present
    from flagperf.paths import VENDOR_MANIFEST

    given = Path(os.path.abspath(path))
    home = next((folder for folder in given.parents if is_present(folder / VENDOR_MANIFEST)), None)
    kind = "an install script" if given.match("*install*.sh") else "a Dockerfile"
    if home is None:
        return (f"{kind} is checked with its vendor folder, and no folder above it has {VENDOR_MANIFEST}: "
                "`flagperf vendor check <folder>` checks the folder once it has one")
    from flagperf.config.vendors import load_vendor_manifest

    built = (f"vendor check builds {display_path(home)}'s container.dockerfile "
             f"({load_vendor_manifest(home / VENDOR_MANIFEST).container.dockerfile}) and each <framework>/Dockerfile")
    if kind == "an install script":
        return (f"an install script beside none of the Dockerfiles {built}: put it beside the Dockerfile that runs it, "
                "or point container.dockerfile at the Dockerfile beside it")
    return f"not a Dockerfile {built}: if it is the vendor's image, point container.dockerfile at it"


def _check_packages_file(home: Path, dockerfile: Path, notes: list[str], what: str | None = None) -> str:
    """A file of a Dockerfile's packages/ folder: first the links of the build context (by an absolute path, or out
    of the vendor folder: each one line, never read through), then what vendor check says of packages/. ``what``: the
    file is the Dockerfile itself, or an install script beside it ("install script of ..."): then all vendor check
    says of that Dockerfile (its FROM line, its install step and copied files, an install script it never runs)."""
    from flagperf.config.adaptation import absolute_links
    from flagperf.hosts.vendorcheck import Findings, dockerfile_findings, links_out_of_vendor_folder, packages_findings

    context = os.path.relpath(dockerfile.parent, home)
    if context == os.curdir:  # container.dockerfile at the top: the build context is the whole vendor folder
        links = absolute_links(home, None, tuple(sorted(os.listdir(home)))) + links_out_of_vendor_folder(home)
    else:
        links = absolute_links(home, dockerfile.parent, (Path(context).parts[0],)) + links_out_of_vendor_folder(
            home, context)
    if links:
        raise gathered(links)
    found = Findings()
    # what vendor check says of packages/ (of a file there; the Dockerfile's rest is the Dockerfile's own check)
    errors = packages_findings(dockerfile, found) if what is None else dockerfile_findings(dockerfile, found)
    notes += found.notes + found.not_checkable
    if errors:
        raise gathered(errors)
    return f"file of the packages/ folder of {display_path(dockerfile)}" if what is None else what


def _check_plugin_manifest(path: Path) -> str | None:
    """A vendor's plug-in manifest, checked as a run checks it, importing, building and running nothing: an engine's
    engine.yaml (<vendor>/<family folder>/<engine>/, by its family's model) or a toolkit's toolkit.yaml
    (<vendor>/toolkits/<toolkit>/); None for any other file."""
    from flagperf.basespec.toolkit import TOOLKIT_FILE, load_toolkit_manifest
    from flagperf.config.adaptation import absolute_links
    from flagperf.config.engines import ENGINE_MANIFEST, INFERENCE_ENGINES, EngineManifest, checked_engine_manifest
    from flagperf.generate.engines import ENGINES_FOLDER as GENERATE_ENGINES
    from flagperf.generate.engines import EngineManifest as GenerateManifest
    from flagperf.inference.engines import EngineManifest as InferenceManifest
    from flagperf.operation.manifest import IMPLEMENTATIONS_FOLDER, ImplementationManifest
    from flagperf.paths import VENDOR_MANIFEST

    where = path.parent.parent
    if path.name in (ENGINE_MANIFEST, TOOLKIT_FILE):  # the round's link scan (imported where it is used)
        from flagperf.hosts.vendorcheck import links_out_of_vendor_folder

        if ".." in path.parts:  # toolkits/../toolkit.yaml: the folder names it is judged by are not its own
            raise ConfigError(display_path(path), None, f"give its path without '..': a run reads <vendor>/<family "
                              f"folder>/<name>/{path.name}, and these folder names are what it is checked by")
    if path.name == ENGINE_MANIFEST:
        # Each family's engine folder and its manifest (the families' own constants and models, none needing torch).
        families: dict[str, tuple[str, type[EngineManifest]]] = {
            INFERENCE_ENGINES: ("inference", InferenceManifest), GENERATE_ENGINES: ("generate", GenerateManifest),
            IMPLEMENTATIONS_FOLDER: ("operation", ImplementationManifest)}
        if where.name not in families:
            raise ConfigError(display_path(path), None, f"never read: an engine's {ENGINE_MANIFEST} is <vendor>/"
                              f"<family folder>/<engine>/{ENGINE_MANIFEST}, its family folder one of "
                              f"{', '.join(sorted(families))} (this one is in {where.name!r})")
        if os.path.lexists(where.parent / VENDOR_MANIFEST):  # a copy of the vendor, shadowed or the one read; a
            _refuse_shadowed(path, where.parent, where.parent.name)  # folder without vendor.yaml only adds engines
        family, model = families[where.name]
        manifest = checked_engine_manifest(path.parent, model)
        links = absolute_links(where.parent, parts=[f"{where.name}/{path.parent.name}"]) + \
            links_out_of_vendor_folder(where.parent, f"{where.name}/{path.parent.name}")
        if links:  # as a vendor.yaml's check: a round's container has the engine folder at another path
            raise gathered(links)
        return f"{family} engine {manifest.name} of vendor {where.parent.name}"
    if path.name == TOOLKIT_FILE:
        if where.name != "toolkits":
            raise ConfigError(display_path(path), None, f"never read: a toolkit's {TOOLKIT_FILE} is <vendor>/toolkits/"
                              f"<toolkit>/{TOOLKIT_FILE} (this one is in {where.name!r})")
        if not os.path.lexists(where.parent / VENDOR_MANIFEST):  # find_toolkit looks in the vendor's own folder only
            raise ConfigError(display_path(path), None, f"never read: a run reads toolkits from its vendor's own "
                              f"folder, the first of the name with a {VENDOR_MANIFEST}; {display_path(where.parent)} "
                              f"has none (a folder without one only adds engines): move the toolkit there")
        _refuse_shadowed(path, where.parent, where.parent.name)
        toolkit = load_toolkit_manifest(path, where.parent)
        links = absolute_links(where.parent, parts=[f"{where.name}/{path.parent.name}"]) + \
            links_out_of_vendor_folder(where.parent, f"{where.name}/{path.parent.name}")
        if links:  # as an engine's
            raise gathered(links)
        return f"toolkit {toolkit.name} of vendor {where.parent.name}, provides {toolkit.provides}"
    return None


def _validate_inference_file(path: Path) -> str | None:
    """FlagPerf's inference files: configurations.yaml, parameters.yaml, vendor/<vendor>_configurations.yaml."""
    from flagperf.config.cases import INFERENCE_FILES, load_case, resolve_case_config

    if path.name in INFERENCE_FILES and path.parent.parent.name == "inference":
        case = load_case(path.parent.name, {path.parent.name: path.parent})
        resolve_case_config(case, vendor="", run_overrides=[])  # the defaults alone must be valid
        return f"inference case {case.name}"
    if path.parent.name == "vendor" and (path.parent.parent / INFERENCE_FILES[0]).is_file() \
            and not path.name.endswith("_configurations.yaml"):
        from flagperf.config.vendorlayout import overrides_name

        raise ConfigError(display_path(path), None, "never read: the vendor overrides of inference cases are "
                          f"vendor/{overrides_name('inference', '<vendor>')}")
    if (path.parent.name == "vendor" and path.name.endswith("_configurations.yaml")
            and (path.parent.parent / INFERENCE_FILES[0]).is_file()):
        case_dir = path.parent.parent
        case = load_case(case_dir.name, {case_dir.name: case_dir})
        resolve_case_config(case, vendor=path.name.removesuffix("_configurations.yaml"), run_overrides=[])
        return f"vendor overrides of {case.name}"
    return None


@app.command()
@_own_handler
def validate(files: Annotated[list[Path], typer.Argument(help="config files to check")]) -> None:
    """Check config files (suites, case.yaml, vendor overrides, vendor.yaml, an engine's engine.yaml, a toolkit's
    toolkit.yaml, inventories) without running anything: a case's module is read, not imported (its Config is
    rebuilt from the source; the case's own validators run when it runs), an engine's module is found, not
    imported, and only regular files inside their folders are read."""
    from flagperf.config.adaptation import next_checked_file, one_cut_line_per_check
    from flagperf.config.casecode import case_code_not_run

    bad = checked = 0
    # Also between files (as one's line is printed): the count is of the files checked so far. A vendor folder whose
    # link walk stops short is said so once, by the first file whose check walks it.
    with _if_interrupted(lambda: f"interrupted after checking {checked} of {len(files)} files; nothing was written"), \
            one_cut_line_per_check():
        for path in files:
            next_checked_file()
            try:
                with case_code_not_run():
                    kind = _validate_file(path)
            except FlagperfError as exc:
                bad, checked = bad + 1, checked + 1
                for finding in findings(exc):  # every finding of the file, each its own line
                    err_console.print(f"[red]error[/] {escape(str(finding))}", highlight=False, soft_wrap=True)
                if more := left_out_line(exc):
                    err_console.print(f"[red]error[/] {escape(str(path))}: {more}", highlight=False, soft_wrap=True)
            else:
                checked += 1
                console.print(f"[green]ok[/]    {escape(str(path))} ({kind})", highlight=False, soft_wrap=True)
    if bad:
        raise typer.Exit(EXIT_BAD_INPUT)


@app.command("list")
@_own_handler
def list_(what: Annotated[str, typer.Argument(help="cases, vendors, suites or all")] = "all") -> None:
    """List cases, vendors and suites."""
    from flagperf.config.cases import available_cases, load_case
    from flagperf.config.plan import available_suites
    from flagperf.config.vendors import available_vendors, load_vendor

    if what not in ("all", "cases", "vendors", "suites"):
        raise _fail(f"list {what!r}: choose cases, vendors, suites or all")
    try:
        if what in ("all", "cases"):
            table = Table("case", "family", "peak", "description", title="cases", title_justify="left")
            for name in sorted(available_cases()):
                m = load_case(name).manifest
                table.add_row(name, m.family, m.peak or "-", m.description.strip())
            console.print(table)
        if what in ("all", "vendors"):
            table = Table("vendor", "torch device", "monitors", "description", title="vendors", title_justify="left")
            for name in sorted(available_vendors()):
                m = load_vendor(name).manifest
                table.add_row(name, m.torch_device, ", ".join(e.name for e in m.monitors) or "-", m.description.strip())
            console.print(table)
        if what in ("all", "suites"):
            from flagperf.config.models import load_suite

            table = Table("suite", "rounds", "cases", "description", title="suites", title_justify="left")
            for name, path in sorted(available_suites().items()):
                s = load_suite(path)
                table.add_row(name, str(s.rounds), ", ".join(s.cases), s.description.strip())
            console.print(table)
    except FlagperfError as exc:
        raise _fail(str(exc)) from None


vendor_app = typer.Typer(cls=_ShortHelps, help="Start and check a vendor folder (FlagPerf's vendor guide).",
                         no_args_is_help=True)
app.add_typer(vendor_app, name="vendor")


@vendor_app.command("check")
@_own_handler
def vendor_check(folder: Annotated[Path, typer.Argument(help="a vendor folder, e.g. vendor_images/<vendor>, or a "
                                                         "vendor's name as --vendor takes it")]) -> None:
    """Check a vendor folder: manifest, Dockerfile and install step, each monitor run for a few seconds (or
    reported not checkable here), the peak table and its sources, and every case adaptation's forbidden
    changes. One line per finding; exit 1 when there is a problem."""
    from flagperf.hosts.vendorcheck import check_vendor_folder, resolve_vendor_argument, summary_lines

    try:
        found = check_vendor_folder(resolve_vendor_argument(folder))
    except FlagperfError as exc:
        raise _fail(str(exc)) from None
    colours = {"ok": "green", "not checkable here": "yellow", "note": "yellow", "problem": "red"}
    for kind, line in summary_lines(found):
        console.print(f"[{colours[kind]}]{kind}[/] {escape(line)}", highlight=False, soft_wrap=True)
    if found.problems:
        raise typer.Exit(EXIT_FAILED)


@vendor_app.command("new")
@_own_handler
def vendor_new(name: Annotated[str, typer.Argument(help="the vendor's name (its folder's, and --vendor's)")],
               torch_device: Annotated[str, typer.Option(help="torch's device type for the chip")] = "cpu",
               into: Annotated[Path | None, typer.Option(help="the folder to write <name>/ in (default: the "
                                                               "project's vendor_images/)")] = None) -> None:
    """Write a commented vendor folder (vendor.yaml, spec.py, a monitor, pytorch/Dockerfile with its install
    script, README.md) that passes `flagperf vendor check`; fill in what is marked TODO."""
    from flagperf.config.vendors import MANIFEST as VENDOR_MANIFEST
    from flagperf.config.vendors import available_vendors, vendor_folders
    from flagperf.hosts.vendorscaffold import write_vendor_folder
    from flagperf.paths import PROJECT_ROOT, vendor_roots

    root = into if into is not None else PROJECT_ROOT / "vendor_images"
    there_before = (root / name).exists() or (root / name).is_symlink()  # refused: never written over
    own = vendor_roots()[0] / name
    if into is not None and not there_before and vendor_folders(name)[:1] == [own] \
            and own.resolve() != (root / name).resolve():
        # The project's vendor_images/ comes first on the search path: a folder of its name elsewhere is never read.
        raise _fail(f"vendor new: {name} is the project's vendor ({display_path(own)}), which --vendor {name} always "
                    "finds first: a folder of that name elsewhere would never be read; choose another name (nothing "
                    "was written)")

    def said() -> str:  # written whole (renamed into place), or not at all
        whole = root / name
        if not there_before and (whole / VENDOR_MANIFEST).is_file():
            return f"interrupted once {display_path(whole)} was written whole"
        return "interrupted; nothing was written"

    try:
        with _if_interrupted(said):
            folder = write_vendor_folder(root, name, torch_device)
    except FlagperfError as exc:
        raise _fail(str(exc)) from None
    with _if_interrupted(said):
        found = available_vendors().get(name)
        where = "" if found is not None and found.resolve() == folder.resolve() else (
            f"; put {escape(display_path(folder.parent))} on FLAGPERF_VENDOR_PATH so that --vendor {name} finds it"
            + (f" (before {escape(display_path(found.parent))}: --vendor {name} now finds "
               f"{escape(display_path(found))})" if found is not None else ""))
        console.print(f"wrote {escape(display_path(folder))}{where}; next: fill in what is marked TODO (README.md "
                      f"says where a case's files go), then `flagperf vendor check {escape(display_path(folder))}` "
                      "(docs/vendor-guide.md)", highlight=False, soft_wrap=True)


def main() -> None:
    app()



if __name__ == "__main__":
    main()
