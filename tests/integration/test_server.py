"""`flagperf server` for real: a Prefect server on PostgreSQL with a process worker, its deployments and the
results site behind one sign-in, stopped cleanly.

Needs a PostgreSQL database: FLAGPERF_TEST_POSTGRES_URL (and PGPASSWORD), as
deployments/postgres/test-database.sh prints them; .ci/run sets them up."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil
import pytest
from held_deploy import holding_env, running, wait_held
from prefect_api import assert_schedule_gets_runs
from server_ports import (
    PoolLock,
    clear_what_ended_servers_left,
    database_pool,
    default_pool_in_use,
    default_pool_unused,
    online_since,
    pool_ended,
    session_pool,
    start_on_os_ports,
)
from site_probe import assert_own_answers_carry, basic, plant, probe, request

from flagperf.site.auth import Credentials
from flows.server import api_headers, database_identity, deploy_command
from tests.unit.childio import Lines, output_of

# In CI the database must be there (.ci/run makes it): a skip there would hide a broken set-up.
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not os.environ.get("FLAGPERF_TEST_POSTGRES_URL") and not os.environ.get("CI"),
                                 reason="no PostgreSQL for the test (see deployments/postgres/test-database.sh)")]
ROOT = Path(__file__).resolve().parents[2]


def said_with_server_log(proc: subprocess.Popen[str]) -> str:
    """What an exited `flagperf server` printed, and its Prefect server's log (a port taken shows in either)."""
    log = Path(proc.args[proc.args.index("--log-dir") + 1]) / "server.log"
    return output_of(proc) + (log.read_text(errors="replace") if log.is_file() else "")


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


def raw_answer(port: int, target: str, headers: dict[str, str | bytes] | list[tuple[str, str | bytes]],
               method: str = "GET", body: bytes | None = None) -> http.client.HTTPResponse:
    """The request with its headers byte for byte (a Host of our choosing, a header beyond ASCII, one header twice:
    a list of pairs), read whole; its body in ``.body``."""
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest(method, target, skip_host=any(name == "Host" for name, _ in pairs), skip_accept_encoding=True)
        for name, value in [*pairs, ("Content-Length", str(len(body or b"")))]:
            conn.putheader(name, value)
        conn.endheaders(body)
        answer = conn.getresponse()
        answer.body = answer.read()  # type: ignore[attr-defined]
        return answer
    finally:
        conn.close()


ALIAS = "https://perf-lab.example.org"  # a second --public-url: a TLS proxy's name for the server
FRAMING = {"X-Frame-Options": "DENY", "Content-Security-Policy": "frame-ancestors 'none'",
           "X-Content-Type-Options": "nosniff"}


