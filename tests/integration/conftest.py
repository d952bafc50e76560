"""One real Prefect server for the whole integration session (it takes 20-30 s to start here)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

FIXTURE_CASES = Path(__file__).resolve().parents[1] / "fixtures" / "cases"


def pytest_configure(config: pytest.Config) -> None:
    """Every container this session starts carries the test bed's owner label with this session's pid
    (FLAGPERF_CONTAINER_OWNER, read by the controller and so by every flow and CLI it starts): up.sh removes what a
    killed session left of those (stopped, or its session gone), never a live session's running ones, and never
    another owner's containers on a shared engine."""
    from tests.testbed.bed import load_testbed, session_id

    try:
        bed = load_testbed()
    except (ValueError, OSError):  # a broken bed (FLAGPERF_TESTBED a folder, unreadable): the tests that need it
        return  # say so; the others (unit tests in the same session) run
    if bed is not None and bed.container_owner:
        # assigned: a lab's own exported value would label this session's containers as the lab's, and up.sh
        # would never remove what a killed session left
        # <bed owner>.<this session's pid>.<its start>: up.sh removes a running one only once that process is gone
        # (or the pid is another's), so a second session on the same bed does not take the first one's containers
        # away mid-round
        os.environ["FLAGPERF_CONTAINER_OWNER"] = f"{bed.container_owner}.{session_id()}"


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[None]:
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "flagperf")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Unit tests that run case code in-process may follow this session fixture (plain `pytest`, one process); its
    # loggers have no flow run there.
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture
def flagperf_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Test cases on the case path, scratch space for the host, and a results folder, all under tmp_path."""
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(FIXTURE_CASES))
    monkeypatch.setenv("FLAGPERF_WORK_ROOT", str(tmp_path / "work"))
    return tmp_path / "results"


@pytest.hookimpl(trylast=True)  # after pytest's own, which tears down the fixtures an interrupt left (a server)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """The work pool this session's `flagperf server`s used on the shared test database, and their deployments, go
    with the session (its servers are stopped by now, also on Ctrl-C: this runs after the fixtures' teardown): a
    developer's database keeps no pool per test session."""
    import server_ports

    if server_ports.SESSION_USED:
        try:
            server_ports.clear_what_ended_servers_left(None)
        except Exception as exc:  # best effort (the next session clears it): never the session's verdict
            print(f"\nthe test database keeps work pool {server_ports.SESSION_USED[0]}: {exc}", file=sys.stderr)
