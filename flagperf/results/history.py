"""A history of runs for baselines and regression verdicts.

SQLite by default (FLAGPERF_HISTORY_URL unset: results/history.sqlite); any SQLAlchemy URL otherwise,
e.g. postgresql+psycopg://user@host/flagperf for a team (the `postgres` extra; the password from PGPASSWORD
or ~/.pgpass, never the URL). The server's own postgresql+asyncpg:// URL (and a plain postgresql://) is read
with psycopg, since the history is written synchronously.

Verdict for one figure of a run, against the same case, metric, vendor and device, judged on the log scale
(figures are positive rates and durations, whose changes are ratios):
  baseline  = median of the last K earlier runs that measured it (K = baseline_runs)
  noise     = sqrt(history_spread^2 + run_spread^2): the standard deviation of ln(value) over those runs, and
              this run's own round-to-round spread (its coefficient of variation cv as a log spread,
              sqrt(ln(1 + cv^2)))
  threshold = max(sigma * noise, floor), on ln(value / baseline)
  band      = baseline * exp(-threshold) .. baseline * exp(threshold); a regression when the figure leaves it
              the wrong way (rates and capacities should rise, durations and losses fall)
  change    = value / baseline - 1, as it is shown.
So a metric that is noisy needs a larger drop to raise an alarm, a steady one flags a real 5 % drop, and a
rate and a duration are judged alike: halving a rate is as far from its baseline as doubling a duration,
and no spread makes a drop impossible to flag (on a linear scale a spread over a third did: a rate cannot
fall more than 100 %); a figure that falls to zero (a goodput no request met) is as far below as it gets.
A figure whose history is zero or negative somewhere is judged on the linear scale instead
((value - baseline) / |baseline| against sigma times the linear spreads): the verdict's ``scale`` says which.

The baseline's runs are the earlier completed runs of the same *workload*: the case's configuration (a digest of the
rounds' config, less the keys that only label a figure: ``PRESENTATION_KEYS``) must match, so a night whose case was
configured differently (a --set that halves the work) is not judged against nights that measured something else; it
is marked ``new-workload`` (naming the keys that changed) until it has a baseline of its own. A failed night is
recorded as such (``record_failed_night``), with no figures: it is shown as a failure in the trends and never
becomes a baseline, so the next good night is judged against the good ones before it. A night the operator stopped
while it measured is recorded as interrupted (``record_interrupted_night``), also without figures and never a
baseline: the trends tell it from a failed night and from a night that never ran. One stopped once it was measured
(while it was recorded, judged or published) keeps its measurement: it is recorded with its figures like any night
(``record_run`` keeping a record made before). Each verdict names what changed in the run's setting (code, image,
libraries, hosts, the vendor's settings) since the newest run of its baseline: the likely cause of a change.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import sqlite3
import statistics
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import (
    Column,
    DateTime,
    Engine,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    delete,
    event,
    false,
    func,
    insert,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from flagperf.errors import ConfigError, FlagperfError, require
from flagperf.paths import HISTORY_FILE, SQLITE_JOURNALS
from flagperf.results.bounded import read_json_file
from flagperf.results.summary import WITHIN_ROUND, load_results, summarize

DEFAULT_URL_ENV = "FLAGPERF_HISTORY_URL"

metadata = MetaData()
runs = Table(
    "runs", metadata,
    Column("run_id", String(128), primary_key=True),
    Column("recorded_at", DateTime(timezone=True), nullable=False),
    Column("vendor", String(64)),
    Column("device", String(256)),
    Column("suite", String(128)),
    Column("git_revision", String(64)),
    Column("counts", Text),
    Column("outcome", String(16)),  # completed | failed | interrupted (None: from before outcomes; completed)
    Column("reason", Text),  # why a failed night failed, or what interrupted one
    Column("setting", Text),  # JSON: what the run ran on and with (run_setting), to name what changed
)
COMPLETED, FAILED, INTERRUPTED = "completed", "failed", "interrupted"
NO_FIGURES = (FAILED, INTERRUPTED)  # nights recorded without figures: shown in the trends, never a baseline
figures = Table(
    "figures", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(128), ForeignKey("runs.run_id", ondelete="CASCADE"), nullable=False, index=True),
    Column("case", String(128), nullable=False),
    Column("metric", String(128), nullable=False),
    Column("unit", String(32)),
    Column("value", Float, nullable=False),
    Column("spread_cv", Float),
    Column("rounds", Integer),
    Column("workload", String(64)),  # digest of the case's configuration: figures of one workload are comparable
    Column("config", Text),  # JSON: that configuration, to say which keys changed
)


def resolved_url(url: str | None = None, results_dir: str | Path = "results") -> str:
    """The history's URL: ``url``, else FLAGPERF_HISTORY_URL, else history.sqlite in the results folder."""
    return url or os.environ.get(DEFAULT_URL_ENV) or f"sqlite:///{Path(results_dir).resolve() / HISTORY_FILE}"


