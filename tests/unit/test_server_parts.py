"""flows/server.py without a Prefect server: the parent watcher, the UI address (the results site is tested in
tests/integration/test_results_site.py),
and the profile look-up; and the evaluate form's parameter schema as Prefect builds it for a deployment."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from flagperf.paths import PROJECT_ROOT
from flows.server import configured_api_url, public_base
from tests.unit.childio import LINE_DEADLINE_S, Lines


def wait_for(predicate, what: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"gave up waiting for {what}")


def drive(app: object, scope: dict, received: list[dict] | None = None) -> list[dict]:
    """One request (or websocket) through the ASGI ``app``, as a server would hand it over: the messages the app
    sent back. ``received``: what it reads, in order (by default one empty request body; then a disconnect)."""
    import asyncio

    said: list[dict] = []
    queued = list(received if received is not None else [{"type": "http.request", "body": b""}])

    async def receive() -> dict:
        return queued.pop(0) if queued else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        said.append(message)

    asyncio.run(app(scope, receive, send))  # type: ignore[operator]
    return said


def answered(said: list[dict]) -> object:
    """A request's status, a websocket's close code, or the type of the first message (websocket.accept)."""
    return said[0].get("status", said[0].get("code", said[0]["type"]))


async def accepting_app(scope: dict, receive: object, send: object) -> None:
    """An app behind a Front that accepts every websocket and answers every request 200: what the front lets by."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.accept"})  # type: ignore[operator]
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b""})  # type: ignore[operator]

def test_a_watched_command_ends_when_its_owner_is_killed_outright(tmp_path: Path) -> None:
    """The owner (a stand-in for `flagperf run`) starts a watched sleeper and is then SIGKILLed: the sleeper,
    a grandchild that no signal of the owner's reaches, must go too."""
    pid_file = tmp_path / "sleeper.pid"
    sleeper_py = tmp_path / "sleeper.py"
    sleeper_py.write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n")
    owner_code = (
        "import subprocess, sys, time\n"
        "from flows.server import watched\n"
        f"subprocess.Popen(watched([sys.executable, {str(sleeper_py)!r}]), start_new_session=True)\n"
        "time.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", owner_code], cwd=PROJECT_ROOT)
    try:
        wait_for(lambda: pid_file.is_file() and pid_file.read_text().strip(), "the sleeper to start")
        sleeper = psutil.Process(int(pid_file.read_text()))
        assert sleeper.is_running()
        owner.kill()
        owner.wait(timeout=60)
        wait_for(lambda: not sleeper.is_running() or sleeper.status() == psutil.STATUS_ZOMBIE,
                 "the sleeper to be stopped by its watcher")
    finally:
        owner.kill()


def test_a_signal_to_the_watcher_reaches_the_command(tmp_path: Path) -> None:
    marker, ready = tmp_path / "got-term", tmp_path / "handler-installed"
    code = ("import signal, sys, time\n"
            f"signal.signal(signal.SIGTERM, lambda *a: (open({str(marker)!r}, 'w').close(), sys.exit(0)))\n"
            f"open({str(ready)!r}, 'w').close()\n"
            "time.sleep(600)\n")
    watcher = subprocess.Popen([sys.executable, "-m", "flows.server", "--watch-parent", str(os.getpid()), "--",
                                sys.executable, "-c", code], cwd=PROJECT_ROOT, start_new_session=True)
    try:
        # The watcher installs its handlers before it starts the command: once the command's are in, both are.
        wait_for(ready.exists, "the command to install its SIGTERM handler")
        watcher.send_signal(signal.SIGTERM)
        assert watcher.wait(timeout=60) == 0
        assert marker.exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(watcher.pid, signal.SIGKILL)


def test_a_step_that_runs_past_its_limit_is_stopped_and_says_so(tmp_path: Path) -> None:
    """`flagperf server`'s work pool and deployment commands (run_step): one that does not end within its limit is
    stopped with what it started (its watcher's group), and the error names the step: not a traceback of
    subprocess's TimeoutExpired."""
    from flows.server import run_step, watched

    token = f"flagperf-step-{tmp_path.name}"  # in the command line of the watcher and of its command

    def left() -> list[psutil.Process]:
        found = []
        for process in psutil.process_iter(["cmdline", "status"]):
            if token in " ".join(process.info["cmdline"] or []) and process.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(process)
        return found

    with pytest.raises(RuntimeError, match=r"^creating the thing did not finish within 1 s$"):
        run_step(watched([sys.executable, "-c", "import time; time.sleep(600)", token]), [], 1.0,
                 "creating the thing", cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: not left(), "the step and its watcher to be stopped")