def assert_front(port: int, results_port: int, signed_in: dict[str, str], server_log: Path) -> None:
    """What stands in front of the Prefect server (flows.team_app) and the results site, as a browser and an
    attacker's page meet it: a Host that is not the server's (DNS rebinding: a page of evil.example whose name now
    points here) is refused with one line, before any sign-in; CORS allows the server's own origin, not any; a page
    of another origin can neither change anything nor open a websocket (CORS covers neither); every answer forbids
    framing and sniffing; a sign-in that is not ASCII, or given twice, is a 401, not a 500 with a traceback (over a
    websocket too)."""
    own = f"127.0.0.1:{port}"
    for server_port, target in ((port, "/api/health"), (port, "/"), (port, "/ui-settings"),
                                (port, "/api/flows/filter"), (results_port, "/")):
        for host in ("evil.example", f"evil.example:{server_port}", "127.0.0.1.evil.example"):
            answer = raw_answer(server_port, target, {"Host": host, **signed_in})
            assert answer.status == 400, (server_port, target, host, answer.status)
        body = request(server_port, target, {"Host": "evil.example", **signed_in})[1].decode()
        assert body.count("\n") == 1 and "DNS rebinding protection" in body, body
    alias = urlsplit(ALIAS).hostname
    for server_port, host in ((port, "localhost"), (port, own), (port, "[::1]"), (results_port, "localhost"),
                              (port, alias), (results_port, alias)):
        assert raw_answer(server_port, "/api/health" if server_port == port else "/",
                          {"Host": host, **signed_in}).status == 200, host
    # CORS: Prefect's `*` let any site's page read the API with a sign-in its script knows; now only the server's
    for origin, allowed in ((f"http://{own}", True), (ALIAS, True), ("http://evil.example", False), ("null", False)):
        preflight = httpx.options(f"http://{own}/api/flows/filter", timeout=10, headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        said = preflight.headers.get("access-control-allow-origin")
        assert (said == origin) if allowed else (preflight.status_code == 400 and said != "*"), (origin, said)
        plain = httpx.get(f"http://{own}/api/health", headers={"Origin": origin}, timeout=10)
        assert plain.headers.get("access-control-allow-origin") == (origin if allowed else None), origin
    for server_port, target, headers in ((port, "/", {}), (port, "/api/health", {}), (port, "/api/admin/settings", {}),
                                         (port, "/api/admin/settings", signed_in), (port, "/nowhere", {}),
                                         (results_port, "/", signed_in), (results_port, "/", {})):
        answer = raw_answer(server_port, target, headers)
        policies = " ".join(v for k, v in answer.getheaders() if k.lower() == "content-security-policy")
        assert answer.getheader("X-Frame-Options") == "DENY", (server_port, target, answer.getheaders())
        assert "frame-ancestors 'none'" in policies and answer.getheader("X-Content-Type-Options") == "nosniff"
        assert len(answer.headers.get_all("X-Frame-Options") or []) == 1, answer.getheaders()
    # uvicorn's own answers (a request that is no HTTP, a broken websocket handshake) too
    for server_port in (port, results_port):
        assert_own_answers_carry(server_port, FRAMING)
    before = server_log.read_bytes() if server_log.is_file() else b""
    non_ascii = "Basic " + base64.b64encode("lab:pässwort-long-enough".encode()).decode()
    for header in (non_ascii, b"Basic \xe9t\xe9", "Basic !!!not-base64", "Basic", "Bearer x y"):
        for method, target in (("GET", "/api/admin/settings"), ("POST", "/api/flows/filter")):
            answer = raw_answer(port, target, {"Authorization": header}, method, b"{}")
            assert answer.status == 401, (header, target, answer.status)
            # twice, the good one last (Starlette reads the first: a check that read the last let it through)
            twice = [("Authorization", header), ("Authorization", signed_in["Authorization"])]
            assert raw_answer(port, target, twice, method, b"{}").status == 401, (header, target)
    assert raw_answer(port, "/api/admin/settings", [("Authorization", signed_in["Authorization"])] * 2).status == 401
    # A page of another site: browsers apply CORS neither to a form's POST nor to a websocket. A change from it is
    # refused in one line; the server's own pages and clients without an Origin (Prefect's) are not.
    for origin, foreign in (("http://evil.example", True), ("null", True), (f"http://{own}", False), (ALIAS, False),
                            (None, False)):
        from_page = {**signed_in, **({"Origin": origin} if origin else {})}
        answer = raw_answer(port, "/api/flows/filter", from_page, "POST", b"{}")
        said = answer.body.decode(errors="replace")  # type: ignore[attr-defined]
        assert (answer.status == 403 and said.count("\n") == 1 and "another site" in said) if foreign else (
            "another site" not in said), (origin, answer.status, said)
        assert raw_answer(port, "/api/admin/settings", from_page).status == 200, origin  # reading: CORS's part
        assert_websocket(port, signed_in, origin, accepted=not foreign)
    said = (server_log.read_bytes() if server_log.is_file() else b"")[len(before):]
    assert b"Traceback" not in said and b"Exception in ASGI" not in said, said[-2000:]


CONTROLLER = """
import json, sys
from prefect import flow
from flagperf.inference.subflows import portable_context

@flow(name="controller-context", persist_result=False)
def controller() -> dict:
    return portable_context()

print(json.dumps(controller()))
"""
CASE = """
import json, sys
from flagperf.inference.subflows import _api_unreachable, _hydrated

with _hydrated(json.loads(sys.stdin.read())):
    print(_api_unreachable())
"""


def assert_case_falls_back(api: str, auth: str, env: dict[str, str], home: Path) -> None:
    """A case process against a signed-in server: it is never given the sign-in (the controller's context carries
    none, not a masked one, which was sent as if it were the sign-in), and its steps then run as plain functions
    (the reason its runner names); it probed /health only, open without a sign-in, and its case flow failed with
    a 401."""
    base = {**env, "PREFECT_HOME": str(home), "PREFECT_API_URL": api}
    made = subprocess.run([sys.executable, "-c", CONTROLLER], cwd=ROOT, env={**base, "PREFECT_API_AUTH_STRING": auth},
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    context = made.stdout.strip().splitlines()[-1]
    assert auth not in context and "*****" not in context, context[:2000]
    case = subprocess.run([sys.executable, "-c", CASE], cwd=ROOT, env=base, input=context, capture_output=True,
                          text=True, timeout=300)
    assert case.returncode == 0, case.stderr[-3000:]
    assert case.stdout.strip().splitlines()[-1] == (f"the Prefect API at {api} refused the sign-in (401); a case "
                                                    "process is never given it"), case.stdout + case.stderr[-2000:]


def assert_websocket(port: int, signed_in: dict[str, str], origin: str | None, accepted: bool) -> None:
    """A websocket to the events Prefect takes in (they can trigger automations) from a page of ``origin`` (None:
    Prefect's clients, which send no Origin): refused at the handshake, or accepted and signed in as Prefect's
    clients sign in; then a sign-in message that is not ASCII is refused (1008), not a traceback in the log."""
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    from websockets.sync.client import connect
    from websockets.typing import Origin, Subprotocol

    auth = base64.b64decode(signed_in["Authorization"].split()[1]).decode()
    url = f"ws://127.0.0.1:{port}/api/events/in"
    options: dict[str, Any] = {"origin": Origin(origin) if origin else None, "open_timeout": 30,
                               "subprotocols": [Subprotocol("prefect")]}
    if not accepted:
        with pytest.raises(InvalidStatus) as refused:
            connect(url, **options).close()
        assert refused.value.response.status_code == 403, origin
        for name, part in FRAMING.items():  # uvicorn writes that 403 (the app closed the socket): framed too
            assert part in refused.value.response.headers.get(name, ""), (name, refused.value.response.headers)
        return
    for token, answered in ((auth, True), ("lab:pässwort", False)):
        with connect(url, **options) as socket:
            socket.send(json.dumps({"type": "auth", "token": token}))
            if answered:
                assert json.loads(socket.recv(timeout=30)) == {"type": "auth_success"}, origin
            else:
                with pytest.raises(ConnectionClosed) as closed:
                    socket.recv(timeout=30)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008, origin


def test_server_on_postgres_with_a_worker_sign_in_deployments_and_site(tmp_path: Path) -> None:
    """On a port other than Prefect's 4200, with a sign-in from a 0600 file: the API, the UI's settings and the
    results site answer 401 without it and 200 with it; the worker signs in (it comes online); the deployments
    are made by the server, the internal ones tagged so, the user-facing ones with the served results folder in
    their environment; the deploy it offers to be run by hand does the same, signed in; what ended test sessions
    left is cleared; the site gives nothing away (the probe); SIGTERM stops everything it started; the password
    appears in no output or log."""
    results = tmp_path / "results"
    results.mkdir()
    planted = plant(results)
    password = f"pw-{os.getpid()}-not-guessable-{time.time_ns()}"
    auth_file = tmp_path / "secrets" / "server-auth"
    auth_file.parent.mkdir()
    auth_file.write_text(f"lab:{password}\n", encoding="utf-8")
    auth_file.chmod(0o600)
    signed_in = basic(f"lab:{password}")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "PREFECT_UI_API_URL", "PREFECT_API_AUTH_STRING",
                        "PREFECT_SERVER_API_AUTH_STRING", "FLAGPERF_AUTH_FILE")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    pool = database_pool()

    def start_server(port: int, results_port: int) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "flows.cli", "server", "--database-url",
                                 os.environ["FLAGPERF_TEST_POSTGRES_URL"], "--port", str(port), "--pool",
                                 pool, "--results", str(results), "--results-port", str(results_port),
                                 "--auth-file", str(auth_file), "--log-dir", str(tmp_path / f"logs-{port}"),
                                 # the first as the default would be (the banner, the UI's API); then a TLS alias
                                 "--public-url", f"http://127.0.0.1:{port}", "--public-url", ALIAS],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    started = datetime.now(timezone.utc)
    proc, port, results_port = start_on_os_ports(start_server, tmp_path / "prefect-home", said_with_server_log,
                                                 headers=signed_in)
    lines = Lines(proc.stdout)  # its output from here, each wait for a line bounded
    api = f"http://127.0.0.1:{port}/api"
    try:
        changes = api_headers(api, f"lab:{password}")  # a POST needs the CSRF token too (a filter is a POST)
        workers: list[dict] = []
        deadline = time.time() + 240
        while time.time() < deadline and not workers:
            assert proc.poll() is None, lines.text() + lines.rest()
            try:
                answer = httpx.get(f"{api}/work_pools/{pool}", headers=signed_in, timeout=5)
                if answer.status_code == 200:  # not a worker an earlier server of the session left on the pool
                    workers = [w for w in httpx.post(f"{api}/work_pools/{pool}/workers/filter", json={},
                                                     headers=changes, timeout=5).json()
                               if online_since(w, started)]
            except httpx.HTTPError:
                pass
            if not workers:
                time.sleep(2)
        assert workers, "no worker came online"
        assert answer.json()["type"] == "process"
        # Signed in or not: the API and the site.
        assert httpx.get(f"{api}/work_pools/{pool}", timeout=10).status_code == 401
        assert httpx.get(f"{api}/work_pools/{pool}", headers=basic("lab:wrong-password-123"),
                         timeout=10).status_code == 401
        wrong = {**changes, **basic("lab:wrong-password-123")}  # a change: 403 without the token, 401 with it
        assert httpx.post(f"{api}/flow_runs/filter", json={}, headers=wrong, timeout=10).status_code == 401
        assert httpx.post(f"{api}/flow_runs/filter", json={}, headers=changes, timeout=10).status_code == 200
        # Signed in but from a page of another site (a browser holding a proxy's sign-in sends it anywhere): no
        # change without the CSRF token, which only a page of the UI can read.
        for forged in ({}, {"Prefect-Csrf-Client": changes["Prefect-Csrf-Client"], "Prefect-Csrf-Token": "forged"}):
            assert httpx.post(f"{api}/flow_runs/filter", json={}, headers={**signed_in, **forged},
                              timeout=10).status_code == 403
        # Every spelling of an API address, every method: the sign-in (only the health probe is open).
        for target in ("/api/admin/settings", "/api/admin/settings/", "/api//admin/settings", "/api/%61dmin/settings",
                       "/api/health/../admin/settings", "/api/ready/../admin/settings", "/api/docs",
                       "/api/openapi.json", "/api/csrf-token?client=x", "/api/static/", "/api/flows/filter",
                       "/api/deployments/filter", "/api/variables/name/x/health"):
            for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"):
                status, body = request(port, target, {}, method, b"{}" if method != "GET" else None)
                assert status in (401, 403) and password.encode() not in body, (method, target, status)
        assert request(port, "/api/health")[0] == 200  # says nothing but "true"
        assert_front(port, results_port, signed_in, tmp_path / f"logs-{port}" / "server.log")
        assert_case_falls_back(api, f"lab:{password}", env, tmp_path / "case")
        assert password not in httpx.get(f"http://127.0.0.1:{port}/ui-settings", timeout=10).text
        site = f"http://127.0.0.1:{results_port}"
        assert httpx.get(f"{site}/", timeout=10).status_code == 401
        assert httpx.get(f"{site}/", headers=signed_in, timeout=10).status_code == 200
        # The server really stores in PostgreSQL: the pool is a row there.
        assert pool in pools_in_postgres()  # other tests of the session may add their pools
        # The pool an ended session's server made goes (a developer's database gained one per session); this
        # session's, a live session's elsewhere (another machine or pid namespace on this database: its pid means
        # nothing here; it holds its pool's lock), and pools made by hand (also flagperf-lab-N), stay.
        gone, elsewhere = (f"flagperf-test-{ended_pid()}" for _ in range(2))
        live_elsewhere = PoolLock(elsewhere)
        assert live_elsewhere.held
        hand_made = (f"lab-{os.getpid()}", f"flagperf-lab-{os.getpid()}")
        try:
            for made in (gone, elsewhere, *hand_made):
                assert httpx.post(f"{api}/work_pools/", json={"name": made, "type": "process"}, headers=changes,
                                  timeout=10).status_code == 201
            clear_what_ended_servers_left(pool)
            assert httpx.get(f"{api}/work_pools/{gone}", headers=signed_in, timeout=10).status_code == 404
            for kept in (pool, elsewhere, *hand_made):
                assert httpx.get(f"{api}/work_pools/{kept}", headers=signed_in, timeout=10).status_code == 200, kept
        finally:
            live_elsewhere.release()
            for made in (elsewhere, *hand_made):
                httpx.delete(f"{api}/work_pools/{made}", headers=changes, timeout=10)
        # The UI in a browser asks this endpoint where the API is (this server, not port 4200) and whether to
        # show its login page.
        settings = httpx.get(f"http://127.0.0.1:{port}/ui-settings", timeout=10).json()
        assert settings["api_url"] == api and settings["auth"] == "BASIC", settings
        # The deployments, made by the server: the banner's line comes once they are there.
        while "deployments:" not in lines.text():
            assert lines.next(), f"flagperf server ended: {lines.text()}"  # a line within 120 s, or it fails
        # this server's, on its pool (the database may hold other flows' deployments of the same name)
        deployments = {d["name"]: d for d in httpx.post(f"{api}/deployments/filter", json={}, headers=changes,
                                                         timeout=10).json() if d["work_pool_name"] == pool}
        assert password not in repr(deployments)  # neither their parameters nor their environment carry it
        assert {"evaluate", "nightly", "host-round", "host-healthcheck"} <= set(deployments)
        for name in ("host-round", "host-healthcheck"):
            assert "internal" in deployments[name]["tags"] and deployments[name]["description"].startswith("Internal")
        for name in ("evaluate", "nightly"):
            assert "internal" not in deployments[name]["tags"]
            assert deployments[name]["job_variables"]["env"]["FLAGPERF_RESULTS_DIR"] == str(results.resolve())
        assert "deployments: evaluate, nightly (start these)" in lines.text()
        assert probe(results_port, planted, signed_in) == []
        # The deploy it offers to be run by hand (--no-deploy, a failed deploy) signs in from the same file, named,
        # and gives the forms the served results folder: followed literally in a shell without the sign-in, it
        # makes them so (it failed, unsigned, or left a results folder set before). Meanwhile (in the background):
        # its scheduler works on this database: a deployment with the nightly's schedule gets its runs.
        evaluate = deployments["evaluate"]
        httpx.patch(f"{api}/deployments/{evaluate['id']}", headers=changes, timeout=10, json={"job_variables": {
            "env": {**evaluate["job_variables"]["env"], "FLAGPERF_RESULTS_DIR": "/elsewhere"}}}).raise_for_status()
        command = deploy_command(api, results.resolve(), pool, Credentials(f"lab:{password}", str(auth_file)),
                                 log_dir=tmp_path / f"logs-{port}",
                                 database=database_identity(os.environ["FLAGPERF_TEST_POSTGRES_URL"]))
        assert password not in command and str(auth_file) in command
        by_hand = subprocess.Popen(["bash", "-c", command], env={
            **env, "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            assert_schedule_gets_runs(api, headers=changes)
            said, _ = by_hand.communicate(timeout=600)
        finally:
            if by_hand.poll() is None:
                by_hand.kill()
                by_hand.wait(timeout=60)
        assert by_hand.returncode == 0 and password not in said, said[-3000:]
        for name in ("evaluate", "nightly"):
            made = httpx.get(f"{api}/deployments/{deployments[name]['id']}", headers=signed_in, timeout=10).json()
            assert made["job_variables"]["env"]["FLAGPERF_RESULTS_DIR"] == str(results.resolve()), made
            assert made["work_pool_name"] == pool, made
        children = psutil.Process(proc.pid).children(recursive=True)
        # The sign-in is in no command line (ps shows every user those); the processes' environment has it.
        assert children and not [c.cmdline() for c in children if password in " ".join(c.cmdline())]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)
    out = lines.text() + lines.rest()
    assert proc.returncode == 0, out
    assert f"worker: pool '{pool}'" in out
    assert "stopped by SIGTERM: the worker, the server and the results site" in out  # not a silent end
    assert f"UI at http://127.0.0.1:{port}" in out and f"at http://127.0.0.1:{results_port}/ (runs" in out
    assert f"sign-in: on, user 'lab' (from {auth_file})" in out
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    logs = [p.read_text(errors="replace") for p in tmp_path.glob("logs-*/*.log")]
    assert logs and not [text for text in [out, *logs] if password in text]


def no_worker_server(tmp_path: Path, env: dict[str, str]) -> Callable[[int, int], subprocess.Popen[str]]:
    """What starts `flagperf server --no-worker` on given ports (start_on_os_ports' start), on this session's
    pool, its results and logs under ``tmp_path``, its output piped."""
    pool = database_pool()

    def start_server(port: int, results_port: int) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "flows.cli", "server", "--database-url",
                                 os.environ["FLAGPERF_TEST_POSTGRES_URL"], "--port", str(port), "--no-worker",
                                 "--pool", pool, "--results", str(tmp_path / "results"),
                                 "--results-port", str(results_port), "--log-dir", str(tmp_path / f"logs-{port}")],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    return start_server


