"""Shared fixtures: real files in tmp_path, found through the FLAGPERF_*_PATH search paths."""

from __future__ import annotations

import os
import signal
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

SEARCH_PATH_VARS = ("FLAGPERF_CASE_PATH", "FLAGPERF_SUITE_PATH", "FLAGPERF_VENDOR_PATH")

# A minimal case module honouring the case contract (Config + run); used for tmp case folders.
BENCH_PY = textwrap.dedent(
    """
    from pydantic import Field

    from flagperf.measure.casekit import CaseConfig
    from flagperf.results.schema import Metric


    class Config(CaseConfig):
        size: int = Field(gt=0)
        label: str = "x"


    def run(config, ctx):
        return [Metric(name="size", value=float(config.size), unit="items")]
    """
)

TIMING_DEFAULTS: dict[str, Any] = {"timeout_s": 60, "max_retries": 0}


@pytest.fixture(autouse=True)
def _clean_search_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts with only the project's own case, suite and vendor folders."""
    for var in SEARCH_PATH_VARS:
        monkeypatch.delenv(var, raising=False)


def write_yaml(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture
def case_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An extra case root (on FLAGPERF_CASE_PATH) holding <family>/<case>/case.yaml folders."""
    root = tmp_path / "extra_cases"
    root.mkdir()
    monkeypatch.setenv("FLAGPERF_CASE_PATH", os.pathsep.join([str(tmp_path / "does-not-exist"), str(root)]))
    return root


@pytest.fixture
def suite_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "extra_suites"
    root.mkdir()
    monkeypatch.setenv("FLAGPERF_SUITE_PATH", str(root))
    return root


@pytest.fixture
def yaml_writer() -> Callable[[Path, Any], Path]:
    """``yaml_writer(path, data)``: dump data as YAML to path (parents created)."""
    return write_yaml


@pytest.fixture
def bench_py() -> str:
    return BENCH_PY


MakeCase = Callable[..., Path]


@pytest.fixture
def make_case(case_root: Path) -> MakeCase:
    """Write a case folder; returns it. ``bench`` None with a flagperf.basespec entry writes no bench.py."""

    def make(name: str = "mycase", *, configurations: dict[str, Any] | None = None,
             parameters: dict[str, Any] | None = None, entry: str = "bench.py", bench: str | None = BENCH_PY,
             vendor: dict[str, Any] | str | None = None, family: str = "base",
             manifest_extra: dict[str, Any] | None = None) -> Path:
        folder = case_root / family / name
        folder.mkdir(parents=True)
        manifest: dict[str, Any] = {
            "name": name, "family": "base", "description": f"test case {name}", "entry": entry,
            "configurations": {"size": 8, "label": "x", **TIMING_DEFAULTS} if configurations is None
            else configurations,
        }
        if parameters is not None:
            manifest["parameters"] = parameters
        manifest.update(manifest_extra or {})
        write_yaml(folder / "case.yaml", manifest)
        if bench is not None and not entry.startswith("flagperf.basespec."):
            (folder / entry).write_text(bench, encoding="utf-8")
        if isinstance(vendor, str):
            (folder / "vendor").mkdir()
            (folder / "vendor" / "cpu.yaml").write_text(vendor, encoding="utf-8")
        elif vendor is not None:
            write_yaml(folder / "vendor" / "cpu.yaml", vendor)
        return folder

    return make



@pytest.fixture
def restored_process_state() -> Iterator[None]:
    """The signal handlers and environment a command under test sets for its process, put back."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    environment = dict(os.environ)
    yield
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    os.environ.clear()
    os.environ.update(environment)
