"""flagperf.results.schema: the RoundResult schema, atomic JSON writes and the run layout."""

from __future__ import annotations

import json
import stat
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from flagperf.results.schema import (
    RESULT_FILE,
    Failure,
    Metric,
    Peak,
    Provenance,
    RoundResult,
    SpecTable,
    read_result,
    round_dir,
    write_json_atomic,
    write_result,
)

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def make_result(**overrides: Any) -> RoundResult:
    data: dict[str, Any] = {
        "run_id": "run1", "case": "computation-FP32", "family": "base", "round": 1, "host": "localhost",
        "node_rank": 0, "vendor": "cpu", "status": "success", "started_at": T0,
        "finished_at": T0 + timedelta(seconds=2.5), "duration_s": 2.5, "measured_seconds": 2.0,
        "device": "Test CPU", "config": {"m": 64, "precision": "fp32"},
        "metrics": [Metric(name="gemm_fp32", value=1.25, unit="TFLOPS", p50=1.2, p10=1.1, p90=1.3, cv=0.01,
                           chunks=20, iterations=200, measured_seconds=2.0,
                           peak=Peak(value=2.5, unit="TFLOPS", source="derived: test"), ratio=0.5,
                           convention="2*M*N*K")],
        "provenance": Provenance(engine_version="0.1.0", git_revision="abc", git_dirty=False, python="3.11",
                                 libraries={"torch": "2.13.0"}, host={"hostname": "h"}, image={"status": "none"},
                                 config_origins={"m": "--set"}, run_overrides={"--set": {"m": 64}}),
    }
    data.update(overrides)
    return RoundResult(**data)


def test_round_trip(tmp_path: Path) -> None:
    result = make_result()
    path = tmp_path / "a" / "b" / RESULT_FILE
    write_result(path, result)
    back = read_result(path)
    assert back == result
    assert back.started_at == T0
    assert back.metrics[0].peak is not None and back.metrics[0].peak.source == "derived: test"
    on_disk = json.loads(path.read_text(encoding="utf-8"))
    assert on_disk["schema_version"] == 1
    assert on_disk["metrics"][0]["unit"] == "TFLOPS"


def test_round_trip_of_a_failed_round(tmp_path: Path) -> None:
    result = make_result(status="failed", metrics=[], failure=Failure(kind="user", message="bad m"),
                         provenance=None, device=None)
    path = tmp_path / RESULT_FILE
    write_result(path, result)
    assert read_result(path) == result


def test_result_file_is_world_readable(tmp_path: Path) -> None:
    path = tmp_path / RESULT_FILE
    write_result(path, make_result())
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


@pytest.mark.parametrize("where", ["top", "metric", "peak", "failure", "provenance"])
def test_extra_keys_are_rejected(tmp_path: Path, where: str) -> None:
    data = make_result(failure=Failure(kind="user", message="m")).model_dump(mode="json")
    target = {"top": data, "metric": data["metrics"][0], "peak": data["metrics"][0]["peak"],
              "failure": data["failure"], "provenance": data["provenance"]}[where]
    target["surprise"] = 1
    path = tmp_path / RESULT_FILE
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValidationError, match="surprise"):
        read_result(path)


@pytest.mark.parametrize(("key", "value"), [("round", 0), ("node_rank", -1), ("status", "ok"), ("schema_version", 2),
                                            ("duration_s", -1.0)])
def test_invalid_values_are_rejected(key: str, value: object) -> None:
    with pytest.raises(ValidationError):
        make_result(**{key: value})


def test_failure_kinds() -> None:
    for kind in ("infrastructure", "user", "unsupported"):
        assert Failure(kind=kind, message="x").kind == kind
    with pytest.raises(ValidationError):
        Failure(kind="crash", message="x")


def test_spec_table_defaults() -> None:
    table = SpecTable.model_validate({"device": "d", "peaks": {"fp32": {"value": 1.0, "unit": "TFLOPS",
                                                                        "source": "datasheet"}}})
    assert table.peaks["fp32"].supported is True
    assert table.peaks["fp32"].dense is True
    with pytest.raises(ValidationError):
        SpecTable.model_validate({"device": "d", "peaks": {"fp32": {"value": 1.0, "unit": "TFLOPS"}}})


def test_round_dir_layout(tmp_path: Path) -> None:
    assert round_dir(tmp_path / "run1", "computation-FP32", 3, "host-a") == \
        tmp_path / "run1" / "computation-FP32" / "round3" / "host-a_noderank0"
    assert round_dir(Path("r"), "c", 1, "h", node_rank=2) == Path("r/c/round1/h_noderank2")


def test_write_json_atomic_creates_parents_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "x" / "y" / "data.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"a": 2, "when": T0})
    assert json.loads(path.read_text(encoding="utf-8")) == {"a": 2, "when": str(T0)}
    assert path.read_text(encoding="utf-8").endswith("\n")
    assert sorted(p.name for p in path.parent.iterdir()) == ["data.json"]


@pytest.mark.parametrize("bad", [{("tuple", "key"): 1}, "circular"])
def test_write_json_atomic_failure_leaves_old_file_and_no_temp(tmp_path: Path, bad: object) -> None:
    path = tmp_path / "data.json"
    write_json_atomic(path, {"old": True})
    if bad == "circular":
        loop: list[Any] = []
        loop.append(loop)
        bad = {"big": list(range(1000)), "loop": loop}
    with pytest.raises((TypeError, ValueError)):
        write_json_atomic(path, bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.json"]
    assert json.loads(path.read_text(encoding="utf-8")) == {"old": True}


def test_write_json_atomic_failure_without_old_file(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        write_json_atomic(tmp_path / "new.json", {(1, 2): "x"})
    assert list(tmp_path.iterdir()) == []