def sqlite_files(url: str | None = None, results_dir: str | Path = "results") -> list[Path]:
    """The files a SQLite history is kept in (the database and its journals); none for a database server."""
    try:
        parsed = make_url(resolved_url(url, results_dir))
    except (ArgumentError, ValueError):  # ValueError: a port that is no number (_checked_url refuses both)
        return []
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return []
    database = Path(parsed.database)
    return [database, *(database.with_name(database.name + suffix) for suffix in SQLITE_JOURNALS)]


def recorded_runs(engine: Engine) -> int:
    """How many runs (nights, failed ones included) the history holds."""
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(runs)).scalar_one())


def _checked_url(url: str | None, results_dir: str | Path) -> str:
    """The history's URL, refused (ConfigError) where it is none or holds a password."""
    url = resolved_url(url, results_dir)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is no number; its text could quote the URL
        raise ConfigError("history_url", None, "not a database URL (postgresql+psycopg://user@host/db or "
                                               "sqlite:///path)") from None
    if parsed.password is not None:  # a flow parameter is stored by Prefect, and run settings end up in files
        raise ConfigError("history_url", None, "holds a password: give it through PGPASSWORD or ~/.pgpass instead")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:  # else a connection error after the night
        raise ConfigError("history_url", None, f"port {parsed.port} is out of range (1-65535)")
    return url


def not_a_file(files: list[Path], option: str = "history_url") -> None:
    """A SQLite history (``files``, sqlite_files') that is there but no regular file is refused (ConfigError): a
    folder is an I/O error to SQLite, a FIFO blocks or fails, /dev/zero reads as an empty database that a night
    would then write to, and a reader would take any of them for no history at all."""
    if files and os.path.lexists(files[0]) and not is_history_file(files[0]) and not link_to_nothing(files[0]):
        raise ConfigError(option, None, f"{files[0]}: not a regular file, so not a SQLite database")


def is_history_file(path: Path) -> bool:
    """Whether the SQLite history ``path`` is a regular file (following links; a link to nothing or a loop is not);
    FlagperfError, one line naming it and why, where it cannot be looked at (Path.is_file lets EACCES through: a link
    into a folder this user cannot enter), which the site's trends page says as a 503, the CLI as its error line."""
    try:
        return path.is_file()
    except OSError as exc:
        target = os.path.realpath(path)  # where the refusal lies: the link's target, not the link
        there = f" (a link to {target})" if target != os.path.abspath(path) else ""
        raise FlagperfError(f"the history {path}{there} cannot be read: {exc.strerror or exc}") from None


def link_to_nothing(path: Path) -> bool:
    """A symbolic link whose target is not there (yet): a history prepared before the first night, whose target
    SQLite makes as it makes a file that is not there. A loop, or a target that cannot be looked at, is not one."""
    if not path.is_symlink():
        return False
    try:
        path.stat()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def check_history(url: str | None = None, results_dir: str | Path = "results") -> None:
    """The history a night will write, checked before the night without writing one: a bad URL is a ConfigError;
    a database server, or a SQLite file that is there, is opened and read (SQLAlchemyError or OSError where it cannot
    be), never changed: its tables are made, or an earlier version's given their new columns, when a night records,
    so a night refused before then leaves it as it was. A SQLite file not there yet is not made (the night makes it
    when it records, so a night refused before then leaves none): only where it would be made is checked, the
    nearest folder there of its path, which must be a folder this user can write (else an OSError naming it); for a
    link to nothing yet (link_to_nothing), its target's folder. A SQLite file that cannot be looked at (a link into a
    folder this user cannot enter) is a FlagperfError naming it (is_history_file)."""
    url_checked = _checked_url(url, results_dir)
    files = sqlite_files(url, results_dir)
    not_a_file(files)
    if not files or (os.path.lexists(files[0]) and not link_to_nothing(files[0])):
        engine = _engine(url_checked)
        try:
            with engine.connect() as conn:  # a file that is no database, a server that refuses the user: said now
                inspect(conn).get_table_names()
        except DatabaseError as exc:
            if files and "not a database" in str(exc.orig):  # a file of the user's given by mistake
                raise ConfigError("history_url", None, f"{files[0]}: not a SQLite database") from None
            raise
        finally:
            engine.dispose()
        return
    if link_to_nothing(files[0]):  # SQLite makes the link's target, in its folder, which nothing makes
        there = Path(os.path.realpath(files[0])).parent
        if not there.is_dir():
            raise FileNotFoundError(errno.ENOENT, f"not a folder, so {files[0]}'s target cannot be made there",
                                    str(there))
    else:
        there = next(folder for folder in files[0].parents if os.path.lexists(folder))
    if not there.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a folder, so the history cannot be made below it", str(there))
    if not os.access(there, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "not writable, so the history cannot be made there", str(there))


