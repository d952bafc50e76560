"""The results site as a security reviewer tries it, served for real by uvicorn on a port the OS gives: every
route of the app (enumerated from the app itself, so a route added later is covered) asks for the sign-in, for
every method and for trailing-slash and encoded spellings of its address; wrong sign-ins are throttled per client
(on an injected clock: no sleeping); a run's own files (a report.html or .svg a case wrote) are sandboxed and run
no script in Chromium; names and values from a run's records are escaped; HSTS once a proxy says TLS."""

from __future__ import annotations

import http.client
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from site_probe import assert_own_answers_carry, basic, make_run

from flagperf.site.auth import Credentials, SignInThrottle
from flows.server import SiteServer, serve_site

pytestmark = pytest.mark.integration
AUTH = "lab:a-long-enough-password-42"
RUN = "run-sec"
CHROMIUM = Path("/usr/bin/chromium")
# Values for a route's path parameters: a real run and a file of it.
PARAMS = {"run_id": RUN, "name": "report.html"}
SCRIPT_RAN = "script-ran-in-the-site"
EVIL_SVG = (f'<svg xmlns="http://www.w3.org/2000/svg" width="40" height="40" onload="document.title=\'{SCRIPT_RAN}\'">'
            f'<script>document.title="{SCRIPT_RAN}"</script><rect width="40" height="40" fill="red"/></svg>')


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[SiteServer, Path]]:
    root = tmp_path / "results"
    root.mkdir()
    make_run(root, RUN, 10.0)
    server = serve_site(root, "127.0.0.1", 0, Credentials(AUTH, "test"))
    try:
        yield server, root
    finally:
        server.stop()


