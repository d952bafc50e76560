"""A case whose launcher died while it was starting (torch's import takes seconds) stops at once: its parent
watch alone would compare against the new parent and never fire, leaving the case running unobserved."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from flagperf.entry import EXIT_ORPHANED
from flagperf.hosts.local import PARENT_PID_ENV, LocalHost

ROOT = Path(__file__).resolve().parents[2]
WATCH_THEN_SLEEP = "from flagperf.entry import watch_parent; watch_parent(); print('watching', flush=True)"


def run_with_parent_env(value: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != PARENT_PID_ENV}
    if value is not None:
        env[PARENT_PID_ENV] = value
    return subprocess.run([sys.executable, "-c", WATCH_THEN_SLEEP], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_case_started_by_a_process_that_is_gone_exits_as_orphaned() -> None:
    # This test process is the child's parent; a launcher pid that is not it means the launcher died.
    other = str(os.getpid() + 1_000_000)
    done = run_with_parent_env(other)
    assert done.returncode == EXIT_ORPHANED
    assert f"the process that started this case ({other}) is gone" in done.stderr and "watching" not in done.stdout


def test_a_case_whose_launcher_is_alive_keeps_running() -> None:
    done = run_with_parent_env(str(os.getpid()))
    assert done.returncode == 0 and "watching" in done.stdout
    assert run_with_parent_env(None).returncode == 0  # started by hand: nothing to compare with


def test_local_host_tells_its_children_who_started_them(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    host = LocalHost(work_root=tmp_path)
    result = host.run([sys.executable, "-c", f"import os; print(os.environ['{PARENT_PID_ENV}'] == str(os.getppid()))"],
                      timeout=60, log_path=log)
    assert result.exit_code == 0, log.read_text()
    assert log.read_text().strip().splitlines()[-1] == "True"
