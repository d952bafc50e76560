"""`flagperf server` for real: a Prefect server on PostgreSQL with a process worker, stopped cleanly.

Needs a PostgreSQL database: FLAGPERF_TEST_POSTGRES_URL (and PGPASSWORD), as
deployments/postgres/test-database.sh prints them; .ci/run sets them up."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from prefect_api import assert_schedule_gets_runs
from server_ports import start_on_os_ports

# In CI the database must be there (.ci/run makes it): a skip there would hide a broken set-up.
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not os.environ.get("FLAGPERF_TEST_POSTGRES_URL") and not os.environ.get("CI"),
                                 reason="no PostgreSQL for the test (see deployments/postgres/test-database.sh)")]
ROOT = Path(__file__).resolve().parents[2]


def said_with_server_log(proc: subprocess.Popen[str]) -> str:
    """What an exited `flagperf server` printed, and its Prefect server's log (a port taken shows in either)."""
    log = Path(proc.args[proc.args.index("--log-dir") + 1]) / "server.log"
    return (proc.stdout.read() if proc.stdout else "") + (log.read_text(errors="replace") if log.is_file() else "")


def pools_in_postgres() -> list[str]:
    import asyncio

    import asyncpg

    async def query() -> list[str]:
        dsn = os.environ["FLAGPERF_TEST_POSTGRES_URL"].replace("postgresql+asyncpg://", "postgresql://")
        conn = await asyncpg.connect(dsn)
        try:
            return [r["name"] for r in await conn.fetch("select name from work_pool where name like 'flagperf%'")]
        finally:
            await conn.close()

    return asyncio.run(query())


def test_server_on_postgres_with_a_worker(tmp_path: Path) -> None:
    """On a port other than Prefect's 4200: the UI is told that port (its settings endpoint), the results
    folder is served read-only beside it, and SIGTERM stops everything it started."""
    results = tmp_path / "results"
    (results / "run-x").mkdir(parents=True)
    (results / "run-x" / "report.html").write_text("<p>the report</p>", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_UI_API_URL")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")

    def start_server(port: int, results_port: int) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "flows.cli", "server", "--database-url",
                                 os.environ["FLAGPERF_TEST_POSTGRES_URL"], "--port", str(port), "--pool",
                                 "flagperf-test", "--results", str(results), "--results-port", str(results_port),
                                 "--log-dir", str(tmp_path / f"logs-{port}")], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    proc, port, results_port = start_on_os_ports(start_server, tmp_path / "prefect-home", said_with_server_log)
    api = f"http://127.0.0.1:{port}/api"
    try:
        workers: list[dict] = []
        deadline = time.time() + 240
        while time.time() < deadline and not workers:
            assert proc.poll() is None, proc.stdout.read()
            try:
                pool = httpx.get(f"{api}/work_pools/flagperf-test", timeout=5)
                if pool.status_code == 200:  # a worker of an earlier server on the same database stays OFFLINE
                    workers = [w for w in httpx.post(f"{api}/work_pools/flagperf-test/workers/filter", json={},
                                                     timeout=5).json() if w["status"] == "ONLINE"]
            except httpx.HTTPError:
                pass
            if not workers:
                time.sleep(2)
        assert workers, "no worker came online"
        assert pool.json()["type"] == "process"
        # The server really stores in PostgreSQL: the pool is a row there.
        assert "flagperf-test" in pools_in_postgres()  # other tests of the session may add their pools
        # The UI in a browser asks this endpoint where the API is: this server, not port 4200.
        settings = httpx.get(f"http://127.0.0.1:{port}/ui-settings", timeout=10).json()
        assert settings["api_url"] == api, settings
        page = httpx.get(f"http://127.0.0.1:{results_port}/run-x/report.html", timeout=10)
        assert page.status_code == 200 and page.text == "<p>the report</p>"
        assert httpx.put(f"http://127.0.0.1:{results_port}/run-x/report.html", content=b"x",
                         timeout=10).status_code == 501
        # Its scheduler works on this database: a deployment with the nightly's schedule gets its runs.
        assert_schedule_gets_runs(api)
        children = psutil.Process(proc.pid).children(recursive=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, out
    assert "worker: pool 'flagperf-test'" in out
    assert f"UI at http://127.0.0.1:{port}" in out and f"served read-only at http://127.0.0.1:{results_port}/" in out
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_a_killed_server_command_leaves_no_server(tmp_path: Path) -> None:
    """SIGKILL gives `flagperf server` no chance to stop anything: its watchers stop the server and worker."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")

    def start_server(port: int, results_port: int) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "flows.cli", "server", "--database-url",
                                 os.environ["FLAGPERF_TEST_POSTGRES_URL"], "--port", str(port), "--no-worker",
                                 "--pool", "flagperf-kill", "--results", str(tmp_path / "results"),
                                 "--results-port", str(results_port), "--log-dir", str(tmp_path / f"logs-{port}")],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    proc, _, _ = start_on_os_ports(start_server, tmp_path / "prefect-home", said_with_server_log)
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children
    finally:
        proc.kill()
        proc.wait()
    _gone, alive = psutil.wait_procs(children, timeout=60)
    left = []
    for c in alive:
        with contextlib.suppress(psutil.Error):
            if c.status() != psutil.STATUS_ZOMBIE:
                left.append((c.pid, c.ppid(), os.getpgid(c.pid), c.cmdline()))
    assert not left, left  # pid, parent, group and command of each: which watcher let it go
