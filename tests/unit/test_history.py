"""Regression verdicts on a seeded history: a true 5 % drop is flagged, noise within the spread is not."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from flagperf.results.history import check_run, history_engine, metadata, record_run
from flagperf.results.schema import Metric, RoundResult, write_result

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
    one_point = _verdict({"case": "c", "metric": "x", "unit": "GB/s", "value": 1.0, "spread_cv": None}, [2.0], 1,
                         3.0, 0.01)
    assert one_point.status == "no-baseline"
