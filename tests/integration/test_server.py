"""`flagperf server` for real: a Prefect server on PostgreSQL with a process worker, stopped cleanly.

Needs a PostgreSQL database: FLAGPERF_TEST_POSTGRES_URL (and PGPASSWORD), as
deployments/postgres/test-database.sh prints them; .ci/run sets them up."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from prefect_api import assert_schedule_gets_runs

# In CI the database must be there (.ci/run makes it): a skip there would hide a broken set-up.
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not os.environ.get("FLAGPERF_TEST_POSTGRES_URL") and not os.environ.get("CI"),
                                 reason="no PostgreSQL for the test (see deployments/postgres/test-database.sh)")]
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "server", "--database-url",
                             os.environ["FLAGPERF_TEST_POSTGRES_URL"], "--port", str(port), "--pool", "flagperf-test",
                             "--log-dir", str(tmp_path / "logs")], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        workers: list[dict] = []
        deadline = time.time() + 240
        while time.time() < deadline and not workers:
            assert proc.poll() is None, proc.stdout.read()
            try:
                pool = httpx.get(f"{api}/work_pools/flagperf-test", timeout=5)
                if pool.status_code == 200:
                    workers = httpx.post(f"{api}/work_pools/flagperf-test/workers/filter", json={}, timeout=5).json()
            except httpx.HTTPError:
                pass
            time.sleep(2)
        assert workers and workers[0]["status"] == "ONLINE", workers
        assert pool.json()["type"] == "process"
        # The server really stores in PostgreSQL: the pool is a row there.
        assert pools_in_postgres() == ["flagperf-test"]
        # Its scheduler works on this database: a deployment with the nightly's schedule gets its runs.
        assert_schedule_gets_runs(api)
        children = psutil.Process(proc.pid).children(recursive=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, out
    assert "worker: pool 'flagperf-test'" in out
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
