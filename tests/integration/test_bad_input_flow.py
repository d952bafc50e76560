"""Bad input only the flow can see (a size the hosts cannot hold): `flagperf run` exits 2 with one line and
no traceback, as for bad input found before the flow, and no round runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL

from flagperf.paths import PROJECT_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]


def test_a_size_that_does_not_fit_is_bad_input(flagperf_env: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", "--cases", "digits-mlp", "--set", "nproc_per_node=48",
         "--results", str(flagperf_env)],
        cwd=PROJECT_ROOT, env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()},
        capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "nproc_per_node" in errors[0] and "48 processes per node" in errors[0], output
    assert "Traceback" not in output
    (run_dir,) = flagperf_env.iterdir()
    assert not (run_dir / "digits-mlp").exists()  # no round ran
