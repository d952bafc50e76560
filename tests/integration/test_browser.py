"""The team's server as its users meet it: `flagperf server` on PostgreSQL (on a port other than 4200) with a
sign-in, making its deployments itself, then Debian's Chromium driven by Playwright. In the classic (V1) Prefect
UI: sign in, start `evaluate` from the deployment's form, wait for it, read a run_case task's logs, open the HTML
report from the run's link artifact (the results site asks for the same credentials), see a failed run and retry
it from the UI, read the runs on the results site and a figure's trend plot, and see the nightly deployment's
upcoming runs. In the UI Prefect opens by default (the newer one): sign in, start `evaluate` with custom
parameters from its form, see it complete, read the run's, the round's and the run_case task's logs, and find
where docs/ui.md says the report, a retry and the nightly's schedule editor are. Both share one server.

Needs FLAGPERF_TEST_POSTGRES_URL (deployments/postgres/test-database.sh), /usr/bin/chromium (apt-get install
chromium) and the playwright package; no browser is downloaded. Screenshots of every step are kept in
FLAGPERF_TEST_ARTIFACTS (default: test-artifacts/browser/ and browser-default-ui/ at the repository root)."""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from server_ports import database_pool, online_since, start_on_os_ports
from site_probe import basic, make_run

from flagperf.paths import RESULTS_DIR_ENV
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
    pool = database_pool()
    started = datetime.now(timezone.utc)
    proc, port, results_port = start_on_os_ports(start_server, tmp / "prefect-home", said, headers=signed_in)
    server = Server(ui=f"http://127.0.0.1:{port}", api=f"http://127.0.0.1:{port}/api",
                    site=f"http://127.0.0.1:{results_port}", results=tmp / "results", user="lab", password=password)
    try:
        def worker_online() -> bool:
            assert proc.poll() is None, "flagperf server exited"
            # Before the worker has made its pool, the API answers 404 with a {"detail": ...} object.
            answer = httpx.post(f"{server.api}/work_pools/{pool}/workers/filter", json={}, headers=server.auth,
                                timeout=5)
            return answer.status_code == 200 and any(online_since(w, started) for w in answer.json())

        def deployed() -> bool:
            """`flagperf server` makes the deployments itself, then gives them its pool and results folder. On a
            database this session's earlier servers used they exist from the start, with those servers' results
            folder (a form opened then would start a run that writes where no site serves)."""
            assert proc.poll() is None, "flagperf server exited"
            for name in ("evaluate/evaluate", "nightly-regression/nightly"):
                answer = httpx.get(f"{server.api}/deployments/name/{name}", headers=signed_in, timeout=5)
                if answer.status_code != 200:
                    return False
                made = answer.json()
                env = (made.get("job_variables") or {}).get("env") or {}
                if made["work_pool_name"] != pool or env.get(RESULTS_DIR_ENV) != str(server.results.resolve()):
                    return False
            return True

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


@contextmanager
def browser_page(shots: Path, **context_options: Any) -> Iterator[tuple[Any, Any]]:
    """Chromium with one page (and its context) for a test; a screenshot of the page where the test failed, in
    ``shots``, and the browser closed either way."""
    from playwright.sync_api import expect, sync_playwright

    # expect()'s own wait is 5 s by default, apart from the page's: on a loaded machine the UI takes longer to
    # show what it will show, and a verdict must not depend on load (the deadline is generous, the wait ends when
    # the element is there)
    expect.set_options(timeout=120_000)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1400}, **context_options)
            page = context.new_page()
            page.set_default_timeout(120_000)
            try:
                yield context, page
            except BaseException:
                page.screenshot(path=shots / "failure.png", full_page=True)
                raise
        finally:
            browser.close()