def history_engine(url: str | None = None, results_dir: str | Path = "results") -> Engine:
    """The history, made where it is not yet and given the tables and columns of this version: the writer's (a night
    recording it). A reader opens it with history_reader, which makes and changes nothing."""
    url = _checked_url(url, results_dir)
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    engine = _engine(url)
    metadata.create_all(engine)
    _add_new_columns(engine)
    return engine


def history_reader(url: str | None = None, results_dir: str | Path = "results") -> Engine | None:
    """The history opened to read it (the results site's trends, `flagperf diagnose --history`), never made or
    changed: a SQLite file is opened read-only (None where there is no such file yet), a database server in
    read-only transactions (its server refuses any write). Before reading, history_found says whether it has its
    tables yet: only a night that records makes them (history_engine). A SQLite file that is a link (or in a folder
    that is one) is read at its target, wherever that is: the night writes through the link (a history prepared as
    one before the first night: link_to_nothing), so its reader reads what it wrote; a link to nothing is none yet."""
    url = _checked_url(url, results_dir)
    files = sqlite_files(url, results_dir)
    if files:
        if not is_history_file(files[0]):  # follows links: a link to nothing (or a loop) is no history to read
            return None
        # A file: URI built by pathlib (percent-encoded): a '#' or '%' in the path written into the URL as it is
        # would end its name there ('#') or be decoded ('%41'), and SQLite would make another file, read-write.
        uri = f"{files[0].resolve().as_uri()}?mode=ro"
        return create_engine("sqlite://", creator=lambda: sqlite3.connect(uri, uri=True), poolclass=NullPool)
    return _engine(url, read_only=True)


def unreadable(exc: SQLAlchemyError, where: str) -> FlagperfError:
    """The error, in one line naming the history, for a history that cannot be read (its server refuses or is not
    there, a SQLite file that is no database): the driver's first line, never SQLAlchemy's statement dump."""
    cause = getattr(exc, "orig", None) or exc
    line = next((part.strip() for part in str(cause).splitlines() if part.strip()), type(cause).__name__)
    return FlagperfError(f"the history {where} cannot be read: {line}")


def history_found(engine: Engine, where: str) -> bool:
    """Whether the history opened by history_reader has its tables (False: none yet); FlagperfError, naming it
    (``where``: its URL as given) and what it lacks, where an earlier version made them without a column this one
    reads (the next night's record adds it: a reader changes nothing)."""
    with engine.connect() as conn:
        look = inspect(conn)
        names = set(look.get_table_names())
        if not names >= set(metadata.tables):
            return False
        lacking = [f"{table.name}.{column.name}" for table in metadata.sorted_tables
                   for have in [{c["name"] for c in look.get_columns(table.name)}]
                   for column in table.columns if column.name not in have]
    if lacking:
        raise FlagperfError(f"the history {where} was made by an earlier version of flagperf and lacks "
                            f"{', '.join(lacking)}: the next night's record adds them; until then it is not read")
    return True


def _engine(url: str, read_only: bool = False) -> Engine:
    """An engine for the history at ``url`` (checked), with this project's driver; nothing is made or changed.
    ``read_only``: every transaction of its sessions is read-only (PostgreSQL refuses a write in one)."""
    for spelling in ("postgresql+asyncpg://", "postgresql://", "postgres://"):  # the driver this project installs
        if url.startswith(spelling):
            url = "postgresql+psycopg://" + url.removeprefix(spelling)
    if url.startswith("postgresql+psycopg"):
        require("psycopg", needed_by="a history on PostgreSQL")
    try:
        engine = create_engine(url, pool_pre_ping=True, connect_args=_connect_timeout(url))
    except (ImportError, NoSuchModuleError) as exc:  # mysql:// needs a MySQL driver, foo:// is no dialect
        raise ConfigError("history_url", None, f"no database driver here for {make_url(url).drivername} "
                                               f"({type(exc).__name__}: {exc}); use postgresql+psycopg://user@host/db "
                                               "or sqlite:///path") from None
    if engine.dialect.name == "postgresql":
        event.listen(engine, "connect", _bounded_lock_wait)
        if read_only:
            # Each transaction BEGIN READ ONLY (psycopg's read_only, reset when the connection goes back to the
            # pool): its server refuses every write, a table made or altered included. Never a session setting,
            # which a pooler (PgBouncer) would hand on with the server connection to a writer.
            return engine.execution_options(postgresql_readonly=True)
    return engine