def test_ctrl_c_while_the_deployments_are_made_stops_them_at_once(tmp_path: Path) -> None:
    """Ctrl-C while `flagperf server` runs `prefect deploy` (held running here: a deploy may take up to its
    10-minute limit): the deploy's process group is stopped at once, not waited for, then the server and the
    results site as on any Ctrl-C while it starts: one line, exit 130, no process of it left."""
    held, marker = holding_env(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), **held)

    proc, port, _ = start_on_os_ports(no_worker_server(tmp_path, env), tmp_path / "prefect-home",
                                      said_with_server_log)
    try:
        deploy = psutil.Process(wait_held(marker, lambda: proc.poll() is None))  # the work pool is made first
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert deploy in tree  # this server's deploy, under its watcher
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=300)  # half the deploy's 600 s (the old code waited for it), ample on a slow machine
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    out = output_of(proc)
    assert proc.returncode == 130, out
    assert out.splitlines()[-1] == ("error: interrupted while the server started; all it had started is stopped (logs "
                                    f"in {tmp_path / f'logs-{port}'})"), out
    assert "deployments:" not in out
    assert not running(deploy)
    _gone, alive = psutil.wait_procs(tree, timeout=30)  # the stopped ones may yet be reaped by their parents
    left = [p for p in alive if running(p)]
    assert not left, [(p.pid, p.cmdline()) for p in left]


