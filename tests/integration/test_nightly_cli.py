"""`flagperf nightly` as a cron job runs it: a subprocess whose exit code and verdict file are the night's outcome.
One real night on the tiny suite against a seeded baseline no CPU reaches (exit 5); bad input is one line,
exit 2, and nothing is made or measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL
from test_hosts import host_entry, write_inventory
from test_nightly import seed_history

from flows.nightly import EXIT_REGRESSION, verdict_file_name
from tests.testbed.bed import Testbed, deploy_project, make_testbed_fixture

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]
testbed = make_testbed_fixture(min_hosts=1)
ROOT = Path(__file__).resolve().parents[2]
# A multiply of well under a millisecond, timed briefly: the figure is far below the seeded baseline anyway.
SMALL = ["m=256", "n=256", "k=256", "min_duration_s=0.3"]


def flagperf_nightly(*args: str, **env_vars: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(),
           "FLAGPERF_SUITE_PATH": str(ROOT / "tests" / "fixtures" / "suites"), **env_vars}
    env = {k: v for k, v in env.items() if v}  # an empty value: unset
    return subprocess.run([sys.executable, "-m", "flows.cli", "nightly", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_regression_exits_5_with_its_verdict_file(flagperf_env: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'history.sqlite'}"
    seed_history(url, tmp_path / "seed", value=50.0)  # 50 TFLOPS of FP32 GEMM: no CPU gets near it
    sets = [arg for value in SMALL for arg in ("--set", value)]
    done = flagperf_nightly("--suite", "tiny", "--rounds", "2", *sets, "--results", str(flagperf_env),
                            "--history-url", url)
    output = done.stdout + done.stderr
    assert done.returncode == EXIT_REGRESSION, output[-3000:]
    assert "Traceback" not in output
    verdict = json.loads((flagperf_env / verdict_file_name("tiny")).read_text())
    assert verdict["exit_code"] == EXIT_REGRESSION and verdict["state"] == "Regressed"
    (run_dir,) = flagperf_env.glob("run*")
    assert verdict["run_id"] == run_dir.name and (run_dir / verdict_file_name("tiny")).is_file()
    assert (flagperf_env / "trends.csv").is_file()
    # Each verdict line and the outcome are printed: the regressed figure against its 50 TFLOPS baseline.
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("computation-FP32 gemm_fp32:")]
    assert "vs baseline 50" in line and "): regression" in line, done.stdout
    assert f"Regressed: 1 regression(s) in {run_dir.name}" in done.stdout and "(exit 5)" in done.stdout


@pytest.mark.parametrize(("args", "words"), [
    (["--suite", "no-such-suite"], ["--suite", "unknown suite 'no-such-suite'"]),
    (["--suite", "tiny", "--history-url", "not a url"], ["--history-url", "not a database URL"]),
    (["--suite", "tiny", "--set", "no_such_key=1"], ["--set", "no_such_key"]),
])
def test_bad_input_is_one_line_and_exit_2_with_nothing_made(flagperf_env: Path, args: list[str],
                                                            words: list[str]) -> None:
    done = flagperf_nightly(*args, "--results", str(flagperf_env))
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error:") and all(w in errors[0] for w in words), output
    assert "Traceback" not in output and not done.stdout  # nothing started: not even the night's first line
    assert not flagperf_env.exists()  # no results folder, no run folder, no history


def test_without_a_server_the_night_starts_its_temporary_server_before_prefect_is_loaded(flagperf_env: Path) -> None:
    """No PREFECT_API_URL (cron on a plain machine): the night's flow must run on the temporary server the command
    starts, which only works if prefect is imported after its URL is set (prefect reads its settings once).
    A server that cannot answer in time shows which server the command was starting, and that nothing else
    went first."""
    done = flagperf_nightly("--suite", "tiny", "--rounds", "1", "--results", str(flagperf_env), PREFECT_API_URL="",
                            PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="0.01")
    output = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in output, output[-3000:]
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith("error: the night could not run: RuntimeError: the Prefect server did not answer "), error


def test_bad_input_only_the_flow_finds_leaves_nothing_made(tmp_path: Path, testbed: Testbed) -> None:
    """A size an SSH host cannot hold is found by the flow's healthcheck, after the input check passed and the
    night began (its header, the history checked, a run folder made): exit 2 in one line, and what this night
    made is gone (the run folder, the results folder made for it), and no history is made, also in a folder that
    was there (a shared --history-url's: an empty history.sqlite stayed there)."""
    host = testbed.hosts[0]
    inventory = write_inventory(tmp_path, [host_entry(testbed, 0, deploy_project(ROOT, testbed))])
    results = tmp_path / "results" / "nested"
    shared = tmp_path / "shared"
    shared.mkdir()
    done = flagperf_nightly("--suite", "smoke", "--rounds", "1", "--inventory", inventory,
                            "--set", "main_memory-bandwidth.size_mib=1048576", "--results", str(results),
                            FLAGPERF_HISTORY_URL=f"sqlite:///{shared / 'history.sqlite'}")
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "main_memory-bandwidth.size_mib" in errors[0] and host.name in errors[0], output
    assert "Traceback" not in output and "nightly smoke" in done.stdout  # it had begun
    assert not (tmp_path / "results").exists(), sorted(tmp_path.rglob("*"))
    assert list(shared.iterdir()) == [], list(shared.iterdir())