PG_CONNECT_TIMEOUT_S = 15
PG_LOCK_TIMEOUT = "60s"


def _connect_timeout(url: str) -> dict[str, Any]:
    """A PostgreSQL history that does not answer ends a write with an error in bounded time rather than stalling a
    night (or its clean-up after Ctrl-C) for ever. Only where nothing else sets it: the URL, a libpq service
    (whose file may set it) or PGCONNECT_TIMEOUT win; only for libpq's drivers (psycopg, psycopg2), whose
    parameter it is. SQLite takes no such argument (its lock wait is its own timeout)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql" or parsed.get_driver_name() not in ("psycopg", "psycopg2"):
        return {}
    if {"connect_timeout", "service"} & set(parsed.query) or os.environ.get("PGCONNECT_TIMEOUT") \
            or os.environ.get("PGSERVICE"):
        return {}
    return {"connect_timeout": PG_CONNECT_TIMEOUT_S}


def _bounded_lock_wait(dbapi_connection: Any, _record: Any) -> None:
    """A table another session holds locked ends a write with an error in PG_LOCK_TIMEOUT, where the session has no
    lock timeout of its own (0: wait for ever): one set by the URL's options, a service, PGOPTIONS, the role or
    the database is kept. A SET, not a connection option, so that libpq services and poolers see nothing new."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SHOW lock_timeout")
        row = cursor.fetchone()
        if row is not None and str(row[0]) == "0":
            cursor.execute(f"SET lock_timeout = '{PG_LOCK_TIMEOUT}'")
        dbapi_connection.commit()  # the SET outlives the connect's implicit transaction
    finally:
        cursor.close()


def _add_new_columns(engine: Engine) -> None:
    """A history made by an earlier version gets the columns added since (all nullable): create_all makes
    missing tables only, and an old row's None reads as 'not known' (a completed run, any workload)."""
    inspector = inspect(engine)
    with engine.begin() as conn:
        for table in metadata.sorted_tables:
            have = {c["name"] for c in inspector.get_columns(table.name)}
            for column in table.columns:
                if column.name not in have:
                    kind = column.type.compile(dialect=engine.dialect)
                    conn.execute(text(f'ALTER TABLE {table.name} ADD COLUMN "{column.name}" {kind}'))


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def case_configs(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Each case's configuration as its rounds ran it (the first round's: a run gives every round the same)."""
    configs: dict[str, dict[str, Any]] = {}
    for _folder, result in load_results(run_dir)[0]:
        configs.setdefault(result.case, dict(result.config))
    return configs


# Config keys that only say how a figure is labelled, not what is measured: they stay out of the workload (a
# release that adds one, as training's target_unit was added, must not restart every figure's baseline).
PRESENTATION_KEYS = frozenset({"target_unit"})


def measured_config(config: dict[str, Any]) -> dict[str, Any]:
    """The configuration less its presentation keys: what the workload's digest and its changes are of."""
    return {k: v for k, v in config.items() if k not in PRESENTATION_KEYS}


def _workload(config: dict[str, Any] | None) -> str | None:
    """The configuration's digest; None where the rounds recorded none (comparable with any)."""
    measured = measured_config(config) if config else None
    return hashlib.sha256(_canonical(measured).encode()).hexdigest()[:16] if measured else None


def run_setting(run_dir: Path) -> dict[str, Any]:
    """What a run ran on and with, beyond the case's configuration: the code, the image, the libraries and
    Python, the vendor's settings and each host's machine. Two nights that differ here are named so."""
    results = [r for _f, r in load_results(run_dir)[0]]
    setting: dict[str, Any] = {}
    for r in results:
        prov = r.provenance
        if prov is None:
            continue
        setting.setdefault("code", {"git_revision": prov.git_revision, "git_dirty": prov.git_dirty,
                                    "source_digest": prov.source_digest, "engine_version": prov.engine_version,
                                    # the digest covers the run's own cases: setting_changes needs them
                                    "cases": sorted({f"{x.family}/{x.case}" for x in results})})
        setting.setdefault("image", prov.image)
        setting.setdefault("libraries", {"python": prov.python, **prov.libraries})
        setting.setdefault("vendor settings", prov.spec_settings)
        host = {key: prov.host.get(key) for key in ("os", "kernel", "cpu_model", "logical_cpus", "usable_cpus",
                                                    "memory_total_bytes", "environment")}
        setting.setdefault("hosts", {})[r.host] = host
    if results:
        setting["device"] = next((r.device for r in results if r.device), None)
    return setting