def send(port: int, target: str, headers: dict[str, str] | None = None, method: str = "GET",
         source: str = "127.0.0.1") -> http.client.HTTPResponse:
    """The request target byte for byte (no client tidies `..` or `%2f`), from the loopback address ``source``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    conn.request(method, target, headers=headers or {})
    answer = conn.getresponse()
    answer.read()
    conn.close()
    return answer


def route_targets(server: SiteServer) -> list[str]:
    """Every route of the running app, its parameters filled in."""
    guard = server.server.config.app
    paths = [route.path for route in guard.app.routes]
    assert paths, "the app lists no routes"
    return [re.sub(r"\{(\w+)(:\w+)?\}", lambda m: PARAMS.get(m.group(1), "x"), path) for path in paths]


def spellings(target: str) -> list[str]:
    """The same address as a client could write it: with or without a trailing slash, percent-encoded, doubled
    or dotted slashes, with a query."""
    first = target[1:2]
    encoded = f"/%{ord(first):02X}{target[2:]}" if first else "/%2F"
    return [target, target.rstrip("/") or "/", target if target.endswith("/") else target + "/", encoded,
            "/" + target, "/." + target, target + "?a=1", target.replace("/", "%2F", 2)]


def test_every_route_every_method_and_spelling_asks_for_the_sign_in(site: tuple[SiteServer, Path]) -> None:
    server, _root = site
    server.server.config.app.throttle = SignInThrottle(free=10**9)  # wrong tries by the hundred are the point here
    checked = 0
    for target in route_targets(server):
        assert send(server.port, target, basic(AUTH)).status not in (401, 405), target  # signed in: let through
        for spelled in spellings(target):
            for method in ("GET", "HEAD", "OPTIONS", "POST", "PUT", "DELETE", "PATCH"):
                for headers in ({}, basic("lab:not-the-password-1234"), basic(AUTH.upper()),
                                {"Authorization": "Bearer " + AUTH}):
                    answer = send(server.port, spelled, headers, method)
                    assert answer.status == 401, (method, spelled, headers, answer.status)
                    assert answer.getheader("WWW-Authenticate", "").startswith("Basic")
                    assert "default-src 'none'" in answer.getheader("Content-Security-Policy", "")
                    assert answer.getheader("X-Frame-Options") == "DENY"
                    checked += 1
    assert checked > 1000


def test_uvicorns_own_answers_carry_the_security_headers(site: tuple[SiteServer, Path]) -> None:
    """A request uvicorn refuses itself (no HTTP, a broken websocket handshake) gets the site's headers as every
    answer of the app does, and an answer of the app names each once (not again by uvicorn)."""
    server, _root = site
    wanted = {"Content-Security-Policy": "default-src 'none'", "X-Frame-Options": "DENY",
              "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}
    assert_own_answers_carry(server.port, wanted)
    answer = send(server.port, "/", basic(AUTH))
    assert answer.status == 200
    for name in wanted:
        assert len(answer.headers.get_all(name) or []) == 1, (name, answer.getheaders())


def test_an_address_the_machine_got_since_it_started_is_its_own_read_again_at_most_every_few_seconds(
        tmp_path: Path) -> None:
    """A server on every interface answers to this machine's addresses: one it got since it started (DHCP, a new
    interface) was refused as another site's. Now a Host that misses has the names read again, at most once per
    REREAD_EVERY_S of the check's clock (injected: no sleeping), before it is refused; a name read nowhere stays
    refused, and asking with it again and again reads nothing more."""
    from flagperf.site.front import REREAD_EVERY_S

    interfaces: list[str] = []
    reads: list[int] = []

    def reread() -> list[str]:
        reads.append(1)
        return list(interfaces)

    server = serve_site(tmp_path / "results", "127.0.0.1", 0, Credentials(AUTH, "test"), names=["127.0.0.1"],
                        reread_names=reread)
    try:
        clock = Clock()
        server.server.config.app.hosts.clock = clock

        def status(host: str) -> int:
            return send(server.port, "/", {**basic(AUTH), "Host": host}).status

        assert status(f"127.0.0.1:{server.port}") == 200 and reads == []  # a Host that matches reads nothing
        assert status("10.9.8.7") == 400 and len(reads) == 1  # not (yet) an address of this machine
        interfaces.append("10.9.8.7")  # DHCP gives it now
        assert status("10.9.8.7") == 400 and len(reads) == 1  # read a moment ago: not again yet
        clock.now += REREAD_EVERY_S
        assert status("10.9.8.7:80") == 200 and len(reads) == 2
        assert status("10.9.8.7") == 200 and len(reads) == 2  # known from here on
        clock.now += REREAD_EVERY_S
        for _ in range(5):  # another site's name: read once, then refused without reading again
            assert status("evil.example") == 400
        assert len(reads) == 3
    finally:
        server.stop()


def test_wrong_sign_ins_are_throttled_per_client(site: tuple[SiteServer, Path]) -> None:
    server, _root = site
    clock = Clock()
    server.server.config.app.throttle = SignInThrottle(free=3, first_delay_s=30.0, clock=clock)
    right = basic(AUTH)

    def wrong(n: int) -> dict[str, str]:  # each a new guess: the same wrong one again is none
        return basic(f"lab:guess-number-{n:06}")

    assert send(server.port, "/", {}).status == 401  # a browser's first request, without any: no guess
    assert [send(server.port, "/", wrong(1)).status for _ in range(3)] == [401, 401, 401]  # one guess
    assert [send(server.port, "/", wrong(n)).status for n in range(2, 5)] == [401, 401, 401]
    locked = send(server.port, "/", right)
    assert locked.status == 429 and locked.getheader("Retry-After") == "30"  # the right one is not even checked
    assert send(server.port, "/", right, source="127.0.0.2").status == 200  # another client is not locked out
    clock.now += 30
    assert send(server.port, "/", right).status == 200
    assert [send(server.port, "/", wrong(n)).status for n in range(5, 8)] == [401, 401, 401]  # cleared by the right one


def test_a_runs_own_files_are_sandboxed_and_run_no_script(site: tuple[SiteServer, Path]) -> None:
    server, root = site
    run = root / RUN
    (run / "plots" / "evil.svg").write_text(EVIL_SVG, encoding="utf-8")
    plot = next(p.name for p in (run / "plots").iterdir() if p.suffix == ".png")
    (run / "report.html").write_text(
        f'<html><head><title>report</title></head><body><script>document.title="{SCRIPT_RAN}"</script>'
        f'<img id="plot" src="plots/{plot}"><img src="x" onerror="document.title=\'{SCRIPT_RAN}\'">'
        f'<a id="js" href="javascript:document.title=\'{SCRIPT_RAN}\'">x</a></body></html>', encoding="utf-8")
    for name in ("report.html", "plots/evil.svg", f"plots/{plot}", "report.md", "summary.csv"):
        answer = send(server.port, f"/runs/{RUN}/{name}", basic(AUTH))
        assert answer.status == 200, name
        policies = [v for k, v in answer.getheaders() if k.lower() == "content-security-policy"]
        assert "sandbox allow-same-origin" in policies, (name, policies)
        assert any("default-src 'none'" in p for p in policies), (name, policies)
        assert answer.getheader("X-Content-Type-Options") == "nosniff"
    page = send(server.port, f"/runs/{RUN}/", basic(AUTH))  # the site's own pages are not sandboxed (its form)
    assert "sandbox" not in page.getheader("Content-Security-Policy", "")
    if not CHROMIUM.is_file() and not os.environ.get("CI"):
        pytest.skip(f"no {CHROMIUM}: the headers are checked, not a browser")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM),
                                             args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            context = browser.new_context(http_credentials={"username": "lab", "password": AUTH.split(":", 1)[1]})
            tab = context.new_page()
            tab.set_default_timeout(120_000)  # Playwright's 30 s is a load-dependent verdict; the waits end when done
            tab.goto(f"http://127.0.0.1:{server.port}/runs/{RUN}/report.html")
            tab.wait_for_function("document.getElementById('plot').complete")
            assert tab.evaluate("document.getElementById('plot').naturalWidth") > 0  # its plots still show
            tab.click("#js")
            tab.goto(f"http://127.0.0.1:{server.port}/runs/{RUN}/plots/evil.svg")
            titles = [tab.title()]
            tab.goto(f"http://127.0.0.1:{server.port}/runs/{RUN}/report.html")
            titles.append(tab.title())
            assert SCRIPT_RAN not in titles, titles
        finally:
            browser.close()


def test_names_and_values_from_records_are_escaped_everywhere(site: tuple[SiteServer, Path]) -> None:
    server, root = site
    hostile = '"><img src=x onerror=alert(1)><script>alert(2)</script>'
    (root / RUN / "plan.json").write_text(json.dumps({"suite": hostile, "vendor": {"name": hostile}}), encoding="utf-8")
    summary = json.loads((root / RUN / "summary.json").read_text(encoding="utf-8"))
    summary["context"] = {"vendor": hostile, "device": hostile}
    summary["not_measured"] = [{"case": hostile, "round": 1, "host": hostile, "status": "failed", "message": hostile}]
    (root / RUN / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    import httpx

    with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", headers=basic(AUTH), timeout=60) as http:
        for target, params in (("/", {}), (f"/runs/{RUN}/", {}), ("/compare", {"a": RUN, "b": hostile}),
                               ("/trends/figure", {"case": hostile, "metric": hostile}), (f"/runs/{hostile}/", {})):
            body = http.get(target, params=params).text
            assert "<script>alert" not in body and "<img src=x" not in body, target


def test_behind_a_tls_proxy_answers_say_strict_transport_security(site: tuple[SiteServer, Path]) -> None:
    server, _root = site
    plain = send(server.port, "/", basic(AUTH))
    assert plain.status == 200 and plain.getheader("Strict-Transport-Security") is None
    proxied = send(server.port, "/", {**basic(AUTH), "X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.7"})
    assert proxied.status == 200 and proxied.getheader("Strict-Transport-Security", "").startswith("max-age=")
