"""Regression verdicts on a seeded history: a true 5 % drop is flagged, noise within the spread is not."""

from __future__ import annotations

import csv
import json
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from flagperf.results.history import check_run, history_engine, metadata, record_run
from flagperf.results.schema import Metric, RoundResult, write_result
from tests.unit.mounts import unenterable

START = datetime(2026, 11, 1, 2, 0, tzinfo=timezone.utc)


def make_run(root: Path, run_id: str, round_values: list[float], device: str = "X1") -> Path:
    run = root / run_id
    for rnd, value in enumerate(round_values, start=1):
        result = RoundResult(
            run_id=run_id, case="computation-FP32", family="base", round=rnd, host="h1", node_rank=0, vendor="cpu",
            status="success", started_at=START, finished_at=START, duration_s=1.0, measured_seconds=1.0,
            device=device, metrics=[Metric(name="gemm_fp32", value=value, unit="TFLOPS")], config={})
        write_result(run / "computation-FP32" / f"round{rnd}" / "h1_noderank0" / "result.json", result)
    return run


def _postgres_url() -> str:
    url = os.environ.get("FLAGPERF_TEST_POSTGRES_URL")
    if not url:
        if os.environ.get("CI"):
            pytest.fail("FLAGPERF_TEST_POSTGRES_URL is not set: .ci/run makes the database "
                        "(deployments/postgres/test-database.sh)")
        pytest.skip("no PostgreSQL: eval \"$(bash deployments/postgres/test-database.sh)\" makes one")
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def history(request: pytest.FixtureRequest, tmp_path: Path):
    """The same verdicts on SQLite (one person) and on a team's PostgreSQL."""
    if request.param == "sqlite":
        yield history_engine(f"sqlite:///{tmp_path / 'history.sqlite'}")
        return
    engine = history_engine(_postgres_url())  # the server's asyncpg URL, read with psycopg
    assert engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg"
    metadata.drop_all(engine)  # each test starts from an empty history
    metadata.create_all(engine)
    yield engine
    metadata.drop_all(engine)
    engine.dispose()


@pytest.fixture
def seeded(history, tmp_path: Path):
    engine = history
    nightly = [[100.0, 100.6, 99.4], [100.8, 101.2, 100.5], [99.1, 99.6, 98.9], [100.2, 99.8, 100.4],
               [99.7, 100.3, 100.0]]
    for night, values in enumerate(nightly):
        record_run(engine, make_run(tmp_path, f"run-n{night}", values), recorded_at=START + timedelta(days=night))
    return engine, tmp_path


def verdict_for(engine, tmp_path: Path, run_id: str, values: list[float], **kw):
    record_run(engine, make_run(tmp_path, run_id, values), recorded_at=START + timedelta(days=30))
    (verdict,) = check_run(engine, run_id, **kw)
    return verdict


def history_tables(engine: Engine) -> dict[str, set[str]]:
    """The history's tables in ``engine``'s database, each with its columns (the team's database holds other tables
    too: the test server's)."""
    from sqlalchemy import inspect

    with engine.connect() as conn:
        look = inspect(conn)
        return {name: {c["name"] for c in look.get_columns(name)} for name in look.get_table_names()
                if name in metadata.tables}


def test_a_true_five_percent_drop_is_a_regression(seeded) -> None:
    engine, tmp_path = seeded
    v = verdict_for(engine, tmp_path, "run-drop", [95.1, 94.8, 95.3])
    assert v.status == "regression"
    assert v.baseline == pytest.approx(100.0)
    assert v.change == pytest.approx(-0.0493, abs=1e-3)
    assert v.threshold < 0.05
    assert "regression" in v.line()


def test_noise_within_the_spread_is_not_flagged(seeded) -> None:
    engine, tmp_path = seeded
    v = verdict_for(engine, tmp_path, "run-noise", [99.0, 98.6, 99.5])
    assert v.status == "ok"


def test_a_noisy_metric_needs_a_bigger_drop(seeded) -> None:
    engine, tmp_path = seeded
    # The same 5 % lower mean, but this run's own rounds scatter by about 5 %: not an alarm.
    v = verdict_for(engine, tmp_path, "run-noisy", [90.0, 95.0, 100.0])
    assert v.status == "ok" and v.threshold > 0.05


def test_no_baseline_without_enough_history(tmp_path: Path) -> None:
    engine = history_engine(f"sqlite:///{tmp_path / 'h.sqlite'}")
    record_run(engine, make_run(tmp_path, "run-first", [100.0, 101.0, 99.0]))
    (v,) = check_run(engine, "run-first")
    assert v.status == "no-baseline" and v.baseline is None


def test_other_devices_are_not_a_baseline(seeded) -> None:
    engine, tmp_path = seeded
    record_run(engine, make_run(tmp_path, "run-other", [50.0, 50.0, 50.0], device="Y2"),
               recorded_at=START + timedelta(days=30))
    (v,) = check_run(engine, "run-other")
    assert v.status == "no-baseline"


def test_recording_a_run_twice_replaces_it(seeded) -> None:
    engine, tmp_path = seeded
    assert record_run(engine, tmp_path / "run-n0", recorded_at=START) == 1
    (v,) = check_run(engine, "run-n4")
    assert v.history == 4 and v.status == "ok"


def test_durations_and_losses_regress_upwards(tmp_path: Path) -> None:
    from flagperf.results.history import _verdict

    history = [10.0, 10.1, 9.9, 10.0, 10.05]
    slower = _verdict({"case": "c", "metric": "e2e_time", "unit": "s", "value": 12.0, "spread_cv": None},
                      history, 3, 3.0, 0.01)
    assert slower.status == "regression"
    faster = _verdict({"case": "c", "metric": "e2e_time", "unit": "s", "value": 8.0, "spread_cv": None},
                      history, 3, 3.0, 0.01)
    assert faster.status == "improvement"
    loss = _verdict({"case": "c", "metric": "final_eval_loss", "unit": "", "value": 11.0, "spread_cv": None},
                    history, 3, 3.0, 0.01)
    assert loss.status == "regression"
    # Inference latencies are in ms; a serving point's failures and (open loop, at its fixed rate) its requests in
    # flight grow as the server gets worse: each judged a regression upwards, never an improvement.
    for metric, unit in (("latency_p99", "ms"), ("failed_requests@c4", "requests"), ("failed_fraction@c4", "fraction"),
                         ("mean_concurrency@r4", "requests"), ("peak_concurrency@r4", "requests")):
        worse = _verdict({"case": "c", "metric": metric, "unit": unit, "value": 12.0, "spread_cv": None},
                         history, 3, 3.0, 0.01)
        assert worse.status == "regression", (metric, worse)
    served = _verdict({"case": "c", "metric": "output_tokens_per_s@r4", "unit": "tokens/s", "value": 12.0,
                       "spread_cv": None}, history, 3, 3.0, 0.01)
    assert served.status == "improvement"
    one_point = _verdict({"case": "c", "metric": "x", "unit": "GB/s", "value": 1.0, "spread_cv": None}, [2.0], 1,
                         3.0, 0.01)
    assert one_point.status == "no-baseline"