def setting_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """'code: git_revision 1a2b3c4d5e6f → 9f8e7d6c5b4a' per key that differs, grouped as run_setting groups."""
    changes = []
    for group in sorted(set(before) | set(after)):
        old, new = before.get(group), after.get(group)
        if old == new:
            continue
        if group == "code" and isinstance(old, dict) and isinstance(new, dict) and "cases" in old and "cases" in new:
            # The source digest covers a run's own cases (FLAGPERF_CASE_PATH's too): two nights over other cases
            # differ there without a code change, so it is not compared, and the cases are named instead.
            if old["cases"] != new["cases"]:
                changes.append(f"cases differ: {len(old['cases'])} → {len(new['cases'])} case(s) (the source digest "
                               "covers each night's own cases: not compared)")
                old = {k: v for k, v in old.items() if k != "source_digest"}
                new = {k: v for k, v in new.items() if k != "source_digest"}
            old = {k: v for k, v in old.items() if k != "cases"}
            new = {k: v for k, v in new.items() if k != "cases"}
            if old == new:
                continue
        if isinstance(old, dict) and isinstance(new, dict):
            keys = [k for k in sorted(set(old) | set(new), key=str) if old.get(k) != new.get(k)]
            changes.append(f"{group}: " + ", ".join(f"{k} {_short(old.get(k))} → {_short(new.get(k))}"
                                                     for k in keys))
        else:
            changes.append(f"{group}: {_short(old)} → {_short(new)}")
    return changes


def _short(value: Any) -> str:
    if value is None:
        return "-"
    shown = value if isinstance(value, str) else _canonical(value)
    return shown[:12] if isinstance(value, str) and len(value) == 40 and value.isalnum() else shown[:80]


def record_run(engine: Engine, run_dir: Path, recorded_at: datetime | None = None, *, replace: bool = True) -> int:
    """Store a run's headline figures (recording the same run again replaces it; with ``replace`` False a run
    recorded before is kept as it is, checked in the same transaction as the write). Returns the count of the
    run's figures in the history."""
    summary = summarize(run_dir)
    plan_file = run_dir / "plan.json"
    plan = read_json_file(plan_file, what="a run's plan") if plan_file.exists() or plan_file.is_symlink() else {}
    suite = plan.get("suite") if isinstance(plan, dict) else None
    ctx = summary.context
    with engine.begin() as conn:
        if not replace and conn.execute(select(runs.c.run_id).where(runs.c.run_id == summary.run_id)).first():
            return int(conn.execute(select(func.count()).select_from(figures).where(
                figures.c.run_id == summary.run_id)).scalar_one())
        conn.execute(delete(figures).where(figures.c.run_id == summary.run_id))
        conn.execute(delete(runs).where(runs.c.run_id == summary.run_id))
        conn.execute(insert(runs).values(
            run_id=summary.run_id, recorded_at=recorded_at or datetime.now(timezone.utc), vendor=ctx.get("vendor"),
            device=ctx.get("device"), suite=suite, git_revision=ctx.get("git_revision"),
            counts=json.dumps(summary.counts), outcome=COMPLETED, setting=_canonical(run_setting(run_dir))))
        configs = case_configs(run_dir)
        rows = [{"run_id": summary.run_id, "case": e["case"], "metric": e["metric"], "unit": e["unit"],
                 "value": e["value"],
                 "spread_cv": e["spread_cv"] if e["spread_over"] not in (None, *WITHIN_ROUND) else None,
                 "rounds": e["rounds"], "config": _canonical(configs.get(e["case"]) or {}),
                 "workload": _workload(configs.get(e["case"]))} for e in summary.headline]
        if rows:
            conn.execute(insert(figures), rows)
    return len(rows)


def record_failed_night(engine: Engine, run_id: str, reason: str, *, suite: str | None, vendor: str | None,
                        device: str | None = None, recorded_at: datetime | None = None) -> None:
    """A night that measured nothing usable: a run with outcome failed and its reason, no figures. The trends
    show it as a failure; no baseline counts it (a baseline is made of figures)."""
    _record_night_without_figures(engine, run_id, FAILED, reason, suite=suite, vendor=vendor, device=device,
                                  recorded_at=recorded_at)


