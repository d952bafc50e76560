"""A results disk that fills mid-run: nothing measured is lost, the run stops with one line, a retry recovers.

The results folder is a real, small file system (an ext4 loop mount for the flow, a tmpfs for `flagperf
run`); a fixture case fills it to the last block while its round runs, as another job on the machine would,
so the disk is full exactly while a measured round waits to be stored."""

from __future__ import annotations

import os
import shlex
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
from flows.progress import CONTROLLER_LOG
from tests.unit.mounts import fill_to_the_last_block, mounted_tmpfs

pytestmark = pytest.mark.integration
FIXTURE_CASES = Path(__file__).resolve().parents[1] / "fixtures" / "cases"


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


def _debris(folder: Path) -> list[Path]:
    """What a write that did not fit could leave: temporary or partial names, 0-byte files."""
    return [p for p in folder.rglob("*") if p.name.startswith(".") or (p.is_file() and p.stat().st_size == 0)]


@pytest.mark.usefixtures("prefect_server")
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


def flagperf_run(args: list[str], tmp_path: Path, api_url: str | None = None) -> subprocess.CompletedProcess[str]:
    """`flagperf run` as a user starts it: its own temporary Prefect server (or the one at ``api_url``), the
    fixture cases on the case path, the host's work root under tmp_path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(FLAGPERF_CASE_PATH=str(FIXTURE_CASES), FLAGPERF_WORK_ROOT=str(tmp_path / "work"),
               PREFECT_HOME=str(tmp_path / "prefect-home"), **({"PREFECT_API_URL": api_url} if api_url else {}))
    return subprocess.run([sys.executable, "-m", "flows.cli", "run", *args], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_flagperf_run_stops_with_one_line_on_a_disk_that_fills_and_its_retry_collects_the_round(
        tmp_path: Path) -> None:
    """The issue's run: a tmpfs results folder filled while round 1 runs. The round stays on the host, the
    controller says so in one line (and once that it cannot write its log), exits 1; `--retry` after space
    is freed stores that very round and runs round 2."""
    with mounted_tmpfs(tmp_path / "disk", "size=1100m") as disk:  # just above the run's 1 GiB check
        results = disk / "results"
        args = ["--cases", "fills-disk", "--rounds", "2", "--set", f"fills-disk.fill_dir={disk}",
                "--set", f"fills-disk.marker={tmp_path / 'filled'}", "--results", str(results)]
        stopped = flagperf_run(args, tmp_path)

        assert stopped.returncode == 1, stopped.stdout[-3000:] + stopped.stderr[-3000:]
        errors = _lines(stopped.stderr)
        assert "Traceback" not in stopped.stderr + stopped.stdout and len(errors) <= 3, stopped.stderr[-5000:]
        assert any(CONTROLLER_LOG in line and "No space left on device" in line for line in errors)
        (run_dir,) = results.iterdir()
        stage = tmp_path / "work" / run_dir.name / "fills-disk" / "round1" / "localhost_noderank0"
        last = errors[-1]
        assert last.startswith("error: ") and RESULTS_UNWRITABLE in last and f"{KEPT_ON_HOST} localhost:{stage}" in last
        # The measured round is on the host, whole; nothing of it (and nothing empty) is on the full disk.
        kept = stage / "attempt1" / "result.json"
        measured = read_result(kept)
        assert measured.status == "success" and measured.metrics[0].value > 0
        kept_bytes = kept.read_bytes()
        assert _debris(disk) == [] and _files(run_dir / "fills-disk") == []
        assert not (tmp_path / "work" / run_dir.name / "fills-disk" / "round2").exists()  # nothing measured for nothing

        # The line says how to go on: the same command with --retry.
        retry_command = shlex.split(last.split("`")[1])
        assert retry_command[:2] == ["flagperf", "run"] and retry_command[-2:] == ["--retry", str(run_dir)]
        (disk / "ballast").unlink()  # space is back
        retried = flagperf_run(retry_command[2:], tmp_path)

        assert retried.returncode == 0, retried.stdout[-3000:] + retried.stderr[-3000:]
        assert "Traceback" not in retried.stderr + retried.stdout and _lines(retried.stderr) == []
        stored = run_dir / "fills-disk" / "round1" / "localhost_noderank0" / "result.json"
        assert stored.read_bytes() == kept_bytes  # collected as measured, not measured again
        assert read_result(run_dir / "fills-disk" / "round2" / "localhost_noderank0" / "result.json").status == \
            "success"
        assert (run_dir / SUMMARY_JSON).is_file() and (run_dir / REPORT_MD).is_file()
        assert "collecting the round an earlier attempt measured" in (run_dir / CONTROLLER_LOG).read_text()
        assert not (tmp_path / "work" / run_dir.name).exists()  # everything stored: the host's copy is gone
        assert [p for p in disk.rglob(".*")] == []  # no temporary or partial file (a monitor's log may be empty)


def test_flagperf_run_on_a_full_results_disk_refuses_in_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "disk", "size=4m") as disk:
        ballast = fill_to_the_last_block(disk)
        done = flagperf_run(["--cases", "computation-FP32", "--results", str(disk / "results")], tmp_path)
        assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
        assert _lines(done.stderr) == [f"error: --results: {disk / 'results'}: cannot write there: No space left on "
                                       "device"]
        assert "Traceback" not in done.stdout
        assert [p for p in disk.rglob("*") if p.is_file()] == [ballast]  # no run folder, no 0-byte file


@pytest.mark.usefixtures("prefect_server")
def test_a_results_disk_that_fills_before_the_flow_plans_leaves_nothing(tmp_path: Path) -> None:
    """A disk out of inodes once the run folder is claimed (another job took the last one): `flagperf run`'s check
    wrote there, the flow cannot write its plan. One line, exit 1, and the run folder and the results folders
    made for it go again, as for any run that did not begin."""
    with mounted_tmpfs(tmp_path / "disk", "size=4m,nr_inodes=4") as disk:  # the root, nested, results, the run
        done = flagperf_run(["--cases", "computation-FP32", "--results", str(disk / "nested" / "results"),
                             "--run-id", "first"], tmp_path, PREFECT_API_URL.value())
        assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
        (line,) = _lines(done.stderr)
        assert line.startswith(f"error: cannot write {disk / 'nested' / 'results' / 'first'}/"), line
        assert line.endswith(": No space left on device") and "Traceback" not in done.stdout, line
        assert list(disk.iterdir()) == []