def test_a_killed_server_command_leaves_no_server(tmp_path: Path) -> None:
    """SIGKILL gives `flagperf server` no chance to stop anything: its watchers stop the server and worker."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")

    proc, _, _ = start_on_os_ports(no_worker_server(tmp_path, env), tmp_path / "prefect-home",
                                   said_with_server_log)
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children
    finally:
        proc.kill()
        proc.wait(timeout=60)
    _gone, alive = psutil.wait_procs(children, timeout=60)
    left = []
    for c in alive:
        with contextlib.suppress(psutil.Error):
            if c.status() != psutil.STATUS_ZOMBIE:
                left.append((c.pid, c.ppid(), os.getpgid(c.pid), c.cmdline()))
    assert not left, left  # pid, parent, group and command of each: which watcher let it go


def ended_pid() -> int:
    """The pid of a process that has ended (and been reaped): no process here has it."""
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait(timeout=60)
    return ended.pid


def test_a_session_s_pool_lock_outlives_its_connection_or_fails_loudly(monkeypatch: pytest.MonkeyPatch,
                                                                       capfd: pytest.CaptureFixture[str]) -> None:
    """The connection that holds a session's pool lock can die (the database restarted, a network cut), and the
    lock with it: another session then took the pool for an ended one's and deleted it under this session's live
    servers, and nothing said so. Now the lock checks its connection: a dead one is replaced and the lock taken
    again, tried again while the database is away (it gave up after one failed try) for a bounded time; where
    another took it meanwhile, or no connection came in time, one line says so at once and the session's next pool
    fails in one line."""
    import asyncio

    import asyncpg
    import server_ports

    dsn = os.environ["FLAGPERF_TEST_POSTGRES_URL"].replace("postgresql+asyncpg://", "postgresql://")

    async def sql(query: str, *args: object) -> object:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetchval(query, *args)
        finally:
            await conn.close()

    def until(condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 120
        while not condition():
            assert time.monotonic() < deadline, what
            time.sleep(0.2)

    pool = f"flagperf-test-{ended_pid()}"
    key = server_ports.pool_key(pool)
    lock = PoolLock(pool, check_s=3600)  # checked by the test only (check), never by the clock
    other: asyncpg.Connection | None = None
    try:
        assert lock.held
        first = lock.backend_pid
        assert asyncio.run(sql("select pg_terminate_backend($1)", first))
        lock.check()
        until(lambda: lock.checks >= 1 or lock.lost is not None, "the lock never checked its connection")
        assert lock.lost is None and lock.backend_pid != first and lock.retaken == 1
        assert not asyncio.run(sql("select pg_try_advisory_lock($1)", key))  # held again, by the new connection
        # Died while the database is away (its address refuses connections for a while): tried again until it is
        # back, the lock then held again.
        with away() as elsewhere:
            lock.dsn, second = elsewhere, lock.backend_pid
            assert asyncio.run(sql("select pg_terminate_backend($1)", second))
            lock.check()
            until(lambda: lock.failed_tries >= 2 or lock.lost is not None, "the lock never tried again")
            lock.dsn = dsn
        # (retaken counts once the lock is known held on the new connection; its backend is set before)
        until(lambda: lock.retaken >= 2 or lock.lost is not None, "the lock never connected again")
        assert lock.lost is None and lock.backend_pid != second
        assert not asyncio.run(sql("select pg_try_advisory_lock($1)", key))
        # Died again, and another session takes the lock before it is taken again: lost, and said.
        assert asyncio.run(sql("select pg_terminate_backend($1)", lock.backend_pid))

        async def take() -> asyncpg.Connection:
            conn = await asyncpg.connect(dsn)
            deadline = time.monotonic() + 120  # until the ended backend has let the lock go
            while not await conn.fetchval("select pg_try_advisory_lock($1)", key):
                assert time.monotonic() < deadline, "the lock of a terminated connection was never let go"
                await asyncio.sleep(0.2)
            return conn

        loop = asyncio.new_event_loop()
        other = loop.run_until_complete(take())
        lock.check()
        until(lambda: lock.lost is not None, "the lost lock was never noticed")
        assert "another session took the lock" in str(lock.lost)
        monkeypatch.setattr(server_ports, "_SESSION_LOCK", [lock])
        with pytest.raises(AssertionError, match=f"this session's lock on its pool '{pool}' was lost"):
            server_ports.session_pool()
        loop.run_until_complete(other.close())
        loop.close()
    finally:
        lock.release()
    said = capfd.readouterr().err.splitlines()
    assert [line for line in said if "lost the lock" in line] == [
        f"test session: lost the lock on work pool '{pool}': {lock.lost}; its deployments may be cleared by another "
        "session"]
    # Away while another session held the lock and cleared the pool (taken for an ended session's): held again on a
    # new connection, but lost, and said.
    cleared = PoolLock(f"flagperf-test-{ended_pid()}", check_s=3600)
    try:
        asyncio.run(sql("insert into work_pool (name, type) values ($1, 'process') returning id", cleared.pool))
        cleared.check()
        until(lambda: cleared.checks >= 1, "the lock never checked its pool")
        with away() as elsewhere:
            cleared.dsn = elsewhere
            assert asyncio.run(sql("select pg_terminate_backend($1)", cleared.backend_pid))
            cleared.check()
            until(lambda: cleared.failed_tries >= 1 or cleared.lost is not None, "the lock never tried again")
            asyncio.run(sql("delete from work_pool where name = $1 returning name", cleared.pool))
            cleared.dsn = dsn
        until(lambda: cleared.lost is not None, "the cleared pool was never noticed")
        assert "its pool was cleared meanwhile" in cleared.lost, cleared.lost
        assert f"lost the lock on work pool '{cleared.pool}'" in capfd.readouterr().err
    finally:
        cleared.release()
        asyncio.run(sql("delete from work_pool where name = $1 returning name", cleared.pool))
    # Away for longer than it tries: lost, and said, in a bounded time; released meanwhile, at once.
    briefly = PoolLock(f"flagperf-test-{ended_pid()}", check_s=3600, reconnect_s=2, first_wait_s=0.1)
    try:
        with away() as elsewhere:
            briefly.dsn = elsewhere
            assert asyncio.run(sql("select pg_terminate_backend($1)", briefly.backend_pid))
            briefly.check()
            until(lambda: briefly.lost is not None, "the lock never gave up")
        assert "no new one came within 2 s" in str(briefly.lost) and briefly.failed_tries >= 2, briefly.lost
        assert f"lost the lock on work pool '{briefly.pool}'" in capfd.readouterr().err
    finally:
        briefly.release()
    waiting = PoolLock(f"flagperf-test-{ended_pid()}", check_s=3600, reconnect_s=7200, first_wait_s=3600,
                       max_wait_s=3600)
    with away() as elsewhere:
        waiting.dsn = elsewhere
        assert asyncio.run(sql("select pg_terminate_backend($1)", waiting.backend_pid))
        waiting.check()
        until(lambda: waiting.failed_tries >= 1, "the lock never tried again")
        waiting.release()  # in its hour-long wait between tries: ended at once (it slept it out, up to 60 s)
    assert not waiting._thread.is_alive() and waiting.lost is None
    # Any other failure of a check (here the database refuses the pool's query) ends the hold: said, never silent
    # (it ended the thread, the lock released with its connection, lost None).
    failing = PoolLock(f"flagperf-test-{ended_pid()}", check_s=3600)
    try:
        async def refused(conn: asyncpg.Connection) -> object:
            return await conn.fetchval("select 1 / 0")

        failing._pool_row = refused  # type: ignore[method-assign]
        failing.check()
        until(lambda: not failing._thread.is_alive(), "the failing check never ended the hold")
        assert "checking it failed (DivisionByZeroError" in str(failing.lost), failing.lost
        assert f"lost the lock on work pool '{failing.pool}'" in capfd.readouterr().err
    finally:
        failing.release()


@contextlib.contextmanager
def away() -> Iterator[str]:
    """The test database's address as it is while it is away: a port bound and not listening (refused at once)."""
    import socket

    dsn = os.environ["FLAGPERF_TEST_POSTGRES_URL"].replace("postgresql+asyncpg://", "postgresql://")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        parts = urlsplit(dsn)
        user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        yield parts._replace(netloc=f"{user}127.0.0.1:{closed.getsockname()[1]}").geturl()


