"""Servers the integration tests start by command (`prefect server start`, `flagperf server`), which take a port
number, not a bound socket: a port the OS gave a moment ago can be taken by someone else (another test session,
any program) before the server binds it. So each start is checked to be this test's server (its PREFECT_HOME,
as the server reports it) and is made again on fresh ports when a port was taken."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import httpx

TAKEN = "already in use"  # uvicorn's, `prefect server start`'s and `flagperf server`'s words, lower-cased


def os_port() -> int:
    """A port the OS gave now: free at this moment only (see start_on_os_ports)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serves_home(api: str, home: Path, headers: dict[str, str] | None = None) -> bool:
    """Whether the Prefect server answering at ``api`` is the one started with PREFECT_HOME ``home`` (``headers``:
    its sign-in, if it has one)."""
    try:
        answer = httpx.get(f"{api}/admin/settings", headers=headers, timeout=5)
    except httpx.HTTPError:
        return False
    return answer.status_code == 200 and Path(answer.json().get("home", "")) == home


def start_on_os_ports(start: Callable[[int, int], subprocess.Popen], home: Path,
                      output: Callable[[subprocess.Popen], str], limit_s: float = 240.0,
                      tries: int = 3, headers: dict[str, str] | None = None) -> tuple[subprocess.Popen, int, int]:
    """``start(port, second_port)`` (a Prefect API on ``port``, started with PREFECT_HOME ``home``), until its
    API answers as this server; started again on other ports when it exited and ``output(process)`` (its
    output, read once it has exited) says a port was taken. Returns the process and its two ports."""
    for _ in range(tries):
        port, second = os_port(), os_port()
        while second == port:
            second = os_port()
        proc = start(port, second)
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline and proc.poll() is None:
            if serves_home(f"http://127.0.0.1:{port}/api", home, headers):
                return proc, port, second
            time.sleep(1)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
            raise AssertionError(f"the server did not answer on port {port} within {limit_s:.0f} s")
        said = output(proc)
        if TAKEN not in said.lower():
            raise AssertionError(f"the server exited with code {proc.returncode}: {said[-3000:]}")
    raise AssertionError(f"ports taken at each of {tries} starts: {said[-3000:]}")


def session_pool(prefix: str) -> str:
    """A work pool of this test session only. The servers of a session share one database with those of earlier
    sessions; a worker an earlier, killed session left behind polls its own pool, so it cannot take this
    session's flow runs."""
    return f"{prefix}-{os.getpid()}"


SESSION_POOL = re.compile(r"flagperf-[a-z]+-(?P<pid>\d+)")


def clear_deployments_of_other_pools(pool: str) -> None:
    """Delete, on the shared test database (FLAGPERF_TEST_POSTGRES_URL), the deployments of prefect.yaml that the
    servers of ended sessions, or earlier ones of this session (stopped by now), left on a pool other than
    ``pool``: `flagperf server` refuses to take over another pool's (flows.server.refuse_other_pools). Those of a
    session still running (another pytest) are left: the refusal then says whose they are."""
    import asyncio

    import asyncpg
    import psutil

    from flows.server import deployments_in_project

    specs = deployments_in_project()["deployments"]
    names, entrypoints = [s["name"] for s in specs], [s["entrypoint"] for s in specs]

    def ended(owner: str) -> bool:
        session = SESSION_POOL.fullmatch(owner)
        return session is None or int(session["pid"]) == os.getpid() or not psutil.pid_exists(int(session["pid"]))

    async def clear() -> None:
        dsn = os.environ["FLAGPERF_TEST_POSTGRES_URL"].replace("postgresql+asyncpg://", "postgresql://")
        conn = await asyncpg.connect(dsn)
        try:
            rows = await conn.fetch(
                "select d.id, p.name as pool from deployment d join work_queue q on q.id = d.work_queue_id "
                "join work_pool p on p.id = q.work_pool_id where d.name = any($1::text[]) "
                "and d.entrypoint = any($2::text[])", names, entrypoints)
            stale = [row["id"] for row in rows if row["pool"] != pool and ended(row["pool"])]
            if stale:
                await conn.execute("delete from deployment where id = any($1::uuid[])", stale)
        except asyncpg.UndefinedTableError:  # no server has used the database yet
            pass
        finally:
            await conn.close()

    asyncio.run(clear())


def database_pool() -> str:
    """The work pool of every `flagperf server` this session starts on the shared test database: one for them all
    (servers on one database serve one pool: flows.server.refuse_other_pools), with what ended sessions left on
    theirs cleared first."""
    pool = session_pool("flagperf-test")
    clear_deployments_of_other_pools(pool)
    return pool


def online_since(worker: dict, moment: datetime) -> bool:
    """Whether a worker (as the API lists them) is online and was made after ``moment``: not one that an earlier
    server of the session left on the same pool (the server marks it offline only after its heartbeats stop)."""
    created = datetime.fromisoformat(worker["created"].replace("Z", "+00:00"))  # Python 3.10 reads no "Z"
    return worker["status"] == "ONLINE" and created > moment