def figure(value: float, unit: str = "TFLOPS", spread_cv: float | None = None, metric: str = "gemm") -> dict:
    return {"case": "c", "metric": metric, "unit": unit, "value": value, "spread_cv": spread_cv}


def test_a_tenfold_drop_of_a_noisy_rate_is_a_regression() -> None:
    """On a linear scale a rate whose spread is over a third could never regress: it cannot fall more than
    100 %, and 3 x 35 % is more. On the log scale a tenfold drop is ln 10 = 2.3 away, beyond 3 x this spread."""
    from flagperf.results.history import _verdict

    history = [0.0073, 0.0105, 0.0091]  # three good nights of a small CPU multiply under a quota
    slow = _verdict(figure(0.0009, spread_cv=0.40), history, 3, 3.0, 0.01)
    assert slow.status == "regression" and slow.scale == "log", slow.line()
    assert slow.change == pytest.approx(0.0009 / 0.0091 - 1)
    assert slow.low < 0.0009 * 10 and slow.high > 0.0105  # the band is wide, but a tenth is outside it
    assert "allowed -" in slow.line() and "regression" in slow.line()
    recovered = _verdict(figure(0.0080, spread_cv=0.10), history, 3, 3.0, 0.01)
    assert recovered.status == "ok" and recovered.low < 0.0080 < recovered.high


def test_a_rate_halved_and_a_duration_doubled_are_judged_alike() -> None:
    from flagperf.results.history import _verdict

    rates = [100.0, 104.0, 96.0, 101.0, 99.0]
    durations = [1 / r for r in rates]
    halved = _verdict(figure(50.0), rates, 3, 3.0, 0.01)
    doubled = _verdict(figure(2 / 100.0, unit="s", metric="e2e_time"), durations, 3, 3.0, 0.01)
    assert halved.status == doubled.status == "regression"
    assert halved.threshold == pytest.approx(doubled.threshold)  # the same spread: the same allowance
    # The band is a ratio on either side of the baseline: -x % down is +y % up with (1 - x)(1 + y) = 1.
    assert halved.low * halved.high == pytest.approx(halved.baseline ** 2)
    assert halved.allowed().startswith("-") and "..+" in halved.allowed()


def test_a_figure_that_is_zero_somewhere_is_judged_on_the_linear_scale() -> None:
    from flagperf.results.history import _verdict

    losses = [0.0, 0.01, 0.02, 0.01]  # a loss can reach zero: no logarithm of it
    worse = _verdict(figure(0.5, unit="", metric="final_eval_loss"), losses, 3, 3.0, 0.01)
    assert worse.status == "regression" and worse.high < 0.5 and worse.scale == "linear"
    assert worse.high - worse.baseline == pytest.approx(worse.baseline - worse.low)


def test_a_noisy_rate_fallen_to_zero_is_a_regression() -> None:
    """A goodput no request met is 0: on the log scale as far below as a figure gets, however noisy its past
    (on the linear scale a spread like this one allowed -100 %)."""
    from flagperf.results.history import _verdict

    nothing = _verdict(figure(0.0, unit="req/s", metric="goodput_requests_per_s"), [0.2, 0.6, 0.9], 3, 3.0, 0.01)
    assert nothing.status == "regression" and nothing.scale == "log" and nothing.change == -1.0


def test_a_history_url_without_a_driver_here_is_one_line_and_plain_postgresql_uses_psycopg(tmp_path: Path) -> None:
    from flagperf.errors import ConfigError

    for url in ("mysql://u@db.example/history", "foo://x"):
        with pytest.raises(ConfigError, match=r"^history_url: no database driver here for (mysql|foo) "):
            history_engine(url)
    with pytest.raises(ConfigError, match="holds a password"):
        history_engine("postgresql://u:secret@127.0.0.1:1/db")
    if os.environ.get("FLAGPERF_TEST_POSTGRES_URL"):  # the team database, spelled as people write it
        plain = "postgresql://" + _postgres_url().split("://", 1)[1]
        assert history_engine(plain).dialect.driver == "psycopg"


def make_configured_run(root: Path, run_id: str, values: list[float], config: dict, revision: str = "a" * 40) -> Path:
    """A run whose rounds record the case's configuration and the code's revision, as real rounds do."""
    from flagperf.results.schema import Provenance

    run = make_run(root, run_id, values)
    for path in run.glob("*/round*/*/result.json"):
        from flagperf.results.schema import read_result

        result = read_result(path).model_copy(update={"config": config, "provenance": Provenance(
            engine_version="1", git_revision=revision, git_dirty=False, python="3.11", libraries={"torch": "2"},
            host={"kernel": "6.1"}, image={}, config_origins={}, run_overrides={})})
        write_result(path, result)
    return run


def test_a_failed_night_is_shown_as_one_and_is_never_a_baseline(seeded) -> None:
    from flagperf.results.history import figure_trend, record_failed_night, trend_table

    engine, tmp_path = seeded
    record_failed_night(engine, "run-broken", "2 of 2 rounds failed: timed out", suite=None, vendor="cpu",
                        recorded_at=START + timedelta(days=10))
    v = verdict_for(engine, tmp_path, "run-next", [95.1, 94.8, 95.3])
    assert v.status == "regression" and "run-broken" not in v.baseline_runs
    assert v.baseline_runs == ("run-n4", "run-n3", "run-n2", "run-n1", "run-n0")
    (failed,) = [p for p in figure_trend(engine, "computation-FP32", "gemm_fp32", "cpu", "X1") if p.verdict is None]
    assert failed.run_id == "run-broken" and "timed out" in failed.failure
    table = trend_table(engine)
    assert list(table["verdict"]) == ["no-baseline"] * 3 + ["ok", "ok", "failed", "regression"]


