"""A results disk that fills mid-run: nothing measured is lost, the run stops with one line, a retry recovers.

The results folder is a real, small ext4 file system (a loop mount); a fixture case fills it to the last
block while its round runs, as another job on the machine would."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL
from prefect_api import all_task_runs, run_evaluate

from flagperf.paths import PROJECT_ROOT
from flagperf.results.schema import KEPT_ON_HOST, RESULTS_UNWRITABLE, read_result
from flagperf.results.summary import REPORT_MD, SUMMARY_JSON

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1.1 GB ext4 file system (sparse image, no reserved blocks): just above the 1 GiB the run's
    disk check asks for, so the check passes and the case's ballast (fallocate: no data written) fills it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a file system image needs root")
    image, mount = tmp_path / "disk.img", tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["truncate", "-s", "1100M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-m", "0", "-F", str(image)], check=True)
    done = subprocess.run(["mount", "-o", "loop", str(image), str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot loop-mount here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def _files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


def test_a_full_results_disk_loses_nothing_and_a_retry_recovers(
        flagperf_env: Path, small_disk: Path, tmp_path: Path) -> None:
    results = small_disk / "results"
    work = tmp_path / "work"
    overrides = [f"fills-disk.fill_dir={small_disk}", f"fills-disk.marker={tmp_path / 'filled'}"]
    state, run_dir = run_evaluate(results, cases=["fills-disk"], rounds=2, overrides=overrides)

    assert state.is_failed()
    message = state.message or ""
    assert RESULTS_UNWRITABLE in message and "stopped after 1 round(s)" in message and "retry" in message
    assert "\n" not in message
    # Nothing half-written on the full disk: no empty JSON, no temporary or partial file or folder.
    leftovers = [p for p in run_dir.rglob("*") if p.name.startswith(".") or (p.is_file() and p.stat().st_size == 0)]
    assert leftovers == []
    assert not (run_dir / "fills-disk").exists() or _files(run_dir / "fills-disk") == []
    # The measured round is still on the host, whole: not deleted before it was stored.
    stage = work / run_dir.name / "fills-disk" / "round1" / "localhost_noderank0"
    kept = read_result(stage / "attempt1" / "result.json")
    assert kept.status == "success" and kept.metrics[0].value > 0
    assert KEPT_ON_HOST in message and str(stage) in message
    # Round 2 never ran: the run stopped instead of measuring rounds it could not store.
    assert not (work / run_dir.name / "fills-disk" / "round2").exists()

    (small_disk / "ballast").unlink()  # space is back: retry the flow run, as from the UI
    flow_run_id = state.state_details.flow_run_id
    retry = subprocess.run(
        [sys.executable, "-m", "prefect", "flow-run", "retry", str(flow_run_id), "--entrypoint",
         "flows/evaluate.py:evaluate"],
        cwd=PROJECT_ROOT, env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()},
        capture_output=True, text=True, timeout=600)
    assert retry.returncode == 0, retry.stdout[-3000:] + retry.stderr[-3000:]
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(flow_run_id).state.is_completed()
    names = [run.name for run in all_task_runs(flow_run_id)]
    assert names.count("run_case[fills-disk/round1@localhost]") == 1  # collected from the host, not re-run
    assert names.count("run_case[fills-disk/round2@localhost]") == 1
    first = read_result(run_dir / "fills-disk" / "round1" / "localhost_noderank0" / "result.json")
    assert first.model_dump(exclude={"provenance"}) == kept.model_dump(exclude={"provenance"})  # collected, not re-run
    second = read_result(run_dir / "fills-disk" / "round2" / "localhost_noderank0" / "result.json")
    assert second.status == "success"
    assert (run_dir / SUMMARY_JSON).is_file() and (run_dir / REPORT_MD).is_file()
    assert not (work / run_dir.name).exists()  # everything collected: the host's copy is gone
