"""A probe of a results service as an outsider and as a signed-in user would try it: directory listings,
links out of the folder (to /etc), `..` raw and percent-encoded (sent byte for byte with http.client: httpx and
browsers resolve `..` before sending), the history database, logs (controller.log, the server's own), a job's
secrets, writes, and access without signing in. Used on the results site of `flagperf server` and, to show it
can fail, on a plain file server like the one it replaced."""

from __future__ import annotations

import base64
import http.client
import os
import sqlite3
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from flagperf.results.history import history_engine, record_run
from flagperf.results.report import build_report
from flagperf.results.schema import Metric, RoundResult, write_result

JOB_SECRET = "job-secret-7f3a1c"  # in a job.json: never to be served
LOG_LINE = "log-line-only-in-logs-91b2"  # in controller.log and the server's logs
OUTSIDE = "outside-the-results-folder-5d0e"  # in a file beside the results folder


@dataclass
class Planted:
    root: Path
    run_id: str
    etc_marker: bytes  # what /etc/hostname holds: served through a link, it would show


def make_run(root: Path, run_id: str, value: float) -> Path:
    run = root / run_id
    for rnd in (1, 2):
        result = RoundResult(
            run_id=run_id, case="computation-FP32", family="base", round=rnd, host="h1", node_rank=0, vendor="cpu",
            status="success", started_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
            finished_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
            duration_s=1.0, measured_seconds=1.0, device="X1",
            metrics=[Metric(name="gemm_fp32", value=value + rnd * 0.1, unit="TFLOPS")], config={})
        write_result(run / "computation-FP32" / f"round{rnd}" / "h1_noderank0" / "result.json", result)
    build_report(run)
    return run


def plant(root: Path) -> Planted:
    """A results folder holding one real run and everything that must not be served."""
    run = make_run(root, "run-probe", 10.0)
    record_run(history_engine(results_dir=root), run)  # root/history.sqlite, as the nightly writes it
    (run / "controller.log").write_text(f"{LOG_LINE} controller\n", encoding="utf-8")
    job = run / "computation-FP32" / "round1" / "h1_noderank0" / "job.json"
    job.write_text(f'{{"env": {{"TOKEN": "{JOB_SECRET}"}}}}', encoding="utf-8")
    (root / "server").mkdir(exist_ok=True)  # `flagperf server`'s default log folder lies in the results folder
    (root / "server" / "server.log").write_text(f"{LOG_LINE} server\n", encoding="utf-8")
    (root / "server" / "worker.log").write_text(f"{LOG_LINE} worker\n", encoding="utf-8")
    (root.parent / "outside.txt").write_text(OUTSIDE, encoding="utf-8")
    os.symlink("/etc", root / "etc-link")
    os.symlink("/etc", run / "etc-link")
    os.symlink("/etc/hostname", run / "plots" / "hostname.png")
    os.symlink(run, root / "run-linked")  # a run folder that is a link: not followed either
    (run / "report-link.html").symlink_to("/etc/hostname")
    try:
        marker = Path("/etc/hostname").read_bytes().strip() or b"\x00never"
    except OSError:
        marker = b"\x00never"
    return Planted(root, run.name, marker)


def basic(auth_string: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(auth_string.encode()).decode()}