def record_interrupted_night(engine: Engine, run_id: str, reason: str, *, suite: str | None, vendor: str | None,
                             device: str | None = None, recorded_at: datetime | None = None) -> None:
    """A night the operator stopped (Ctrl-C, SIGTERM; ``reason`` says which): outcome interrupted, no figures, not
    judged. The trends show it as interrupted, apart from a failed night and from a night that never ran; no
    baseline counts it. A night recorded with figures (or as failed) is not overwritten by this."""
    _record_night_without_figures(engine, run_id, INTERRUPTED, reason, suite=suite, vendor=vendor, device=device,
                                  recorded_at=recorded_at, replace=False)


def _record_night_without_figures(engine: Engine, run_id: str, outcome: str, reason: str, *, suite: str | None,
                                  vendor: str | None, device: str | None, recorded_at: datetime | None,
                                  replace: bool = True) -> None:
    """One transaction: the check of an earlier record (``replace`` False keeps it) and the write."""
    with engine.begin() as conn:
        if not replace and conn.execute(select(runs.c.run_id).where(runs.c.run_id == run_id)).first() is not None:
            return
        conn.execute(delete(figures).where(figures.c.run_id == run_id))
        conn.execute(delete(runs).where(runs.c.run_id == run_id))
        conn.execute(insert(runs).values(run_id=run_id, recorded_at=recorded_at or datetime.now(timezone.utc),
                                         vendor=vendor, device=device, suite=suite, outcome=outcome,
                                         reason=reason[:2000]))


@dataclass(frozen=True)
class Verdict:
    case: str
    metric: str
    unit: str | None
    value: float
    baseline: float | None
    change: float | None
    threshold: float | None
    history: int
    status: Literal["regression", "improvement", "ok", "no-baseline", "new-workload"]
    baseline_runs: tuple[str, ...] = ()  # the runs the baseline is the median of, newest first
    changes: tuple[str, ...] = ()  # what differs from the baseline's newest run (new-workload: the config keys)
    low: float | None = None  # the band a held figure stays in, in the figure's unit
    high: float | None = None
    scale: Literal["log", "linear"] | None = None  # what threshold is on: ln(value / baseline), or the linear change

    def allowed(self) -> str:
        """The band as changes from the baseline: '-25.9%..+35.0%' (a log band is not symmetric)."""
        if self.baseline is None or self.low is None or self.high is None or not self.baseline:
            return "-"
        return f"{self.low / self.baseline - 1:+.1%}..{self.high / self.baseline - 1:+.1%}"

    def line(self) -> str:
        changed = f"; changed since {self.baseline_runs[0]}: " + "; ".join(self.changes) if self.changes and \
            self.baseline_runs else ""
        if self.status == "new-workload":
            return (f"{self.case} {self.metric}: {self.value:.4g} {self.unit} not compared: the case's configuration "
                    f"changed ({'; '.join(self.changes)}); a new baseline starts")
        if self.baseline is None:
            return f"{self.case} {self.metric}: {self.value:.4g} {self.unit} (no baseline: {self.history} earlier runs)"
        return (f"{self.case} {self.metric}: {self.value:.4g} {self.unit} vs baseline {self.baseline:.4g} "
                f"(median of {self.history} runs; {self.change:+.1%}, allowed {self.allowed()}): "
                f"{self.status}{changed}")


def check_run(engine: Engine, run_id: str, *, baseline_runs: int = 5, min_history: int = 3, sigma: float = 3.0,
              floor: float = 0.01) -> list[Verdict]:
    """Each figure of the run against its baseline, as figure_trend judges that run's point."""
    with engine.connect() as conn:
        run = conn.execute(select(runs).where(runs.c.run_id == run_id)).mappings().first()
        if run is None:
            raise KeyError(f"run {run_id} is not in the history")
        current = conn.execute(select(figures.c.case, figures.c.metric).where(figures.c.run_id == run_id)).all()
        verdicts = []
        for case, metric in current:
            rows = _series_rows(conn, case, metric, run["vendor"], run["device"], until=run["recorded_at"])
            verdicts.append(_judge_series(rows, baseline_runs, min_history, sigma, floor)[-1])
    return verdicts


