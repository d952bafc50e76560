"""Servers the integration tests start by command (`prefect server start`, `flagperf server`), which take a port
number, not a bound socket: a port the OS gave a moment ago can be taken by someone else (another test session,
any program) before the server binds it. So each start is checked to be this test's server (its PREFECT_HOME,
as the server reports it) and is made again on fresh ports when a port was taken."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import httpx
import psutil

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
DEFAULT_POOL = "flagperf"  # prefect.yaml's: the team-server tutorial's server (its page's command) is on it


def _default_pool_lock() -> Path:
    """The lock a session holds while its server serves the default pool on the test database (one per database:
    the sessions of this machine that share it share the file)."""
    digest = hashlib.sha256(os.environ["FLAGPERF_TEST_POSTGRES_URL"].encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"flagperf-test-default-pool-{digest}.lock"


@contextlib.contextmanager
def default_pool_in_use() -> Iterator[None]:
    """Held (shared) while this session's server serves the default pool: no session clears its deployments
    meanwhile (clear_deployments_of_other_pools). The lock goes with the process, however it ends."""
    with open(_default_pool_lock(), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def default_pool_unused() -> Iterator[bool]:
    """Whether no session's server serves the default pool now; while this is held (exclusively), none starts to."""
    with open(_default_pool_lock(), "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def pool_ended(pool: str, default_unused: bool) -> bool:
    """Whether the server that made deployments on ``pool`` has provably ended: a session's pool whose session
    (pid) is gone, or is this one (its servers are stopped by the time it starts another); the default pool where
    no session serves it (``default_unused``: default_pool_unused). Any other pool is no test's: never cleared."""
    if pool == DEFAULT_POOL:
        return default_unused
    session = SESSION_POOL.fullmatch(pool)
    if session is None:
        return False
    return int(session["pid"]) == os.getpid() or not psutil.pid_exists(int(session["pid"]))


def clear_what_ended_servers_left(pool: str | None) -> None:
    """Delete, on the shared test database (FLAGPERF_TEST_POSTGRES_URL), what the servers of ended sessions, or
    earlier ones of this session (stopped by now), left there: the deployments of prefect.yaml they made on a pool
    other than ``pool`` (`flagperf server` refuses to take over another pool's: flows.server.refuse_other_pools), and
    the sessions' own work pools (with their queues and workers), so that a developer's database does not gain a pool
    per test session. ``pool`` (this session's, in use) is kept; None at the end of the session: its own goes too.
    Those of a server still running (another pytest's, the tutorial's of any session) are left: the refusal then
    says whose they are. The default pool (prefect.yaml's, the tutorial's) is one row, remade by its server: kept."""
    import asyncio

    import asyncpg

    from flows.server import deployments_in_project

    specs = deployments_in_project()["deployments"]
    names, entrypoints = [s["name"] for s in specs], [s["entrypoint"] for s in specs]

    async def clear(default_unused: bool) -> None:
        dsn = os.environ["FLAGPERF_TEST_POSTGRES_URL"].replace("postgresql+asyncpg://", "postgresql://")
        conn = await asyncpg.connect(dsn)
        try:
            rows = await conn.fetch(
                "select d.id, p.name as pool from deployment d join work_queue q on q.id = d.work_queue_id "
                "join work_pool p on p.id = q.work_pool_id where d.name = any($1::text[]) "
                "and d.entrypoint = any($2::text[])", names, entrypoints)
            stale = [row["id"] for row in rows if row["pool"] != pool and pool_ended(row["pool"], default_unused)]
            if stale:
                await conn.execute("delete from deployment where id = any($1::uuid[])", stale)
            pools = [row["name"] for row in await conn.fetch("select name from work_pool")]
            ended = [name for name in pools if name != pool and SESSION_POOL.fullmatch(name)
                     and pool_ended(name, default_unused)]
            if ended:  # its queues and workers with it (cascade), as Prefect deletes a pool
                await conn.execute("delete from work_pool where name = any($1::text[])", ended)
        except asyncpg.UndefinedTableError:  # no server has used the database yet
            pass
        finally:
            await conn.close()

    with default_pool_unused() as unused:  # held while they are deleted: no tutorial server starts meanwhile
        asyncio.run(clear(unused))


SESSION_USED: list[str] = []  # the pool database_pool gave this session, once it did: its end clears it


def database_pool() -> str:
    """The work pool of every `flagperf server` this session starts on the shared test database: one for them all
    (servers on one database serve one pool: flows.server.refuse_other_pools), with what ended sessions left
    cleared first; the session's end clears it too (conftest.py)."""
    pool = session_pool("flagperf-test")
    clear_what_ended_servers_left(pool)
    if pool not in SESSION_USED:
        SESSION_USED.append(pool)
    return pool


def online_since(worker: dict, moment: datetime) -> bool:
    """Whether a worker (as the API lists them) is online and was made after ``moment``: not one that an earlier
    server of the session left on the same pool (the server marks it offline only after its heartbeats stop)."""
    created = datetime.fromisoformat(worker["created"].replace("Z", "+00:00"))  # Python 3.10 reads no "Z"
    return worker["status"] == "ONLINE" and created > moment