def test_the_session_clears_only_the_deployments_of_servers_that_provably_ended() -> None:
    """The servers of a session share the test database with other sessions': before its servers start, a session
    clears what ended ones left on their pools (a server of another pool is refused). It took any pool not named
    like a session's for ended, the tutorial's `flagperf` too, so a concurrent session's tutorial server lost its
    deployments; then a session's pool whose pid was gone here, so a live session on another machine or in another
    pid namespace lost its pool, and a pool made by hand named like one (flagperf-lab-2) was taken for a session's.
    Now: a session's pool (flagperf-test-N) whose lock no session holds (PoolLock: the session holds it while it
    lives, wherever it runs), or this session's own; the default pool only while no session's server holds it (its
    lock); any other pool never."""
    elsewhere = f"flagperf-test-{ended_pid()}"
    lock = PoolLock(elsewhere)
    try:
        assert lock.held and not PoolLock(elsewhere).held  # one session per pool
        assert not pool_ended(elsewhere, True)
    finally:
        lock.release()
    assert pool_ended(elsewhere, False)  # its session is gone
    assert pool_ended(session_pool(), False)  # this session's own (its servers are stopped when it clears)
    assert not pool_ended("lab", True) and not pool_ended("flagperf-other", True)
    assert not pool_ended(f"flagperf-lab-{ended_pid()}", True) and not pool_ended("flagperf-test", True)
    assert not pool_ended("flagperf", False) and pool_ended("flagperf", True)
    with default_pool_unused() as unused:
        assert unused
    # a tutorial's server on the default pool, in this session or another
    with default_pool_in_use(), default_pool_unused() as unused:
        assert not unused
    with default_pool_unused() as unused:
        assert unused