def _series_rows(conn: Any, case: str, metric: str, vendor: str | None, device: str | None,
                 until: datetime | None = None) -> list[Any]:
    """The figure's rows with their run's setting, oldest first (up to and including ``until``)."""
    query = (select(figures, runs.c.recorded_at, runs.c.setting)
             .join(runs, runs.c.run_id == figures.c.run_id)
             .where(figures.c.case == case, figures.c.metric == metric,
                    runs.c.vendor.is_(None) if vendor is None else runs.c.vendor == vendor,
                    runs.c.device.is_(None) if device is None else runs.c.device == device))
    if until is not None:
        query = query.where(runs.c.recorded_at <= until)
    return list(conn.execute(query.order_by(runs.c.recorded_at)).mappings().all())


def _loads(value: str | None) -> dict[str, Any]:
    return json.loads(value) if value else {}


def _judge_series(rows: list[Any], baseline_runs: int, min_history: int, sigma: float,
                  floor: float) -> list[Verdict]:
    """Each row judged against the last ``baseline_runs`` earlier rows of the same workload (None, a row from
    before workloads were recorded, matches any)."""
    verdicts = []
    for i, row in enumerate(rows):
        same = [r for r in reversed(rows[:i])
                if r["workload"] is None or row["workload"] is None or r["workload"] == row["workload"]]
        earlier = same[:baseline_runs]
        if len(same) < max(min_history, 2) and len(same) < i:  # runs of another workload came before it
            other = next(r for r in reversed(rows[:i]) if r["workload"] != row["workload"])
            keys = setting_changes({"config": measured_config(_loads(other["config"]))},
                                   {"config": measured_config(_loads(row["config"]))})
            verdicts.append(Verdict(row["case"], row["metric"], row["unit"], float(row["value"]), None, None, None,
                                    len(same), "new-workload", (other["run_id"],),
                                    tuple(k.removeprefix("config: ") for k in keys)))
            continue
        verdict = _verdict(row, [float(r["value"]) for r in earlier], min_history, sigma, floor)
        if verdict.baseline is not None:
            changes = setting_changes(_loads(earlier[0]["setting"]), _loads(row["setting"]))
            verdict = Verdict(**{**asdict(verdict), "baseline_runs": tuple(r["run_id"] for r in earlier),
                                 "changes": tuple(changes)})
        verdicts.append(verdict)
    return verdicts


# Durations in any unit (inference latencies are in ms) are better lower
TIME_UNITS = frozenset({"s", "ms", "us", "µs", "ns"})
# Figures better lower by what they count (the name before a serving point's "@label"): requests that failed, were
# cut short, came back empty or miscounted; and the requests in flight of an open-loop point, which at its fixed
# offered rate is the rate x the mean latency (Little's law): fewer in flight is a faster server
LOWER_IS_BETTER = frozenset({"failed_requests", "failed_fraction", "truncated_requests", "empty_outputs",
                             "token_count_mismatches", "mean_concurrency", "peak_concurrency"})


def higher_is_better(metric: str, unit: str | None) -> bool:
    """Rates and capacities are better higher; durations, losses, failure counts and an open loop's requests in
    flight are better lower."""
    return not (unit in TIME_UNITS or "loss" in metric or metric.split("@", 1)[0] in LOWER_IS_BETTER)


def _verdict(fig: Any, history: list[float], min_history: int, sigma: float, floor: float) -> Verdict:
    value = float(fig["value"])
    if len(history) < max(min_history, 2):  # a spread needs two points
        return Verdict(fig["case"], fig["metric"], fig["unit"], value, None, None, None, len(history), "no-baseline")
    baseline = statistics.median(history)
    run_cv = fig["spread_cv"] or 0.0
    if all(h > 0 for h in history):
        noise = math.hypot(statistics.stdev(math.log(h) for h in history), math.sqrt(math.log1p(run_cv ** 2)))
        shift = math.log(value / baseline) if value > 0 else -math.inf  # a rate fallen to 0: as far as it goes
        threshold = max(sigma * noise, floor)
        low, high = baseline * math.exp(-threshold), baseline * math.exp(threshold)
        scale: Literal["log", "linear"] = "log"
    else:  # zero or negative somewhere: the linear scale (see the module's doc)
        size = abs(baseline) or 1.0
        noise = math.hypot(statistics.stdev(history) / size, run_cv)
        shift = (value - baseline) / size
        threshold = max(sigma * noise, floor)
        low, high = baseline - threshold * size, baseline + threshold * size
        scale = "linear"
    change = (value - baseline) / abs(baseline) if baseline else 0.0
    better = shift if higher_is_better(fig["metric"], fig["unit"]) else -shift
    status: Literal["regression", "improvement", "ok"] = (
        "regression" if better < -threshold else "improvement" if better > threshold else "ok")
    return Verdict(fig["case"], fig["metric"], fig["unit"], value, baseline, change, threshold, len(history), status,
                   low=low, high=high, scale=scale)


