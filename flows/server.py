"""`flagperf server`: a Prefect server on PostgreSQL plus a process worker, for a team.

The embedded default (a temporary server per `flagperf run`) suits one person. A team that wants the
UI, schedules, retries from the dashboard and one history of runs needs a lasting server, and under
several concurrent flow runs SQLite locks ("database is locked"): PostgreSQL does not.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.error import URLError
from urllib.parse import urlsplit
from urllib.request import urlopen

from flagperf.errors import ConfigError
from flagperf.paths import PROJECT_ROOT

DATABASE_URL_ENV = "PREFECT_API_DATABASE_CONNECTION_URL"
HEALTH_TIMEOUT_S = 180.0
DATABASE_SECRETS = (DATABASE_URL_ENV, "PGPASSWORD", "PGPASSFILE")


def check_database_url(url: str | None) -> str:
    if not url:
        raise ConfigError("--database-url", None, f"give a PostgreSQL URL (or set {DATABASE_URL_ENV}), e.g. "
                                                  "postgresql+asyncpg://flagperf@127.0.0.1:5432/prefect; keep the "
                                                  "password in ~/.pgpass or PGPASSWORD, not in a file of this project")
    parts = urlsplit(url)
    if parts.scheme != "postgresql+asyncpg":
        raise ConfigError("--database-url", None, f"scheme {parts.scheme!r}: the server needs postgresql+asyncpg://")
    if parts.password:
        raise ConfigError("--database-url", None, "has a password in it, which would show in process lists and "
                                                  "logs; put it in ~/.pgpass or PGPASSWORD instead")
    return url


def wait_healthy(api_url: str, proc: subprocess.Popen[bytes], stopping: list[int],
                 timeout_s: float = HEALTH_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stopping:
        if proc.poll() is not None:
            raise RuntimeError(f"the Prefect server exited with code {proc.returncode} (see its log)")
        try:
            with urlopen(f"{api_url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (URLError, OSError):
            pass
        time.sleep(1)
    raise RuntimeError(f"the Prefect server did not answer {api_url}/health within {timeout_s:.0f} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def serve(database_url: str, host: str, port: int, pool: str, worker: bool, log_dir: Path) -> int:
    """Start the server (and a worker), wait until interrupted, stop both. Returns an exit code."""
    api_url = f"http://{host}:{port}/api"
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, DATABASE_URL_ENV: database_url, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    with (log_dir / "server.log").open("ab") as server_log:
        server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", host,
                                   "--port", str(port)], env=env, stdout=server_log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    processes = [server]
    stopping: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))
    try:
        wait_healthy(api_url, server, stopping)
        if stopping:
            return 0
        print(f"server: {api_url} (UI at http://{host}:{port}), database {urlsplit(database_url).hostname}",
              flush=True)
        # The worker, its flow runs and their cases get no database credentials: only the server needs them.
        client_env = {k: v for k, v in os.environ.items() if k not in DATABASE_SECRETS}
        client_env.update(PREFECT_API_URL=api_url, PREFECT_SERVER_ANALYTICS_ENABLED="false",
                          PREFECT_LOGGING_EXTRA_LOGGERS="flagperf")
        created = subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", "work-pool", "create", pool,
                                  "--type", "process", "--overwrite"], env=client_env, capture_output=True,
                                 text=True, timeout=120, check=False)
        if created.returncode != 0:
            raise RuntimeError(f"creating work pool {pool!r} failed: {created.stderr.strip()[-300:]}")
        if worker:
            with (log_dir / "worker.log").open("ab") as worker_log:
                processes.append(subprocess.Popen(
                    [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool], cwd=PROJECT_ROOT,
                    env=client_env, stdout=worker_log, stderr=subprocess.STDOUT, start_new_session=True))
            print(f"worker: pool {pool!r}, running flows from {PROJECT_ROOT}", flush=True)
        print(f"logs in {log_dir}; export PREFECT_API_URL={api_url} to use it; Ctrl-C stops both", flush=True)
        while not stopping and all(p.poll() is None for p in processes):
            time.sleep(1)
        failed = [p for p in processes if p.poll() not in (None, 0)]
        return 1 if failed else 0
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not cut the shutdown short
        for proc in reversed(processes):  # the worker first, then the server it talks to
            _stop(proc)