def test_a_step_is_not_started_after_a_signal(tmp_path: Path) -> None:
    from flows.server import run_step

    assert run_step([sys.executable, "-c", f"open({str(tmp_path / 'ran')!r}, 'w')"], [signal.SIGINT], 60.0,
                    "a step") is None
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize(("fqdn", "hostname", "route", "base", "guess"), [
    ("perf-lab.example.org", "perf-lab", "10.1.2.3", "http://perf-lab.example.org:4310", None),
    # /etc/hosts maps the host name to 127.0.0.1 first: getfqdn says 'localhost'; the host name has a domain
    ("localhost", "perf-lab.example.org", "10.1.2.3", "http://perf-lab.example.org:4310", None),
    # a short name only: the default route's address (a short name resolves only in the same DNS domain), said
    ("perf-lab", "perf-lab", "10.1.2.3", "http://10.1.2.3:4310", "its host name 'perf-lab' has no domain; used the "
                                                                 "address of its default route"),
    ("localhost", "perf-lab", "fd00::5", "http://[fd00::5]:4310", "its host name 'perf-lab' has no domain"),
    ("perf-lab", "perf-lab", None, "http://perf-lab:4310", "its host name 'perf-lab' has no domain"),
    # every name loopback: never silently 'localhost' (every browser would open its own machine)
    ("localhost", "localhost.localdomain", "10.1.2.3", "http://10.1.2.3:4310", "its names (localhost, "
                                                                               "localhost.localdomain) are loopback"),
    ("localhost.", "localhost", None, "http://localhost:4310", "its names (localhost, localhost.) are loopback"),
    # a name of this network only, or one this machine does not resolve to a network address: no full name, said
    ("perf-lab.localdomain", "perf-lab", "10.1.2.3", "http://10.1.2.3:4310",
     "its name 'perf-lab.localdomain' has no domain beyond this network; used the address of its default route"),
    ("perf-lab.local", "perf-lab", None, "http://perf-lab.local:4310",
     "its name 'perf-lab.local' has no domain beyond this network"),
    ("perf-lab.lan", "perf-lab", "10.1.2.3", "http://10.1.2.3:4310",
     "its name 'perf-lab.lan' does not resolve here; used the address of its default route"),
    ("perf-lab.hosts.example.org", "perf-lab", "10.1.2.3", "http://10.1.2.3:4310",
     "its name 'perf-lab.hosts.example.org' resolves here to loopback only; used the address of its default route"),
])
def test_the_ui_s_address_on_every_interface_is_the_machine_s_full_name_else_a_guess_said(
        monkeypatch: pytest.MonkeyPatch, fqdn: str, hostname: str, route: str | None, base: str,
        guess: str | None) -> None:
    """--host 0.0.0.0 without --public-url: the UI's address (and the results site's, the reports' links) names this
    machine by its FQDN; without one (a short name only, or only loopback names) it is a guess (the default route's
    address, else the short name, else localhost), and the banner says so in one line with the way out
    (--public-url); it gave a short name, or localhost, without a word."""
    import socket
    from urllib.parse import urlsplit

    from flows import server

    monkeypatch.setattr(socket, "getfqdn", lambda *args: fqdn)
    monkeypatch.setattr(socket, "gethostname", lambda: hostname)
    monkeypatch.setattr(server, "default_route_address", lambda ipv6=False: route)
    # The resolver as a LAN's DNS and /etc/hosts answer (Debian's 127.0.1.1 line for the host's own name)
    answers = {"perf-lab.example.org": "10.1.2.3", "perf-lab.hosts.example.org": "127.0.1.1"}
    real = socket.getaddrinfo

    def resolve(name: str, *args: object, **kwargs: object) -> list[tuple[object, ...]]:
        if name in answers:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[name], 0))]
        if name.endswith(".lan"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    for wildcard in ("0.0.0.0", "::"):
        assert public_base(wildcard, 4310) == base
        advice = server.address_advice(wildcard, 4310, None)
        if guess is None:
            assert advice is None
        else:
            name = urlsplit(base).hostname
            assert advice is not None and advice.startswith(f"address: {name} is a guess ({guess}"), advice
            assert advice.endswith("restart with --public-url http://NAME:4310 (NAME as they reach this machine)")
        assert server.address_advice(wildcard, 4310, "http://perf-lab:80") is None
    assert public_base("0.0.0.0", 4310, "http://perf-lab:80/") == "http://perf-lab:80"
    assert public_base("127.0.0.1", 4310) == "http://127.0.0.1:4310"
    assert server.address_advice("127.0.0.1", 4310, None) is None


def test_the_default_route_is_looked_for_over_ipv6_only_for_a_server_on_ipv6(monkeypatch: pytest.MonkeyPatch) -> None:
    """--host 0.0.0.0 listens on IPv4 only: an IPv6 route's address would be one teammates cannot reach it by."""
    import socket

    from flows import server

    tried: list[int] = []

    class Probe:
        def __init__(self, family: int, kind: int) -> None:
            self.family = family

        def __enter__(self) -> Probe:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def connect(self, target: tuple[str, int]) -> None:
            tried.append(self.family)
            if self.family == socket.AF_INET:
                raise OSError("no IPv4 route")  # an IPv6-only network

        def getsockname(self) -> tuple[str, int]:
            return ("2001:db8::5", 4)

    monkeypatch.setattr(socket, "getfqdn", lambda *args: "perf-lab")
    monkeypatch.setattr(socket, "gethostname", lambda: "perf-lab")
    monkeypatch.setattr(socket, "socket", Probe)
    assert server.public_base("0.0.0.0", 4310) == "http://perf-lab:4310" and tried == [socket.AF_INET]
    tried.clear()
    assert server.public_base("::", 4310) == "http://[2001:db8::5]:4310"
    assert tried == [socket.AF_INET, socket.AF_INET6]


def test_urls_made_from_an_ipv6_host_bracket_it() -> None:
    """--host ::1: the worker's API address, the UI's and the results site's are URLs (http://::1:4200/api is
    none: the worker could not reach the server)."""
    from urllib.parse import urlsplit

    from flows.server import local_api_url, results_base_for

    assert local_api_url("::1", 4200) == "http://[::1]:4200/api" and urlsplit(local_api_url("::1", 4200)).port == 4200
    assert local_api_url("[::1]", 4200) == "http://[::1]:4200/api"
    assert local_api_url("0.0.0.0", 4200) == local_api_url("::", 4200) == "http://127.0.0.1:4200/api"
    assert local_api_url("127.0.0.1", 4200) == "http://127.0.0.1:4200/api"
    assert public_base("::1", 4200) == "http://[::1]:4200"
    assert results_base_for("http://[::1]:4200", 4201) == "http://[::1]:4201"
    assert results_base_for("http://perf-lab:4200", 4201) == "http://perf-lab:4201"
    assert results_base_for("http://perf-lab:4200", 4201, "https://results.lab/") == "https://results.lab"


def test_a_server_answers_to_its_own_names_only() -> None:
    """The Host names the team server answers (any other is refused: DNS rebinding protection): the bound host,
    the public URL's, loopback's where this machine's clients reach it by loopback, and on a wildcard bind this
    machine's names and interface addresses; its CORS origins are those names on its port and the public URL's."""
    import socket

    import psutil

    from flows.server import own_origins, server_names

    loopback = server_names("127.0.0.1", ["https://perf-lab.example.org"])
    assert set(loopback) == {"127.0.0.1", "localhost", "[::1]", "perf-lab.example.org"}
    assert server_names("::1", [None]) == ["127.0.0.1", "[::1]", "localhost"]
    assert server_names("10.1.2.3", ["http://10.1.2.3:4200"]) == ["10.1.2.3"]  # not loopback: not its names
    everywhere = set(server_names("0.0.0.0", ["http://perf-lab:4200"]))
    addresses = {a.address for found in psutil.net_if_addrs().values() for a in found if a.family == socket.AF_INET}
    assert {"localhost", "127.0.0.1", "perf-lab", socket.gethostname().lower(), *addresses} <= everywhere
    assert "evil.example" not in everywhere and "*" not in everywhere
    assert own_origins(loopback, 4200, ["https://perf-lab.example.org/"]) == [
        "http://127.0.0.1:4200", "http://[::1]:4200", "http://localhost:4200", "http://perf-lab.example.org:4200",
        "https://perf-lab.example.org"]


def test_configured_api_url_reads_the_environment_then_the_active_profile(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_PROFILE", raising=False)
    profiles = tmp_path / "profiles.toml"
    monkeypatch.setenv("PREFECT_PROFILES_PATH", str(profiles))
    assert configured_api_url() is None
    profiles.write_text('active = "team"\n[profiles.team]\nPREFECT_API_URL = "http://perf-lab:4200/api"\n'
                        '[profiles.ephemeral]\n', encoding="utf-8")
    assert configured_api_url() == "http://perf-lab:4200/api"
    monkeypatch.setenv("PREFECT_PROFILE", "ephemeral")
    assert configured_api_url() is None
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    assert configured_api_url() == "http://127.0.0.1:9/api"


def test_the_form_explains_itself_and_offers_the_folders() -> None:
    """What `prefect deploy` puts in the evaluate deployment's form: every parameter described, no internal
    ones, choices from the folders, no optional (None) fields."""
    from prefect.utilities.callables import parameter_schema_from_entrypoint

    from flagperf.config.cases import available_cases
    from flagperf.config.plan import available_suites
    from flagperf.config.vendors import available_vendors

    schema = parameter_schema_from_entrypoint(f"{PROJECT_ROOT / 'flows' / 'evaluate.py'}:evaluate_form").model_dump()
    props = schema["properties"]
    assert set(props) == {"suite", "cases", "vendor", "rounds", "overrides", "inventory", "results_dir",
                          "monitor_interval_s"}
    assert all(p.get("description") for p in props.values()), props
    assert all("anyOf" not in p and p.get("type") != "null" for p in props.values()), props
    assert schema["required"] == []
    assert set(props["suite"]["enum"]) == set(available_suites())
    assert set(props["cases"]["items"]["enum"]) == set(available_cases())
    assert set(props["vendor"]["enum"]) == {"auto", *available_vendors()}


def test_the_host_round_form_has_no_probe_and_an_old_run_s_probe_is_still_taken() -> None:
    """host-round's `probe` is read from the run folder now: the deployment's form and schema, as `prefect deploy`
    makes them from the flow it loads, are the function's as Prefect makes them, every parameter typed as there
    (host and image were left untyped), without `probe` (users filled it); so too for a copy made by with_options
    (a plain Flow, which offered it again). A run made before, retried with it among its parameters, is still taken
    (Prefect checks them against the function, which keeps it); a run made now stores none."""
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.callables import parameter_schema

    flow = load_flow_from_entrypoint(f"{PROJECT_ROOT / 'flows' / 'host_round.py'}:host_round")
    whole = parameter_schema(flow.fn).model_dump()
    assert "probe" in whole["properties"] and whole["properties"]["host"].get("type") == "object", whole
    del whole["properties"]["probe"]
    copy = flow.with_options(name="host-round-copy", retries=1)
    assert copy.name == "host-round-copy" and copy.retries == 1
    for made in (flow, copy):
        assert parameter_schema(made).model_dump() == whole
        assert made.parameters.model_dump() == whole
        old_run = {"run_dir": "/r", "case": "c", "round_no": 1, "host": {"name": "h1"}, "probe": {"device": "X1"}}
        assert made.validate_parameters(old_run)["probe"] == {"device": "X1"}
        assert "probe" not in made.serialize_parameters({**old_run, "probe": None})


def test_a_server_stopped_while_it_starts_stops_what_it_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C before the Prefect server answers (delivered in this process as serve begins to wait for it): the
    server's process is stopped, and serve returns 128 + the signal, for `flagperf server` to say it was
    interrupted while it started (it returned 0, and the command ended without a word), with none of the banner
    that says the server is up."""
    import threading

    from flows import server

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    real, started = server.wait_healthy, []

    def interrupted_at_start(api_url: str, proc: subprocess.Popen[bytes], stopping: list[int], **limits: float) -> None:
        started.append((proc, psutil.Process(proc.pid).environ(), psutil.Process(proc.pid).cmdline()))
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # serve's handler notes it, here and now
        real(api_url, proc, stopping, **limits)

    monkeypatch.setattr(server, "wait_healthy", interrupted_at_start)
    # An operator's aliases of what serve sets (Prefect reads them first): the server gets serve's only.
    monkeypatch.setenv("PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS", "http://tools.lab")
    monkeypatch.setenv("PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED", "false")
    monkeypatch.setenv("PREFECT_SERVER_DATABASE_CONNECTION_URL", "sqlite+aiosqlite:///elsewhere.db")
    try:
        code = server.serve("postgresql+asyncpg://lab@127.0.0.1:5432/none", "127.0.0.1", 0, "pool", True,
                            tmp_path / "logs", results_dir=tmp_path / "results", results_port=0)  # 0: any free port
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert code == 128 + signal.SIGINT
    ((proc, env, command),) = started
    assert proc.poll() is not None
    assert not {"PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS", "PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED",
                "PREFECT_SERVER_DATABASE_CONNECTION_URL"} & set(env)
    assert env["PREFECT_SERVER_CSRF_PROTECTION_ENABLED"] == "true"
    assert env["PREFECT_API_DATABASE_CONNECTION_URL"] == "postgresql+asyncpg://lab@127.0.0.1:5432/none"
    port = command[command.index("--port") + 1]  # --port 0: the port the OS chose, in its URLs and origins too
    assert port != "0" and f"--origin=http://127.0.0.1:{port}" in command and "--origin=http://tools.lab" in command
    assert env["PREFECT_SERVER_CORS_ALLOWED_ORIGINS"].split(",") == [
        arg.split("=", 1)[1] for arg in command if arg.startswith("--origin=")]
    assert "server: UI at" not in capsys.readouterr().out


def test_serve_outside_the_main_thread_is_stopped_by_its_caller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """Signal handlers exist in the main thread only (signal.signal raised ValueError in another). In another
    thread serve installs none: without a ``stopping`` list to stop it by, it says so in one line and starts
    nothing; with one, appending a signal number stops it as the signal would, and the main thread's handlers
    are left as they were."""
    import threading

    from flows import server

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    outcome: list[object] = []

    def serve_in_a_thread(**kwargs: object) -> object:
        def call() -> None:
            try:
                outcome.append(server.serve("postgresql+asyncpg://lab@127.0.0.1:5432/none", "127.0.0.1", 4200,
                                            "pool", True, tmp_path / "logs", results_dir=tmp_path / "results",
                                            results_port=0, **kwargs))
            except Exception as exc:  # what the thread met is the verdict
                outcome.append(exc)

        thread = threading.Thread(target=call)
        thread.start()
        thread.join(timeout=120)
        assert not thread.is_alive()
        return outcome.pop()

    refused = serve_in_a_thread()
    assert isinstance(refused, RuntimeError), refused
    assert str(refused).startswith("the server runs in the main thread only") and "\n" not in str(refused)
    assert not (tmp_path / "logs").exists()

    stopping: list[int] = []
    started: list[subprocess.Popen[bytes]] = []

    def stopped_by_the_caller(api_url: str, proc: subprocess.Popen[bytes], noted: list[int], **limits: float) -> None:
        started.append(proc)
        assert noted is stopping
        stopping.append(signal.SIGTERM)  # as the code that started the thread would

    monkeypatch.setattr(server, "wait_healthy", stopped_by_the_caller)
    assert serve_in_a_thread(stopping=stopping) == 128 + signal.SIGTERM
    (proc,) = started
    assert proc.poll() is not None  # the Prefect server it started is stopped
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers


def test_what_an_interrupted_start_saved_is_put_back_only_where_the_deploy_changed_it(tmp_path: Path) -> None:
    """What users had set, saved by a start killed while it made the deployments, against what the deployments
    have when the next start reads them: prefect.yaml's (the killed deploy gave them that), or what a put-back cut
    midway leaves (the saved ones beside prefect.yaml's, some or none of the saved ones: the old put-back deleted
    first) gets the saved back; anything else was changed in the UI since, and stays."""
    from flows.server import SAVED_SETTINGS, read_saved_settings, save_settings, with_saved_settings

    project = [{"cron": "0 2 * * *", "timezone": "{{ server-timezone.stdout }}", "active": True}]
    as_in_yaml = [{"schedule": {"cron": "0 2 * * *", "timezone": "UTC"}, "active": True, "parameters": {},
                   "slug": None, "max_scheduled_runs": None}]
    users = [{**as_in_yaml[0], "schedule": {"cron": "30 3 * * *", "timezone": "Europe/Berlin"}},
             {**as_in_yaml[0], "schedule": {"cron": "0 12 * * 6", "timezone": "UTC"}, "active": False}]
    since = [{**as_in_yaml[0], "schedule": {"cron": "0 4 * * *", "timezone": "UTC"}}]
    path = tmp_path / SAVED_SETTINGS
    save_settings(path, {"d1": {"name": "nightly", "schedules": users, "paused": True, "project_schedules": project,
                                "project_paused": False}}, "db-host:5432/prefect")
    saved = read_saved_settings(path)
    assert saved is not None and saved.database == "db-host:5432/prefect" and saved.saved_at
    assert saved.deployments == {"d1": {"name": "nightly", "schedules": users, "paused": True}}

    def now(schedules: list[dict], paused: bool) -> dict[str, dict]:
        return {"d1": {"name": "nightly", "schedules": schedules, "paused": paused, "project_schedules": project,
                       "project_paused": False}}

    assert with_saved_settings(now(as_in_yaml, False), saved.deployments) == now(users, True)
    for cut in ([], users[:1], users[1:], [*users, *as_in_yaml], [as_in_yaml[0], users[0]]):
        assert with_saved_settings(now(cut, False), saved.deployments) == now(users, True), cut
    for changed in (since, [*users, *since], [*users, *users]):
        assert with_saved_settings(now(changed, True), saved.deployments) == now(changed, True), changed
    assert with_saved_settings(now(as_in_yaml, False), {}) == now(as_in_yaml, False)
    save_settings(path, {}, "db-host:5432/prefect")
    assert not path.exists() and read_saved_settings(path) is None


@pytest.mark.parametrize(("change", "key"), [
    (lambda e: e.pop("database"), "the file: has the keys deployments, saved_at, not exactly database, saved_at, "
                                     "deployments"),
    (lambda e: e["deployments"]["d1"].pop("paused"), "deployments.d1: has the keys"),
    (lambda e: e["deployments"]["d1"].update(paused="false"), "deployments.d1.paused: not true or false"),
    (lambda e: e["deployments"]["d1"]["schedules"][0].pop("schedule"), "deployments.d1.schedules[0]: has the keys"),
    (lambda e: e["deployments"]["d1"]["schedules"][0].update(active="false"),
     "deployments.d1.schedules[0].active: not true or false"),
    (lambda e: e["deployments"]["d1"]["schedules"][0].update(max_scheduled_runs="5"),
     "deployments.d1.schedules[0].max_scheduled_runs: not a whole number or null"),
    (lambda e: e["deployments"]["d1"]["schedules"][0].update(schedule={"crn": "0 2 * * *"}),
     "deployments.d1.schedules[0].schedule: not a schedule Prefect takes"),
    (lambda e: e["deployments"]["d1"]["schedules"][0]["schedule"].update(day_or="false"),
     "deployments.d1.schedules[0].schedule: not an object whose day_or is true or false"),
])
def test_a_saved_file_that_is_not_what_was_saved_is_one_line_naming_it_and_the_key(tmp_path: Path, change,
                                                                                   key: str) -> None:
    """Every field of the saved file, as strictly as it was written (a string "false" is true to Python, and a
    schedule without its `schedule` ended the start with a KeyError traceback): one line naming the file and the
    key, and saying that removing it lets the server start."""
    import json

    from flows.server import SAVED_SETTINGS, read_saved_settings

    entry = {"database": "db:5432/prefect", "saved_at": "2026-11-26T00:00:00+00:00", "deployments": {"d1": {
        "name": "nightly", "paused": True, "schedules": [{
            "schedule": {"cron": "30 3 * * *", "timezone": "Europe/Berlin", "day_or": True}, "active": True,
            "parameters": {}, "slug": None, "max_scheduled_runs": None}]}}}
    path = tmp_path / SAVED_SETTINGS
    path.write_text(json.dumps(entry), encoding="utf-8")
    assert read_saved_settings(path) is not None  # as written, it is read
    change(entry)
    path.write_text(json.dumps(entry), encoding="utf-8")
    with pytest.raises(RuntimeError) as info:
        read_saved_settings(path)
    said = str(info.value)
    assert said.startswith(f"{path}: not what an interrupted start saved of the deployments' schedules ({key}")
    assert "remove it to start" in said and "\n" not in said, said


def test_a_saved_file_of_another_database_or_deployments_is_set_aside_not_applied(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A leftover file is applied on the database it was saved on, to the deployments it names (by id and name);
    one saved on another database, or naming the deployments otherwise, is said in one line and renamed, not put
    back (it would put back what belongs elsewhere)."""
    from flows.server import SAVED_SETTINGS, SET_ASIDE, read_saved_settings, save_settings, saved_for_this_start

    schedules = [{"schedule": {"cron": "30 3 * * *", "timezone": "Europe/Berlin"}, "active": True, "parameters": {},
                  "slug": None, "max_scheduled_runs": None}]
    path = tmp_path / SAVED_SETTINGS
    now = {"d1": {"name": "nightly", "schedules": [], "paused": False, "project_schedules": [],
                  "project_paused": False}}

    def saved_on(database: str, name: str = "nightly"):
        save_settings(path, {"d1": {**now["d1"], "name": name, "schedules": schedules}}, database)
        return read_saved_settings(path)

    assert saved_for_this_start(path, saved_on("db:5432/prefect"), "db:5432/prefect", now) == {
        "d1": {"name": "nightly", "schedules": schedules, "paused": False}}
    assert capsys.readouterr().out.startswith(f"schedules: putting back what users had set, from {path} (saved at ")
    assert path.is_file()  # removed once put back, not before

    for on, name, why in (("other:5432/prefect", "nightly", "it was saved on database other:5432/prefect, not this "
                                                             "one (db:5432/prefect)"),
                          ("db:5432/prefect", "evaluate", "the deployments it names by id are named otherwise now: "
                                                          "evaluate (now nightly)")):
        saved = saved_on(on, name)
        assert saved_for_this_start(path, saved, "db:5432/prefect", now) == {}
        (line,) = capsys.readouterr().out.splitlines()
        assert line == (f"schedules: not putting back what {path} holds (saved at {saved.saved_at}): {why}; renamed "
                        f"{SAVED_SETTINGS}{SET_ASIDE}")
        assert not path.exists() and (tmp_path / f"{SAVED_SETTINGS}{SET_ASIDE}").is_file()


def test_the_saved_database_is_its_host_port_and_name_never_its_user_or_password() -> None:
    from flows.server import database_identity

    assert database_identity("postgresql+asyncpg://lab:secret@db.lab:6543/prefect") == "db.lab:6543/prefect"
    assert database_identity("postgresql+asyncpg://lab@127.0.0.1/prefect") == "127.0.0.1:5432/prefect"
    assert database_identity("postgresql+asyncpg://lab@/prefect?host=/run/postgresql") == "/run/postgresql:5432/prefect"


def test_the_by_hand_deploy_command_is_the_server_s_own_deploy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """The command printed for --no-deploy and in every "by hand:" error runs the server's own deploy
    (`python -m flows.server deploy`: create_deployments), not `prefect deploy`, which put the nightly's schedule and
    pause back to prefect.yaml's: so it keeps what users set in the UI, saving it first in the server's logs folder
    (absolute: the command runs in the project) with the server's database, as a start does; each deployment on the
    server's pool with the served results folder. It runs in a subshell: the reader's shell keeps its folder and
    environment. (tests/integration/test_deployments.py and test_server.py run it against a real server.)"""
    import shlex

    from flows import server

    monkeypatch.chdir(tmp_path)
    for pool in ("flagperf", "lab 2"):
        command = server.deploy_command("http://127.0.0.1:4200/api", Path("/data/re=sults"), pool,
                                        log_dir=Path("logs"), database="db:5432/prefect")
        assert command.startswith(f"(cd {shlex.quote(str(PROJECT_ROOT))} && ") and command.endswith(")"), command
        words = shlex.split(command[1:-1].split(" && ", 1)[1])
        assert words == [sys.executable, "-m", "flows.server", "deploy", "--api-url", "http://127.0.0.1:4200/api",
                         "--pool", pool, "--results", "/data/re=sults", "--log-dir", str(tmp_path / "logs"),
                         "--database", "db:5432/prefect"], words
        assert "prefect deploy" not in command and "--no-prompt" not in command


def test_the_by_hand_deploy_command_signs_in_from_where_the_server_s_sign_in_came(tmp_path: Path) -> None:
    """Against a signed-in server the by-hand command signs in as the server does: from the same file or variable,
    named, never the value (the command is printed, and a command line shows in every process list), its line ends
    taken off as the server takes them off (a variable's were passed on as they were); where that is missing it
    stops with the shell's one line, before any request. Here the stand-in API has the nightly on another server's
    pool: the server's own deploy refuses to take it over, in one line, before it makes anything (`prefect deploy`
    took it over). (test_server.py runs it on a signed-in server.)"""
    import base64
    import shlex

    from flagperf.site.auth import Credentials
    from flows.server import deploy_command

    secret = "lab:not-in-the-command-4242"
    auth_file = tmp_path / "it is auth"
    auth_file.write_text(secret + "\r\n", encoding="utf-8")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    by_file = Credentials(secret, str(auth_file))
    by_variable = Credentials(secret, "PREFECT_SERVER_API_AUTH_STRING")
    for credentials, named, environ in ((by_file, shlex.quote(str(auth_file)), {}),
                                        (by_variable, "${PREFECT_SERVER_API_AUTH_STRING:?", {
                                            "PREFECT_SERVER_API_AUTH_STRING": secret + "\r\n"})):
        signed: list[str | None] = []
        with deployments_api([], {**a_nightly(), "work_pool_name": "flagperf"}, signed=signed) as (api, seen):
            command = deploy_command(api, tmp_path / "results", "lab2", credentials, log_dir=tmp_path / "logs",
                                     database="db:5432/prefect")
            assert "not-in-the-command" not in command and named in command, command
            ran = subprocess.run(["sh", "-c", command], env={**env, **environ}, capture_output=True, text=True,
                                 timeout=300)
            assert ran.returncode == 2, ran.stdout + ran.stderr
            (line,) = ran.stderr.splitlines()
            assert line.startswith("error: --pool lab2: the deployments nightly on this database are on work pool "
                                   "'flagperf', another server's"), line
            assert seen and signed == [f"Basic {base64.b64encode(secret.encode()).decode()}"] * len(seen), signed
            assert not [request for request in seen if not request.startswith(("GET ", "POST /api/deployments/filter"))]
            # the file gone, the variable not set: one line from the shell, and no request
            seen.clear()
            missing = subprocess.run(["sh", "-c", command.replace(str(auth_file), str(tmp_path / "gone"))], env=env,
                                     capture_output=True, text=True, timeout=60)
            assert missing.returncode != 0 and not seen, missing.stderr
            assert len(missing.stderr.strip().splitlines()) == 1, missing.stderr


@contextlib.contextmanager
def deployments_api(filter_answers: list[int], deployment: dict, port: int = 0,
                    signed: list[str | None] | None = None):
    """A stand-in for the Prefect API's deployment reads, on a real local HTTP server (on ``port``, 0: any): CSRF
    off, /deployments/filter answering each status of ``filter_answers`` in turn (then 200) with ``deployment``,
    and any other change refused (422), as Prefect refuses one it cannot take. ``signed``: gets each request's
    Authorization header."""
    import http.server
    import json
    import threading

    answers = list(filter_answers)
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_args: object) -> None:
            pass

        def answer(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            seen.append(f"GET {self.path}")
            if signed is not None:
                signed.append(self.headers.get("Authorization"))
            if self.path.startswith("/api/csrf-token"):
                self.answer(422, {"detail": "CSRF protection is disabled."})
            elif self.path == f"/api/deployments/{deployment['id']}":
                self.answer(200, deployment)
            else:
                self.answer(404, {"detail": "not found"})

        def do_POST(self) -> None:
            seen.append(f"POST {self.path}")
            if signed is not None:
                signed.append(self.headers.get("Authorization"))
            wanted = json.loads(self.rfile.read(int(self.headers["Content-Length"] or 0)) or b"null")
            if self.path != "/api/deployments/filter":
                self.answer(422, {"detail": "not taken"})
                return
            status = answers.pop(0) if answers else 200
            names = wanted["deployments"]["name"]["any_"]
            self.answer(status, [deployment] if status == 200 and deployment["name"] in names else
                        ([] if status == 200 else {"detail": "busy"}))

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


def a_nightly() -> dict:
    from flows.server import deployments_in_project

    (spec,) = [d for d in deployments_in_project()["deployments"] if d["name"] == "nightly"]
    return {"id": "d-nightly", "name": "nightly", "entrypoint": spec["entrypoint"], "paused": True,
            "schedules": [{"id": "s1", "schedule": {"cron": "30 3 * * *", "timezone": "Europe/Berlin"},
                           "active": True, "parameters": {}, "slug": None, "max_scheduled_runs": None}]}


def test_the_first_read_of_what_users_set_is_tried_again_while_the_server_is_busy(tmp_path: Path) -> None:
    """`flagperf server` reads the user-facing deployments' schedules before `prefect deploy`: a 503 (Prefect's
    answer while its database is busy) is tried again, as the put-back after the deploy is (it ended the command
    with a traceback). A signal is noted before the deploy here, so no deploy runs."""
    from flows.server import create_deployments

    with deployments_api([503], a_nightly()) as (api, seen):
        assert create_deployments(api, dict(os.environ), tmp_path / "results", "pool", None, tmp_path,
                                  [signal.SIGINT], database="db:5432/prefect") is None
    filters = [s for s in seen if s.startswith("POST /api/deployments/filter")]
    assert len(filters) >= 3  # evaluate's and nightly's, the first of them twice (503, then 200)
    assert "GET /api/deployments/d-nightly" in seen  # read back as the stopped start puts back what users set


def test_an_api_error_while_the_deployments_are_made_is_one_line_saying_how_by_hand(tmp_path: Path) -> None:
    from flows.server import create_deployments, deploy_command

    with deployments_api([500], a_nightly()) as (api, _seen), pytest.raises(RuntimeError) as info:
        create_deployments(api, dict(os.environ), tmp_path / "results", "pool", None, tmp_path, [signal.SIGINT],
                           database="db:5432/prefect")
    said = str(info.value)
    assert said.startswith("reading the deployments' schedules before making them failed (Server error '500")
    by_hand = deploy_command(api, tmp_path / "results", "pool", log_dir=tmp_path, database="db:5432/prefect")
    assert said.endswith(f"; by hand: {by_hand}") and "\n" not in said


def test_a_put_back_the_server_refuses_names_the_saved_file_to_remove(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """What a cut start saved is put back by every start from its file: where the server refuses it (a 4xx), each
    start would fail alike; the line names the file and says to remove it (it said the next start puts it back).
    Here the nightly has prefect.yaml's schedule, the file a user's, and the stand-in refuses every change."""
    from flows.server import SAVED_SETTINGS, create_deployments, save_settings

    nightly = {**a_nightly(), "paused": False, "schedules": [{
        "id": "s1", "schedule": {"cron": "0 2 * * *", "timezone": "UTC"}, "active": True, "parameters": {},
        "slug": None, "max_scheduled_runs": None}]}
    users = [{"schedule": {"cron": "30 3 * * *", "timezone": "Europe/Berlin"}, "active": True, "parameters": {},
              "slug": None, "max_scheduled_runs": None}]
    save_settings(tmp_path / SAVED_SETTINGS, {"d-nightly": {"name": "nightly", "schedules": users, "paused": False}},
                  "db:5432/prefect")
    with deployments_api([], nightly) as (api, seen):
        assert create_deployments(api, dict(os.environ), tmp_path / "results", "pool", None, tmp_path,
                                  [signal.SIGINT], database="db:5432/prefect") is None
    assert "POST /api/deployments/d-nightly/schedules" in seen  # the put-back, refused
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("schedules: what users set on nightly (schedules, pause) is not back: the server refused "
                           "it (Client error '422")
    assert line.endswith(f"which puts it back from {tmp_path / SAVED_SETTINGS}: remove that file to start (what it "
                         "holds is then not put back; check the schedules in the UI)")
    assert (tmp_path / SAVED_SETTINGS).is_file()


def test_a_no_deploy_server_on_another_pool_is_refused_before_it_makes_its_pool(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`flagperf server --no-deploy` on a database whose deployments are on another pool: refused as a server that
    makes them is (the docs said so; it started, its worker polling a pool the deployments are not on, and the
    deploy it printed took them over), before it makes its pool. The stand-in API answers where serve's clients
    reach its server (the server it starts, on a port the OS chooses, is stopped unasked)."""
    from flagperf.errors import ConfigError
    from flows import server

    monkeypatch.setattr(server, "wait_healthy", lambda *args, **kwargs: None)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with deployments_api([], {**a_nightly(), "work_pool_name": "flagperf"}) as (api, seen):
        monkeypatch.setattr(server, "local_api_url", lambda host, port: api)
        try:
            with pytest.raises(ConfigError) as info:
                server.serve("postgresql+asyncpg://lab@127.0.0.1:5432/none", "127.0.0.1", 0, "lab2", False,
                             tmp_path / "logs", results_dir=tmp_path / "results", results_port=0, deploy=False)
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    assert str(info.value).startswith("--pool lab2: the deployments nightly on this database are on work pool "
                                      "'flagperf', another server's"), str(info.value)
    assert not [request for request in seen if "work_pools" in request]


def test_schedules_are_prefect_yamls_where_every_field_it_states_matches() -> None:
    """Only a deployment whose schedules are prefect.yaml's (the deploy rewrote them) gets what users set put
    back: one a user changed while the deploy ran keeps that. A time zone filled in by a build step matches any."""
    from flows.server import as_in_project

    project = [{"cron": "0 2 * * *", "timezone": "{{ server-timezone.stdout }}", "active": True}]
    made = {"schedule": {"cron": "0 2 * * *", "timezone": "Asia/Shanghai", "day_or": True}, "active": True,
            "parameters": {}, "slug": None, "max_scheduled_runs": None}
    assert as_in_project([made], project)
    assert not as_in_project([{**made, "schedule": {**made["schedule"], "cron": "30 3 * * *"}}], project)
    assert not as_in_project([{**made, "active": False}], project)
    assert not as_in_project([made, made], project) and not as_in_project([], project)
    assert as_in_project([], []) and not as_in_project([made], [])
    assert as_in_project([{**made, "schedule": {"interval": 3600.0, "timezone": "UTC"}}], [{"interval": 3600}])


def test_a_third_signal_while_the_server_stops_ends_it_at_once(tmp_path: Path) -> None:
    """`flagperf server` stopping (30 s per process at most, then SIGKILL): a second signal is ignored, a third
    ends it at once with one line, as every command (it ignored them all). Here its Prefect server ignores
    SIGTERM, so the clean-up waits on it; the test signals once it has been asked to stop."""
    asked, ready = tmp_path / "asked-to-stop", tmp_path / "ignores-sigterm"
    stubborn = ("import os, signal, sys, time\n"
                f"signal.signal(signal.SIGTERM, lambda *a: open({str(asked)!r}, 'w').write(str(os.getpid())))\n"
                f"open({str(ready)!r}, 'w').close()\n"
                "time.sleep(600)\n")
    code = ("import signal, sys, threading, time\n"
            "from pathlib import Path\n"
            "from flows import server\n"
            f"server.watched = lambda argv, pass_fds=(): [sys.executable, '-c', {stubborn!r}]\n"
            "def up_then_ctrl_c(*args, **kwargs):\n"
            f"    while not Path({str(ready)!r}).exists():\n"
            "        time.sleep(0.1)\n"
            "    signal.pthread_kill(threading.get_ident(), signal.SIGINT)\n"
            "server.wait_healthy = up_then_ctrl_c\n"
            f"tmp = Path({str(tmp_path)!r})\n"
            "sys.exit(server.serve('postgresql+asyncpg://lab@127.0.0.1:5432/none', '127.0.0.1', 4200, 'pool', True,"
            " tmp / 'logs', results_dir=tmp / 'results', results_port=0))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=PROJECT_ROOT, stderr=subprocess.PIPE, text=True)
    errors = Lines(proc.stderr)
    try:
        wait_for(lambda: asked.is_file() and asked.read_text(), "the clean-up to ask the server to stop", 120)
        proc.send_signal(signal.SIGINT)  # the second: noted, and said, not acted on
        while not (line := errors.next()).startswith("still stopping the worker and the server"):
            assert line, f"it ended without taking the second signal: {errors.text()}"  # a line within 120 s each
        proc.send_signal(signal.SIGINT)  # the third: at once (not after the server's 30 s grace)
        assert proc.wait(timeout=120) == -signal.SIGINT
        assert errors.rest().splitlines()[-1].startswith(
            "stopping now: the worker and the Prefect server are stopped by their watchers")
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=60)
        if asked.is_file() and asked.read_text():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(asked.read_text()), signal.SIGKILL)


def test_the_session_s_pool_is_cleared_after_its_servers_are_stopped_also_on_ctrl_c(tmp_path: Path) -> None:
    """The integration tests' session end clears the session's work pool (tests/integration/conftest.py): only once
    the fixtures are torn down, the servers they started stopped. On Ctrl-C pytest tears them down in its own
    pytest_sessionfinish, which ran after the clearing: a live server's pool was deleted under it."""
    (tmp_path / "conftest.py").write_text(
        "import pytest\n"
        "import server_ports\n"
        "from tests.integration.conftest import pytest_sessionfinish  # noqa: F401 (the hook, as it is)\n"
        f"SAID = {str(tmp_path / 'said')!r}\n"
        "def note(what):\n"
        "    with open(SAID, 'a') as said:\n"
        "        said.write(what + '\\n')\n"
        "server_ports.clear_what_ended_servers_left = lambda pool: note('cleared')\n"
        "@pytest.fixture(scope='module')\n"
        "def live_server():\n"
        "    server_ports.SESSION_USED.append('flagperf-test-1')\n"
        "    yield\n"
        "    note('stopped')\n", encoding="utf-8")
    (tmp_path / "test_interrupted.py").write_text(
        "def test_interrupted(live_server):\n    raise KeyboardInterrupt\n", encoding="utf-8")
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300, env={
                             **os.environ, "PYTHONPATH": os.pathsep.join(
                                 [str(PROJECT_ROOT / "tests" / "integration"), str(PROJECT_ROOT)])})
    assert ran.returncode == 2, ran.stdout + ran.stderr  # interrupted
    assert (tmp_path / "said").read_text().splitlines() == ["stopped", "cleared"], ran.stdout


@contextlib.contextmanager
def stub_api(status: int, held: threading.Event | None = None) -> Iterator[tuple[str, threading.Event]]:
    """An HTTP server on loopback answering every request with ``status`` (after ``held`` is set, where given);
    yields its API URL and an event set once a request came."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    asked = threading.Event()

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.set()
            if held is not None:
                held.wait(LINE_DEADLINE_S)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api", asked
    finally:
        if held is not None:
            held.set()
        server.shutdown()
        server.server_close()


def deploy_by_hand_command(api_url: str, tmp_path: Path) -> list[str]:
    return [sys.executable, "-m", "flows.server", "deploy", "--api-url", api_url, "--pool", "flagperf", "--results",
            str(tmp_path / "results"), "--log-dir", str(tmp_path / "logs"), "--database", "127.0.0.1:5432/prefect"]


@pytest.mark.parametrize("status", [401, 403])
def test_the_by_hand_deploy_refused_its_sign_in_exits_2_in_one_line(tmp_path: Path, status: int) -> None:
    """A wrong sign-in is a setting to change (exit 2, as documented), not a failure to try again (exit 1)."""
    with stub_api(status) as (api_url, _asked):
        done = subprocess.run(deploy_by_hand_command(api_url, tmp_path), capture_output=True, text=True,
                              env={**os.environ, "PREFECT_API_AUTH_STRING": "perf:wrong-password-0123"},
                              timeout=LINE_DEADLINE_S)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"error: PREFECT_API_AUTH_STRING: the server at {api_url} refused the sign-in ({status}); "
                           "use the server's (its banner names where it comes from)\n")


@pytest.mark.parametrize("credentials", [None, "lab:wrong-password-0123"])
def test_a_server_on_a_port_another_server_holds_names_the_port_in_one_line(
        tmp_path: Path, credentials: str | None) -> None:
    """Another server answers on serve's port: its launcher failed to bind, but the other's /health passed for its
    own, and the other's 401 was blamed on the sign-in (serve signs in with the server's own). Now serve binds the
    port before it starts anything (as `prefect server start` checks it): one line naming --port (ConfigError:
    `flagperf server` exits 2), nothing asked of the other server."""
    from flagperf.errors import ConfigError
    from flagperf.site.auth import Credentials
    from flows import server

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with stub_api(401) as (api_url, asked):
        port = int(api_url.rsplit(":", 1)[1].split("/")[0])  # the Prefect server started there finds it taken
        try:
            with pytest.raises(ConfigError) as info:
                server.serve("postgresql+asyncpg://lab@127.0.0.1:5432/none", "127.0.0.1", port, "pool", False,
                             tmp_path / "logs", results_dir=tmp_path / "results", results_port=0,
                             credentials=Credentials(credentials, "/etc/lab-auth") if credentials else None)
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    assert not asked.is_set()
    assert str(info.value) == (f"--port {port}: cannot listen on 127.0.0.1:{port}: Address already in use; choose "
                               "another --port")


def test_the_by_hand_deploy_says_a_third_signal_stops_it_and_what_puts_back_what_users_set(tmp_path: Path) -> None:
    """As the server: a second signal says one more stops at once; the third stops it, naming this command's next
    run as what puts back what users set (a server with --no-deploy never does)."""
    held = threading.Event()
    with stub_api(500, held) as (api_url, asked):
        child = subprocess.Popen(deploy_by_hand_command(api_url, tmp_path), stderr=subprocess.PIPE, text=True,
                                 env={k: v for k, v in os.environ.items() if k != "PREFECT_API_AUTH_STRING"})
        try:
            said = Lines(child.stderr)
            assert asked.wait(LINE_DEADLINE_S), "the deploy never asked the API"  # its handlers are installed
            child.send_signal(signal.SIGTERM)
            child.send_signal(signal.SIGINT)  # another signal: not merged with the pending first
            assert said.next() == "still putting back what users set on the deployments; one more signal stops " \
                                  "at once\n"
            child.send_signal(signal.SIGHUP)
            rest = said.rest()
            assert child.wait(LINE_DEADLINE_S) == -signal.SIGHUP
        finally:
            child.kill()
            child.wait()
    assert "the next run of this command puts it back from " in rest, rest


def test_origins_are_as_browsers_send_them_and_the_operator_s_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A browser's Origin has the host in lower case and no default port or userinfo: a --public-url written
    otherwise allowed none of its pages. --server-name adds a name (and its origin); origins an operator set in
    PREFECT_SERVER_CORS_ALLOWED_ORIGINS are kept (they were overwritten without a word), "*" refused in one line."""
    from flagperf.errors import ConfigError
    from flows.server import allowed_origins, own_origins, server_names

    assert own_origins(["perf-lab"], 80, ["HTTPS://Admin:pw@Perf-Lab.Example.org:443/"]) == [
        "http://perf-lab", "https://perf-lab.example.org"]
    names = server_names("127.0.0.1", [None], ["Perf-Lab", "perf-lab.example.org"])
    assert {"perf-lab", "perf-lab.example.org"} <= set(names)
    monkeypatch.setenv("PREFECT_SERVER_CORS_ALLOWED_ORIGINS", "https://Dashboards.lab:443, http://tools.lab:8080")
    merged = allowed_origins(names, 4200, [None])
    assert {"https://dashboards.lab", "http://tools.lab:8080", "http://perf-lab:4200"} <= set(merged)
    monkeypatch.setenv("PREFECT_SERVER_CORS_ALLOWED_ORIGINS", "http://tools.lab,*")
    with pytest.raises(ConfigError, match=r"^PREFECT_SERVER_CORS_ALLOWED_ORIGINS: '\*' lets a page of any site"):
        allowed_origins(names, 4200, [None])


def test_the_front_refuses_a_sign_in_given_twice_and_changes_from_other_origins() -> None:
    """Starlette (Prefect's check) reads the first Authorization header; the front read the last, so a malformed
    first one behind a good last one reached Prefect (a 500 with a traceback). A change from a page of another
    origin is refused (403, one line); reading, a preflight, and a request without an Origin pass."""
    import base64

    from flagperf.site.front import Front

    reached: list[str] = []

    async def app(scope: dict, receive: object, send: object) -> None:
        reached.append(scope["method"])
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b""})  # type: ignore[operator]

    front = Front(app, ["127.0.0.1"], signed_in=True, origins=["http://127.0.0.1:4200"])

    def status(method: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
        said = drive(front, {"type": "http", "method": method, "path": "/api/flows/filter", "headers": [
            (b"host", b"127.0.0.1:4200"), *headers]})
        return said[0]["status"], said[1]["body"]

    good = (b"authorization", b"Basic " + base64.b64encode(b"lab:pw-long-enough"))
    bad = (b"authorization", b"Basic " + base64.b64encode("lab:pässwort".encode()))
    assert status("GET", [bad, good])[0] == 401 and status("GET", [good, good])[0] == 401
    assert status("GET", [good])[0] == 200
    refused, said = status("POST", [good, (b"origin", b"http://evil.example")])
    assert refused == 403 and said.count(b"\n") == 1 and b"another site" in said
    assert status("POST", [good, (b"origin", b"null")])[0] == 403
    assert status("POST", [good, (b"Origin", b"HTTP://127.0.0.1:4200")])[0] == 200
    assert status("POST", [good])[0] == 200  # Prefect's clients send no Origin
    for method in ("GET", "HEAD", "OPTIONS"):
        assert status(method, [good, (b"origin", b"http://evil.example")])[0] == 200, method
    assert reached == ["GET", "POST", "POST", "GET", "HEAD", "OPTIONS"]


def test_a_page_of_an_address_the_server_got_since_it_started_may_change_things() -> None:
    """On every interface, a page the server served under an address it got since it started (read again on a
    Host that missed) names that address in its Origin, which is in no list made at start: its changes were
    refused as another site's. A page's own origin (its scheme and the Host accepted) is the server's; another
    site's still is not, with that Host too."""

    from flagperf.site.front import Front, interface_addresses
    from flows import team_app
    from flows.server import rereads_names

    assert rereads_names("127.0.0.1") is None and rereads_names("10.1.2.3") is None
    assert rereads_names("0.0.0.0") is interface_addresses and rereads_names("::") is interface_addresses
    # serve passes --reread-names to the Prefect server's launcher on a wildcard --host
    assert team_app.create_app(["lab"], [], reread_names=True).hosts.reread is interface_addresses  # type: ignore[attr-defined]

    app = accepting_app

    front = Front(app, ["127.0.0.1"], signed_in=False, origins=["http://127.0.0.1:4200"],
                  reread=lambda: ["10.9.8.7"])

    def status(host: bytes, origin: bytes, kind: str = "http", to: Front = front, scheme: str = "http") -> object:
        return answered(drive(to, {"type": kind, "method": "POST", "scheme": {"http": "ws", "https": "wss"}[scheme]
                                   if kind == "websocket" else scheme, "server": ("10.9.8.7", 4200),
                                   "path": "/api/flows/filter", "headers": [(b"host", host), (b"origin", origin)]}))

    assert status(b"10.9.8.7:4200", b"http://10.9.8.7:4200") == 200
    assert status(b"10.9.8.7:4200", b"http://10.9.8.7:4200", "websocket") == "websocket.accept"
    assert status(b"10.9.8.7:4200", b"http://evil.example") == 403
    assert status(b"10.9.8.7:4200", b"http://10.9.8.7:4300") == 403  # another port: another origin
    assert status(b"10.9.8.7:4200", b"http://evil.example", "websocket") == 1008
    # the re-read address, but not on the port the server listens on (a proxy there: its page is no page of ours)
    assert status(b"10.9.8.7:8080", b"http://10.9.8.7:8080") == 403
    assert status(b"10.9.8.7", b"http://10.9.8.7", "websocket") == 1008


def test_the_front_adds_only_the_frame_headers_an_answer_lacks() -> None:
    """The front appended its frame headers to every answer: one of the app's that set X-Frame-Options already
    went out with two (browsers may then ignore both). Now only those the answer does not name are added, as
    served.py does for uvicorn's own answers."""

    from flagperf.site.front import FRAME_HEADERS, Front

    async def app(scope: dict, receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 200,  # type: ignore[operator]
                    "headers": [(b"X-Frame-Options", b"SAMEORIGIN"), (b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b""})  # type: ignore[operator]

    said = drive(Front(app, ["lab"], signed_in=False), {"type": "http", "method": "GET", "path": "/",
                                                          "headers": [(b"host", b"lab:4200")]})
    names = [name.lower() for name, _ in said[0]["headers"]]
    assert names.count(b"x-frame-options") == 1 and (b"X-Frame-Options", b"SAMEORIGIN") in said[0]["headers"]
    assert all(names.count(name) == 1 for name, _ in FRAME_HEADERS)


def test_a_page_at_http_alias_is_not_the_server_s_where_its_public_url_is_https() -> None:
    """The request's own origin (the scheme uvicorn saw and its Host) counted as the server's for any Host: behind
    a TLS proxy that uvicorn does not trust for X-Forwarded-Proto, uvicorn sees http, so a page at http://alias (or
    http://alias:8080) could change things and open websockets where only https://alias, the configured public
    URL, may. Now the own origin holds only for an address read again since the start, on the server's port."""

    from flagperf.site.front import Front

    app = accepting_app

    from flows.server import allowed_origins, server_names

    # The names and origins serve builds for a loopback bind behind a TLS proxy at https://alias (not made by hand:
    # the test is of what production allows).
    names = server_names("127.0.0.1", ["https://alias"])
    assert "alias" in names
    front = Front(app, names, signed_in=False, origins=allowed_origins(names, 4200, ["https://alias"]))

    def said(kind: str, host: bytes, origin: bytes) -> object:
        return answered(drive(front, {"type": kind, "method": "POST", "scheme": "ws" if kind == "websocket" else "http",
                                      "server": ("127.0.0.1", 4200), "path": "/api/flows/filter",
                                      "headers": [(b"host", host), (b"origin", origin)]}))

    for host, origin in ((b"alias", b"http://alias"), (b"alias:8080", b"http://alias:8080")):
        assert said("websocket", host, origin) == 1008, origin
        assert said("http", host, origin) == 403, origin
    # The server's own plain address (a name it answers to, on its port) stays its own page, as every name's is.
    assert said("http", b"alias:4200", b"http://alias:4200") == 200
    assert said("websocket", b"alias", b"https://alias") == "websocket.accept"
    assert said("http", b"alias", b"https://alias") == 200


def test_a_host_that_misses_has_addresses_read_again_without_any_dns_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Host that is none of the names had machine_names read again, socket.getfqdn included: a DNS lookup inside
    the server's event loop, at any stranger's request (once per 10 s), stalling every client on a slow resolver,
    and whatever reverse DNS said then added to the names. Now a miss reads the interfaces' addresses only (names
    from DNS are read at start), for the Prefect server's front and the results site alike."""
    import asyncio
    import socket

    from flagperf.site.front import HostCheck
    from flows.server import rereads_names

    looked_up: list[str] = []

    def lookup(name: str) -> object:
        def refused(*args: object, **kwargs: object) -> None:
            looked_up.append(name)
            raise OSError(f"{name}: no DNS on a request")
        return refused

    for name in ("getfqdn", "gethostbyaddr", "gethostbyname", "gethostbyname_ex", "getaddrinfo", "getnameinfo"):
        monkeypatch.setattr(socket, name, lookup(name))
    reread = rereads_names("0.0.0.0")
    assert reread is not None and "127.0.0.1" in reread()
    hosts = HostCheck(["lab"], reread)
    scope = {"type": "http", "headers": [(b"host", b"127.0.0.1:4200")]}
    assert asyncio.run(hosts.refused(scope)) is None  # loopback's address, read again on the miss
    assert looked_up == []


def test_an_address_a_new_read_of_the_interfaces_lacks_is_dropped_and_the_given_names_kept() -> None:
    """On every interface, each address a read of the interfaces gave stayed a name of the server for good: one
    DHCP gave to another machine since kept being answered (a page there could name it). Now each read replaces the
    one before; the names given at start (the configured, the public ones) are always kept."""
    import asyncio

    from flagperf.site.front import HostCheck

    now = [0.0]
    interfaces = [["10.0.0.1"]]
    hosts = HostCheck(["lab", "10.9.9.9"], lambda: interfaces[0], clock=lambda: now[0], every_s=10.0)

    def refused(host: bytes) -> bool:
        return asyncio.run(hosts.refused({"type": "http", "headers": [(b"host", host)]})) is not None

    assert not refused(b"10.0.0.1:4200") and hosts.added == {"10.0.0.1"}  # read on the miss, added
    now[0], interfaces[0] = 20.0, ["10.0.0.2"]
    assert not refused(b"10.0.0.2:4200") and hosts.added == {"10.0.0.2"}  # the next read lacks 10.0.0.1: dropped
    now[0] = 21.0  # within every_s of that read: no read again, the miss is refused
    assert refused(b"10.0.0.1:4200")
    assert not refused(b"lab:4200") and not refused(b"10.9.9.9:4200")


def test_a_host_refused_for_its_port_is_told_what_port_it_names() -> None:
    """The temporary server's refusal of a Host on another port said "names another port than this server's (4200)"
    of a Host that names none, and "(None)" where the server did not say its port. A Host without a port is said
    to name none; a server without a port has none named."""
    import asyncio

    from flagperf.site.front import REBINDING, HostCheck

    hosts = HostCheck(["127.0.0.1"], own_port=True)

    def refusal(host: bytes, server: tuple[str, int] | None) -> str | None:
        scope = {"type": "http", "scheme": "http", "headers": [(b"host", host)], "server": server}
        return asyncio.run(hosts.refused(scope))

    tail = "; open it by the address its banner shows\n"
    assert refusal(b"127.0.0.1", ("127.0.0.1", 4200)) == \
        f"{REBINDING}: Host '127.0.0.1' names no port (this server listens on 4200){tail}"
    assert refusal(b"127.0.0.1:4201", ("127.0.0.1", 4200)) == \
        f"{REBINDING}: Host '127.0.0.1:4201' names another port than this server's (4200){tail}"
    assert refusal(b"127.0.0.1:4200", None) == \
        f"{REBINDING}: Host '127.0.0.1:4200' names another port than this server's{tail}"
    assert refusal(b"127.0.0.1", None) == f"{REBINDING}: Host '127.0.0.1' names no port{tail}"


def test_the_temporary_servers_host_check_takes_its_names_on_its_own_port_only() -> None:
    """own_port (the temporary server of `flagperf run`, flows/team_app.py): a Host that is one of its names passes
    only on the port the request came in on, the scheme's default where the Host names none; a websocket's
    handshake is checked as a request."""
    import asyncio

    from flagperf.site.front import HostCheck
    from flows.server import server_names

    hosts = HostCheck(server_names("127.0.0.1", []), own_port=True)

    def refused(host: bytes, port: int = 4200, kind: str = "http") -> bool:
        scope = {"type": kind, "scheme": {"http": "http", "websocket": "ws"}[kind], "headers": [(b"host", host)],
                 "server": ("127.0.0.1", port)}
        return asyncio.run(hosts.refused(scope)) is not None

    for host in (b"127.0.0.1:4200", b"[::1]:4200", b"localhost:4200"):
        assert not refused(host) and not refused(host, kind="websocket"), host
    for host in (b"127.0.0.1:4201", b"127.0.0.1:99999", b"127.0.0.1", b"[::1]", b"localhost:80"):
        assert refused(host) and refused(host, kind="websocket"), host
    # a server on the scheme's default port: a Host that names none names it
    assert not refused(b"127.0.0.1", port=80) and not refused(b"localhost", port=80, kind="websocket")
    assert refused(b"127.0.0.1:4200", port=80)


def test_the_temporary_server_of_a_run_listens_on_loopback_only() -> None:
    """`flagperf run`'s temporary server has no sign-in (docs/team.md): that holds only while nothing beyond this
    machine reaches it, so it listens on 127.0.0.1 and its API address says so."""
    import shutil

    from flows.server import TemporaryServer

    server = TemporaryServer()
    try:
        assert server.socket.getsockname()[0] == "127.0.0.1"
        assert server.api_url == f"http://127.0.0.1:{server.port}/api"
    finally:
        server.socket.close()
        shutil.rmtree(server.folder, ignore_errors=True)


TEMPORARY_SERVER_HOSTS = """
import http.client, json, sys
from flows.server import TemporaryServer

server = TemporaryServer()
try:
    server.start([])
    said = {}
    other = server.port + 1 if server.port < 65535 else server.port - 1
    for host, port in (("127.0.0.1", server.port), ("localhost", server.port), ("evil.example", server.port),
                       ("127.0.0.1", other), ("localhost", None)):
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        connection.request("GET", "/api/health", headers={"Host": host if port is None else f"{host}:{port}"})
        said[host if port == server.port else f"{host} on {'another port' if port else 'no port'}"] = \
            connection.getresponse().status
        connection.close()
    print(json.dumps(said))
finally:
    server.stop()
"""


def test_the_temporary_server_of_a_run_answers_only_to_loopback_names() -> None:
    """`flagperf run`'s temporary server (no sign-in, on 127.0.0.1) answered any Host: a page of another site whose
    DNS name was pointed at 127.0.0.1 (DNS rebinding) could use its API during a run. Now it is behind the team
    server's front: only loopback's names are answered, and only on its own port (a Host naming another port, or
    none, is refused: its clients name its port). (A process of its own: prefect must not be imported.)"""
    import json

    ROOT = Path(__file__).resolve().parents[2]  # this checkout's flows, whatever FLAGPERF_HOME says
    done = subprocess.run([sys.executable, "-c", TEMPORARY_SERVER_HOSTS], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"127.0.0.1": 200, "localhost": 200, "evil.example": 400,
                                                        "127.0.0.1 on another port": 400,
                                                        "localhost on no port": 400}


def test_every_name_of_a_setting_serve_sets_is_the_operator_s_only_through_serve(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefect reads PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS before PREFECT_SERVER_CORS_ALLOWED_ORIGINS (and alike
    for CSRF protection and the database URL); serve refused '*' and set only the second name, copying the rest of
    the environment: an operator's '*' under the first turned off every Origin check. Now '*' under either is
    refused, naming it; every alias of what serve sets is removed and the one it means set; the database URL under
    any name never reaches a client."""
    from flagperf.errors import ConfigError
    from flows import server

    assert server.prefect_env_names(server.CORS_ENV) == ["PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS",
                                                         "PREFECT_SERVER_CORS_ALLOWED_ORIGINS"]
    monkeypatch.setenv("PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS", "http://tools.lab, *")
    with pytest.raises(ConfigError, match=r"^PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS: '\*' lets a page of any site"):
        server.allowed_origins(["lab"], 4200, [None])
    monkeypatch.setenv("PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS", "http://tools.lab:8080")
    assert "http://tools.lab:8080" in server.allowed_origins(["lab"], 4200, [None])
    given = {"PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS": "*", "PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED": "false",
             "PREFECT_SERVER_DATABASE_CONNECTION_URL": "sqlite+aiosqlite:///elsewhere.db", "HOME": "/home/lab"}
    made = server.with_prefect_settings(given, {server.CORS_ENV: "http://lab:4200", server.CSRF_ENV: "true",
                                                server.DATABASE_URL_ENV: "postgresql+asyncpg://db/prefect"})
    assert made == {"PREFECT_SERVER_CORS_ALLOWED_ORIGINS": "http://lab:4200", "HOME": "/home/lab",
                    "PREFECT_SERVER_CSRF_PROTECTION_ENABLED": "true",
                    "PREFECT_API_DATABASE_CONNECTION_URL": "postgresql+asyncpg://db/prefect"}
    secrets = {*server.prefect_env_names(server.DATABASE_URL_ENV),
               *server.prefect_env_names("PREFECT_API_DATABASE_PASSWORD")}
    assert secrets <= set(server.DATABASE_SECRETS)
    for name in secrets:
        monkeypatch.setenv(name, "postgresql+asyncpg://lab@db/prefect")
    assert not secrets & set(server.client_environment("http://127.0.0.1:4200/api", Path("/r"), None))


def test_the_front_allows_no_origin_of_every_site_and_no_origin_with_a_port_that_does_not_parse() -> None:
    """'*' in the front's origins turned off every Origin check; now the front refuses it (and so does its
    launcher, given the origins by serve). An origin whose port does not parse matched one allowed alike."""

    from flagperf.site.front import Front, origin_of
    from flows import team_app

    async def app(scope: dict, receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b""})  # type: ignore[operator]

    with pytest.raises(ValueError, match="any site"):
        Front(app, ["lab"], signed_in=False, origins=["http://lab:4200", " * "])
    with pytest.raises(SystemExit) as refused:
        team_app.main(["--host", "lab", "--port", "4200", "--origin", "http://lab:4200", "--origin", "*"])
    assert refused.value.code == 2
    assert origin_of("http://lab:99999") == "" and origin_of("http://lab:4200") == "http://lab:4200"
    front = Front(app, ["lab"], signed_in=False, origins=["http://lab:99999", "http://lab:4200"])
    for origin, status in ((b"http://lab:99999", 403), (b"http://lab:4200", 200)):
        said = drive(front, {"type": "http", "method": "POST", "path": "/api/x",
                             "headers": [(b"host", b"lab:4200"), (b"origin", origin)]})
        assert said[0]["status"] == status, origin


@pytest.mark.parametrize("signed_in", [True, False])
def test_a_websocket_s_first_message_reaches_prefect_only_as_one_it_reads(signed_in: bool) -> None:
    """A binary frame, a JSON list or string, non-JSON text, a token that is not ASCII text, as a websocket's first
    message, each put a traceback in server.log (the front rewrote only a non-ASCII token, and only with a
    sign-in). Now any first message but a text frame holding a JSON object whose token is missing, null or ASCII
    text reaches Prefect as an invalid one (which it refuses, 1008); later messages pass as they are."""
    import json

    from flagperf.site.front import Front

    reached: list[dict] = []

    async def app(scope: dict, receive: object, send: object) -> None:
        reached.append(await receive())  # type: ignore[operator]
        reached.append(await receive())  # type: ignore[operator]

    front = Front(app, ["lab"], signed_in=signed_in, origins=["http://lab:4200"])
    invalid = {"type": "websocket.receive", "text": json.dumps({"type": "invalid"}), "bytes": None}
    later = {"type": "websocket.receive", "bytes": b"\xff"}
    cases = [
        ({"type": "websocket.receive", "bytes": json.dumps({"type": "auth", "token": "t"}).encode()}, False),
        ({"type": "websocket.receive", "text": "[1, 2]"}, False),
        ({"type": "websocket.receive", "text": '"auth"'}, False),
        ({"type": "websocket.receive", "text": "not json"}, False),
        ({"type": "websocket.receive", "text": json.dumps({"type": "auth", "token": "pässwort"})}, False),
        ({"type": "websocket.receive", "text": json.dumps({"type": "auth", "token": 12})}, False),
        ({"type": "websocket.receive", "text": json.dumps({"type": "auth", "token": "lab:pw"})}, True),
        ({"type": "websocket.receive", "text": json.dumps({"type": "auth", "token": None})}, True),
        ({"type": "websocket.receive", "text": json.dumps({"type": "filter"})}, True),
    ]
    for first, passes in cases:
        reached.clear()
        said = drive(front, {"type": "websocket", "path": "/api/events/out", "headers": [(b"host", b"lab:4200")]},
                     [first, later])
        assert said == [], f"the front answered itself: {said}"
        assert reached == [first if passes else invalid, later], first


def test_listening_names_the_option_at_fault_and_takes_the_port_the_os_chose() -> None:
    """serve's bind said 'choose another --port' for any error, a name that does not resolve included (as
    strerror None), and --host :: took IPv6 only (127.0.0.1, where serve's clients go, refused). Now the error
    names --host, its resolver's words, or --port where the port is taken; '::' takes IPv4 too; port 0 is
    the one the OS chose."""
    import socket

    from flagperf.errors import ConfigError
    from flows.server import listen

    with pytest.raises(ConfigError, match=r"^--host no-such-host\.invalid: cannot listen on 'no-such-host\.invalid': "
                                          r"[A-Z]\w.*[^)]$"):
        listen("no-such-host.invalid", 0)
    with pytest.raises(ConfigError) as not_here:
        listen("192.0.2.1", 0)  # TEST-NET-1: an address of no interface here
    assert str(not_here.value) == "--host 192.0.2.1: cannot listen on 192.0.2.1:0: Cannot assign requested address"
    with listen("127.0.0.1", 0) as taken:
        port = taken.getsockname()[1]
        assert port != 0
        with pytest.raises(ConfigError, match=rf"^--port {port}: .*Address already in use; choose another --port$"):
            listen("127.0.0.1", port)
    if socket.has_dualstack_ipv6():
        with listen("::", 0) as every, socket.create_connection(("127.0.0.1", every.getsockname()[1]), timeout=30):
            pass


def test_the_watcher_keeps_no_copy_of_the_listening_socket_it_hands_on(tmp_path: Path) -> None:
    """The watcher kept the listening socket it handed to the server: once the server closed its own (a graceful
    stop), the port still accepted connections that nobody answered. Now the watcher closes its copy once the
    command has it: the command's closing it is the port's."""
    import socket

    from flows.server import watched

    listening = socket.create_server(("127.0.0.1", 0))
    port, fd = listening.getsockname()[1], listening.fileno()
    code = f"import os, sys, time; os.close({fd}); print('closed', flush=True); time.sleep(600)"
    child = subprocess.Popen(watched([sys.executable, "-c", code], pass_fds=(fd,)), cwd=PROJECT_ROOT,
                             stdout=subprocess.PIPE, text=True, pass_fds=(fd,), start_new_session=True)
    listening.close()
    try:
        assert Lines(child.stdout).next() == "closed\n"
        deadline = time.monotonic() + LINE_DEADLINE_S
        while True:  # the watcher closes its copy just after it started the command
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
            except ConnectionRefusedError:
                break
            assert time.monotonic() < deadline, "the port still accepts: the watcher holds the socket"
            time.sleep(0.1)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def test_wrong_sign_ins_to_prefects_api_are_throttled_per_client_as_the_sites() -> None:
    """Prefect's API takes the same password as the results site but counted no wrong one: a guesser left the
    site's throttle for the API's port. Through the front, a client of the network that sent too many wrong
    sign-ins (in an Authorization header, or a websocket's sign-in message) gets 429 and Retry-After, its
    websocket closed at the handshake, until its lockout ends; a request without a sign-in (the UI's files,
    /api/health) is no guess and passes. A client on this machine is never locked out: the server's worker and
    flow runs speak from there (a proxy that names no X-Forwarded-For would make every browser one of them)."""
    import base64
    import json

    from flagperf.site.auth import Credentials, SignInThrottle
    from flagperf.site.front import Front

    class Clock:
        now = 100.0

        def __call__(self) -> float:
            return self.now

    async def prefect(scope: dict, receive: object, send: object) -> None:  # reads a websocket's sign-in message
        if scope["type"] == "websocket":
            await send({"type": "websocket.accept"})  # type: ignore[operator]
            await receive()  # type: ignore[operator]
            return
        await accepting_app(scope, receive, send)

    clock = Clock()
    right = "lab:a-long-enough-password-42"
    front = Front(prefect, ["lab"], signed_in=True, credentials=Credentials(right, "test"),
                  throttle=SignInThrottle(free=2, first_delay_s=30.0, clock=clock))

    def status(client: str, sign_in: str | None, path: str = "/api/flows/filter") -> tuple[int, dict]:
        headers = [(b"host", b"lab:4200")]
        if sign_in is not None:
            headers.append((b"authorization", b"Basic " + base64.b64encode(sign_in.encode())))
        said = drive(front, {"type": "http", "method": "GET", "path": path, "headers": headers,
                             "client": (client, 5000)})
        return said[0]["status"], dict(said[0]["headers"])

    def websocket(client: str, token: str) -> object:
        first = {"type": "websocket.receive", "text": json.dumps({"type": "auth", "token": token})}
        return answered(drive(front, {"type": "websocket", "path": "/api/events/out", "headers": [
            (b"host", b"lab:4200")], "client": (client, 5000)}, [first]))

    guesser = "10.0.0.66"
    assert [status(guesser, f"lab:guess-{n}")[0] for n in range(2)] == [200, 200]  # Prefect answers them (401)
    assert websocket(guesser, "lab:guess-ws") == "websocket.accept"  # the third: locked out from now
    locked, headers = status(guesser, right)
    assert locked == 429 and headers[b"retry-after"] == b"30"
    assert websocket(guesser, right) == 1008
    assert status(guesser, None, "/api/health")[0] == 200  # no sign-in given: no guess, nothing to refuse
    assert status("10.0.0.7", right)[0] == 200  # another client
    for _ in range(5):
        assert status("127.0.0.1", "lab:wrong-again")[0] == 200  # this machine's: Prefect answers 401
    assert status("127.0.0.1", right)[0] == 200
    clock.now += 30
    assert status(guesser, right)[0] == 200  # the lockout over, the right one clears the count
    assert status(guesser, "lab:guess-3")[0] == 200