def verdicts_as_rows(verdicts: list[Verdict]) -> list[dict[str, Any]]:
    return [asdict(v) for v in verdicts]


@dataclass(frozen=True)
class Series:
    """One figure's course: a case's metric on one vendor and device."""

    case: str
    metric: str
    unit: str | None
    vendor: str | None
    device: str | None
    points: int


@dataclass(frozen=True)
class TrendPoint:
    run_id: str
    recorded_at: datetime
    verdict: Verdict | None  # judged against the runs before it, as check_run judged it that night; None: failed
    failure: str | None = None  # a failed night: why (it measured nothing); an interrupted one: what stopped it
    outcome: str = COMPLETED  # failed or interrupted where verdict is None


def list_series(engine: Engine) -> list[Series]:
    """Every figure the history holds, per vendor and device, with how many runs measured it."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(figures.c.case, figures.c.metric, func.max(figures.c.unit), runs.c.vendor, runs.c.device,
                   func.count())
            .join(runs, runs.c.run_id == figures.c.run_id)
            .group_by(figures.c.case, figures.c.metric, runs.c.vendor, runs.c.device)
            .order_by(runs.c.vendor, runs.c.device, figures.c.case, figures.c.metric)).all()
    return [Series(*row) for row in rows]


def figure_trend(engine: Engine, case: str, metric: str, vendor: str | None, device: str | None, *,
                 baseline_runs: int = 5, min_history: int = 3, sigma: float = 3.0, floor: float = 0.01
                 ) -> list[TrendPoint]:
    """The figure's value in each run, oldest first, each with the verdict against the runs before it (the
    allowed band is low..high around the baseline; a regression is a point below it for a rate, above it for a
    duration), and the failed and interrupted nights of the suites that measured it, in their place."""
    with engine.connect() as conn:
        rows = _series_rows(conn, case, metric, vendor, device)
        if not rows:
            return []
        suites = conn.execute(select(runs.c.suite).distinct().where(
            runs.c.run_id.in_([r["run_id"] for r in rows]))).scalars().all()
        failed = conn.execute(select(runs.c.run_id, runs.c.recorded_at, runs.c.reason, runs.c.outcome).where(
            runs.c.outcome.in_(NO_FIGURES),
            runs.c.suite.in_([s for s in suites if s is not None]) | (runs.c.suite.is_(None) if None in suites
                                                                      else false()),
            runs.c.vendor.is_(None) if vendor is None else runs.c.vendor == vendor,
            runs.c.device.is_(None) | (runs.c.device == device))).all()
    verdicts = _judge_series(rows, baseline_runs, min_history, sigma, floor)
    points = [TrendPoint(row["run_id"], _utc(row["recorded_at"]), verdict)
              for row, verdict in zip(rows, verdicts, strict=True)]
    points += [TrendPoint(run_id, _utc(at), None, reason or outcome, outcome) for run_id, at, reason, outcome in failed]
    return sorted(points, key=lambda p: p.recorded_at)


def _utc(moment: datetime) -> datetime:
    """SQLite gives back a naive time (what was stored, in UTC); PostgreSQL an aware one."""
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


TREND_COLUMNS = ["vendor", "device", "case", "metric", "unit", "recorded_at", "run_id", "value", "baseline",
                 "change", "low", "high", "threshold", "scale", "history", "verdict", "baseline_runs", "changes"]


def trend_table(engine: Engine, **judging: Any) -> Any:
    """Every figure's course as one table (a pandas DataFrame, a row per figure and night, failed nights
    and interrupted ones included with verdict 'failed' or 'interrupted' and the reason in changes), as the site's
    trend pages judge it."""
    import pandas as pd

    rows = []
    for series in list_series(engine):
        for point in figure_trend(engine, series.case, series.metric, series.vendor, series.device, **judging):
            v = point.verdict
            rows.append({
                "vendor": series.vendor, "device": series.device, "case": series.case, "metric": series.metric,
                "unit": series.unit, "recorded_at": point.recorded_at.isoformat(), "run_id": point.run_id,
                "value": v.value if v else None, "baseline": v.baseline if v else None,
                "change": v.change if v else None, "low": v.low if v else None, "high": v.high if v else None,
                "threshold": v.threshold if v else None, "scale": v.scale if v else None,
                "history": v.history if v else None, "verdict": v.status if v else point.outcome,
                "baseline_runs": " ".join(v.baseline_runs) if v else "",
                "changes": "; ".join(v.changes) if v else point.failure})
    return pd.DataFrame(rows, columns=TREND_COLUMNS)
