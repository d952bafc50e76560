"""The team's server as its users meet it: `flagperf server` on PostgreSQL (on a port other than 4200) with a
sign-in, making its deployments itself, then Debian's Chromium driven by Playwright: sign in to the Prefect UI,
start `evaluate` from the deployment's form, wait for it, read a run_case task's logs, open the HTML report from
the run's link artifact (the results site asks for the same credentials), see a failed run and retry it from the
UI, read the runs on the results site and a figure's trend plot, and see the nightly deployment's upcoming runs.

Needs FLAGPERF_TEST_POSTGRES_URL (deployments/postgres/test-database.sh), /usr/bin/chromium (apt-get install
chromium) and the playwright package; no browser is downloaded. Screenshots of every step are kept in
FLAGPERF_TEST_ARTIFACTS (default: test-artifacts/browser/ at the repository root)."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest
from server_ports import session_pool, start_on_os_ports
from site_probe import basic, make_run

from flows.server import api_headers, watched
from tests.unit.childio import output_of

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
SHOTS = Path(os.environ.get("FLAGPERF_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "browser"


def _missing() -> str | None:
    if not os.environ.get("FLAGPERF_TEST_POSTGRES_URL"):
        return "no PostgreSQL for the test (see deployments/postgres/test-database.sh)"
    if not CHROMIUM.is_file():
        return f"no {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the playwright package is not installed"
    return None


# In CI every part must be there (.ci/run installs them): a skip there would hide a broken set-up.
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(_missing() is not None and not os.environ.get("CI"), reason=str(_missing()))]


@dataclass
class Server:
    ui: str
    api: str
    site: str
    results: Path
    user: str
    password: str

    @functools.cached_property
    def auth(self) -> dict[str, str]:
        """The sign-in and a CSRF token: the server has CSRF protection on, and a filter is a POST."""
        return api_headers(self.api, f"{self.user}:{self.password}")


def wait_until(what: str, check, limit_s: float, every_s: float = 2.0):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            value = check()
        except httpx.HTTPError:
            value = None
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"gave up waiting for {what} after {limit_s:.0f} s")


def zone_far_from_the_nightly_hour() -> str:
    """A time zone in which it is now about 14:00, twelve hours from the nightly's 02:00: the team server's worker
    must not start a real night among the runs this test makes and counts, whenever CI runs it."""
    offset = (14 - datetime.now(timezone.utc).hour + 12) % 24 - 12  # hours east of UTC, -12..11
    return f"Etc/GMT{-offset:+d}"  # POSIX sign: Etc/GMT-3 is three hours east


@pytest.fixture(scope="module")
def team_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("team")
    password = f"browser-{os.getpid()}-{time.time_ns()}"
    auth_file = tmp / "secrets" / "server-auth"
    auth_file.parent.mkdir()
    auth_file.write_text(f"lab:{password}\n", encoding="utf-8")
    auth_file.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "FLAGPERF_AUTH_FILE"}
    # The test cases (fails-until-fixed) are on the case path: the form offers them, the worker finds them.
    env.update(FLAGPERF_SUITE_PATH=str(ROOT / "tests" / "fixtures" / "suites"), FLAGPERF_WORK_ROOT=str(tmp / "work"),
               FLAGPERF_CASE_PATH=str(ROOT / "tests" / "fixtures" / "cases"), PREFECT_HOME=str(tmp / "prefect-home"),
               FLAGPERF_TIMEZONE=zone_far_from_the_nightly_hour())

    def start_server(port: int, results_port: int) -> subprocess.Popen[bytes]:
        # Watched: a killed pytest takes it along (a stale worker would take a later session's runs).
        return subprocess.Popen(watched([sys.executable, "-m", "flows.cli", "server", "--database-url",
                                         os.environ["FLAGPERF_TEST_POSTGRES_URL"], "--port", str(port), "--pool",
                                         pool, "--results", str(tmp / "results"), "--results-port",
                                         str(results_port), "--auth-file", str(auth_file), "--log-dir",
                                         str(tmp / f"logs-{port}")]), cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)

    def said(proc: subprocess.Popen[bytes]) -> str:  # the command's words and its Prefect server's log
        log = Path(proc.args[proc.args.index("--log-dir") + 1]) / "server.log"
        return output_of(proc) + (
            log.read_text(errors="replace") if log.is_file() else "")

    signed_in = basic(f"lab:{password}")
    pool = session_pool("flagperf-browser")
    proc, port, results_port = start_on_os_ports(start_server, tmp / "prefect-home", said, headers=signed_in)
    server = Server(ui=f"http://127.0.0.1:{port}", api=f"http://127.0.0.1:{port}/api",
                    site=f"http://127.0.0.1:{results_port}", results=tmp / "results", user="lab", password=password)
    try:
        def worker_online() -> bool:
            assert proc.poll() is None, "flagperf server exited"
            # Before the worker has made its pool, the API answers 404 with a {"detail": ...} object.
            answer = httpx.post(f"{server.api}/work_pools/{pool}/workers/filter", json={}, headers=server.auth,
                                timeout=5)
            return answer.status_code == 200 and any(w["status"] == "ONLINE" for w in answer.json())

        def deployed() -> bool:  # `flagperf server` makes the deployments itself, the nightly last
            assert proc.poll() is None, "flagperf server exited"
            return httpx.get(f"{server.api}/deployments/name/nightly-regression/nightly", headers=signed_in,
                             timeout=5).status_code == 200

        wait_until("the worker", worker_online, 300)
        wait_until("the deployments", deployed, 600)
        yield server
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)


def deployment_id(server: Server, flow: str, name: str) -> str:
    return httpx.get(f"{server.api}/deployments/name/{flow}/{name}", headers=server.auth, timeout=10).json()["id"]


def flow_run(server: Server, flow_run_id: str) -> dict:
    return httpx.get(f"{server.api}/flow_runs/{flow_run_id}", headers=server.auth, timeout=10).json()


def finished(server: Server, flow_run_id: str) -> dict | None:
    run = flow_run(server, flow_run_id)
    return run if run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None


def test_sign_in_evaluate_from_the_form_fail_retry_report_site_trend_and_schedule(team_server: Server) -> None:
    from playwright.sync_api import expect, sync_playwright

    shutil.rmtree(SHOTS, ignore_errors=True)
    SHOTS.mkdir(parents=True)
    evaluate_id = deployment_id(team_server, "evaluate", "evaluate")
    nightly_id = deployment_id(team_server, "nightly-regression", "nightly")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        # The results site asks with a Basic challenge, which the browser answers with these; the Prefect UI has
        # its own login page.
        context = browser.new_context(viewport={"width": 1400, "height": 1400}, http_credentials={
            "username": team_server.user, "password": team_server.password, "origin": team_server.site})
        page = context.new_page()
        page.set_default_timeout(120_000)
        try:
            # Signing in: the UI shows its login page first, and the form once the credentials are right.
            page.goto(f"{team_server.ui}/deployments/deployment/{evaluate_id}/run", wait_until="networkidle")
            login = page.get_by_placeholder("admin:pass")
            expect(login).to_be_visible()
            page.screenshot(path=SHOTS / "0-login.png", full_page=True)
            login.fill(f"{team_server.user}:{team_server.password}")
            page.get_by_role("button", name="Login").click()
            expect(page.get_by_text("The suite to run")).to_be_visible()
            # The form: described parameters, choices from the folders, no internal parameters.
            page.goto(f"{team_server.ui}/deployments/deployment/{evaluate_id}/run", wait_until="networkidle")
            expect(page.get_by_text("The suite to run")).to_be_visible()
            expect(page.get_by_text("Seconds between monitor samples")).to_be_visible()
            assert page.get_by_text("run_id", exact=True).count() == 0
            assert page.get_by_text('Property is type "None"').count() == 0
            page.get_by_role("button", name="smoke").focus()
            page.keyboard.press("ArrowDown")  # opens the suite's list of choices
            page.get_by_role("option", name="tiny").click()
            results_field = page.locator(".schema-form-property").filter(has_text="results_dir").locator("textarea")
            results_field.fill(str(team_server.results))
            page.screenshot(path=SHOTS / "1-form.png", full_page=True)

            def runs_of_evaluate() -> list[dict]:
                return httpx.post(f"{team_server.api}/flow_runs/filter", headers=team_server.auth,
                                  json={"deployments": {"id": {"any_": [evaluate_id]}}}, timeout=10).json()

            earlier = {r["id"] for r in runs_of_evaluate()}  # none on a fresh database
            page.get_by_role("button", name="Submit").click()
            runs = wait_until("the flow run made by the form",
                              lambda: [r for r in runs_of_evaluate() if r["id"] not in earlier], 60)
            (run,) = runs
            assert run["parameters"]["suite"] == "tiny"
            page.goto(f"{team_server.ui}/runs/flow-run/{run['id']}", wait_until="networkidle")
            done = wait_until("the evaluation to finish", lambda: finished(team_server, run["id"]), 900, every_s=5)
            page.reload(wait_until="networkidle")
            page.screenshot(path=SHOTS / "2-flow-run.png", full_page=True)
            assert done["state"]["type"] == "COMPLETED", done["state"]

            # A run_case task's logs: the case's own output, no transport chatter.
            tasks = httpx.post(f"{team_server.api}/task_runs/filter", json={"sort": "EXPECTED_START_TIME_DESC"},
                               headers=team_server.auth, timeout=10).json()  # the newest first: this run's
            case_task = next(t for t in tasks if t["name"] == "run_case[computation-FP32/round1@localhost]")
            page.goto(f"{team_server.ui}/runs/task-run/{case_task['id']}", wait_until="networkidle")
            expect(page.get_by_text("gemm_fp32:").first).to_be_visible()
            assert page.get_by_text("HTTP Request").count() == 0
            page.screenshot(path=SHOTS / "3-run-case-logs.png", full_page=True)

            # The report, opened from the run's link artifact, served by the server's results service.
            page.goto(f"{team_server.ui}/runs/flow-run/{run['id']}?tab=Artifacts", wait_until="networkidle")
            page.screenshot(path=SHOTS / "4-artifacts.png", full_page=True)
            artifacts = httpx.post(f"{team_server.api}/artifacts/filter", json={
                "artifacts": {"flow_run_id": {"any_": [run["id"]]}, "key": {"any_": ["flagperf-report-html"]}}},
                headers=team_server.auth, timeout=10).json()
            page.goto(f"{team_server.ui}/artifacts/artifact/{artifacts[0]['id']}", wait_until="networkidle")
            with context.expect_page() as opened:
                page.get_by_role("link", name="report (HTML, plots)").click()
            report = opened.value
            report.wait_for_load_state("networkidle")
            expect(report.get_by_role("heading", name="FlagPerf evaluation")).to_be_visible()
            expect(report.get_by_role("heading", name="Plots")).to_be_visible()
            plots = report.locator("img")
            assert plots.count() >= 2
            # Every plot really loaded (naturalWidth is 0 for an image the browser could not fetch).
            assert all(plots.nth(i).evaluate("img => img.naturalWidth") > 0 for i in range(plots.count()))
            report.screenshot(path=SHOTS / "5-report.png", full_page=True)
            assert report.url.startswith(f"{team_server.site}/runs/")  # the results site, signed in

            # A run that fails (its input is missing), seen failed in the UI, fixed, then retried from the UI.
            marker = team_server.results.parent / "input-fixed"
            parameters = {"cases": ["fails-until-fixed"], "results_dir": str(team_server.results),
                          "overrides": [f"fails-until-fixed.marker={marker}"]}
            failing = httpx.post(f"{team_server.api}/deployments/{evaluate_id}/create_flow_run",
                                 headers=team_server.auth, json={"parameters": parameters}, timeout=10).json()
            first = wait_until("the failing evaluation to finish", lambda: finished(team_server, failing["id"]), 900,
                               every_s=5)
            assert first["state"]["type"] == "FAILED", first["state"]
            page.goto(f"{team_server.ui}/runs/flow-run/{failing['id']}", wait_until="networkidle")
            expect(page.get_by_text("Failed").first).to_be_visible()
            page.screenshot(path=SHOTS / "6-failed.png", full_page=True)
            marker.write_text("fixed\n", encoding="utf-8")
            page.get_by_role("button", name="Retry").click()
            expect(page.get_by_text(f"This will retry flow run {first['name']}")).to_be_visible()
            page.get_by_role("button", name="Retry").last.click()  # the confirmation's, shown above the page
            retried = wait_until("the retry to finish", lambda: (r := finished(team_server, failing["id"])) and r[
                "run_count"] > first["run_count"] and r, 900, every_s=5)
            page.reload(wait_until="networkidle")
            page.screenshot(path=SHOTS / "7-retried.png", full_page=True)
            assert retried["state"]["type"] == "COMPLETED", retried["state"]

            # The results site: both runs, newest first, with their outcomes and figures.
            site = context.new_page()
            site.goto(f"{team_server.site}/", wait_until="networkidle")
            runs_table = site.locator("#runs")
            rows = runs_table.locator("tr")
            assert rows.count() == 3, rows.all_inner_texts()  # the header and the two runs
            expect(rows.nth(1)).to_contain_text("succeeded")
            expect(rows.nth(2)).to_contain_text("computation-FP32 gemm_fp32")
            site.screenshot(path=SHOTS / "8-site-runs.png", full_page=True)

            # A figure's trend: nights recorded in the history (as the nightly records them), one with a drop.
            from flagperf.results.history import history_engine, record_run

            history = history_engine(results_dir=team_server.results)
            for night, value in enumerate([50.0, 50.3, 49.8, 50.1, 45.0]):
                record_run(history, make_run(team_server.results.parent / "nights", f"night{night}", value),
                           recorded_at=datetime(2026, 3, 1, 2, tzinfo=timezone.utc) + timedelta(days=night))
            history.dispose()
            site.goto(f"{team_server.site}/trends", wait_until="networkidle")
            site.locator("#series tr").filter(has_text="X1").get_by_role("link").first.click()
            site.wait_for_load_state("networkidle")
            trend = site.locator("img#trend")
            expect(trend).to_be_visible()
            assert trend.evaluate("img => img.naturalWidth") > 0
            expect(site.locator("#points")).to_contain_text("regression")
            site.screenshot(path=SHOTS / "9-trend.png", full_page=True)

            # The nightly deployment's schedule: upcoming runs.
            # The server's scheduler makes them within a minute or so of the deployment (it did so during the
            # evaluation above, as a rule); the page is reloaded until they show.
            def upcoming() -> bool:
                page.goto(f"{team_server.ui}/deployments/deployment/{nightly_id}?tab=Upcoming",
                          wait_until="networkidle")
                try:
                    expect(page.get_by_text("Scheduled for").first).to_be_visible(timeout=10_000)
                except AssertionError:
                    return False
                return True

            wait_until("the nightly deployment's upcoming runs", upcoming, 300, every_s=5)
            assert "02:00 AM every day" in page.inner_text("body")
            page.screenshot(path=SHOTS / "10-nightly-upcoming.png", full_page=True)
        except BaseException:
            page.screenshot(path=SHOTS / "failure.png", full_page=True)
            raise
        finally:
            browser.close()