def test_another_workload_is_marked_not_compared(tmp_path: Path) -> None:
    engine = history_engine(f"sqlite:///{tmp_path / 'h.sqlite'}")
    for night in range(4):
        record_run(engine, make_configured_run(tmp_path, f"run-n{night}", [100.0, 100.2], {"m": 4096}),
                   recorded_at=START + timedelta(days=night))
    halved = make_configured_run(tmp_path, "run-half", [50.0, 50.1], {"m": 2048})
    record_run(engine, halved, recorded_at=START + timedelta(days=5))
    (v,) = check_run(engine, "run-half")
    assert v.status == "new-workload" and v.changes == ("m 4096 → 2048",) and "not compared" in v.line()


def test_a_key_that_only_labels_a_figure_keeps_its_workload(tmp_path: Path) -> None:
    """The release that added training's target_unit (the unit final_<metric> states) changed every training
    case's recorded config: a night after it is judged against the nights before (it was new-workload, the
    baseline restarting unannounced), and a real change beside it is named without it."""
    engine = history_engine(f"sqlite:///{tmp_path / 'h.sqlite'}")
    for night in range(4):
        record_run(engine, make_configured_run(tmp_path, f"run-n{night}", [100.0, 100.2], {"m": 4096}),
                   recorded_at=START + timedelta(days=night))
    record_run(engine, make_configured_run(tmp_path, "run-unit", [80.0, 80.1], {"m": 4096, "target_unit": ""}),
               recorded_at=START + timedelta(days=5))
    (v,) = check_run(engine, "run-unit")
    assert v.status == "regression" and v.baseline_runs[0] == "run-n3"
    record_run(engine, make_configured_run(tmp_path, "run-half", [50.0, 50.1],
                                           {"m": 2048, "target_unit": "fraction"}),
               recorded_at=START + timedelta(days=6))
    (v,) = check_run(engine, "run-half")
    assert v.status == "new-workload" and v.changes == ("m 4096 → 2048",)


def test_what_changed_since_the_baseline_is_named(tmp_path: Path) -> None:
    engine = history_engine(f"sqlite:///{tmp_path / 'h.sqlite'}")
    for night in range(4):
        record_run(engine, make_configured_run(tmp_path, f"run-n{night}", [100.0, 100.2], {"m": 4096}),
                   recorded_at=START + timedelta(days=night))
    record_run(engine, make_configured_run(tmp_path, "run-new", [80.0, 80.1], {"m": 4096}, revision="b" * 40),
               recorded_at=START + timedelta(days=5))
    (v,) = check_run(engine, "run-new")
    assert v.status == "regression" and v.changes == (f"code: git_revision {'a' * 12} → {'b' * 12}",)
    assert "changed since run-n3: code: git_revision" in v.line()