def test_sign_in_evaluate_from_the_form_fail_retry_report_site_trend_and_schedule(team_server: Server) -> None:
    from playwright.sync_api import expect

    shutil.rmtree(SHOTS, ignore_errors=True)
    SHOTS.mkdir(parents=True)
    evaluate_id = deployment_id(team_server, "evaluate", "evaluate")
    nightly_id = deployment_id(team_server, "nightly-regression", "nightly")
    # The results site asks with a Basic challenge, which the browser answers with these; the Prefect UI has
    # its own login page.
    credentials = {"username": team_server.user, "password": team_server.password, "origin": team_server.site}
    with browser_page(SHOTS, http_credentials=credentials) as (context, page):
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
        # its card on the key's page (every run's) names the run it belongs to
        named, _, said = artifacts[0]["description"].partition(": ")
        assert named.endswith(run["id"].replace("-", "")[-12:]) and said.startswith("the HTML report"), artifacts[0]
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

        # The results site: both runs, newest first, with their outcomes and figures. (Only these two: the
        # module's other test leaves its run there too.) A run's folder ends with its flow run id's tail.
        site = context.new_page()
        site.goto(f"{team_server.site}/", wait_until="networkidle")
        runs_table = site.locator("#runs")
        folders = [flow_run_id.replace("-", "")[-12:] for flow_run_id in (failing["id"], run["id"])]
        rows = runs_table.locator("tr").filter(has_text=re.compile("|".join(folders)))
        assert rows.count() == 2, runs_table.locator("tr").all_inner_texts()
        expect(rows.nth(0)).to_contain_text(folders[0])
        expect(rows.nth(0)).to_contain_text("succeeded")
        expect(rows.nth(1)).to_contain_text(folders[1])
        expect(rows.nth(1)).to_contain_text("computation-FP32 gemm_fp32")
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

    # After runs through the worker (started from a form, failed, retried from the UI): the sign-in, which the
    # worker and its flow runs hold in their environment, is in no record of them: not in the database (flow
    # runs, parameters, logs, events, artifacts), the run folders (plan, results, reports) or the server's logs.
    assert secret_found(team_server) == []


def secret_found(server: Server) -> list[str]:
    """Where the server's password, or the Basic header made of it, appears: the database (all of it, as pg_dump
    writes it), the files of the results folder and of the folders beside it that the server, the worker and the
    rounds write: the logs folders, PREFECT_HOME (Prefect's own files: profiles, its local result storage) and the
    work root (the rounds' staging folders on the host). Not the sign-in's own file (secrets/)."""
    import base64

    secrets = [server.password.encode(),
               base64.b64encode(f"{server.user}:{server.password}".encode())]
    dsn = os.environ["FLAGPERF_TEST_POSTGRES_URL"].replace("postgresql+asyncpg://", "postgresql://")
    assert shutil.which("pg_dump"), "no pg_dump to read the database with (apt-get install postgresql-client)"
    dump = subprocess.run(["pg_dump", "--data-only", dsn], capture_output=True, timeout=300)
    assert dump.returncode == 0, dump.stderr.decode(errors="replace")
    found = ["the database" for secret in secrets if secret in dump.stdout]
    beside = server.results.parent
    written = [server.results, *beside.glob("logs-*"), beside / "prefect-home", beside / "work"]
    # each one searched is there, as the fixture named it: a folder missing (the work root too, made once a round ran
    # on the local host, as every run here does) would be searched as empty, and the test pass without looking
    missing = [str(folder) for folder in written if not folder.is_dir()]
    assert not missing and len(written) > 3, f"not there to search for the sign-in: {missing} (of {written})"
    for path in [path for folder in written for path in folder.rglob("*")]:
        if path.is_file() and not path.is_symlink() and any(s in path.read_bytes() for s in secrets):
            found.append(str(path))
    return found


