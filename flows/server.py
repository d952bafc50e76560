"""Prefect servers for the engine: the lasting one of `flagperf server` (PostgreSQL, a process worker, its
deployments, the results site, one sign-in for all) and the temporary one `flagperf run` starts for a single evaluation.

The embedded default (a temporary server per `flagperf run`) suits one person. A team that wants the
UI, schedules, retries from the dashboard and one history of runs needs a lasting server, and under
several concurrent flow runs SQLite locks ("database is locked"): PostgreSQL does not.

Every server process runs under a watcher (``python -m flows.server --watch-parent PID -- command``) that
ends it when the process that started it is gone, even after a SIGKILL: no server outlives its owner.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import errno
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar
from urllib.error import URLError
from urllib.parse import parse_qsl, urlsplit
from urllib.request import urlopen

import psutil

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser as the tomli package (a dependency there)
    import tomli as tomllib

from flagperf.errors import ConfigError, FlagperfError
from flagperf.paths import PROJECT_ROOT, RESULTS_DIR_ENV, RESULTS_ROOT_ENV, RESULTS_URL_ENV
from flagperf.results.bounded import read_json_file
from flagperf.results.schema import atomic_path, write_json_atomic
from flagperf.site.auth import (
    CLIENT_AUTH_ENV,
    SERVER_AUTH_ENV,
    Credentials,
    binds_loopback,
    check_auth_string,
    find_credentials,
    how_to_set,
    is_loopback,
)
from flagperf.stopping import STOP_NOW_AT, stop_now

DATABASE_URL_ENV = "PREFECT_API_DATABASE_CONNECTION_URL"
HEALTH_TIMEOUT_S = 180.0
# Every name Prefect reads the database's URL and password from (prefect_env_names; a unit test keeps this in step).
DATABASE_SECRETS = (DATABASE_URL_ENV, "PREFECT_SERVER_DATABASE_CONNECTION_URL", "PREFECT_API_DATABASE_PASSWORD",
                    "PREFECT_SERVER_DATABASE_PASSWORD", "PGPASSWORD", "PGPASSFILE")
WATCH_POLL_S = 0.5
WATCH_GRACE_S = 10.0
T = TypeVar("T")
STEP_POLL_S = 0.2  # how soon a signal stops a step's command (the work pool's, the deployments')
POOL_TIMEOUT_S, DEPLOY_TIMEOUT_S = 120.0, 600.0
# The results folder `flagperf server` serves, in its worker's and deployments' environment: the evaluate and
# nightly forms default their results folder to it, so a run started from the UI gets its report on the site.


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


WILDCARDS = ("0.0.0.0", "::", "")  # --host values that listen on every interface


def url_host(host: str) -> str:
    """``host`` as it goes into a URL: an IPv6 address in brackets (http://::1:4200 is no URL)."""
    host = host.strip("[]")
    return f"[{host}]" if ":" in host else host


def public_base(host: str, port: int, public_url: str | None = None) -> str:
    """The address browsers use: --public-url, else the listening address (a wildcard one becomes this machine's
    address as teammates reach it, see machine_address; 127.0.0.1 could only ever mean their own machine)."""
    if public_url:
        return public_url.rstrip("/")
    name = machine_address(host)[0] if host in WILDCARDS else host
    return f"http://{url_host(name)}:{port}"


def local_api_url(host: str, port: int) -> str:
    """Where this machine's processes (the worker, the deploy) reach the API of a server listening on ``host``."""
    return f"http://{'127.0.0.1' if host in WILDCARDS else url_host(host)}:{port}/api"


def results_base_for(base: str, results_port: int, results_public_url: str | None = None) -> str:
    """The results site's address for browsers: --results-public-url, else the UI's host (``base``) on its port."""
    if results_public_url:
        return results_public_url.rstrip("/")
    return f"{urlsplit(base).scheme}://{url_host(urlsplit(base).hostname or '')}:{results_port}"


def server_names(host: str, public_urls: list[str | None], extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The names a server listening on ``host`` answers to (the Host header of its requests; any other is refused:
    DNS rebinding protection, flagperf.site.front): ``host`` itself, the hosts of ``public_urls`` (a proxy passes
    the browser's Host on), loopback's on a loopback or wildcard ``host`` (this machine's clients, see
    local_api_url), on a wildcard one this machine's names and the addresses of its interfaces, and the ``extra``
    ones an operator names (--server-name: a DNS alias). An IPv6 address in brackets, as a Host header has it."""
    names = set() if host in WILDCARDS else {host}
    names.update(name.strip() for name in extra)
    names.update(urlsplit(url).hostname or "" for url in public_urls if url)
    if host in WILDCARDS or binds_loopback(host):
        names.update(("localhost", "127.0.0.1", "::1"))
    if host in WILDCARDS:  # read again where a Host misses (an address DHCP gave since): see rereads_names
        from flagperf.site.front import machine_names

        names.update((machine_address(host)[0], *machine_names()))
    return sorted(url_host(name).lower() for name in names if name)


def rereads_names(host: str) -> Callable[[], list[str]] | None:
    """What the server and the site listening on ``host`` read their names from again where a request's Host is
    not one of them (flagperf.site.front.HostCheck): on a wildcard ``host``, this machine's names and addresses as
    they are then (a new interface, an address DHCP changed); elsewhere nothing (the names are the options').
    Addresses only: names from DNS are read at start (server_names), never on a request (its event loop waits)."""
    from flagperf.site.front import interface_addresses

    return interface_addresses if host in WILDCARDS else None


def own_origins(names: list[str], port: int, public_urls: list[str | None]) -> list[str]:
    """The origins of a server's pages (CORS: the only ones allowed to call its API from a browser): its names on
    its port over HTTP, and the public URLs' (a TLS proxy's https://...)."""
    from flagperf.site.front import origin_of

    origins = {origin_of(f"http://{name}:{port}") for name in names}
    origins.update(origin_of(url) for url in public_urls if url)
    return sorted(origins - {""})


CORS_ENV = "PREFECT_SERVER_CORS_ALLOWED_ORIGINS"
CSRF_ENV = "PREFECT_SERVER_CSRF_PROTECTION_ENABLED"


def prefect_env_names(name: str) -> list[str]:
    """Every environment variable Prefect reads the setting ``name`` (one of its PREFECT_... names) from, in the
    order it looks (the first one set wins: PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS before
    PREFECT_SERVER_CORS_ALLOWED_ORIGINS), from its settings models (the field's validation aliases)."""
    import prefect.settings
    from prefect.settings.models.root import Settings

    model: Any = Settings
    *path, last = getattr(prefect.settings, name).accessor.split(".")
    for part in path:
        model = model.model_fields[part].annotation
    choices = getattr(model.model_fields[last].validation_alias, "choices", [])
    names = [choice.upper() for choice in choices if isinstance(choice, str)]
    return list(dict.fromkeys([*names, f"{model.model_config.get('env_prefix', '')}{last}".upper(), name]))


def with_prefect_settings(env: dict[str, str], settings: dict[str, str]) -> dict[str, str]:
    """``env`` with each of ``settings`` (Prefect's names) set to its value under that name and every other name of
    it removed: an operator's alias that Prefect reads first would otherwise win over what serve means."""
    env = dict(env)
    for name, value in settings.items():
        for alias in prefect_env_names(name):
            env.pop(alias, None)
        env[name] = value
    return env


def allowed_origins(names: list[str], port: int, public_urls: list[str | None]) -> list[str]:
    """own_origins and those the operator set in PREFECT_SERVER_CORS_ALLOWED_ORIGINS or its alias (kept: a page of
    theirs that uses the API); "*" in either, any site's page, is refused (a ConfigError naming it)."""
    from flagperf.site.front import origin_of

    set_by_operator = []
    for env_name in prefect_env_names(CORS_ENV):
        given = [origin.strip() for origin in os.environ.get(env_name, "").split(",") if origin.strip()]
        if "*" in given:
            raise ConfigError(env_name, None, "'*' lets a page of any site use the API and its websockets; name the "
                                              "origins instead (the server's own are allowed already)")
        set_by_operator += given
    return sorted({*own_origins(names, port, public_urls), *(origin_of(o) for o in set_by_operator)} - {""})


def address_advice(host: str, port: int, public_url: str | None) -> str | None:
    """The banner's line where the UI's address is a guess (a wildcard --host on a machine without a full name:
    machine_address), None where it is not."""
    if host not in WILDCARDS or public_url:
        return None
    name, guessed = machine_address(host)
    if guessed is None:
        return None
    return (f"address: {name} is a guess ({guessed}); if teammates cannot open the UI, restart with --public-url "
            f"http://NAME:{port} (NAME as they reach this machine)")


def default_route_address(ipv6: bool = False) -> str | None:
    """The address of the interface this machine reaches the network by (its default route), None without one; an
    IPv6 one only where ``ipv6`` (a server on '::'; one on 0.0.0.0 is not reached by IPv6). A UDP socket's connect
    only picks the route: nothing is sent (to documentation addresses, RFC 5737 and 3849)."""
    targets = [(socket.AF_INET, "192.0.2.1")] + ([(socket.AF_INET6, "2001:db8::1")] if ipv6 else [])
    for family, target in targets:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect((target, 9))
                address = str(probe.getsockname()[0])
        except OSError:
            continue
        if not is_loopback(address) and address not in WILDCARDS:
            return address
    return None


# Domains of one network segment or of this machine only (RFC 6762 .local, the 'localdomain' of /etc/hosts): a
# name in them is no name teammates' DNS gives, as a host name without a domain is none.
LOCAL_DOMAINS = ("local", "localdomain")


def _name_problem(name: str) -> str | None:
    """Why the dotted ``name`` is no address for teammates, None where it may be: in a local-only domain, or not
    resolving here to a network address (only to loopback, as /etc/hosts' 127.0.1.1 line, or not at all)."""
    if name.strip(".").rsplit(".", 1)[-1].lower() in LOCAL_DOMAINS:
        return f"its name {name!r} has no domain beyond this network"
    try:
        found = {str(info[4][0]).split("%")[0] for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError):
        return f"its name {name!r} does not resolve here"
    if all(is_loopback(address) for address in found):
        return f"its name {name!r} resolves here to loopback only"
    return None


def machine_address(host: str = "0.0.0.0") -> tuple[str, str | None]:
    """This machine as teammates reach it on a server listening on ``host`` (a wildcard), and None, or why that is
    a guess: its FQDN where it resolves here to a network address; where it has none (only a short host name, a
    .local or .localdomain one, or only 'localhost': /etc/hosts mapping the host name to 127.0.0.1 first, which
    would send every browser to its own machine), the address of its default route's interface, else the name,
    else 'localhost'."""
    fqdn, name = socket.getfqdn(), socket.gethostname()
    names = [n for n in (fqdn, name) if n and not is_loopback(n)]
    dotted = [n for n in names if "." in n.strip(".")]
    problems = {n: _name_problem(n) for n in dotted}
    full = next((n for n in dotted if problems[n] is None), None)
    if full is not None:
        return full, None
    if dotted:
        why = str(problems[dotted[0]])
    else:
        why = (f"its host name {names[0]!r} has no domain" if names else
               f"its names ({', '.join(sorted({fqdn, name} - {''})) or 'none'}) are loopback")
    address = default_route_address(ipv6=host == "::")
    if address is not None:
        return address, f"{why}; used the address of its default route"
    return (names[0], why) if names else ("localhost", why)


# Where the server processes start: `python -m flows.server` puts its working folder first on the import path, so
# a user's own `flows` package in theirs (a common Prefect project layout) would be imported instead of this one.
CODE_ROOT = Path(__file__).resolve().parent.parent


def watched(argv: list[str], pass_fds: tuple[int, ...] = ()) -> list[str]:
    """``argv`` run under a watcher that ends it (its whole process group) once this process is gone. The file
    descriptors in ``pass_fds`` (which the watcher must be given too) are handed on to ``argv``."""
    passed = [arg for fd in pass_fds for arg in ("--pass-fd", str(fd))]
    return [sys.executable, "-m", "flows.server", "--watch-parent", str(os.getpid()), *passed, "--", *argv]


def watch_parent(parent: int, argv: list[str], pass_fds: tuple[int, ...] = ()) -> int:
    """Run ``argv`` and wait; if ``parent`` goes away (killed, even with SIGKILL), stop ``argv`` and whatever it
    started: SIGTERM to the process group, then SIGKILL after a grace. A signal to the watcher is passed on.
    The watcher is started as a group leader (start_new_session), so the group is its own and the command's."""
    stopping: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # before the command exists: none is lost
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))
    child = subprocess.Popen(argv, pass_fds=pass_fds)  # same group: a signal to the group (see _stop) reaches both
    for fd in pass_fds:  # the command has its copy: this one would keep a listening socket accepting once it stops
        with contextlib.suppress(OSError):
            os.close(fd)
    while child.poll() is None and not stopping and os.getppid() == parent:
        time.sleep(WATCH_POLL_S)
    # The command's processes, listed before any is signalled: one that moved to a group or session of its own
    # is not reached by the group's signal, and once its parent is gone it is no longer in the tree.
    tree = _descendants(child.pid)
    own_group = os.getpgid(0) == os.getpid()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if child.poll() is not None:
            break
        if sig == signal.SIGKILL:
            _kill(tree)  # first: the group's SIGKILL ends this watcher too
        try:
            os.killpg(os.getpid(), sig) if own_group else child.send_signal(sig)
            child.wait(timeout=WATCH_GRACE_S)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue
    _end(tree)  # the command ended: any of its processes that outlived it are ended too
    return child.returncode if child.returncode is not None else 1


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _kill(processes: list[psutil.Process]) -> None:
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()  # psutil checks the pid still names the process it listed


def _end(processes: list[psutil.Process]) -> None:
    """SIGTERM to those still running, SIGKILL after the grace to those that are left."""
    running = [p for p in processes if p.is_running()]
    for process in running:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _gone, alive = psutil.wait_procs(running, timeout=WATCH_GRACE_S)
    _kill(alive)


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
        time.sleep(0.5)
    if not stopping:
        raise RuntimeError(f"the Prefect server did not answer {api_url}/health within {timeout_s:.0f} s")


def _stop(proc: subprocess.Popen[Any], grace_s: float = 30.0) -> None:
    """SIGTERM to ``proc``'s process group (it was started as its leader), SIGKILL after ``grace_s``."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
            if sig == signal.SIGTERM:  # a stopped process (SIGSTOP, a debugger) acts on it once continued, as kill(1)
                os.killpg(proc.pid, signal.SIGCONT)  # does for a stopped job
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def run_step(argv: list[str], stopping: list[int], timeout_s: float, what: str,
             **popen: Any) -> subprocess.CompletedProcess[Any] | None:
    """``argv`` (a watched command: see ``watched``) run to its end as subprocess.run runs it, in a process group
    of its own; but a signal noted in ``stopping`` (serve's handler) stops it, and what it started, at once
    instead of waiting for its end, up to its timeout: None then, also when a signal came before it started.
    Past ``timeout_s`` it is stopped and a RuntimeError says ``what`` did not finish."""
    if stopping:
        return None
    proc = subprocess.Popen(argv, start_new_session=True, **popen)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:  # reads its output meanwhile, if piped: a full pipe would hold it up
                out, err = proc.communicate(timeout=STEP_POLL_S)
                return subprocess.CompletedProcess(argv, proc.returncode, out, err)
            except subprocess.TimeoutExpired:
                pass
            if stopping:
                return None
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not finish within {timeout_s:.0f} s")
    finally:
        if proc.poll() is None:  # stopped, timed out, or an error here: its group goes too (the watcher's grace)
            _stop(proc, grace_s=WATCH_GRACE_S + 5)


def configured_api_url() -> str | None:
    """PREFECT_API_URL from the environment or the active Prefect profile, read without importing prefect
    (once prefect is imported, its settings no longer follow the environment)."""
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    home = Path(os.environ.get("PREFECT_HOME", "~/.prefect")).expanduser()
    path = Path(os.environ.get("PREFECT_PROFILES_PATH", home / "profiles.toml")).expanduser()
    try:
        profiles = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return None
    active = os.environ.get("PREFECT_PROFILE") or profiles.get("active") or "ephemeral"
    value = (profiles.get("profiles", {}).get(active) or {}).get("PREFECT_API_URL")
    return str(value) if value else None


class TemporaryServer:
    """Prefect's API on a private SQLite file for one `flagperf run`, as Prefect's own temporary server
    runs it (uvicorn, no UI), but owned here: every process of the run (the case processes too) is pointed
    at it through PREFECT_API_URL, it is stopped when the run ends, interrupted or not, and its watcher
    stops it if this process is killed outright."""

    LOG = "prefect-server.log"

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="flagperf-prefect-"))
        self.log_path = self.folder / self.LOG
        # Bound here, on a port the OS chooses as it binds, and handed to uvicorn (--fd): a port found free and
        # bound later by the server could be taken meanwhile, and /health then answered by someone else's.
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.socket.getsockname()[1])
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, stopping: list[int]) -> str:
        if "prefect" in sys.modules:  # its settings were read at import: the caller's PREFECT_API_URL would not count
            raise RuntimeError("prefect was imported before the temporary server started; its flows would run on "
                               "an ephemeral server of their own")
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
               "PREFECT__SERVER_FINAL": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
               DATABASE_URL_ENV: f"sqlite+aiosqlite:///{self.folder / 'prefect.db'}"}
        env.pop("PREFECT_API_URL", None)
        env.pop(SERVER_AUTH_ENV, None)  # a team server's sign-in, exported in this shell, is not this one's
        with self.log_path.open("ab") as log:
            fd = self.socket.fileno()
            self.proc = subprocess.Popen(watched(
                # Prefect's app behind the Host check of the team server's (flows.team_app.temporary_app)
                # (its folder first: a `flows` folder in the current one is not it)
                [sys.executable, "-m", "uvicorn", "--app-dir", str(CODE_ROOT),
                 "--factory", "flows.team_app:temporary_app", "--fd", str(fd),
                 "--log-level", "error", "--lifespan", "on", "--timeout-graceful-shutdown", "3"], pass_fds=(fd,)),
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(fd,), cwd=CODE_ROOT)
        wait_healthy(self.api_url, self.proc, stopping, float(os.environ.get(
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", HEALTH_TIMEOUT_S)))
        return self.api_url

    def stop(self, keep_log_in: Path | None = None) -> None:
        """Stop the server and remove its database; its log, unless empty, is kept in ``keep_log_in`` if that
        folder exists."""
        if self.proc is not None:
            _stop(self.proc, grace_s=8.0)
            self.proc = None
        self.socket.close()
        said_something = self.log_path.is_file() and self.log_path.stat().st_size > 0
        if keep_log_in is not None and keep_log_in.is_dir() and said_something:
            # Whole or not at all: a results disk that is full is reported by the run itself.
            with contextlib.suppress(OSError), atomic_path(keep_log_in / self.LOG) as partial:
                shutil.copyfile(self.log_path, partial)
        shutil.rmtree(self.folder, ignore_errors=True)


class SiteServer:
    """The results site (flagperf/site) on uvicorn, in a thread of this process (it ends with it). The socket is
    bound here, before the thread starts: a port that is taken fails the start at once, with the port named."""

    def __init__(self, app: Any, host: str, port: int) -> None:
        import uvicorn

        from flagperf.site import served
        from flagperf.site.app import SECURITY_HEADERS

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.create_server((host, port), family=family)
        self.port = int(self.socket.getsockname()[1])
        # log_config None: uvicorn leaves this process's logging alone; no access log (a line per plot). The site's
        # headers on uvicorn's own answers too (a malformed request's 400).
        self.server = uvicorn.Server(served.config(app, SECURITY_HEADERS, log_config=None, access_log=False,
                                                   lifespan="off", log_level="warning", timeout_graceful_shutdown=3))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]},
                                       name="results-site", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.socket.close()


def serve_site(root: Path, host: str, port: int, credentials: Credentials | None,
               history_url: str | None = None, ui_url: str | None = None, *,
               names: list[str] | None = None, reread_names: Callable[[], list[str]] | None = None) -> SiteServer:
    """The results site for ``root``: GET and HEAD only, behind ``credentials`` when given; its run pages link
    their flow runs in the Prefect UI at ``ui_url``. ``names``: the only Host names it answers (server_names);
    None: any; ``reread_names``: where more of them are read on a miss (rereads_names)."""
    from flagperf.site.app import create_app

    root.mkdir(parents=True, exist_ok=True)
    return SiteServer(create_app(root, credentials, history_url, ui_url, names=names, reread_names=reread_names),
                      host, port)


def beyond_loopback(host: str, public_urls: Mapping[str, str | Sequence[str] | None] | None = None
                    ) -> tuple[str, str] | None:
    """The option that opens a server beyond this machine, and its value: a --host that is not loopback, or an
    address for browsers (--public-url, --results-public-url: one or several) on another host, which says a proxy
    forwards to it from the network (the server listening on loopback then serves every machine that reaches the
    proxy)."""
    if not binds_loopback(host):
        return "--host", host
    for option, given in (public_urls or {}).items():
        for url in [given] if isinstance(given, str) else given or ():
            try:
                name = urlsplit(url).hostname or ""
            except ValueError:  # not an address one can tell: taken as one of the network
                name = ""
            if not is_loopback(name):
                return option, url
    return None


def server_credentials(host: str, auth_file: Path | None,
                       public_urls: Mapping[str, str | Sequence[str] | None] | None = None) -> Credentials | None:
    """The sign-in for a server on ``host`` whose browsers use ``public_urls`` (by option): required beyond
    loopback (anyone who reaches the port, or the proxy in front of it, could start any deployment, that is run
    code on the worker), optional on loopback (one person on this machine)."""
    credentials = find_credentials(auth_file)
    opened = beyond_loopback(host, public_urls)
    if credentials is None and opened is not None:
        option, value = opened
        raise ConfigError(option, None, f"{value} opens the server beyond this machine, which needs a sign-in: "
                                        f"{how_to_set()}")
    return credentials


def deployments_in_project(pool: str | None = None) -> dict[str, Any]:
    """prefect.yaml, its deployments on ``pool`` (the server's own pool when it is not the file's)."""
    import yaml

    project = yaml.safe_load((PROJECT_ROOT / "prefect.yaml").read_text(encoding="utf-8"))
    for spec in project.get("deployments") or []:
        if pool is not None and isinstance(spec.get("work_pool"), dict):
            spec["work_pool"] = {**spec["work_pool"], "name": pool}
    project.pop("definitions", None)  # anchors, already merged in by the loader
    return project


def is_internal(spec: dict[str, Any]) -> bool:
    """Whether a deployment of prefect.yaml is an internal one (evaluate dispatches it), not one users start."""
    return "internal" in (spec.get("tags") or [])


def served_job_variables(variables: dict[str, Any] | None, results_root: Path) -> dict[str, Any]:
    """A user-facing deployment's job variables with the served results folder in their environment, so that a
    run started from its form writes where the results site reads, on whichever worker of the pool runs it."""
    variables = dict(variables or {})
    variables["env"] = {**(variables.get("env") or {}), RESULTS_DIR_ENV: str(results_root)}
    return variables


def deploy_command(api_url: str, results_root: Path, pool: str, credentials: Credentials | None = None, *,
                   log_dir: Path, database: str) -> str:
    """The one command that makes the deployments by hand (what `--no-deploy` leaves to the admin, and every failed
    deploy offers): ``python -m flows.server deploy``, which runs the server's own create_deployments, so the
    deployments are made as the server makes them, what users set in the UI (schedules, pause) kept, saved first in
    ``log_dir`` (the server's: its next start puts back what a cut deploy saved there) with the ``database`` it was
    read from (database_identity). In a subshell (the caller's shell keeps its folder and environment), signed in
    from where the server's sign-in came (``credentials``: its variable or file by name, never the value)."""
    sign_in = f"{credentials.exported_in_shell(CLIENT_AUTH_ENV)} && " if credentials else ""
    words = [sys.executable, "-m", "flows.server", "deploy", "--api-url", api_url, "--pool", pool,
             "--results", str(results_root), "--log-dir", str(log_dir.resolve()), "--database", database]
    return f"(cd {shlex.quote(str(PROJECT_ROOT))} && {sign_in}{shlex.join(words)})"


def client_environment(api_url: str, results_root: Path, credentials: Credentials | None,
                       ui_url: str | None = None, results_url: str | None = None) -> dict[str, str]:
    """The environment of the server's clients (its worker, their flow runs and cases, `prefect deploy`): this
    process's without the database's credentials or the server's sign-in (only the server needs them), pointed at
    the server at ``api_url``, signed in with ``credentials``, the served results folder the forms' default."""
    env = {k: v for k, v in os.environ.items() if k not in (*DATABASE_SECRETS, SERVER_AUTH_ENV, CLIENT_AUTH_ENV)}
    env.update(PREFECT_API_URL=api_url, PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_LOGGING_EXTRA_LOGGERS="flagperf",
               **{RESULTS_ROOT_ENV: str(results_root), RESULTS_DIR_ENV: str(results_root)})
    if ui_url is not None:
        env["PREFECT_UI_URL"] = ui_url
    if results_url is not None:
        env[RESULTS_URL_ENV] = results_url
    if credentials is not None:
        env[CLIENT_AUTH_ENV] = credentials.auth_string
    return env


def api_headers(api_url: str, auth_string: str | None) -> dict[str, str]:
    """The headers a plain HTTP client of the server at ``api_url`` sends: the sign-in, and the CSRF token that a
    change (POST, PUT, PATCH, DELETE) needs where the server has CSRF protection on (as `flagperf server` has),
    fetched for a client id of its own as Prefect's own client does; none where the server has it off."""
    import uuid

    import httpx

    headers = {"Authorization": f"Basic {base64.b64encode(auth_string.encode()).decode()}"} if auth_string else {}
    client = str(uuid.uuid4())
    answer = httpx.get(f"{api_url}/csrf-token", params={"client": client}, headers=headers, timeout=30)
    if answer.status_code == 422 and "disabled" in answer.text:
        return headers
    answer.raise_for_status()
    return {**headers, "Prefect-Csrf-Token": answer.json()["token"], "Prefect-Csrf-Client": client}


# What a user sets on a deployment in the UI (its schedules: time, zone, on/off, parameter overrides; pausing it),
# which `prefect deploy` would put back to prefect.yaml's on every start of the server.
SCHEDULE_FIELDS = ("schedule", "active", "parameters", "slug", "max_scheduled_runs")


def _deployments_named(http: Any, spec: dict[str, Any]) -> list[dict[str, Any]]:
    found = http.post("/deployments/filter", json={"deployments": {"name": {"any_": [spec["name"]]}}})
    found.raise_for_status()
    return [d for d in found.json() if d.get("entrypoint") == spec.get("entrypoint")]


def _schedules(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: s.get(k) for k in SCHEDULE_FIELDS} for s in deployment.get("schedules") or []]


def describe_schedules(schedules: list[dict[str, Any]]) -> str:
    said = [f"{s['schedule'].get('cron') or s['schedule'].get('interval') or s['schedule'].get('rrule')} "
            f"{s['schedule'].get('timezone') or 'UTC'}{'' if s.get('active') else ' (off)'}" for s in schedules]
    return ", ".join(said) or "none"


def set_by_users(http: Any, specs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The schedules and pause of the user-facing deployments that exist already, by deployment id, with what
    prefect.yaml gives them (what `prefect deploy` makes them)."""
    return {d["id"]: {"name": spec["name"], "schedules": _schedules(d), "paused": bool(d.get("paused")),
                      "project_schedules": list(spec.get("schedules") or []),
                      "project_paused": bool(spec.get("paused", False))}
            for spec in specs for d in _deployments_named(http, spec)}


def _same_value(given: Any, have: Any) -> bool:
    if isinstance(given, str) and "{{" in given:  # filled in by a build step as the deploy ran: any value is it
        return True
    if isinstance(given, int | float) and not isinstance(given, bool) and isinstance(have, int | float):
        return float(given) == float(have)  # an interval: seconds in prefect.yaml, a float from the server
    return bool(given == have)


def as_in_project(schedules: list[dict[str, Any]], project: list[dict[str, Any]]) -> bool:
    """Whether a deployment's schedules (as _schedules gives them) are prefect.yaml's: one each, every field
    prefect.yaml states the same (those it leaves out take the server's defaults, and match any value)."""
    if len(schedules) != len(project):
        return False
    left = list(schedules)
    for given in project:
        match = next((have for have in left if all(
            _same_value(value, (have if key in SCHEDULE_FIELDS else have.get("schedule") or {}).get(key))
            for key, value in given.items())), None)
        if match is None:
            return False
        left.remove(match)
    return True


def _matching(schedules: list[dict[str, Any]], wanted: list[dict[str, Any]], project: list[dict[str, Any]]
              ) -> bool:
    """Whether ``schedules`` (a deployment's now, as _schedules gives them) are made of ``wanted`` ones (exactly)
    and prefect.yaml's (``project``), each used once: what a put-back of ``wanted`` over prefect.yaml's leaves where
    it was cut midway (see _put_schedules). None at all is such a state too (a put-back of the code before, which
    deleted first, cut after the deletes)."""
    wanted, project = list(wanted), list(project)
    for have in schedules:
        if have in wanted:
            wanted.remove(have)
            continue
        given = next((given for given in project if as_in_project([have], [given])), None)
        if given is None:
            return False
        project.remove(given)
    return True


def _put_schedules(http: Any, deployment_id: str, now: list[dict[str, Any]], wanted: list[dict[str, Any]]) -> None:
    """Make a deployment's schedules ``wanted``: those it lacks are made first, the ones it has beyond them deleted
    after, so a cut at any point (a SIGKILL) leaves it with the wanted ones, never with none (the next start
    recognises that state: _matching). One it has already is kept; one whose slug (unique per deployment) an old
    one holds is changed in place. Done again after a cut, it finishes the work."""
    left = list(now)
    missing = []
    for schedule in wanted:
        have = next((have for have in left if {k: have.get(k) for k in SCHEDULE_FIELDS} == schedule), None)
        if have is not None:
            left.remove(have)
        else:
            missing.append(schedule)
    new = []
    for schedule in missing:
        holder = next((have for have in left if schedule["slug"] and have.get("slug") == schedule["slug"]), None)
        if holder is not None:
            http.patch(f"/deployments/{deployment_id}/schedules/{holder['id']}", json=schedule).raise_for_status()
            left.remove(holder)
        else:
            new.append(schedule)
    if new:
        http.post(f"/deployments/{deployment_id}/schedules", json=new).raise_for_status()
    for schedule in left:
        http.delete(f"/deployments/{deployment_id}/schedules/{schedule['id']}").raise_for_status()


def restore_set_by_users(http: Any, before: dict[str, dict[str, Any]], begun: dict[str, str] | None = None
                         ) -> list[str]:
    """Put back what users had set (see set_by_users) where making the deployments again changed it to
    prefect.yaml's; one line per deployment whose schedule prefect.yaml would have changed. A deployment whose
    schedules (or pause) are neither as before nor prefect.yaml's was changed in the UI while the deployments were
    made: it is left so (a line says so). ``begun``: the deployments a try cut midway had begun to put back (their
    schedules partly made, partly not yet deleted), with their lines, which the next try finishes whatever it
    finds."""
    begun = {} if begun is None else begun
    left: dict[str, str] = {}
    for deployment_id, kept in before.items():
        answer = http.get(f"/deployments/{deployment_id}")
        if answer.status_code == 404:
            continue
        answer.raise_for_status()
        now = answer.json()
        if _schedules(now) != kept["schedules"]:
            if deployment_id in begun or as_in_project(_schedules(now), kept["project_schedules"]):
                begun.setdefault(deployment_id, f"{kept['name']}: kept the schedule set in the UI "
                                                f"({describe_schedules(kept['schedules'])}), not prefect.yaml's "
                                                f"({describe_schedules(_schedules(now))})")
                _put_schedules(http, deployment_id, now.get("schedules") or [], kept["schedules"])
            else:
                left[deployment_id] = (f"{kept['name']}: left the schedule as it is now "
                                       f"({describe_schedules(_schedules(now))}): changed in the UI while the "
                                       "deployments were made")
        if bool(now.get("paused")) != kept["paused"] and bool(now.get("paused")) == kept["project_paused"]:
            http.patch(f"/deployments/{deployment_id}", json={"paused": kept["paused"]}).raise_for_status()
    return [begun.get(i) or left[i] for i in before if i in begun or i in left]


# What users had set on the deployments (see set_by_users), saved in the server's --log-dir while `prefect deploy`
# runs, and removed once it is put back: a start killed outright meanwhile (SIGKILL, a power cut) leaves it for the
# next start to put back. The database it was read from (host, port and name: never a user or password), when, and
# the deployments' ids, names, schedules and pause: nothing secret.
SAVED_SETTINGS = "schedules-set-by-users.json"
SET_ASIDE = ".ignored"  # a saved file that is not this database's is renamed so, not applied


@dataclass(frozen=True)
class SavedSettings:
    database: str
    saved_at: str
    deployments: dict[str, dict[str, Any]]


def database_identity(url: str) -> str:
    """The database a URL names, as the saved file records it: host, port and name (not the user, nor a password)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    host = parts.hostname or query.get("host") or "localhost"
    return f"{host}:{parts.port or 5432}/{parts.path.lstrip('/')}"


def _exactly(value: Any, keys: tuple[str, ...], where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: not an object")
    if set(value) != set(keys):
        raise ValueError(f"{where}: has the keys {', '.join(sorted(value)) or 'none'}, not exactly "
                         f"{', '.join(keys)}")
    return value


def _saved_schedule(value: Any, where: str) -> dict[str, Any]:
    """One saved schedule, checked as strictly as it was written: exactly SCHEDULE_FIELDS, JSON true or false where
    a flag is (the string "false" is true to Python), and a schedule Prefect's server takes."""
    from prefect.server.schemas.actions import DeploymentScheduleCreate
    from pydantic import ValidationError

    schedule = _exactly(value, SCHEDULE_FIELDS, where)
    if not isinstance(schedule["active"], bool):
        raise ValueError(f"{where}.active: not true or false")
    if not isinstance(schedule["schedule"], dict) or not isinstance(schedule["schedule"].get("day_or", True), bool):
        raise ValueError(f"{where}.schedule: not an object whose day_or is true or false")
    if not isinstance(schedule["parameters"], dict):
        raise ValueError(f"{where}.parameters: not an object")
    if schedule["slug"] is not None and not isinstance(schedule["slug"], str):
        raise ValueError(f"{where}.slug: not a string or null")
    runs = schedule["max_scheduled_runs"]
    if runs is not None and (isinstance(runs, bool) or not isinstance(runs, int)):
        raise ValueError(f"{where}.max_scheduled_runs: not a whole number or null")
    try:
        DeploymentScheduleCreate.model_validate(schedule)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise ValueError(f"{where}.schedule: not a schedule Prefect takes ({error['loc'][-1]}: {error['msg']})"
                         ) from None
    return schedule


def read_saved_settings(path: Path) -> SavedSettings | None:
    """What a start that was cut while it made the deployments had saved (see SAVED_SETTINGS); None where it left
    none. A file that is not exactly what was saved is one line naming it and the key."""
    if not path.is_file():
        return None
    try:
        saved = _exactly(read_json_file(path, what="what users set on the deployments"),
                         ("database", "saved_at", "deployments"), "the file")
        if not isinstance(saved["database"], str) or not isinstance(saved["saved_at"], str):
            raise ValueError("database, saved_at: not strings")
        if not isinstance(saved["deployments"], dict):
            raise ValueError("deployments: not an object")
        deployments = {}
        for deployment_id, value in saved["deployments"].items():
            where = f"deployments.{deployment_id}"
            entry = _exactly(value, ("name", "schedules", "paused"), where)
            if not isinstance(entry["name"], str):
                raise ValueError(f"{where}.name: not a string")
            if not isinstance(entry["paused"], bool):
                raise ValueError(f"{where}.paused: not true or false")
            if not isinstance(entry["schedules"], list):
                raise ValueError(f"{where}.schedules: not a list")
            deployments[deployment_id] = {"name": entry["name"], "paused": entry["paused"], "schedules": [
                _saved_schedule(s, f"{where}.schedules[{n}]") for n, s in enumerate(entry["schedules"])]}
    except (FlagperfError, ValueError) as exc:
        raise RuntimeError(f"{path}: not what an interrupted start saved of the deployments' schedules ({_said(exc)})"
                           "; remove it to start (what users had set before that start is then not put back)"
                           ) from None
    return SavedSettings(saved["database"], saved["saved_at"], deployments)


def saved_for_this_start(path: Path, saved: SavedSettings | None, database: str,
                         now: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The deployments of ``saved`` (read from ``path``) that this start puts back: all of them where it was saved on
    this ``database`` and names the deployments as they are ``now`` (by id, see set_by_users); else none, with a line
    saying why, and the file renamed (SET_ASIDE) so that it is neither applied nor lost. A leftover of another
    database or of deployments made again since would put back what belongs elsewhere."""
    if saved is None:
        return {}
    renamed = [f"{name} (now {now[i]['name']})" for i, e in saved.deployments.items()
               if i in now and (name := e["name"]) != now[i]["name"]]
    if saved.database == database and not renamed:
        if any(i in now for i in saved.deployments):
            print(f"schedules: putting back what users had set, from {path} (saved at {saved.saved_at} by a start "
                  "cut while it made the deployments)", flush=True)
        return saved.deployments
    why = (f"it was saved on database {saved.database}, not this one ({database})" if saved.database != database
           else f"the deployments it names by id are named otherwise now: {', '.join(renamed)}")
    aside = path.with_name(path.name + SET_ASIDE)
    try:
        os.replace(path, aside)
        moved = f"renamed {aside.name}"
    except OSError as exc:
        moved = f"it could not be renamed ({exc.strerror or exc}) and is replaced"
    print(f"schedules: not putting back what {path} holds (saved at {saved.saved_at}): {why}; {moved}", flush=True)
    return {}


def with_saved_settings(before: dict[str, dict[str, Any]], saved: dict[str, dict[str, Any]]
                        ) -> dict[str, dict[str, Any]]:
    """``before`` (set_by_users, read now) with what a cut start saved: a deployment that has prefect.yaml's
    schedules now (the cut `prefect deploy` gave it those), or the saved ones and prefect.yaml's, or some or none
    of the saved ones (a put-back cut midway: _put_schedules, or the code before it), gets the saved ones; one that
    has others was changed in the UI since, and keeps them. Its pause likewise."""
    merged = {}
    for deployment_id, now in before.items():
        kept = saved.get(deployment_id)
        entry = dict(now)
        if kept is not None:
            if now["schedules"] != kept["schedules"] and (
                    as_in_project(now["schedules"], now["project_schedules"])
                    or _matching(now["schedules"], kept["schedules"], now["project_schedules"])):
                entry["schedules"] = kept["schedules"]
            if now["paused"] != kept["paused"] and now["paused"] == now["project_paused"]:
                entry["paused"] = kept["paused"]
        merged[deployment_id] = entry
    return merged


def save_settings(path: Path, before: dict[str, dict[str, Any]], database: str) -> None:
    """``before`` in ``path``, whole or not at all (and durably: it is what a power cut must not lose), with the
    ``database`` it was read from and the time, before `prefect deploy` may change what it holds; no file when
    there is nothing to put back."""
    if not before:
        path.unlink(missing_ok=True)
        return
    try:
        write_json_atomic(path, {"database": database,
                                 "saved_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                 "deployments": {i: {k: e[k] for k in ("name", "schedules", "paused")}
                                                 for i, e in before.items()}})
    except OSError as exc:  # nothing made yet: better not made than made with what users set lost to a crash
        raise RuntimeError(f"cannot save what users set on the deployments to {path} ({exc.strerror or exc}) "
                           "before making them") from None


def on_other_pools(http: Any, specs: list[dict[str, Any]], pool: str) -> dict[str, str]:
    """The deployments of prefect.yaml (by name) that exist on a work pool other than ``pool``."""
    return {spec["name"]: d["work_pool_name"] for spec in specs for d in _deployments_named(http, spec)
            if d.get("work_pool_name") not in (None, pool)}


def refuse_other_pools(api_url: str, auth: dict[str, str], pool: str) -> None:
    """A ConfigError naming --pool where the deployments of prefect.yaml are another work pool's. Prefect names a
    deployment per flow, not per pool: servers that share a database share `evaluate`, `nightly` and the internal
    ones, and a server on another pool would silently take them over (the other server's worker would get no more
    runs; its next start would take them back). A pool deleted since (the deployments on none) is no one's. An
    error of the API is raised as httpx.HTTPError, for the caller to say in one line."""
    specs = deployments_in_project(pool)["deployments"]
    others = with_retries(api_url, auth, lambda http: on_other_pools(http, specs, pool))
    if others:
        theirs = sorted(set(others.values()))[0]
        raise ConfigError(f"--pool {pool}", None, (
            f"the deployments {', '.join(others)} on this database are on work pool {theirs!r}, another server's "
            "(Prefect names deployments per flow, not per pool: this one would take them over); "
            f"start it with --pool {shlex.quote(theirs)}, or give it a database of its own (--database-url); if no "
            f"server uses pool {theirs!r} any more, `prefect work-pool delete {shlex.quote(theirs)}` lets this one "
            "take them (their schedules kept)"))


BUSY = (429, 502, 503)  # the server is busy (Prefect answers 503 while its database is): Prefect's clients retry


def with_retries(api_url: str, auth: dict[str, str], step: Callable[[Any], T], timeout_s: float = 30.0,
                 attempts: int = 3) -> T:
    """``step(client)`` tried again where the server was busy or did not answer; the last try's error is raised
    (an httpx.HTTPError: create_deployments says it in one line)."""
    import httpx

    for attempt in range(1, attempts):
        try:
            with httpx.Client(base_url=api_url, headers=auth, timeout=timeout_s) as http:
                return step(http)
        except (httpx.TransportError, httpx.HTTPStatusError) as exc:
            if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code not in BUSY:
                raise
            time.sleep(attempt)
    with httpx.Client(base_url=api_url, headers=auth, timeout=timeout_s) as http:
        return step(http)


def put_back_set_by_users(api_url: str, auth: dict[str, str], before: dict[str, dict[str, Any]],
                          timeout_s: float = 30.0, attempts: int = 3) -> list[str]:
    """restore_set_by_users, tried again where the server was busy or did not answer: each try compares with what
    is there then, and finishes what a try cut midway had begun (its schedules deleted and not yet made again)."""
    begun: dict[str, str] = {}
    return with_retries(api_url, auth, lambda http: restore_set_by_users(http, before, begun), timeout_s, attempts)


def _not_back(exc: Exception, before: dict[str, dict[str, Any]], saved_path: Path) -> str:
    """What a failed put-back of ``before`` (saved in ``saved_path``) left, and the way on. The server refusing it
    (a 4xx other than busy) would refuse it again at every start, which puts it back from the file: remove it."""
    import httpx

    names = ", ".join(sorted({entry["name"] for entry in before.values()}))
    status = exc.response.status_code if isinstance(exc, httpx.HTTPStatusError) else None
    if status is not None and 400 <= status < 500 and status not in BUSY:
        return (f"what users set on {names} (schedules, pause) is not back: the server refused it ({_said(exc)}), and "
                f"would at every start, which puts it back from {saved_path}: remove that file to start (what it "
                "holds is then not put back; check the schedules in the UI)")
    return (f"what users set on {names} (schedules, pause) may not be back ({_said(exc)}): the next start puts it "
            f"back from {saved_path}, or check them in the UI")


SIGN_IN_REFUSED = (401, 403)


def refused_sign_in(exc: Exception, api_url: str, credentials: Credentials | None) -> None:
    """A 401 or 403 from the server: a sign-in to change (exit 2), in one line naming where it came from, not a
    failure to try again (exit 1)."""
    import httpx

    if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code in SIGN_IN_REFUSED:
        source = credentials.source if credentials is not None else CLIENT_AUTH_ENV
        said = "refused the sign-in" if credentials is not None else "needs a sign-in, and none was given"
        raise ConfigError(source, None, f"the server at {api_url} {said} ({exc.response.status_code}); use the "
                                         "server's (its banner names where it comes from)") from None


def _said(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def create_deployments(api_url: str, client_env: dict[str, str], results_root: Path, pool: str,
                       credentials: Credentials | None, log_dir: Path, stopping: list[int] | None = None, *,
                       database: str, way_on: str | None = None) -> tuple[list[str], list[str], list[str]] | None:
    """The deployments of prefect.yaml on the server's pool, made as `prefect deploy --all` makes them (its form
    schemas read with the results folder's default in the environment); then the user-facing ones get the served
    results folder in their job variables, so a worker elsewhere runs them with it too. A deployment that existed
    keeps the schedules and pause its users set in the UI (and one changed in the UI while they were made, that
    change): prefect.yaml's schedule is the new deployment's. Its
    output goes to deploy.log. Returns (user-facing, internal) names and a line per schedule kept; None when a
    signal noted in ``stopping`` stopped it (`prefect deploy` is stopped at once, see run_step). Deployments of
    another work pool on this database are left alone, with one line (refuse_other_pools).

    Stopped, failed or timed out midway, `prefect deploy` may have made some deployments and not others, and
    given prefect.yaml's schedule to some that had their users': what users had set is put back all the same
    (the next start would take prefect.yaml's for theirs), and the next start makes them all again. ``way_on``:
    what its errors say to do then (default: the command that makes them by hand, deploy_command). Killed
    outright meanwhile, it cannot put anything back: what users had set is saved in ``log_dir`` first
    (SAVED_SETTINGS), and the next start on the same ``database`` (database_identity) puts it back from there."""
    import httpx
    import yaml

    stopping = [] if stopping is None else stopping
    project = deployments_in_project(pool)
    by_hand = way_on or "by hand: " + deploy_command(api_url, results_root, pool, credentials, log_dir=log_dir,
                                                     database=database)
    user_specs = [spec for spec in project["deployments"] if not is_internal(spec)]
    saved_path = log_dir / SAVED_SETTINGS
    saved = read_saved_settings(saved_path)
    try:
        auth = api_headers(api_url, credentials.auth_string if credentials else None)
        refuse_other_pools(api_url, auth, pool)
        now = with_retries(api_url, auth, lambda http: set_by_users(http, user_specs))
    except httpx.HTTPError as exc:  # nothing made yet: the one line, and how to make them by hand
        refused_sign_in(exc, api_url, credentials)
        raise RuntimeError(f"reading the deployments' schedules before making them failed ({_said(exc)}); "
                           f"{by_hand}") from None
    before = with_saved_settings(now, saved_for_this_start(saved_path, saved, database, now))
    save_settings(saved_path, before, database)
    restored = False
    try:
        with tempfile.TemporaryDirectory(prefix="flagperf-deploy-") as folder:
            prefect_file = Path(folder) / "prefect.yaml"
            prefect_file.write_text(yaml.safe_dump(project, sort_keys=False), encoding="utf-8")
            with (log_dir / "deploy.log").open("ab") as deploy_log:
                made = run_step(watched([sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all",
                                         "--prefect-file", str(prefect_file)]), stopping, DEPLOY_TIMEOUT_S,
                                "creating the deployments (see deploy.log)",
                                cwd=PROJECT_ROOT, env={**client_env, "PWD": str(PROJECT_ROOT)}, stdout=deploy_log,
                                stderr=subprocess.STDOUT)
        if made is None:
            return None
        if made.returncode != 0:
            raise RuntimeError(f"creating the deployments failed (see deploy.log); {by_hand}")
        user = [spec["name"] for spec in user_specs]
        internal = [spec["name"] for spec in project["deployments"] if spec not in user_specs]

        def served_results_folder(http: Any) -> None:  # the same job variables again on a retry
            for spec in user_specs:
                for deployment in _deployments_named(http, spec):
                    variables = served_job_variables(deployment.get("job_variables"), results_root)
                    http.patch(f"/deployments/{deployment['id']}",
                               json={"job_variables": variables}).raise_for_status()

        try:
            with_retries(api_url, auth, served_results_folder)
        except httpx.HTTPError as exc:
            raise RuntimeError(f"giving the deployments the served results folder failed ({_said(exc)}); "
                               f"{by_hand}") from None
        restored = True  # tried: an error in it is this command's error
        try:
            kept = put_back_set_by_users(api_url, auth, before)
        except httpx.HTTPError as exc:  # made again by hand, they would take prefect.yaml's schedules once more
            raise RuntimeError(f"the deployments are made, but {_not_back(exc, before, saved_path)}") from None
        saved_path.unlink(missing_ok=True)
        return user, internal, kept
    finally:
        if not restored and before:  # the server is still up (it is stopped next): briefly, and said if it fails
            try:
                put_back_set_by_users(api_url, auth, before, timeout_s=10)
                saved_path.unlink(missing_ok=True)
            except httpx.HTTPError as exc:
                print(f"schedules: {_not_back(exc, before, saved_path)}", flush=True)


def say_deployments(user: list[str], internal: list[str], kept: list[str]) -> None:
    print(f"deployments: {', '.join(user)} (start these); internal, tagged so: {', '.join(internal)} "
          f"(dispatched by evaluate)", flush=True)
    for line in kept:
        print(f"schedules: {line}", flush=True)


def deploy_by_hand(argv: list[str]) -> int:
    """``python -m flows.server deploy``: the deployments made on a running server as `flagperf server` makes them
    (create_deployments), for the command deploy_command prints. Signed in with PREFECT_API_AUTH_STRING (the command
    sets it from where the server's sign-in came). Exit 0 made, 1 failed, 2 refused (another server's pool, a wrong
    or missing sign-in: a 401 or 403), 128 + the signal that stopped it (what users set put back all the same)."""
    parser = argparse.ArgumentParser(prog="python -m flows.server deploy", description=(
        "make the deployments of prefect.yaml on a running `flagperf server` as it makes them, keeping what users "
        "set in the UI (the command its banner prints with --no-deploy)"))
    parser.add_argument("--api-url", required=True, help="the server's API, e.g. http://127.0.0.1:4200/api")
    parser.add_argument("--pool", required=True, help="the server's work pool")
    parser.add_argument("--results", type=Path, required=True, help="the results folder the server serves")
    parser.add_argument("--log-dir", type=Path, required=True, help="the server's --log-dir")
    parser.add_argument("--database", required=True, help="the server's database as host:port/name")
    args = parser.parse_args(argv)
    stopping: list[int] = []

    def noted(signum: int, _frame: object) -> None:
        # as the server's: the first stops `prefect deploy` and puts back what users set, a second says a third
        # stops at once (without putting it back: the next run of this command does, from the saved file)
        stopping.append(signum)
        if len(stopping) >= STOP_NOW_AT:
            stop_now(signum, "what users set on the deployments may not be back: the next run of this command "
                             f"puts it back from {args.log_dir / SAVED_SETTINGS} (so does the server's next start "
                             "where it makes the deployments, without --no-deploy)")
        elif len(stopping) == STOP_NOW_AT - 1:  # os.write: it may land while this process writes to stderr
            os.write(2, b"still putting back what users set on the deployments; one more signal stops at once\n")

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, noted)
    try:
        value = os.environ.get(CLIENT_AUTH_ENV)
        credentials = Credentials(check_auth_string(value, CLIENT_AUTH_ENV), CLIENT_AUTH_ENV) if value else None
        results_root = args.results.resolve()
        args.log_dir.mkdir(parents=True, exist_ok=True)
        made = create_deployments(args.api_url, client_environment(args.api_url, results_root, credentials),
                                  results_root, args.pool, credentials, args.log_dir, stopping,
                                  database=args.database, way_on="fix that and run the same command again")
    except FlagperfError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except (RuntimeError, OSError) as exc:
        said = f"{exc.filename}: {exc.strerror}" if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"error: {said} (logs in {args.log_dir})", file=sys.stderr, flush=True)
        return 1
    if made is None:
        print(f"interrupted by {signal.Signals(stopping[0]).name}: what users set on the deployments is put back; "
              "run the command again to make them all", file=sys.stderr, flush=True)
        return 128 + stopping[0]
    say_deployments(*made)
    return 0


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host`` (an address or name; "::" also takes IPv4 where the system can) and
    ``port`` (0: any free one), or a ConfigError naming --port where the port is taken or not allowed, --host
    otherwise (a name that does not resolve, an address not on this machine)."""
    try:
        found = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"--host {host}", None, f"cannot listen on {host!r}: {exc.strerror}") from None
    family, _type, _proto, _name, address = found[0]
    try:
        if host == "::" and socket.has_dualstack_ipv6():  # 127.0.0.1 (this machine's clients) reaches it too
            return socket.create_server(address, family=socket.AF_INET6, dualstack_ipv6=True)
        return socket.create_server(address, family=family)
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        if exc.errno in (errno.EADDRINUSE, errno.EACCES):
            raise ConfigError(f"--port {port}", None, f"cannot listen on {url_host(host)}:{port}: {why}; choose "
                                                      "another --port") from None
        raise ConfigError(f"--host {host}", None, f"cannot listen on {url_host(host)}:{port}: {why}") from None


def serve(database_url: str, host: str, port: int, pool: str, worker: bool, log_dir: Path, *,
          results_dir: Path = Path("results"), results_port: int | None = None,
          public_urls: Sequence[str] = (), results_public_url: str | None = None,
          credentials: Credentials | None = None, deploy: bool = True, stopping: list[int] | None = None,
          extra_names: tuple[str, ...] = ()) -> int:
    """Start the server (and a worker), the deployments and the results site, wait until interrupted, stop all.
    ``credentials`` None only on a loopback ``host`` (see server_credentials). Returns an exit code: 0 once
    stopped by a signal after it was up (the way to end it: it says so), 1 when a process of it failed, 128 +
    the signal when a signal stopped it while it started (everything it had started is stopped, the commands that
    make the work pool and the deployments at once: see run_step). ``public_urls`` (--public-url, repeatable):
    the addresses browsers use, the first the one the banner says and the UI's API address; each adds its host to
    the names the server and the site answer to and its origin to the allowed ones (a TLS alias behind a proxy).
    ``extra_names``: more names the server and the site answer to (--server-name), besides server_names'.

    ``stopping``: the signals that stop it, noted by its handlers of SIGTERM, SIGHUP and SIGINT. Signal handlers
    exist in the main thread only: called in another thread, it installs none, and its caller stops it by
    appending a signal number to the ``stopping`` it gave (without one: a RuntimeError, before anything starts)."""
    main_thread = threading.current_thread() is threading.main_thread()
    if stopping is None and not main_thread:
        raise RuntimeError("the server runs in the main thread only, where signals (which stop it) arrive; in "
                           "another thread, give flows.server.serve a stopping list and append a signal number to "
                           "it to stop the server")
    stopping = [] if stopping is None else stopping
    host = host.strip("[]")  # --host [::1], as in a URL
    given = [url.rstrip("/") for url in public_urls]
    public_url, aliases = (given[0] if given else None), given[1:]
    opened = beyond_loopback(host, {"--public-url": public_urls, "--results-public-url": results_public_url})
    if credentials is None and opened is not None:
        raise ConfigError(opened[0], None, f"{opened[1]} needs a sign-in: {how_to_set()}")
    # Bound here and handed to the server (as `prefect server start` checks the port first): on a port another
    # server holds, that one's /health would pass for this one's, and its 401 read as a wrong sign-in.
    listening = listen(host, port)
    with contextlib.ExitStack() as on_error:  # emptied once the server holds the socket: until then, closed
        on_error.callback(listening.close)
        port = listening.getsockname()[1]  # --port 0: the one the OS chose, in every URL, name and origin
        api_url = local_api_url(host, port)
        base = public_base(host, port, public_url)
        results_root = (results_dir if results_dir.is_absolute() else PROJECT_ROOT / results_dir).resolve()
        if results_port is None:
            results_port = port + 1 if port < 65535 else port - 1
        results_base = results_base_for(base, results_port, results_public_url)
        names = server_names(host, [base, *aliases], extra_names)
        origins = allowed_origins(names, port, [base, *aliases])  # before anything starts: a "*" there is refused
        log_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in (CLIENT_AUTH_ENV, SERVER_AUTH_ENV)}
        if credentials is not None:  # the environment only: a command line shows in every process list
            env[SERVER_AUTH_ENV] = credentials.auth_string
        # What serve means, each under the one name it sets, every alias of it removed (an operator's alias that
        # Prefect reads first would win). The UI asks /ui-settings where the API is (else port 4200). A change to
        # the API (start a run, edit a deployment) needs a token only a page of the UI can read: a page of another
        # site cannot make a browser that holds the sign-in (a proxy's Basic prompt) change anything; Prefect's UI
        # and clients fetch the token themselves. CORS: the server's own origins and the operator's (Prefect
        # allows any).
        env = with_prefect_settings(env, {DATABASE_URL_ENV: database_url, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                                          "PREFECT_UI_API_URL": f"{base}/api", "PREFECT_UI_URL": base,
                                          CSRF_ENV: "true", CORS_ENV: ",".join(origins)})
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT) if main_thread else ():
            signal.signal(sig, lambda signum, _frame: stopping.append(signum))
        from flagperf.results.history import DEFAULT_URL_ENV as HISTORY_URL_ENV  # pandas: only where the site runs

        try:
            site = serve_site(results_root, host, results_port, credentials, os.environ.get(HISTORY_URL_ENV), base,
                              names=server_names(host, [results_base, *aliases], extra_names),
                              reread_names=rereads_names(host))
        except OSError as exc:
            raise RuntimeError(f"cannot serve the results site on {url_host(host)}:{results_port}: "
                               f"{exc.strerror or exc} (choose another --results-port)") from None
        on_error.callback(site.stop)
        # Prefect's app behind our front (flows.team_app): requests that name the server otherwise refused, CORS for
        # its own origins only and those the operator set, pages of other origins kept from changes and websockets
        # (the same origins, given to it here), frame protection, a malformed sign-in a 401.
        fd = listening.fileno()
        with (log_dir / "server.log").open("ab") as server_log:
            server = subprocess.Popen(watched([sys.executable, "-m", "flows.team_app", "--host", host,
                                               "--port", str(port), "--fd", str(fd),
                                               *(f"--name={name}" for name in names),
                                               *(f"--origin={origin}" for origin in origins),
                                               *(["--reread-names"] if rereads_names(host) else [])], pass_fds=(fd,)),
                                      env=env, stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True,
                                      pass_fds=(fd,), cwd=CODE_ROOT)
        on_error.pop_all()
    listening.close()  # the server holds it from here
    processes = [server]
    up = False
    try:
        wait_healthy(api_url, server, stopping)
        if stopping:
            return 128 + stopping[0]
        print(f"server: UI at {base} (API {base}/api), database {urlsplit(database_url).hostname}", flush=True)
        advice = address_advice(host, port, public_url)
        if advice is not None:
            print(advice, flush=True)
        if credentials is not None:
            print(f"sign-in: on, user {credentials.user!r} (from {credentials.source}); the results site asks the "
                  f"same", flush=True)
        else:
            print(f"sign-in: off, for one person on this machine only ({host} is loopback); beyond it the server "
                  f"needs one: {how_to_set()}", flush=True)
        print(f"results: {results_root} at {results_base}/ (runs, reports, compare, trends; read-only)", flush=True)
        # The worker, its flow runs and their cases get no database credentials: only the server needs them.
        client_env = client_environment(api_url, results_root, credentials, ui_url=base,
                                        results_url=f"{results_base}/runs")
        # Before the pool is made: a refused start leaves nothing on the database it shares. With --no-deploy too:
        # its worker would poll a pool the deployments are not on (the deploy it prints refuses alike).
        import httpx

        try:
            refuse_other_pools(api_url, api_headers(api_url, credentials.auth_string if credentials else None), pool)
        except httpx.HTTPError as exc:
            # The client signs in with the server's own sign-in: a 401 or 403 is another server's answer
            if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code in SIGN_IN_REFUSED:
                raise ConfigError(f"--port {port}", None, f"the API on port {port} is not this server's (it "
                                                          f"refused this server's sign-in, "
                                                          f"{exc.response.status_code}); choose another "
                                                          "--port") from None
            raise RuntimeError(f"reading the deployments before making them failed ({_said(exc)})") from None
        # Watched too: killed meanwhile, this command would leave it retrying a server that is gone. One API call:
        # the pool is there or not (a signal stops the command at once), and the next start makes it with
        # --overwrite either way.
        created = run_step(watched([sys.executable, "-m", "prefect", "--no-prompt", "work-pool", "create", pool,
                                    "--type", "process", "--overwrite"]), stopping, POOL_TIMEOUT_S,
                           f"creating work pool {pool!r}", env=client_env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
        if created is None or stopping:  # a signal before or while the pool was made
            return 128 + stopping[0]
        if created.returncode != 0:
            raise RuntimeError(f"creating work pool {pool!r} failed: {created.stderr.strip()[-300:]}")
        if worker:
            with (log_dir / "worker.log").open("ab") as worker_log:
                processes.append(subprocess.Popen(
                    watched([sys.executable, "-m", "prefect", "worker", "start", "--pool", pool]), cwd=PROJECT_ROOT,
                    env=client_env, stdout=worker_log, stderr=subprocess.STDOUT, start_new_session=True))
            print(f"worker: pool {pool!r}, running flows from {PROJECT_ROOT}", flush=True)
        if deploy:
            made = create_deployments(api_url, client_env, results_root, pool, credentials, log_dir, stopping,
                                      database=database_identity(database_url))
            if made is None:  # a signal while they were made
                return 128 + stopping[0]
            say_deployments(*made)
        else:
            command = deploy_command(api_url, results_root, pool, credentials, log_dir=log_dir,
                                     database=database_identity(database_url))
            print(f"deployments: not created (--no-deploy); to create them: {command}", flush=True)
        if stopping:
            return 128 + stopping[0]
        auth_hint = f" and {CLIENT_AUTH_ENV}=user:password" if credentials is not None else ""
        print(f"logs in {log_dir}; export PREFECT_API_URL={base}/api{auth_hint} to use it; Ctrl-C stops all",
              flush=True)
        up = True
        while not stopping and all(p.poll() is None for p in processes):
            time.sleep(1)
        failed = [p for p in processes if p.poll() not in (None, 0)]
        return 1 if failed else 0
    finally:
        def in_clean_up(signum: int, _frame: object) -> None:
            # a second signal must not cut the shutdown short; a third (counting those before it began) is the way
            # out of one that hangs, as for every command (flagperf.stopping)
            stopping.append(signum)
            if len(stopping) >= STOP_NOW_AT:
                stop_now(signum, "the worker and the Prefect server are stopped by their watchers once this "
                                 f"process is gone (SIGTERM, SIGKILL {WATCH_GRACE_S:.0f} s later)")
            elif len(stopping) == STOP_NOW_AT - 1:  # os.write: it may land while this process writes to stderr
                os.write(2, b"still stopping the worker and the server (up to 40 s each); one more signal stops "
                            b"at once\n")

        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT) if main_thread else ():
            signal.signal(sig, in_clean_up)
        for proc in reversed(processes):  # the worker first, then the server it talks to
            _stop(proc)
        site.stop()
        if up and stopping:
            print(f"stopped by {signal.Signals(stopping[0]).name}: "
                  + ("the worker, " if len(processes) > 1 else "") + "the server and the results site", flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["deploy"]:
        return deploy_by_hand(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m flows.server",
                                     description="run COMMAND until PID (its owner) is gone",
                                     epilog="python -m flows.server deploy --help: the deployments, made by hand")
    parser.add_argument("--watch-parent", type=int, required=True, metavar="PID")
    parser.add_argument("--pass-fd", type=int, action="append", default=[], metavar="FD",
                        help="a file descriptor the command inherits (a listening socket)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    return watch_parent(args.watch_parent, command, tuple(args.pass_fd))


if __name__ == "__main__":
    sys.exit(main())
