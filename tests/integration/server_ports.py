"""Servers the integration tests start by command (`prefect server start`, `flagperf server`), which take a port
number, not a bound socket: a port the OS gave a moment ago can be taken by someone else (another test session,
any program) before the server binds it. So each start is checked to be this test's server (its PREFECT_HOME,
as the server reports it) and is made again on fresh ports when a port was taken."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import queue
import re
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

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


SESSION_PREFIX = "flagperf-test"
# A session's pool: the prefix, its pid, and a number where a session elsewhere (another machine or pid namespace on
# the same database) holds the name. Nothing else: a pool someone made by hand (flagperf-lab-2) is never a session's.
SESSION_POOL = re.compile(rf"{re.escape(SESSION_PREFIX)}-\d+(?:-\d+)?")


def pool_key(pool: str) -> int:
    """The PostgreSQL advisory lock (a bigint) a test session holds on ``pool`` while it lives."""
    return int.from_bytes(hashlib.sha256(f"flagperf test session pool {pool}".encode()).digest()[:8], "big",
                          signed=True)


def _dsn() -> str:
    return os.environ["FLAGPERF_TEST_POSTGRES_URL"].replace("postgresql+asyncpg://", "postgresql://")


LOCK_CHECK_S = 30.0  # how often a PoolLock checks that its connection (which holds the lock) is alive
# How long a PoolLock whose connection died tries to connect again (a database restarting takes a while), and its
# waits between tries: doubling from the first, at most the last.
RECONNECT_S, RECONNECT_FIRST_WAIT_S, RECONNECT_MAX_WAIT_S = 300.0, 0.5, 15.0


class PoolLock:
    """A connection to the test database that holds ``pool``'s advisory lock (pool_key) until released or the
    process ends, however (PostgreSQL drops a session's locks with its connection): what says, to every session on
    the database wherever it runs, that the pool's session lives. ``held``: False where another holds it already.

    The connection is checked every ``check_s`` (select 1): one that died (the database restarted, a network cut)
    took the lock with it, and another session would take the pool for an ended one's and delete it under this
    session's servers. So a dead one is replaced and the lock taken again, the connection tried again with waits
    that double (``first_wait_s`` up to ``max_wait_s``) for up to ``reconnect_s``: a restart of the database takes
    longer than one try. Where that fails, or another session took the lock meanwhile (or held it meanwhile and
    cleared the pool: its row seen at the last check is gone), ``lost`` says why, one line
    on stderr says so at once, and session_pool() fails from then on. The lock is a session's:
    FLAGPERF_TEST_POSTGRES_URL must reach PostgreSQL directly (or through a pooler in session mode), never through a
    transaction pooler (PgBouncer's transaction mode), which would hand the lock's server connection to other
    clients."""

    def __init__(self, pool: str, limit_s: float = 120.0, check_s: float = LOCK_CHECK_S,
                 reconnect_s: float = RECONNECT_S, first_wait_s: float = RECONNECT_FIRST_WAIT_S,
                 max_wait_s: float = RECONNECT_MAX_WAIT_S) -> None:
        import asyncio

        self.pool = pool
        self.check_s = check_s
        self.reconnect_s, self.first_wait_s, self.max_wait_s = reconnect_s, first_wait_s, max_wait_s
        self.dsn = _dsn()  # where it connects (tests point it elsewhere for a while: a database that is away)
        self.lost: str | None = None
        self.checks = 0  # checks done (for tests: a condition to wait for)
        self.failed_tries = 0  # tries to connect again that failed, in all (for tests: a condition to wait for)
        self.backend_pid = 0  # the server process of the connection that holds the lock
        self.retaken = 0  # times the lock was held again on a new connection (for tests: a condition to wait for)
        self._pool_id: Any = None  # the pool's row at the last check (None: not made yet)
        self._released: Any = None  # an asyncio.Event set by release(): a wait between tries ends at once
        self._answer: queue.Queue[bool | BaseException] = queue.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._releasing = False
        self._thread = threading.Thread(target=lambda: asyncio.run(self._hold()), name=f"lock {pool}", daemon=True)
        self._thread.start()
        answer = self._answer.get(timeout=limit_s)
        if isinstance(answer, BaseException):
            raise answer
        self.held = answer

    async def _take(self, timeout_s: float = 60.0) -> tuple[Any, bool]:
        import asyncpg

        conn = await asyncpg.connect(self.dsn, timeout=timeout_s)
        self.backend_pid = conn.get_server_pid()
        try:
            return conn, bool(await conn.fetchval("select pg_try_advisory_lock($1)", pool_key(self.pool), timeout=60))
        except BaseException:
            conn.terminate()
            raise

    async def _hold(self) -> None:
        import asyncio

        try:
            self._loop, self._wake, self._released = asyncio.get_running_loop(), asyncio.Event(), asyncio.Event()
            conn, held = await self._take()
        except BaseException as exc:  # said in the thread that waits for it
            self._answer.put(exc)
            return
        self._answer.put(held)
        try:
            while held and not self._releasing:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.check_s)
                self._wake.clear()
                if self._releasing:
                    break
                try:
                    await conn.fetchval("select 1", timeout=60)
                    self._pool_id = await self._pool_row(conn)
                except Exception as exc:  # any failure: the connection, and the lock, are gone
                    conn.terminate()
                    taken = await self._take_again(exc)
                    if taken is None:
                        return
                    conn, held = taken
                    if not held:
                        self._lose(f"its connection died ({exc!r}) and another session took the lock meanwhile")
                        await conn.close()
                        return
                    # Held again, but another session may have held it meanwhile and taken the pool for an ended
                    # session's: its row (the one seen at the last check; remade, it would be another) is gone.
                    if self._pool_id is not None and await self._pool_row(conn) != self._pool_id:
                        self._lose(f"its connection died ({exc!r}) and its pool was cleared meanwhile")
                        await conn.close()
                        return
                    self.retaken += 1
                    self._pool_id = await self._pool_row(conn)
                self.checks += 1
        except Exception as exc:  # anything else ends the hold: never silently (the lock goes with the connection)
            self._lose(f"checking it failed ({exc!r})")
        finally:
            if not conn.is_closed():
                await conn.close()

    async def _pool_row(self, conn: Any) -> Any:
        """The id of the pool's row, None where there is none (or no server has used the database yet)."""
        import asyncpg

        try:
            return await conn.fetchval("select id from work_pool where name = $1", self.pool, timeout=60)
        except asyncpg.UndefinedTableError:
            return None

    async def _take_again(self, died: Exception) -> tuple[Any, bool] | None:
        """A new connection and the lock's state on it, tried with waits that double for up to ``reconnect_s``;
        None (and the lock lost) where none came, or where it is released meanwhile."""
        import asyncio
        import time

        deadline, wait, tries = time.monotonic() + self.reconnect_s, self.first_wait_s, 0
        while not self._releasing:
            tries += 1
            try:  # bounded by what is left (at least a short try): release() waits for this
                return await self._take(max(5.0, min(30.0, deadline - time.monotonic())))
            except Exception as again:
                self.failed_tries += 1
                if time.monotonic() + wait > deadline:
                    self._lose(f"its connection died ({died!r}) and no new one came within {self.reconnect_s:.0f} s "
                               f"({tries} tries; the last: {again!r})")
                    return None
            # Not woken by check(): a database that is away is given its time; release() ends the wait at once.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._released.wait(), wait)
            wait = min(wait * 2, self.max_wait_s)
        return None

    def _lose(self, why: str) -> None:
        import sys

        self.lost = why
        print(f"test session: lost the lock on work pool {self.pool!r}: {why}; its deployments may be cleared by "
              "another session", file=sys.__stderr__, flush=True)

    def check(self) -> None:
        """Check the connection now (tests), not at the next ``check_s``."""
        if self._loop is not None and self._wake is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._wake.set)

    def release(self) -> None:
        self._releasing = True
        if self._loop is not None and self._released is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # its loop ended meanwhile
                self._loop.call_soon_threadsafe(self._released.set)
        self.check()
        self._thread.join(timeout=60)


_SESSION_LOCK: list[PoolLock] = []  # this session's, once it took one


def session_pool() -> str:
    """The work pool of this test session only, its lock held from now on (PoolLock). The servers of a session share
    one database with those of earlier and concurrent sessions; a worker an earlier, killed session left behind
    polls its own pool, so it cannot take this session's flow runs."""
    if not _SESSION_LOCK:
        for name in (f"{SESSION_PREFIX}-{os.getpid()}", *(f"{SESSION_PREFIX}-{os.getpid()}-{n}" for n in range(1, 20))):
            lock = PoolLock(name)
            if lock.held:
                _SESSION_LOCK.append(lock)
                break
        else:
            raise AssertionError(f"sessions elsewhere on the test database hold every pool name of {name}'s kind")
    lock = _SESSION_LOCK[0]
    if lock.lost is not None:  # another session may have deleted the pool under this one's servers
        raise AssertionError(f"this session's lock on its pool {lock.pool!r} was lost: {lock.lost}; its servers' "
                             "deployments may have been cleared by another session; run the tests again")
    return lock.pool


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


async def _ended(conn: Any, pool: str, default_unused: bool) -> bool:
    """Whether the server that made deployments on ``pool`` has provably ended: this session's pool (its servers are
    stopped by the time it starts another, or clears at its end); another session's whose lock (PoolLock) no session
    holds: ``conn`` takes it then, and keeps it while what the pool's session left is deleted; the default pool
    where no session serves it (``default_unused``: default_pool_unused). Any other pool is no test's: never."""
    if pool == DEFAULT_POOL:
        return default_unused
    if SESSION_POOL.fullmatch(pool) is None:
        return False
    if _SESSION_LOCK and pool == _SESSION_LOCK[0].pool:
        return True
    return bool(await conn.fetchval("select pg_try_advisory_lock($1)", pool_key(pool)))


def pool_ended(pool: str, default_unused: bool) -> bool:
    """_ended, asked on a connection of its own (any lock it takes goes with it)."""
    import asyncio

    import asyncpg

    async def ask() -> bool:
        conn = await asyncpg.connect(_dsn())
        try:
            return await _ended(conn, pool, default_unused)
        finally:
            await conn.close()

    return asyncio.run(ask())


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
        conn = await asyncpg.connect(_dsn())  # closed at the end: the locks _ended took go with it
        try:
            rows = await conn.fetch(
                "select d.id, p.name as pool from deployment d join work_queue q on q.id = d.work_queue_id "
                "join work_pool p on p.id = q.work_pool_id where d.name = any($1::text[]) "
                "and d.entrypoint = any($2::text[])", names, entrypoints)
            stale = [row["id"] for row in rows
                     if row["pool"] != pool and await _ended(conn, row["pool"], default_unused)]
            if stale:
                await conn.execute("delete from deployment where id = any($1::uuid[])", stale)
            pools = [row["name"] for row in await conn.fetch("select name from work_pool")]
            ended = [name for name in pools if name != pool and SESSION_POOL.fullmatch(name)
                     and await _ended(conn, name, default_unused)]
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
    pool = session_pool()
    clear_what_ended_servers_left(pool)
    if pool not in SESSION_USED:
        SESSION_USED.append(pool)
    return pool


def online_since(worker: dict, moment: datetime) -> bool:
    """Whether a worker (as the API lists them) is online and was made after ``moment``: not one that an earlier
    server of the session left on the same pool (the server marks it offline only after its heartbeats stop)."""
    created = datetime.fromisoformat(worker["created"].replace("Z", "+00:00"))  # Python 3.10 reads no "Z"
    return worker["status"] == "ONLINE" and created > moment