def test_default_ui_sign_in_evaluate_from_the_form_and_read_the_round_s_log(team_server: Server) -> None:
    """What a lab member does first, in the UI Prefect opens by default (the newer one, under /v2): sign in, find
    the evaluate deployment, start a run with their own parameters from its form, see it complete, and read its
    log, its round's and the run_case task's; the places docs/ui.md names for the report, a retry and the
    nightly's schedule are there."""
    from playwright.sync_api import expect

    shots = SHOTS.parent / "browser-default-ui"
    shutil.rmtree(shots, ignore_errors=True)
    shots.mkdir(parents=True)
    evaluate_id = deployment_id(team_server, "evaluate", "evaluate")
    with browser_page(shots) as (_, page):
        # The server's address opens the default UI, at its sign-in.
        page.goto(team_server.ui, wait_until="networkidle")
        login = page.get_by_placeholder("admin:pass")
        expect(login).to_be_visible()
        assert urlsplit(page.url).path.startswith("/v2/"), page.url  # the newer UI, not V1
        login.fill(f"{team_server.user}:{team_server.password}")
        page.get_by_role("button", name="Login").click()
        expect(page.get_by_role("button", name="Switch to V1 UI")).to_be_visible()

        # Deployments, evaluate (the first link of its cell: the deployment, above its flow), Run, Custom run.
        page.get_by_role("link", name="Deployments", exact=True).click()
        expect(page.get_by_role("row").filter(has_text="host-round")).to_contain_text("internal")
        page.get_by_role("cell", name="evaluate evaluate", exact=True).get_by_role("link").first.click()
        page.get_by_role("button", name="Run", exact=True).click()
        expect(page.get_by_role("menuitem", name="Quick run")).to_be_visible()
        page.get_by_role("menuitem", name="Custom run").click()

        # The form: described fields, choices from the folders, lists to add to; the tiny suite, one round
        # of a smaller multiply than its own.
        expect(page.get_by_text("The suite to run")).to_be_visible()
        assert page.get_by_text("run_id", exact=True).count() == 0
        page.get_by_role("button", name="Select suite").click()
        page.get_by_role("option", name="tiny", exact=True).click()
        page.get_by_role("spinbutton", name="rounds (Optional)").fill("1")
        overrides = page.get_by_role("group").filter(has=page.get_by_role("button", name="Add item"))
        for setting in ("m=1024", "n=1024", "k=1024"):
            overrides.get_by_role("button", name="Add item").click()
            overrides.get_by_role("textbox").last.fill(setting)
        run_name = page.get_by_role("textbox", name="Run Name").input_value()
        page.screenshot(path=shots / "1-form.png", full_page=True)
        page.get_by_role("button", name="Submit").click()

        def the_run() -> list[dict]:
            return httpx.post(f"{team_server.api}/flow_runs/filter", headers=team_server.auth, timeout=10, json={
                "deployments": {"id": {"any_": [evaluate_id]}}, "flow_runs": {"name": {"any_": [run_name]}}}
                              ).json()

        (run,) = wait_until("the flow run made by the form", the_run, 60)
        assert {k: run["parameters"][k] for k in ("suite", "rounds", "overrides", "results_dir")} == {
            "suite": "tiny", "rounds": 1, "overrides": ["m=1024", "n=1024", "k=1024"], "results_dir": ""}
        # The form leads back to the deployment, where the new run is listed.
        expect(page.get_by_role("link", name=run_name).first).to_be_visible()
        done = wait_until("the evaluation to finish", lambda: finished(team_server, run["id"]), 900, every_s=1)
        assert done["state"]["type"] == "COMPLETED", done["state"]

        # The run: Completed; its log has each host's checks (naming the host: this UI shows no task name on
        # a flow run's lines) and the report's address on the results site.
        page.reload(wait_until="networkidle")
        page.get_by_role("link", name=run_name).first.click()
        expect(page.locator("main").get_by_text("Completed", exact=True).first).to_be_visible()
        expect(page.get_by_text("ok host localhost: deployed: flagperf")).to_be_visible()
        report_address = re.compile(rf"^{re.escape(team_server.site)}/runs/run\w+-\w+/report\.html$")
        report = page.get_by_role("link", name=f"{team_server.site}/runs/run")
        expect(report).to_have_attribute("href", report_address)
        page.screenshot(path=shots / "2-flow-run-log.png", full_page=True)
        flow_run_page = page.url

        # Retry is in the run's menu (shown for a finished run; not used here: the V1 test retries).
        page.locator("main").get_by_role("button", name="Open menu").first.click()
        expect(page.get_by_role("menuitem", name="Retry")).to_be_visible()
        page.goto(flow_run_page, wait_until="networkidle")

        # The round: one (the form's rounds, not the suite's 2), named CASE/roundN@HOST; its log has the case's
        # measured figure, and so has its run_case task's.
        page.get_by_role("tab", name="Subflow Runs").click()
        round_link = page.get_by_role("link", name="computation-FP32/round1@localhost", exact=True)
        expect(round_link).to_be_visible()
        expect(page.get_by_role("link", name="computation-FP32/round")).to_have_count(1)
        round_link.click()
        figure = re.compile(r"gemm_fp32: \d+(\.\d+)? TFLOPS .* of peak")
        expect(page.get_by_text(figure)).to_be_visible()
        # Its Parameters: what names the round, not the host's whole probe (the round reads that from the run
        # folder), which made the tab a page of libraries, limits and peaks.
        page.get_by_role("tab", name="Parameters").click()
        parameters = page.get_by_role("tabpanel", name="Parameters")
        expect(parameters).to_contain_text('"case": "computation-FP32"')
        expect(parameters).not_to_contain_text('"probe"')
        expect(parameters).to_contain_text('"round_no": 1')  # the whole of it shown (an editor shows what fits)
        page.screenshot(path=shots / "3a-round-parameters.png", full_page=True)
        page.get_by_role("tab", name="Task Runs").click()
        page.get_by_role("link", name="run_case[computation-FP32/round1@localhost]", exact=True).click()
        expect(page.get_by_text(figure)).to_be_visible()
        assert page.get_by_text("HTTP Request").count() == 0
        page.screenshot(path=shots / "3-run-case-log.png", full_page=True)

        # The report: the run's Artifacts, flagperf-report-html (the key's page: every run's), this run's.
        page.goto(flow_run_page, wait_until="networkidle")
        page.get_by_role("tab", name="Artifacts").click()
        page.get_by_role("link", name="flagperf-report-html").click()
        page.locator("main").get_by_role("paragraph").filter(has_text=f"Flow run: {run_name}").locator(
            "xpath=..").get_by_role("link").first.click()
        expect(page.get_by_role("link", name="report (HTML, plots)")).to_have_attribute("href", report_address)
        page.screenshot(path=shots / "4-report-artifact.png", full_page=True)

        # The nightly's schedule: its time on the card, with its on/off switch; Edit shows the cron and zone.
        page.get_by_role("link", name="Deployments", exact=True).click()
        page.get_by_role("cell", name="nightly nightly-regression", exact=True).get_by_role("link").first.click()
        expect(page.get_by_role("switch", name="toggle At 02:00 AM")).to_be_checked()
        page.get_by_role("complementary").get_by_role("button", name="Open menu").click()
        page.get_by_role("menuitem", name="Edit").click()
        dialog = page.get_by_role("dialog", name="Edit Schedule")
        expect(dialog.get_by_role("textbox", name="Value")).to_have_value("0 2 * * *")
        # the zone the deployment's schedule has (the fixture's FLAGPERF_TIMEZONE, Etc/GMT<offset>; on a database
        # an earlier server left a nightly on, the schedule kept from it), by the name the dialog gives it
        nightly = httpx.get(f"{team_server.api}/deployments/name/nightly-regression/nightly", headers=team_server.auth,
                            timeout=10).json()
        zone = nightly["schedules"][0]["schedule"]["timezone"]
        shown = re.match(r"[A-Za-z_]+", zone.rsplit("/", 1)[-1]).group()  # Etc/GMT+7: GMT; Etc/UTC: UTC
        expect(dialog.get_by_role("button", name="Select timezone")).to_contain_text(shown)
        page.screenshot(path=shots / "5-nightly-schedule.png", full_page=True)