def test_a_history_of_an_earlier_version_gets_the_new_columns(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:  # the tables as the earlier version made them
        db.execute("CREATE TABLE runs (run_id VARCHAR(128) PRIMARY KEY, recorded_at DATETIME NOT NULL, vendor "
                   "VARCHAR(64), device VARCHAR(256), suite VARCHAR(128), git_revision VARCHAR(64), counts TEXT)")
        db.execute("CREATE TABLE figures (id INTEGER PRIMARY KEY, run_id VARCHAR(128) NOT NULL, \"case\" "
                   "VARCHAR(128) NOT NULL, metric VARCHAR(128) NOT NULL, unit VARCHAR(32), value FLOAT NOT NULL, "
                   "spread_cv FLOAT, rounds INTEGER)")
        db.execute("INSERT INTO runs VALUES ('run-old', '2026-10-01 02:00:00', 'cpu', 'X1', 'smoke', NULL, '{}')")
        db.execute("INSERT INTO figures VALUES (1, 'run-old', 'computation-FP32', 'gemm_fp32', 'TFLOPS', 100.0, "
                   "0.01, 3)")
    engine = history_engine(f"sqlite:///{path}")
    record_run(engine, make_run(tmp_path, "run-now", [100.0, 100.5]), recorded_at=START)
    (v,) = check_run(engine, "run-now")
    assert v.status == "no-baseline" and v.history == 1  # the old night counts, as a run of any workload


def test_a_nights_history_is_checked_before_it_begins_without_making_one(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """`flagperf nightly` (and the flow) check the history before a night of measuring, but a SQLite history is made
    only when the night records: a night refused or stopped before then leaves none (it left an empty
    history.sqlite, in a results folder or a --history-url's folder that was there before). One that is there is
    opened; where none can be made, or one there is none, it is said in one line."""
    from flagperf.errors import ConfigError, FlagperfError
    from flows.nightly_cli import Night, open_history

    monkeypatch.delenv("FLAGPERF_HISTORY_URL", raising=False)

    def night(results: Path, url: str | None = None) -> Night:
        return Night(suite="tiny", vendor="auto", rounds=1, overrides=[], inventory=None, results=results,
                     history_url=url, baseline_runs=5, sigma=3.0, run_id="run-tonight")

    open_history(night(tmp_path / "fresh" / "results"))
    (tmp_path / "shared").mkdir()
    open_history(night(tmp_path / "results", f"sqlite:///{tmp_path / 'shared' / 'h' / 'history.sqlite'}"))
    assert sorted(tmp_path.rglob("*")) == [tmp_path / "shared"]  # nothing made, in either folder

    earlier = night(tmp_path / "earlier")
    history_engine(None, earlier.results).dispose()
    open_history(earlier)
    assert (tmp_path / "earlier" / "history.sqlite").is_file()
    (tmp_path / "earlier" / "history.sqlite").write_text("not a database\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^the history \(history.sqlite in --results, the default\): "
                                          r".*history.sqlite: not a SQLite database$"):
        open_history(earlier)  # bad input (exit 2), as a bad URL is: the file is the user's mistake; named by
        # where its URL came from, not an option the user never gave
    monkeypatch.setenv("FLAGPERF_HISTORY_URL", f"sqlite:///{tmp_path / 'earlier' / 'history.sqlite'}")
    with pytest.raises(ConfigError, match=r"^FLAGPERF_HISTORY_URL: .*history.sqlite: not a SQLite database$"):
        open_history(night(tmp_path / "elsewhere"))
    with pytest.raises(ConfigError, match=r"^--history-url: .*history.sqlite: not a SQLite database$"):
        open_history(night(tmp_path / "elsewhere", f"sqlite:///{tmp_path / 'earlier' / 'history.sqlite'}"))
    monkeypatch.delenv("FLAGPERF_HISTORY_URL")

    (tmp_path / "a-file").write_text("x", encoding="utf-8")
    with pytest.raises(FlagperfError) as info:  # where the results folder would be: nothing can be made below it
        open_history(night(tmp_path / "a-file" / "results"))
    assert str(info.value) == (f"the history cannot be opened: NotADirectoryError: [Errno 20] not a folder, so the "
                               f"history cannot be made below it: '{tmp_path / 'a-file'}'")
    with pytest.raises(ConfigError, match=r"^--history-url: not a database URL"):
        open_history(night(tmp_path / "results", "not a url"))


def test_a_history_that_is_a_link_to_nothing_yet_is_made_at_its_target(tmp_path: Path) -> None:
    """A history path prepared as a link before the first night (its target not there yet) is a history not there
    yet, as before the check refused anything but a regular file: checked at its target's folder, made there by the
    night that records; a diagnosis reads it as none, and once recorded reads it at its target, as the site does.
    A link whose target's folder is not there is said."""
    from flagperf.errors import ConfigError
    from flagperf.results.history import (
        check_history,
        history_reader,
        link_to_nothing,
        list_series,
        not_a_file,
        sqlite_files,
    )
    from flagperf.site.trends import open_history

    (tmp_path / "store").mkdir()
    link = tmp_path / "results" / "history.sqlite"
    link.parent.mkdir()
    link.symlink_to(tmp_path / "store" / "history.sqlite")
    assert link_to_nothing(link)
    check_history(None, link.parent)
    not_a_file(sqlite_files(None, link.parent), "--history")
    assert not (tmp_path / "store" / "history.sqlite").exists()  # checked, not made
    assert history_reader(None, link.parent) is None  # none yet
    made = history_engine(None, link.parent)
    assert link.is_symlink() and (tmp_path / "store" / "history.sqlite").is_file()  # made at the link's target
    check_history(None, link.parent)
    record_run(made, make_run(tmp_path, "run-linked", [100.0, 100.5]), recorded_at=START)
    made.dispose()
    # Read where the night wrote it (once taken for no history at all): the reader, the site and a diagnosis,
    # through the linked file and through a results folder that is itself a link.
    (tmp_path / "linked-results").symlink_to(link.parent)
    for results in (link.parent, tmp_path / "linked-results"):
        reader = history_reader(None, results)
        assert reader is not None and [s.metric for s in list_series(reader)] == ["gemm_fp32"]
        reader.dispose()
        site = open_history(results, None)
        assert site is not None and [s.metric for s in list_series(site)] == ["gemm_fp32"]
        site.dispose()

    elsewhere = tmp_path / "r2" / "history.sqlite"
    elsewhere.parent.mkdir()
    elsewhere.symlink_to(tmp_path / "gone" / "history.sqlite")
    with pytest.raises(FileNotFoundError, match="target cannot be made there"):
        check_history(None, elsewhere.parent)
    loop = tmp_path / "r3" / "history.sqlite"
    loop.parent.mkdir()
    loop.symlink_to(loop)
    assert not link_to_nothing(loop)
    with pytest.raises(ConfigError, match="not a regular file"):
        check_history(None, loop.parent)


def test_checking_a_nights_history_changes_none_that_is_there(history) -> None:
    """The check before a night reads a history that is there (a SQLite file, a team's database) and changes
    nothing: an empty one gets no tables, an earlier version's no new column, until a night records (a night
    refused after the check changed an older history's schema)."""
    from sqlalchemy import text

    from flagperf.results.history import check_history

    engine = history
    url = engine.url.render_as_string(hide_password=False)
    path = Path(engine.url.database) if engine.dialect.name == "sqlite" else None

    def tables() -> dict[str, set[str]]:
        return history_tables(engine)

    metadata.drop_all(engine)
    check_history(url)
    assert tables() == {}
    metadata.create_all(engine)  # an earlier version's history: figures without the workload and config columns
    with engine.begin() as conn:
        for column in ("workload", "config"):
            conn.execute(text(f'ALTER TABLE figures DROP COLUMN "{column}"'))
    before, data = tables(), path.read_bytes() if path else None
    assert "workload" not in before["figures"]
    check_history(url)
    assert tables() == before and (path is None or path.read_bytes() == data)
    history_engine(url).dispose()  # the night, as it records: the new columns now
    assert {"workload", "config"} <= tables()["figures"]


def test_reading_a_history_makes_and_changes_none(history, tmp_path: Path) -> None:
    """The results site's trends open the history to read it, and so does `flagperf diagnose --history`: a database
    without the tables yet reads as no history and gets none, a SQLite URL naming no file makes none, an earlier
    version's history is said to be one in one line and gets no new column; one of this version is read, and a write
    through the reader is refused by the database itself. Only a night that records makes or changes it."""
    from sqlalchemy import inspect, text
    from sqlalchemy.exc import DBAPIError

    from flagperf.errors import FlagperfError
    from flagperf.results.history import list_series
    from flagperf.site.trends import open_history

    engine = history
    url = engine.url.render_as_string(hide_password=False)

    def tables() -> dict[str, set[str]]:
        return history_tables(engine)

    metadata.drop_all(engine)
    assert open_history(tmp_path, url) is None and tables() == {}
    nowhere = tmp_path / "nowhere"
    assert open_history(tmp_path, f"sqlite:///{nowhere / 'history.sqlite'}") is None and not nowhere.exists()
    assert open_history(nowhere, None) is None and not nowhere.exists()  # the results folder's own: not there
    metadata.create_all(engine)  # an earlier version's history: figures without the workload and config columns
    with engine.begin() as conn:
        for column in ("workload", "config"):
            conn.execute(text(f'ALTER TABLE figures DROP COLUMN "{column}"'))
    before = tables()
    with pytest.raises(FlagperfError) as info:
        open_history(tmp_path, url)
    assert str(info.value) == (f"the history {url} was made by an earlier version of flagperf and lacks "
                               "figures.workload, figures.config: the next night's record adds them; until then it "
                               "is not read") and tables() == before
    history_engine(url).dispose()  # a night records: the new columns now
    record_run(engine, make_run(tmp_path, "run-now", [100.0, 100.5]), recorded_at=START)
    reader = open_history(tmp_path, url)
    assert reader is not None and [s.metric for s in list_series(reader)] == ["gemm_fp32"]
    with pytest.raises(DBAPIError), reader.begin() as conn:
        conn.execute(text("CREATE TABLE made_by_a_reader (x INTEGER)"))
    assert "made_by_a_reader" not in inspect(engine).get_table_names()
    if engine.dialect.name == "postgresql":  # read-only by transaction, never the session's default: a pooler
        with reader.connect() as conn:     # (PgBouncer) would hand a session's on to a writer
            assert conn.exec_driver_sql("SHOW transaction_read_only").scalar() == "on"
            assert conn.exec_driver_sql("SHOW default_transaction_read_only").scalar() == "off"


def test_a_sqlite_history_whose_path_holds_a_hash_or_a_percent_is_read_as_it_is_and_only_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader opens the SQLite file read-only by a file: URI: a '#' in its path (which ends a URI's path) or a
    '%41' (which a URI decodes to 'A') is the file's name as it is, never another file made read-write beside it."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    from flagperf.results.history import history_reader, list_series

    monkeypatch.delenv("FLAGPERF_HISTORY_URL", raising=False)  # the results folder's own history
    results = tmp_path / "night #1 %41"
    results.mkdir()
    made = history_engine(f"sqlite:///{results / 'history.sqlite'}")
    record_run(made, make_run(tmp_path, "run-now", [100.0, 100.5]), recorded_at=START)
    made.dispose()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    reader = history_reader(None, results)
    assert reader is not None and [s.metric for s in list_series(reader)] == ["gemm_fp32"]
    with pytest.raises(DBAPIError), reader.begin() as conn:
        conn.execute(text("CREATE TABLE made_by_a_reader (x INTEGER)"))
    reader.dispose()
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_an_interrupted_night_is_shown_as_one_never_a_baseline_nor_a_failure(seeded) -> None:
    """The owner reading the trends tells a night the operator stopped from a failed one and from one that never
    ran: it is there, with its run id and what stopped it, and the next night is judged as if it were not."""
    from flagperf.results.history import figure_trend, record_interrupted_night, trend_table

    engine, tmp_path = seeded
    record_interrupted_night(engine, "run-stopped", "interrupted (SIGINT)", suite=None, vendor="cpu",
                             recorded_at=START + timedelta(days=10))
    record_interrupted_night(engine, "run-n4", "interrupted (SIGTERM)", suite=None, vendor="cpu")  # recorded: kept
    v = verdict_for(engine, tmp_path, "run-next", [95.1, 94.8, 95.3])
    assert v.status == "regression" and v.baseline_runs == ("run-n4", "run-n3", "run-n2", "run-n1", "run-n0")
    (stopped,) = [p for p in figure_trend(engine, "computation-FP32", "gemm_fp32", "cpu", "X1") if p.verdict is None]
    assert (stopped.run_id, stopped.outcome, stopped.failure) == ("run-stopped", "interrupted", "interrupted (SIGINT)")
    table = trend_table(engine)
    assert list(table["verdict"]) == ["no-baseline"] * 3 + ["ok", "ok", "interrupted", "regression"]
    assert list(table[table["verdict"] == "interrupted"]["run_id"]) == ["run-stopped"]


def test_two_nights_over_other_cases_are_not_named_a_code_change() -> None:
    """The source digest covers a night's own cases (those on FLAGPERF_CASE_PATH too): the same code over other
    cases differs there, and the comparison says the cases differ, not that the code changed."""
    from flagperf.results.history import setting_changes

    def code(digest: str, cases: list[str], revision: str = "a" * 40) -> dict:
        return {"code": {"git_revision": revision, "git_dirty": False, "source_digest": digest,
                         "engine_version": "1", "cases": cases}}

    assert setting_changes(code("sha256:1", ["base/x"]), code("sha256:2", ["base/x", "lab/y"])) == [
        "cases differ: 1 → 2 case(s) (the source digest covers each night's own cases: not compared)"]
    assert setting_changes(code("sha256:1", ["base/x"]), code("sha256:1", ["base/x"])) == []
    # The same cases: a digest change is a code change; another commit is one whatever the cases.
    assert setting_changes(code("sha256:1", ["base/x"]), code("sha256:2", ["base/x"])) == [
        "code: source_digest sha256:1 → sha256:2"]
    assert setting_changes(code("sha256:1", ["base/x"]), code("sha256:2", ["lab/y"], "b" * 40)) == [
        "cases differ: 1 → 1 case(s) (the source digest covers each night's own cases: not compared)",
        f"code: git_revision {'a' * 12} → {'b' * 12}"]


@pytest.fixture
def measured_night(tmp_path: Path) -> tuple[str, Path, Path]:
    """A results folder with five nights in its SQLite history, and a sixth measured and collected (its run
    folder whole: 5 % below the others) as the nightly flow finds it once its evaluation returned."""
    results = tmp_path / "results"
    url = f"sqlite:///{results / 'history.sqlite'}"
    engine = history_engine(url)
    for night, values in enumerate([[100.0, 100.6, 99.4], [100.8, 101.2, 100.5], [99.1, 99.6, 98.9],
                                    [100.2, 99.8, 100.4], [99.7, 100.3, 100.0]]):
        record_run(engine, make_run(results, f"run-n{night}", values), recorded_at=START + timedelta(days=night))
    engine.dispose()
    return url, results, make_run(results, "run-tonight", [95.1, 94.8, 95.3])


def recorded(url: str, run_id: str) -> list[tuple]:
    from flagperf.results.history import figures, runs

    with history_engine(url).connect() as conn:
        return [tuple(row) for row in conn.execute(
            select(runs.c.outcome, runs.c.recorded_at, func.count(figures.c.id)).select_from(
                runs.outerjoin(figures, figures.c.run_id == runs.c.run_id)).where(runs.c.run_id == run_id)
            .group_by(runs.c.run_id, runs.c.outcome, runs.c.recorded_at)).all()]


def published(results: Path, run: Path) -> dict:
    """The night's verdict file, the same in the results folder and in its run folder; nothing half-written."""
    verdict = json.loads((results / "nightly-tiny.json").read_text())
    assert json.loads((run / "nightly-tiny.json").read_text()) == verdict
    assert [p for p in results.rglob(".*")] == []
    return verdict


def test_a_night_interrupted_while_it_is_recorded_keeps_its_measurement(
        measured_night: tuple[str, Path, Path], restored_process_state: None) -> None:
    """Ctrl-C as the night's figures go into the history (after its evaluation measured and collected every
    round): the transaction is undone whole, and the flow's handler records the night with its figures all the
    same, so it is a baseline for the nights after it, as the regression owner expects of a measured night; its
    verdict file says Interrupted, not judged, and trends.csv shows it judged like every night."""
    import signal
    import threading

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from flows.nightly import record_measured_interruption

    url, results, run = measured_night
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def ctrl_c_as_figures_go_in(_conn, _cursor, statement: str, *_args) -> None:
        if statement.startswith("INSERT INTO figures"):
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    event.listen(Engine, "before_cursor_execute", ctrl_c_as_figures_go_in)
    try:
        with pytest.raises(KeyboardInterrupt) as stopped:
            record_run(history_engine(url), run)  # what the flow's record_history does
    finally:
        event.remove(Engine, "before_cursor_execute", ctrl_c_as_figures_go_in)
    assert recorded(url, run.name) == []  # not half a night: the run's row went with its figures
    record_measured_interruption(stopped.value, run, "tiny", None, url, str(results))
    ((outcome, _at, count),) = recorded(url, run.name)
    assert (outcome, count) == ("completed", 1)
    verdict = published(results, run)
    assert (verdict["run_id"], verdict["state"], verdict["exit_code"], verdict["measured"]) == (
        run.name, "Interrupted", 5, True)  # stopped before it was judged: judged now, its regression's exit code
    assert verdict["message"] == ("interrupted (SIGINT) once measured: its 1 figures are recorded in the history, "
                                  "judged: 1 regression(s)")
    assert [v["status"] for v in verdict["verdicts"]] == ["regression"] and len(verdict["regressions"]) == 1
    with (results / "trends.csv").open() as handle:
        trend = {row["run_id"]: row["verdict"] for row in csv.DictReader(handle)}
    assert trend[run.name] == "regression"
    engine = history_engine(url)
    record_run(engine, make_run(results, "run-next", [95.0, 95.2, 94.9]), recorded_at=START + timedelta(days=40))
    (after,) = check_run(engine, "run-next")
    assert after.baseline_runs[0] == run.name  # a night like any other


def test_a_night_interrupted_once_judged_keeps_its_record_and_publishes_its_verdicts(
        measured_night: tuple[str, Path, Path]) -> None:
    """SIGTERM after the night was recorded and judged (while its verdict was published): the record stands as it
    was (one, not written again), and the verdict file has the verdicts, the regression among them, with the
    exit code of the signal; `flagperf nightly` says the flow's account in its one line."""
    from flows.nightly import record_measured_interruption
    from flows.nightly_cli import NOT_JUDGED, Night, interrupted_line, interrupted_outcome

    url, results, run = measured_night
    engine = history_engine(url)
    record_run(engine, run, recorded_at=START + timedelta(days=6))
    verdicts = check_run(engine, run.name)
    before = recorded(url, run.name)
    record_measured_interruption(KeyboardInterrupt("SIGTERM"), run, "tiny", verdicts, url, str(results))
    assert recorded(url, run.name) == before
    verdict = published(results, run)
    assert (verdict["state"], verdict["exit_code"], verdict["measured"]) == ("Interrupted", 5, True)
    assert verdict["message"] == ("interrupted (SIGTERM) once measured: its 1 figures are recorded in the "
                                  "history, judged: 1 regression(s)")
    assert verdict["regressions"] == [verdicts[0].line()] and verdicts[0].status == "regression"
    night = Night(suite="tiny", vendor="auto", rounds=3, overrides=[], inventory=None, results=results,
                  history_url=url, baseline_runs=5, sigma=3.0, run_id=run.name)
    assert interrupted_outcome(night) == (f"{verdict['message']}; verdict: {results / 'nightly-tiny.json'}", 5)
    assert interrupted_line(Night(**{**night.__dict__, "run_id": "run-other"})) == NOT_JUDGED  # not this night's


def test_a_second_sigterm_inside_the_flow_does_not_undo_the_interrupted_nights_record(
        measured_night: tuple[str, Path, Path], restored_process_state: None) -> None:
    """Inside a flow run Prefect's own SIGTERM handler raises TerminationSignal on every SIGTERM: a second one
    as the interrupted night's figures go in is only noted, so the record is not rolled back and the verdict
    file is written; the handlers of before (Prefect's) are back afterwards."""
    import signal
    import threading

    from prefect.exceptions import TerminationSignal
    from prefect.utilities.engine import capture_sigterm
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from flows.nightly import record_measured_interruption

    url, results, run = measured_night
    outside: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: outside.append(signum))  # the CLI's, before the flow

    def sigterm(*_args: object) -> None:
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    def again_as_figures_go_in(_conn, _cursor, statement: str, *_args) -> None:
        if statement.startswith("INSERT INTO figures"):
            sigterm()

    with pytest.raises(TerminationSignal), capture_sigterm():  # what the flow engine runs the flow in
        prefects = signal.getsignal(signal.SIGTERM)
        try:
            sigterm()  # the first: the flow stops where it is
        except TerminationSignal as first:
            event.listen(Engine, "before_cursor_execute", again_as_figures_go_in)
            try:
                record_measured_interruption(first, run, "tiny", None, url, str(results))
            finally:
                event.remove(Engine, "before_cursor_execute", again_as_figures_go_in)
            assert signal.getsignal(signal.SIGTERM) is prefects
            raise
    ((outcome, _at, count),) = recorded(url, run.name)
    assert (outcome, count) == ("completed", 1)
    verdict = published(results, run)
    assert (verdict["state"], verdict["exit_code"], verdict["measured"]) == ("Interrupted", 5, True)


def test_a_postgresql_history_has_a_connect_and_a_lock_timeout(history) -> None:
    """A history server that does not answer, or a table another session holds locked, ends a write with an
    error in bounded time (a night's clean-up after Ctrl-C waits on it); SQLite takes no such arguments."""
    from sqlalchemy import text

    with history.connect() as conn:
        if history.dialect.name != "postgresql":
            assert conn.execute(text("SELECT 1")).scalar() == 1
            return
        assert conn.execute(text("SHOW lock_timeout")).scalar() == "1min"
        assert conn.connection.dbapi_connection.info.get_parameters()["connect_timeout"] == "15"
    # What the deployment sets itself wins: the URL's options and connect_timeout (a libpq service file's and
    # PGOPTIONS' the same way: nothing is passed over them)
    own = history_engine(f"{_postgres_url()}?connect_timeout=7&options=-c%20lock_timeout%3D5s")
    try:
        with own.connect() as conn:
            assert conn.execute(text("SHOW lock_timeout")).scalar() == "5s"
            assert conn.connection.dbapi_connection.info.get_parameters()["connect_timeout"] == "7"
    finally:
        own.dispose()


def test_the_history_s_connect_timeout_is_passed_only_where_nothing_else_sets_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A libpq service (its file may set connect_timeout) or PGCONNECT_TIMEOUT win, and a driver other than libpq's
    (pg8000) takes no such argument: nothing is passed there."""
    from flagperf.results.history import PG_CONNECT_TIMEOUT_S, _connect_timeout

    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    monkeypatch.delenv("PGSERVICE", raising=False)
    assert _connect_timeout("postgresql+psycopg://u@h/db") == {"connect_timeout": PG_CONNECT_TIMEOUT_S}
    assert _connect_timeout("postgresql+psycopg:///?service=perf") == {}
    assert _connect_timeout("postgresql+pg8000://u@h/db") == {}
    assert _connect_timeout("sqlite:///h.sqlite") == {}
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "3")
    assert _connect_timeout("postgresql+psycopg://u@h/db") == {}


def test_a_night_interrupted_once_published_keeps_its_outcome_and_exit_code(
        measured_night: tuple[str, Path, Path]) -> None:
    """Ctrl-C after the flow published a regression (exit 5) but before it returned: `flagperf nightly` says the
    outcome stands and exits 5, not 'not judged' with 130, so that cron does not lose the regression."""
    from prefect.states import Failed

    from flows.nightly import REGRESSED_STATE, publish_night
    from flows.nightly_cli import Night, interrupted_outcome

    url, results, run = measured_night
    engine = history_engine(url)
    record_run(engine, run, recorded_at=START + timedelta(days=6))
    verdicts = check_run(engine, run.name)
    publish_night(str(results), "tiny", run, Failed(message="1 regression(s)", name=REGRESSED_STATE), verdicts, url)
    night = Night(suite="tiny", vendor="auto", rounds=3, overrides=[], inventory=None, results=results,
                  history_url=url, baseline_runs=5, sigma=3.0, run_id=run.name)
    assert interrupted_outcome(night) == (
        f"interrupted as the night ended; its outcome stands: Regressed (exit 5); verdict: "
        f"{results / 'nightly-tiny.json'}", 5)


def test_nights_of_a_suite_at_the_same_time_each_read_back_their_own_verdict(
        measured_night: tuple[str, Path, Path]) -> None:
    """Nights of the suite running at once into one results folder (a cron night and a manual rerun): each
    `flagperf nightly` reads back the verdict it published itself, never the other's, though both publish the
    results folder's nightly-tiny.json. That file is the night started last: one started earlier that ends later
    (the rerun) leaves it there and writes only its run folder's copy; a night that published nothing (stopped
    before it measured) is not judged, whatever the others published."""
    from prefect.states import Completed, Failed

    from flows.nightly import REGRESSED_STATE, publish_night, record_interruption
    from flows.nightly_cli import NOT_JUDGED, Night, interrupted_outcome, this_night

    url, results, tonight = measured_night
    engine = history_engine(url)
    record_run(engine, tonight, recorded_at=START + timedelta(days=6))
    verdicts = check_run(engine, tonight.name)
    # Run ids as nights name them (flagperf.config.night.new_night_run_id): started 02:00, 02:05, and 02:05 again
    rerun, cron, same_second = (f"run20241107{hhmmss}-{tail * 12}" for hhmmss, tail in (
        ("020000", "a"), ("020500", "b"), ("020500", "c")))
    latest = results / "nightly-tiny.json"

    def night(run_id: str) -> Night:
        return Night(suite="tiny", vendor="auto", rounds=3, overrides=[], inventory=None, results=results,
                     history_url=url, baseline_runs=5, sigma=3.0, run_id=run_id)

    def publish(run_id: str, state: object, judged: list | None = None) -> dict:
        (results / run_id).mkdir()
        publish_night(str(results), "tiny", results / run_id, state, judged or [], url)
        return json.loads(latest.read_text())

    # The cron night ends first, in a regression; the rerun, started before it, ends after it and held.
    assert publish(cron, Failed(message="1 regression(s)", name=REGRESSED_STATE), verdicts)["run_id"] == cron
    assert publish(rerun, Completed(message="no regression: 1 ok"))["run_id"] == cron  # the later night's stays
    assert json.loads((results / rerun / latest.name).read_text())["state"] == "Completed"
    assert interrupted_outcome(night(rerun)) == (
        f"interrupted as the night ended; its outcome stands: Completed (exit 0); verdict: "
        f"{results / rerun / latest.name}", 0)
    assert interrupted_outcome(night(cron)) == (
        f"interrupted as the night ended; its outcome stands: Regressed (exit 5); verdict: {latest}", 5)
    assert this_night(night(rerun))[0]["verdicts"] == [] and len(this_night(night(cron))[0]["verdicts"]) == 1
    # Stopped before anything was published: not judged, though the file has a regression and the exit code 5
    assert interrupted_outcome(night("run20241107021000-dddddddddddd")) == (NOT_JUDGED, None)
    assert this_night(night("run20241107021000-dddddddddddd")) == ({}, None)
    # Started in the same second as the cron night (or named with no time in it): in the order they publish
    assert publish(same_second, Completed(message="no regression: 1 ok"))["run_id"] == same_second
    # Stopped before its run folder was made: its verdict is the results folder's only, while it names this night
    stopped = "run20241107021500-eeeeeeeeeeee"
    record_interruption(KeyboardInterrupt("SIGTERM"), stopped, "tiny", "cpu", url, str(results))
    assert not (results / stopped).exists()
    published, path = this_night(night(stopped))
    assert (published["run_id"], published["exit_code"], path) == (stopped, 143, latest)
    # A run_id typed in the form names no start time, though it looks like one (only a night's own form does), and a
    # start after this machine's clock (typed, or a host's clock running ahead) is not trusted: either such night is
    # in the order they end, and the next night to end replaces its verdict, never held back by it for ever.
    for typed, after in (("run99991231235959-mine", "run20241107022000-ffffffffffff"),
                         ("run99991231235959-0123456789ab", "run20241107022500-abababababab")):
        assert publish(typed, Completed(message="no regression: 1 ok"))["run_id"] == typed
        assert publish(after, Completed(message="no regression: 1 ok"))["run_id"] == after
    assert [p for p in results.rglob(".*")] == []  # every write whole, no lock file left among the results


def test_a_night_waits_for_another_publishing_and_a_hung_one_holds_it_up_to_a_deadline(
        measured_night: tuple[str, Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Two nights publishing at once into one results folder: the lock on the folder is held here (as another night
    writing trends.csv from its history would hold it), and tonight's publishing, in a thread, waits: nothing of it
    in the results folder until the lock is released, then its verdict and trends.csv. A night that holds the lock
    and hangs (a remote history that does not answer) holds the others up to PUBLISH_WAIT_S only: then they publish
    without it, with a warning. The wait is the flow's own poll; here each pause waits for the test's go instead of
    a time, so nothing depends on timing."""
    import fcntl
    import logging
    import threading

    from prefect.states import Completed

    import flows.nightly
    from flows.nightly import publish_night

    url, results, tonight = measured_night
    latest, trends = results / "nightly-tiny.json", results / "trends.csv"
    waiting, released = threading.Event(), threading.Event()

    def pause(_seconds: float) -> None:  # tonight found the lock held: it waits until the test lets the other go
        waiting.set()
        assert released.wait(timeout=300)

    monkeypatch.setattr(flows.nightly, "_pause", pause)
    other = os.open(results, os.O_RDONLY | os.O_DIRECTORY)  # the other night's hold on the folder
    failures: list[BaseException] = []

    def publish(run: Path) -> None:
        try:
            publish_night(str(results), "tiny", run, Completed(message="no regression: 1 ok"), [], url)
        except BaseException as exc:  # said by the test, in its thread
            failures.append(exc)

    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        thread = threading.Thread(target=publish, args=(tonight,))
        thread.start()
        assert waiting.wait(timeout=300), "tonight's publishing did not wait for the lock"
        assert not latest.exists() and not trends.exists()  # only its run folder's copy, which is its own
        assert json.loads((tonight / latest.name).read_text())["run_id"] == tonight.name
        fcntl.flock(other, fcntl.LOCK_UN)
        released.set()
        thread.join(timeout=300)
        assert not thread.is_alive() and failures == []
        assert json.loads(latest.read_text())["run_id"] == tonight.name and trends.is_file()

        # The other night holds the lock and hangs: past the deadline (none here), the next night publishes anyway.
        monkeypatch.setattr(flows.nightly, "PUBLISH_WAIT_S", 0.0)
        monkeypatch.setattr(flows.nightly, "_pause", lambda _seconds: pytest.fail("waited past the deadline"))
        fcntl.flock(other, fcntl.LOCK_EX)
        later = make_run(results, "run-later", [100.0, 100.1, 99.9])
        said: list[logging.LogRecord] = []

        class Said(logging.Handler):  # the log of a night published outside a flow run
            def emit(self, record: logging.LogRecord) -> None:
                said.append(record)

        handler = Said(logging.WARNING)
        logging.getLogger("flows.nightly").addHandler(handler)
        try:
            publish(later)
        finally:
            logging.getLogger("flows.nightly").removeHandler(handler)
        assert failures == [] and json.loads(latest.read_text())["run_id"] == later.name
        assert [r.getMessage() for r in said] == [
            f"another night has been publishing into {results} for 0 s (its trends.csv from the history): this night "
            "publishes without waiting for it"]
    finally:
        released.set()
        os.close(other)


def test_a_measured_night_whose_figures_cannot_be_recorded_is_recorded_as_interrupted(
        measured_night: tuple[str, Path, Path]) -> None:
    """The history refuses the interrupted night's figures (a full disk as they go in): the night is recorded as
    interrupted all the same, and its verdict file says what became of its figures, not nothing at all."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from flows.nightly import record_measured_interruption

    url, results, run = measured_night

    def disk_full_as_figures_go_in(_conn, _cursor, statement: str, *_args) -> None:
        if statement.startswith("INSERT INTO figures"):
            raise OSError(28, "No space left on device")

    event.listen(Engine, "before_cursor_execute", disk_full_as_figures_go_in)
    try:
        record_measured_interruption(KeyboardInterrupt("SIGINT"), run, "tiny", None, url, str(results))
    finally:
        event.remove(Engine, "before_cursor_execute", disk_full_as_figures_go_in)
    ((outcome, _at, count),) = recorded(url, run.name)
    assert (outcome, count) == ("interrupted", 0)
    verdict = published(results, run)
    assert (verdict["state"], verdict["exit_code"], verdict["measured"]) == ("Interrupted", 130, True)
    assert verdict["message"] == ("interrupted (SIGINT) once measured: its figures could not be recorded in the "
                                  "history ([Errno 28] No space left on device); its run folder has them")


def test_a_night_whose_history_cannot_be_looked_at_fails_in_one_line(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The nightly's history is a link into a folder this user cannot enter: the night fails before measuring
    with one line naming the link, its target and why, where it crashed with a traceback (the check's
    FlagperfError was not among the errors it said)."""
    from flows.nightly import nightly_regression

    results = tmp_path / "results"
    results.mkdir()
    locked = tmp_path / "locked"
    locked.mkdir()
    link = results / "history.sqlite"
    link.symlink_to(locked / "history.sqlite")
    with unenterable(locked, monkeypatch):
        state = nightly_regression.fn(results_dir=str(results))
    line = f"the history {link} (a link to {locked / 'history.sqlite'}) cannot be read: Permission denied"
    assert state.is_failed() and state.message == line, state
    assert sorted(p.name for p in results.iterdir()) == ["history.sqlite"]  # no run folder: nothing measured
