"""The team's server as its users meet it: `flagperf server` on PostgreSQL (on a port other than 4200),
`prefect deploy --all`, then Debian's Chromium driven by Playwright through the Prefect UI: start `evaluate`
from the deployment's form, wait for it, read a run_case task's logs, open the HTML report from the run's
link artifact, and see the nightly deployment's upcoming runs.

Needs FLAGPERF_TEST_POSTGRES_URL (deployments/postgres/test-database.sh), /usr/bin/chromium (apt-get install
chromium) and the playwright package; no browser is downloaded. Screenshots of every step are kept in
FLAGPERF_TEST_ARTIFACTS (default: test-artifacts/browser/ at the repository root)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from server_ports import start_on_os_ports

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
    results: Path


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


@pytest.fixture(scope="module")
def team_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("team")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(FLAGPERF_SUITE_PATH=str(ROOT / "tests" / "fixtures" / "suites"), FLAGPERF_WORK_ROOT=str(tmp / "work"),
               PREFECT_HOME=str(tmp / "prefect-home"))

    def start_server(port: int, results_port: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "flows.cli", "server", "--database-url",
                                 os.environ["FLAGPERF_TEST_POSTGRES_URL"], "--port", str(port), "--results",
                                 str(tmp / "results"), "--results-port", str(results_port), "--log-dir",
                                 str(tmp / f"logs-{port}")], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)

    def said(proc: subprocess.Popen[bytes]) -> str:  # the command's words and its Prefect server's log
        log = Path(proc.args[proc.args.index("--log-dir") + 1]) / "server.log"
        return (proc.stdout.read().decode(errors="replace") if proc.stdout else "") + (
            log.read_text(errors="replace") if log.is_file() else "")

    proc, port, _ = start_on_os_ports(start_server, tmp / "prefect-home", said)
    ui, api = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/api"
    try:
        def worker_online() -> bool:
            assert proc.poll() is None, "flagperf server exited"
            # Before the worker has made its pool, the API answers 404 with a {"detail": ...} object.
            answer = httpx.post(f"{api}/work_pools/flagperf/workers/filter", json={}, timeout=5)
            return answer.status_code == 200 and any(w["status"] == "ONLINE" for w in answer.json())

        wait_until("the worker", worker_online, 300)
        deployed = subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all"], cwd=ROOT,
                                  env={**env, "PREFECT_API_URL": api, "PWD": str(ROOT)}, capture_output=True,
                                  text=True, timeout=300)
        assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
        yield Server(ui=ui, api=api, results=tmp / "results")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)


def deployment_id(server: Server, flow: str, name: str) -> str:
    return httpx.get(f"{server.api}/deployments/name/{flow}/{name}", timeout=10).json()["id"]


def test_evaluate_from_the_form_then_logs_report_and_schedule(team_server: Server) -> None:
    from playwright.sync_api import expect, sync_playwright

    shutil.rmtree(SHOTS, ignore_errors=True)
    SHOTS.mkdir(parents=True)
    evaluate_id = deployment_id(team_server, "evaluate", "evaluate")
    nightly_id = deployment_id(team_server, "nightly-regression", "nightly")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 1400})
        page = context.new_page()
        page.set_default_timeout(120_000)
        try:
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
                return httpx.post(f"{team_server.api}/flow_runs/filter",
                                  json={"deployments": {"id": {"any_": [evaluate_id]}}}, timeout=10).json()

            earlier = {r["id"] for r in runs_of_evaluate()}  # none on a fresh database
            page.get_by_role("button", name="Submit").click()
            runs = wait_until("the flow run made by the form",
                              lambda: [r for r in runs_of_evaluate() if r["id"] not in earlier], 60)
            (run,) = runs
            assert run["parameters"]["suite"] == "tiny"
            page.goto(f"{team_server.ui}/runs/flow-run/{run['id']}", wait_until="networkidle")
            finished = wait_until("the evaluation to finish", lambda: (r := httpx.get(
                f"{team_server.api}/flow_runs/{run['id']}", timeout=10).json())["state"]["type"] in (
                "COMPLETED", "FAILED", "CRASHED", "CANCELLED") and r, 900, every_s=5)
            page.reload(wait_until="networkidle")
            page.screenshot(path=SHOTS / "2-flow-run.png", full_page=True)
            assert finished["state"]["type"] == "COMPLETED", finished["state"]

            # A run_case task's logs: the case's own output, no transport chatter.
            tasks = httpx.post(f"{team_server.api}/task_runs/filter", json={"sort": "EXPECTED_START_TIME_DESC"},
                               timeout=10).json()  # the newest first: this run's
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
                timeout=10).json()
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
            page.screenshot(path=SHOTS / "6-nightly-upcoming.png", full_page=True)
        except BaseException:
            page.screenshot(path=SHOTS / "failure.png", full_page=True)
            raise
        finally:
            browser.close()