def request(port: int, target: str, headers: dict[str, str] | None = None, method: str = "GET",
            body: bytes | None = None) -> tuple[int, bytes]:
    """The request target sent byte for byte."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, target, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# Addresses a file server would answer, and the site's own: each for something that must not be reached.
FORBIDDEN = [
    # listings
    "/", "/runs/", "/run-probe/", "/runs/run-probe/plots/", "/run-probe/plots/", "/server/",
    # links out of the folder
    "/etc-link/hostname", "/etc-link/", "/run-probe/etc-link/hostname", "/runs/etc-link/", "/runs/run-probe/etc-link",
    "/runs/run-probe/plots/hostname.png", "/run-probe/plots/hostname.png", "/runs/run-linked/",
    "/runs/run-linked/report.html", "/run-linked/report.html", "/runs/run-probe/report-link.html",
    "/run-probe/report-link.html",
    # `..`, raw and percent-encoded
    "/../outside.txt", "/run-probe/../../outside.txt", "/runs/../../outside.txt",
    "/runs/run-probe/../../../outside.txt",
    "/%2e%2e/outside.txt", "/%2E%2E%2Foutside.txt", "/runs/%2e%2e/%2e%2e/outside.txt", "/runs/..%2f..%2foutside.txt",
    "/runs/run-probe/..%2f..%2f..%2foutside.txt", "/..%5coutside.txt", "//../outside.txt",
    # the database
    "/history.sqlite", "/runs/history.sqlite", "/runs/history.sqlite/", "/runs/run-probe/../history.sqlite",
    # logs and a job's secrets
    "/run-probe/controller.log", "/runs/run-probe/controller.log", "/server/server.log", "/server/worker.log",
    "/runs/server/", "/runs/server/server.log",
    "/run-probe/computation-FP32/round1/h1_noderank0/job.json", "/runs/run-probe/job.json",
    "/runs/run-probe/computation-FP32/round1/h1_noderank0/job.json", "/run-probe/summary.json",
]


def leaks(body: bytes, planted: Planted) -> list[str]:
    found = []
    for what, marker in (("a directory listing", b"Directory listing for"), ("/etc", planted.etc_marker),
                         ("the history database", b"SQLite format 3"), ("a log", LOG_LINE.encode()),
                         ("a job's secret", JOB_SECRET.encode()), ("a file outside the folder", OUTSIDE.encode()),
                         ("a folder's entries", b'href="computation-FP32/"'),
                         ("a folder's entries", b'href="etc-link')):
        if marker in body:
            found.append(what)
    return found


def probe(port: int, planted: Planted, auth: dict[str, str] | None) -> list[str]:
    """What the service at ``port`` gives away; empty when nothing. ``auth``: the sign-in it should ask for
    (None: it is meant to be open, on loopback)."""
    findings = []
    signed_in = auth or {}
    # It must work at all: the run's report and a plot, signed in (so the probe cannot pass on an empty server).
    report_at = [t for t in (f"/runs/{planted.run_id}/report.html", f"/{planted.run_id}/report.html")
                 if request(port, t, signed_in)[0] == 200]
    if not report_at:
        findings.append("the run's report is not served at all")
    if auth is not None:
        for target in ["/", *report_at, f"/runs/{planted.run_id}/", "/trends", "/compare"]:
            status, body = request(port, target)
            if status != 401:
                findings.append(f"{target} answers {status} without signing in")
            status, _ = request(port, target, basic("intruder:not-the-password-at-all"))
            if status != 401:
                findings.append(f"{target} answers {status} to a wrong password")
    for target in FORBIDDEN:
        status, body = request(port, target, signed_in)
        for what in leaks(body, planted):
            findings.append(f"{target} ({status}) shows {what}")
        if status == 200 and target != "/":
            findings.append(f"{target} answers 200")
    history = sqlite3.connect(planted.root / "history.sqlite").execute("select count(*) from runs").fetchone()[0]
    for method in ("PUT", "POST", "DELETE", "PATCH"):
        target = f"/runs/{planted.run_id}/report.html"
        status, _ = request(port, target, signed_in, method, b"overwritten")
        if 200 <= status < 300:
            findings.append(f"{method} {target} answers {status}")
    if sqlite3.connect(planted.root / "history.sqlite").execute("select count(*) from runs").fetchone()[0] != history:
        findings.append("the history changed")
    return findings


# What uvicorn answers by itself, before any app sees the request: a request line that is no HTTP (h11's 400), a
# websocket handshake without its key (400) or of a version it does not speak (426).
MALFORMED = (b"NOT HTTP AT ALL\r\n\r\n",
             b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             b"Sec-WebSocket-Version: 13\r\n\r\n",
             b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 99\r\n\r\n")


def raw_exchange(port: int, data: bytes) -> tuple[int, list[tuple[str, str]]]:
    """``data`` sent as it is over a socket; the answer's status and headers, read until the server closes."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(data)
        said = b""
        while b"\r\n\r\n" not in said and (chunk := conn.recv(65536)):
            said += chunk
    head = said.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    assert head[0].startswith("HTTP/1.1 "), said[:300]
    pairs = [line.split(":", 1) for line in head[1:]]
    return int(head[0].split()[1]), [(name.strip().lower(), value.strip()) for name, value in pairs]


def assert_own_answers_carry(port: int, wanted: dict[str, str]) -> None:
    """uvicorn's own answers to MALFORMED requests carry each of ``wanted`` (header: a part of its value) once."""
    for data in MALFORMED:
        status, headers = raw_exchange(port, data)
        assert status in (400, 426), (data, status)
        for name, part in wanted.items():
            values = [value for key, value in headers if key == name.lower()]
            assert len(values) == 1 and part in values[0], (data, name, headers)
