"""The results site of `flagperf server` (flagperf/site), served by uvicorn on a port the OS gives as it binds,
without a Prefect server: the probe finds nothing (and finds plenty on a plain file server, which it replaced),
its pages show runs, reports, plots, a comparison and trends; and the sign-in's rules (credentials from a 0600
file outside the project or the environment, none beyond loopback refused)."""

from __future__ import annotations

import contextlib
import functools
import html
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from site_probe import basic, make_run, plant, probe

from flagperf.errors import ConfigError
from flagperf.paths import PROJECT_ROOT
from flagperf.results.history import history_engine, record_run
from flagperf.results.schema import Failure, RoundResult, write_result
from flagperf.site.auth import Credentials, find_credentials, read_auth_file
from flows.server import SiteServer, serve_site, server_credentials

pytestmark = pytest.mark.integration
AUTH = "probe:a-long-enough-password-42"


@pytest.fixture
def no_credentials_around(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No credentials from this machine's environment or home: the test says which it has."""
    for name in ("FLAGPERF_AUTH_FILE", "PREFECT_SERVER_API_AUTH_STRING", "PREFECT_API_AUTH_STRING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config" / "flagperf" / "server-auth"


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[SiteServer, Path]]:
    root = tmp_path / "results"
    root.mkdir()
    # The OS gives the port as it binds; run pages link their flow runs in the Prefect UI at this address.
    server = serve_site(root, "127.0.0.1", 0, Credentials(AUTH, "test"), ui_url="http://perf-lab:4200")
    try:
        yield server, root
    finally:
        server.stop()


def test_the_site_gives_nothing_away(site: tuple[SiteServer, Path]) -> None:
    server, root = site
    planted = plant(root)
    assert probe(server.port, planted, basic(AUTH)) == []


def test_the_open_site_on_loopback_gives_nothing_away_either(tmp_path: Path) -> None:
    root = tmp_path / "results"
    root.mkdir()
    planted = plant(root)
    server = serve_site(root, "127.0.0.1", 0, None)
    try:
        assert probe(server.port, planted, None) == []
    finally:
        server.stop()


def test_the_probe_catches_a_plain_file_server(tmp_path: Path) -> None:
    """What `flagperf server` served before the site: a SimpleHTTPRequestHandler on the folder. The probe must
    find each kind of leak there, or it proves nothing about the site."""
    root = tmp_path / "results"
    root.mkdir()
    planted = plant(root)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(SimpleHTTPRequestHandler, directory=str(root)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        findings = "\n".join(probe(httpd.server_address[1], planted, basic(AUTH)))
    finally:
        httpd.shutdown()
        httpd.server_close()
    for kind in ("without signing in", "shows a directory listing", "shows /etc", "shows the history database",
                 "shows a log", "shows a job's secret"):
        assert kind in findings, (kind, findings)


def test_pages_runs_report_compare_and_trends(site: tuple[SiteServer, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    server, root = site
    engine = history_engine(results_dir=root)
    start = datetime(2026, 3, 1, 2, 0, tzinfo=timezone.utc)
    values = [100.0, 100.4, 99.8, 100.1, 99.9, 90.0]  # steady nights, then a 10 % drop
    for night, value in enumerate(values):
        run = make_run(root, f"run-night{night}", value)
        os.utime(run / "summary.json", (1e9 + night, 1e9 + night))  # listed by when they ran, newest first
        record_run(engine, run, recorded_at=start + timedelta(days=night))
    broken = root / "run-broken"
    write_result(broken / "computation-FP32" / "round1" / "h1_noderank0" / "result.json", RoundResult(
        run_id="run-broken", case="computation-FP32", family="base", round=1, host="h1", node_rank=0, vendor="cpu",
        status="failed", started_at=start, finished_at=start, duration_s=1.0, measured_seconds=0.0,
        failure=Failure(kind="infrastructure", message="<script>alert(1)</script> [x](javascript:alert(1))"),
        config={}))
    from flagperf.results.report import build_report

    build_report(broken)
    os.utime(broken / "summary.json", (2e9, 2e9))
    flow_run = "0d24e7a6-3ee4-4a32-a86a-dc14a6b5c5d6"  # plan.json names the flow run that made a run
    (root / "run-night5" / "plan.json").write_text(json.dumps({"flow_run_id": flow_run}), encoding="utf-8")
    (root / "run-night4" / "plan.json").write_text(json.dumps({"flow_run_id": "x/../../admin"}), encoding="utf-8")
    with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", headers=basic(AUTH), timeout=60) as http:
        index = http.get("/")
        assert index.status_code == 200
        order = [index.text.index(f'href="/runs/{name}/"') for name in ("run-broken", "run-night5", "run-night0")]
        assert order == sorted(order)  # newest first
        assert "failed (1 of 1 rounds)" in index.text and "succeeded (2 rounds)" in index.text
        assert "computation-FP32 gemm_fp32: 90.15 TFLOPS" in index.text  # a headline figure
        assert "content-security-policy" in index.headers and "script-src" not in index.headers[
            "content-security-policy"] and "default-src 'none'" in index.headers["content-security-policy"]

        failed = http.get("/runs/run-broken/")
        assert "&lt;script&gt;" in failed.text and "<script>" not in failed.text  # autoescape
        night = http.get("/runs/run-night5/")
        assert f'<a href="http://perf-lab:4200/runs/flow-run/{flow_run}">its flow run and logs' in night.text
        assert "perf-lab:4200" not in http.get("/runs/run-night4/").text + failed.text  # no flow run, or no id
        plots = [p for p in (root / "run-night5" / "plots").iterdir()]
        assert plots and all(f'src="plots/{p.name}"' in night.text for p in plots)
        png = http.get(f"/runs/run-night5/plots/{plots[0].name}")
        assert png.status_code == 200 and png.headers["content-type"] == "image/png"
        assert png.content == plots[0].read_bytes()
        report = http.get("/runs/run-night5/report.html")
        assert report.status_code == 200 and "FlagPerf run-night5" in report.text

        picker = http.get("/compare")
        assert '<option value="run-night0"' in picker.text and '<option value="run-night5"' in picker.text
        # Chosen at first: B the newest run, A the one before; from a run's "compare with another run" link
        # (a=RUN), B is the newest other run: never a run against itself.
        assert re.findall(r'<option value="([^"]+)" selected>', picker.text) == ["run-night5", "run-broken"]
        from_run = http.get("/compare", params={"a": "run-broken"})
        assert re.findall(r'<option value="([^"]+)" selected>', from_run.text) == ["run-broken", "run-night5"]
        compared = http.get("/compare", params={"a": "run-night0", "b": "run-night5"})
        assert compared.status_code == 200 and "DIFFERENT" in compared.text and "0.90" in compared.text
        assert http.get("/compare", params={"a": "run-night0", "b": "run-nope"}).status_code == 404
        cut = root / "run-cut" / "computation-FP32" / "round1" / "h1_noderank0" / "result.json"
        cut.parent.mkdir(parents=True)
        cut.write_text('{"run_id": "run-cut", "case": ', encoding="utf-8")
        (root / "run-cut" / "plan.json").write_text("{}", encoding="utf-8")  # a run (its plan), cut short since
        refused = html.unescape(http.get("/compare", params={"a": "run-night0", "b": "run-cut"}).text)
        # Named as the reader knows it (the run's id, its file under the run); no CLI argument, no server path
        assert "run run-cut: computation-FP32/round1/h1_noderank0/result.json: unreadable result" in refused
        assert "the run is not compared while a host's result cannot be read" in refused
        assert str(root) not in refused and "RUN_B" not in refused and "repair" not in refused

        trends = http.get("/trends")
        assert "gemm_fp32" in trends.text
        key = {"case": "computation-FP32", "metric": "gemm_fp32", "vendor": "cpu", "device": "X1"}
        figure = http.get("/trends/figure", params=key)
        assert figure.status_code == 200 and figure.text.count('class="bad">regression') == 1
        assert figure.text.count("no-baseline") == 3  # the first three nights have too few before them
        assert 'id="trend" src="/trends/plot.png?' in figure.text
        picture = http.get("/trends/plot.png", params=key)
        assert picture.status_code == 200 and picture.content.startswith(b"\x89PNG")
        assert http.get("/trends/figure", params={**key, "device": "Y9"}).status_code == 404

        # A server without matplotlib says so instead of failing.
        monkeypatch.setattr("flagperf.site.trends.matplotlib_figure", lambda: None)
        without = http.get("/trends/figure", params=key)
        assert without.status_code == 200 and "matplotlib is not installed" in without.text
        assert 'id="trend"' not in without.text and "regression" in without.text
        assert http.get("/trends/plot.png", params=key).status_code == 404


def test_trends_without_a_history_say_so(site: tuple[SiteServer, Path]) -> None:
    server, root = site
    make_run(root, "run-alone", 5.0)
    answer = httpx.get(f"http://127.0.0.1:{server.port}/trends", headers=basic(AUTH), timeout=30)
    assert answer.status_code == 200 and "No history yet" in answer.text
    assert not (root / "history.sqlite").exists()  # reading made no database


def test_credentials_come_from_a_private_file_outside_the_project(tmp_path: Path,
                                                                 no_credentials_around: Path) -> None:
    secret = "lab:correct-horse-battery-staple"
    good = tmp_path / "auth"
    good.write_text(secret + "\n", encoding="utf-8")
    good.chmod(0o600)
    found = read_auth_file(good)
    assert found.auth_string == secret and found.user == "lab"
    assert "staple" not in repr(found) and "staple" not in str(found)
    good.chmod(0o644)
    with pytest.raises(ConfigError, match="mode 0644 lets others read it; chmod 600"):
        read_auth_file(good)
    short = tmp_path / "short"
    short.write_text("lab:short\n", encoding="utf-8")
    short.chmod(0o600)
    with pytest.raises(ConfigError, match="shorter than 12") as error:
        read_auth_file(short)
    assert "lab:short" not in str(error.value)  # the message names the file, never its text
    # Beyond printable ASCII, Prefect's server answers every call 500 (its compare refuses such a str): refused here.
    for odd in ("lab:pässwort-long-enough", "lab:tab\tin-the-password-1234"):
        short.write_text(odd + "\n", encoding="utf-8")
        with pytest.raises(ConfigError, match="printable ASCII") as error:
            read_auth_file(short)
        assert odd.split(":")[1] not in str(error.value)
    # In an ignored folder of the project: a file git sees would make a round run meanwhile beside this test (the
    # other worker's) record its checkout as modified.
    ignored = PROJECT_ROOT / "build"
    made = not ignored.exists()
    ignored.mkdir(exist_ok=True)
    inside = ignored / f"auth-test-{os.getpid()}"
    inside.write_text(secret, encoding="utf-8")
    try:
        inside.chmod(0o600)
        with pytest.raises(ConfigError, match="inside the project"):
            read_auth_file(inside)
    finally:
        inside.unlink()
        if made:
            with contextlib.suppress(OSError):  # something else was put there meanwhile: it stays
                ignored.rmdir()
    # The default file, then the environment: none means none; a bad one is an error, not skipped.
    assert find_credentials() is None
    no_credentials_around.parent.mkdir(parents=True)
    no_credentials_around.write_text(secret, encoding="utf-8")
    no_credentials_around.chmod(0o640)
    with pytest.raises(ConfigError, match="chmod 600"):
        find_credentials()
    no_credentials_around.chmod(0o600)
    assert find_credentials().source == str(no_credentials_around)


def test_beyond_loopback_the_server_needs_a_sign_in(no_credentials_around: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    assert server_credentials("127.0.0.1", None) is None
    assert server_credentials("::1", None) is None
    for host in ("0.0.0.0", "::", "perf-lab", "10.1.2.3"):
        with pytest.raises(ConfigError, match="needs a sign-in"):
            server_credentials(host, None)
    # On loopback behind a proxy that the network reaches (an address for browsers on another host): the same.
    assert server_credentials("127.0.0.1", None, {"--public-url": "http://localhost:4200"}) is None
    # loopback however it is written (these were refused a start without a sign-in)
    assert server_credentials("127.1", None, {"--public-url": "http://localhost.:4200",
                                              "--results-public-url": "http://[::ffff:127.0.0.1]:81"}) is None
    for option, url in (("--public-url", "https://perf-lab.example.org"), ("--results-public-url", "http://10.1.2.3:81")):
        with pytest.raises(ConfigError, match=f"^{option}: {re.escape(url)} opens the server beyond this machine, "
                                              "which needs a sign-in"):
            server_credentials("127.0.0.1", None, {"--public-url": None, option: url})
    monkeypatch.setenv("PREFECT_SERVER_API_AUTH_STRING", "lab:correct-horse-battery-staple")
    assert server_credentials("0.0.0.0", None).source == "PREFECT_SERVER_API_AUTH_STRING"
    assert server_credentials("127.0.0.1", None, {"--public-url": "https://perf-lab.example.org"}) is not None
    # The command: one line, exit 2, before anything starts.
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_SERVER_API_AUTH_STRING"}
    said = subprocess.run([sys.executable, "-m", "flows.cli", "server", "--host", "0.0.0.0", "--database-url",
                           "postgresql+asyncpg://flagperf@127.0.0.1:5432/prefect"], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert said.returncode == 2, said.stdout + said.stderr
    lines = said.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs a sign-in" in lines[0] and "chmod 600" in lines[0], said.stderr
