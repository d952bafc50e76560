"""`flagperf run` stopped from outside (Ctrl-C: SIGINT to the terminal's process group, SIGTERM, or SIGKILL: nothing
of the controller can react) while a round runs, while a round is collected, or while the run is set up, then
continued: exit 128 + the signal and one line, no traceback; every record in the run folder is whole or absent,
`flagperf report` rebuilds the report, no case or monitor process outlives the controller, and `--retry` runs only
the lost round (the completed one is kept as it was; a measured one is collected, not run again). Each phase is
reached on a condition (a file the case writes, the partial folder of a collection, the run's header line), never
on a timer."""

from __future__ import annotations

import csv
import dataclasses
import http.server
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import psutil
import pytest

from flagperf.hosts.local import CommandResult, LocalHost
from flagperf.results.controller import CONTROLLER_FILE, held_by
from flagperf.results.schema import RESULT_FILE, read_result
from flagperf.results.summary import REPORT_MD, SUMMARY_JSON, hosts_left_out, summarize
from tests.unit.childio import Lines, output_of

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
FIXTURE_CASES = ROOT / "tests" / "fixtures" / "cases"


def flagperf(args: list[str], tmp_path: Path, api_url: str | None = None) -> subprocess.Popen[str]:
    """The CLI with its temporary server, or on the server at ``api_url``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    if api_url:
        env["PREFECT_API_URL"] = api_url
    env.update(FLAGPERF_CASE_PATH=str(FIXTURE_CASES), FLAGPERF_WORK_ROOT=str(tmp_path / "work"),
               PREFECT_HOME=str(tmp_path / "prefect-home"))
    # Its own process group, as a command started in a terminal is: Ctrl-C there signals the whole group.
    return subprocess.Popen([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def stop(proc: subprocess.Popen[str], sig: signal.Signals) -> None:
    """Ctrl-C as a terminal sends it, to the foreground process group (the controller and every child that
    stayed in it); other signals to the controller alone, as `kill PID` does."""
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)


def wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    """Until ``path`` exists (the case wrote it); the controller must still be running meanwhile."""
    deadline = time.monotonic() + 600  # a guard against a hang, not a timing assumption
    while not path.exists():
        assert proc.poll() is None, output_of(proc)
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def command_line(process: psutil.Process) -> str:
    """A process's command line, or "" once it has ended: a short-lived child listed a moment ago can be gone or a
    zombie by now (is_running() is true for a zombie, whose cmdline() raises)."""
    try:
        return " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):  # ZombieProcess is a NoSuchProcess
        return ""


def interrupted_in_one_line(out: str, run_dir: Path) -> None:
    """What the terminal shows after Ctrl-C or SIGTERM: no traceback, and one error line saying where the
    report of what was done is (the live view's last frame and the progress line come before it)."""
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert errors == [f"error: interrupted; the report of what was done is in {run_dir}"], out


def left_out(run_dir: Path) -> str:
    """The line of host rounds `flagperf compare` and `diagnose` say the run's figures leave out, and why."""
    return hosts_left_out(run_dir, summarize(run_dir)) or ""


def records_are_whole(run_dir: Path) -> None:
    """Every JSON and CSV record of the run folder parses whole; no temporary or partial name is left."""
    assert [p for p in run_dir.rglob("*") if p.name.startswith(".")] == []
    for path in run_dir.rglob("*.json"):
        json.loads(path.read_text(encoding="utf-8"))
    for path in run_dir.rglob("*.csv"):
        rows = list(csv.reader(path.open(encoding="utf-8", newline="")))
        assert rows and len({len(row) for row in rows}) == 1, path


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_a_controller_stopped_mid_round_leaves_whole_records_and_its_retry_runs_only_the_lost_round(
        tmp_path: Path, sig: signal.Signals) -> None:
    started, release, results = tmp_path / "started", tmp_path / "release", tmp_path / "results"
    # --run-id: the run folder is claimed before the flow, which takes it (and its log waits for the plan there);
    # the retry is the same command with --retry, as the run says.
    args = ["run", "--cases", "waits", "--rounds", "2", "--set", f"waits.started={started}",
            "--set", f"waits.release={release}", "--set", "waits.hold_round=2", "--results", str(results),
            "--run-id", "held"]
    proc = flagperf(args, tmp_path)
    try:
        wait_for(started, proc)  # round 1 is done and stored, round 2's case runs
        case_pid = int(started.read_text().strip())
        running = descendants(proc.pid)
        assert case_pid in {p.pid for p in running}
        assert any("--parent-pid" in command_line(p) for p in running)  # a monitor
        # Running: round 2 may yet get its result (the controller holds its record's lock)
        assert "(yet): the run is not finished" in left_out(results / "held")
        assert held_by(results / "held" / CONTROLLER_FILE) is not None  # not merely no record
        stop(proc, sig)
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == (128 + sig if sig != signal.SIGKILL else -sig), out
    (run_dir,) = results.iterdir()
    assert run_dir.name == "held" and (run_dir / "controller.log").is_file()
    if sig != signal.SIGKILL:
        interrupted_in_one_line(out, run_dir)
    _, alive = psutil.wait_procs(running, timeout=120)
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == [], "processes outlived the controller"

    records_are_whole(run_dir)
    if sig == signal.SIGKILL:  # neither summary.json nor an interruption record: its controller is gone, not running
        assert (f"waits round2: not run: the run ended without its summary.json, its controller (pid {proc.pid} on "
                in left_out(run_dir)), left_out(run_dir)
    first = run_dir / "waits" / "round1" / "localhost_noderank0" / "result.json"
    assert read_result(first).status == "success"
    kept = first.read_bytes()
    assert not (run_dir / "waits" / "round2").exists()  # the lost round left nothing half-collected

    report = flagperf(["report", str(run_dir)], tmp_path)
    out, _ = report.communicate(timeout=300)
    assert report.returncode == 0, out
    assert (run_dir / SUMMARY_JSON).is_file() and (run_dir / REPORT_MD).is_file()
    records_are_whole(run_dir)

    release.write_text("go\n")  # round 2 no longer waits
    retry = flagperf([*args, "--retry", str(run_dir)], tmp_path)
    out, _ = retry.communicate(timeout=900)
    assert retry.returncode == 0, out
    assert first.read_bytes() == kept  # completed: kept, not run again
    assert read_result(run_dir / "waits" / "round2" / "localhost_noderank0" / "result.json").status == "success"
    summary = json.loads((run_dir / SUMMARY_JSON).read_text(encoding="utf-8"))
    assert summary["counts"]["success"] == 2
    # The retry completed the run: its report is not "interrupted"; the first attempt's record (none after a
    # SIGKILL: nothing of the controller could write it) is kept aside.
    assert summary["progress"]["interrupted"] is None, summary["progress"]
    assert "**interrupted**" not in (run_dir / REPORT_MD).read_text(encoding="utf-8")
    aside = run_dir / "retries" / "attempt1" / "interrupted.json"
    assert aside.is_file() == (sig != signal.SIGKILL)
    if sig != signal.SIGKILL:
        assert json.loads(aside.read_text(encoding="utf-8"))["running"] == ["waits", 2]
    records_are_whole(run_dir)
    assert not (tmp_path / "work" / run_dir.name).exists()  # the host's copy is gone once all is stored


@pytest.mark.usefixtures("prefect_server")  # the session's: no temporary server to start for each command
def test_ctrl_c_while_a_round_is_collected_leaves_no_half_copy_and_its_retry_collects_the_round_measured(
        tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the process group) once the controller copies a measured round from its host into a
    hidden partial folder: nothing half-copied stays in the run folder, the host keeps the round, and the retry
    stores that very measurement without running the case again. The round's large output keeps the copy going
    long enough to be caught; wherever the interrupt lands, the same whole-or-absent records are asserted."""
    results, never = tmp_path / "results", tmp_path / "never"
    args = ["run", "--cases", "waits", "--rounds", "1", "--set", "waits.hold_round=0", "--set",
            f"waits.started={never}", "--set", f"waits.release={never}", "--set", "waits.output_mib=128",
            "--results", str(results)]
    from prefect.settings import PREFECT_API_URL

    api_url = PREFECT_API_URL.value()
    proc = flagperf(args, tmp_path, api_url)
    partial: list[Path] = []

    def copying() -> bool:
        partial[:] = results.glob("*/waits/round1/.localhost_noderank0.partial")
        return bool(partial)

    out = ctrl_c_once(proc, copying)
    interrupted_in_one_line(out, run_dir := partial[0].parents[2])
    records_are_whole(run_dir)  # the partial copy is gone
    stored = run_dir / "waits" / "round1" / "localhost_noderank0"
    stage = tmp_path / "work" / run_dir.name / "waits" / "round1" / "localhost_noderank0" / "attempt1"
    if stored.exists():  # the copy was done before the signal came: stored whole, and the host's copy is not needed
        measured, kept = read_result(stored / RESULT_FILE), (stored / RESULT_FILE).read_bytes()
        said = "1 of 1 planned rounds done, 0 stopped while running, 0 not started"
    else:  # caught mid-copy (the usual case): the host keeps the measured round, and the report says so
        measured, kept = read_result(stage / RESULT_FILE), None
        retry = shlex.join(["flagperf", *args, "--retry", str(run_dir)])
        said = (f"0 of 1 planned rounds done, 1 measured, kept on host localhost (`{retry}` collects it), "
                "0 stopped while running, 0 not started")
        progress = json.loads((run_dir / SUMMARY_JSON).read_text(encoding="utf-8"))["progress"]
        assert (progress["measured"], progress["kept_on"], progress["stopped"]) == (
            ["waits round 1 on localhost"], ["localhost"], []), progress
        assert "## Measured, not yet collected" in (run_dir / REPORT_MD).read_text(encoding="utf-8")
    assert measured.status == "success"
    assert f"interrupted: {said} (report.md)" in out, out
    assert said in (run_dir / REPORT_MD).read_text(encoding="utf-8")

    report = flagperf(["report", str(run_dir)], tmp_path)
    out, _ = report.communicate(timeout=300)
    assert report.returncode == 0, out
    assert (run_dir / SUMMARY_JSON).is_file() and (run_dir / REPORT_MD).is_file()
    records_are_whole(run_dir)

    retry = flagperf([*args, "--retry", str(run_dir)], tmp_path, api_url)
    out, _ = retry.communicate(timeout=900)
    assert retry.returncode == 0, out
    # The very measurement, not a second one: the case did not run again.
    assert read_result(stored / RESULT_FILE).model_dump(exclude={"provenance"}) == measured.model_dump(
        exclude={"provenance"})
    assert (stored / "output.bin").stat().st_size == 128 << 20
    if kept is not None:
        assert (stored / RESULT_FILE).read_bytes() == kept
    else:
        assert "collecting the round an earlier attempt measured" in (run_dir / "controller.log").read_text()
    assert json.loads((run_dir / SUMMARY_JSON).read_text(encoding="utf-8"))["counts"]["success"] == 1
    records_are_whole(run_dir)
    assert not (tmp_path / "work" / run_dir.name).exists()  # the host's copy is gone once all is stored


def ctrl_c_once(proc: subprocess.Popen[str], ready: Callable[[], bool], lines: Lines | None = None) -> str:
    """Ctrl-C, as a terminal sends it, as soon as ``ready()`` (checked again and again while the command runs);
    the command must end with code 130 and leave no process of its. Its output (all of it where ``lines`` reads
    it, the part nobody read before otherwise)."""

    def said() -> str:
        return lines.text() + lines.rest() if lines is not None else output_of(proc)

    try:
        deadline = time.monotonic() + 600  # a guard against a hang, not a timing assumption
        while not ready():
            assert proc.poll() is None, said()
            assert time.monotonic() < deadline, "the moment to interrupt never came"
            time.sleep(0.005)
        running = descendants(proc.pid)
        stop(proc, signal.SIGINT)
        if lines is None:
            out, _ = proc.communicate(timeout=300)
        else:
            proc.wait(timeout=300)
            out = said()
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, out
    _, alive = psutil.wait_procs(running, timeout=120)
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == [], "processes outlived the controller"
    return out


def ctrl_c_at_header(proc: subprocess.Popen[str], header: str, error: str) -> str:
    """Ctrl-C once the command's header (a line starting with ``header``; notes on stderr may come first) is on
    the terminal, while its temporary server starts: it must end in the one line ``error``, without a
    traceback. Its output."""
    lines = Lines(proc.stdout)

    def header_printed() -> bool:  # printed once the input is good
        line = lines.next()  # within 120 s, or the test fails with what the command said: a hang is no pass
        assert line, f"the command ended before its header: {lines.text()}"
        return line.startswith(header)

    out = ctrl_c_once(proc, header_printed, lines)
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    assert [line for line in out.splitlines() if line.startswith("error:")] == [f"error: {error}"], repr(out)
    return out


def test_ctrl_c_while_the_run_is_set_up_leaves_nothing_and_says_so_in_one_line(tmp_path: Path) -> None:
    """Ctrl-C once the run's header is on the terminal, while the temporary server starts (seconds): no flow ran,
    so no run folder, results folder or server is left, and one line says nothing started."""
    results = tmp_path / "results"
    proc = flagperf(["run", "--cases", "waits", "--rounds", "1", "--set", "waits.hold_round=0", "--set",
                     f"waits.started={tmp_path / 'never'}", "--set", f"waits.release={tmp_path / 'never'}",
                     "--results", str(results)], tmp_path)
    ctrl_c_at_header(proc, "run ", "interrupted before anything started")
    assert not results.exists()  # made by this command, left empty: removed


def test_ctrl_c_while_a_night_is_set_up_stops_it_before_it_measures(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`flagperf nightly` from a terminal, Ctrl-C once its header is printed (its temporary server starting): the
    night stops there in one line; nothing is measured, judged or published as the night's verdict."""
    monkeypatch.setenv("FLAGPERF_SUITE_PATH", str(ROOT / "tests" / "fixtures" / "suites"))
    results = tmp_path / "results"
    proc = flagperf(["nightly", "--suite", "tiny", "--rounds", "1", "--results", str(results)], tmp_path)
    out = ctrl_c_at_header(proc, "nightly tiny", "interrupted; the night is not judged")
    assert not (results / "nightly-tiny.json").exists() and not list(results.glob("run*")), out


@pytest.mark.usefixtures("prefect_server")  # the session's: no temporary server to start
def test_ctrl_c_while_a_night_measures_records_it_as_interrupted(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`flagperf nightly` stopped by Ctrl-C while its round runs: not judged, but recorded, so the owner reading
    the trends tells it from a night that never ran: the history holds it as interrupted with its run id and no
    figures, and the night's verdict file says so."""
    from prefect.settings import PREFECT_API_URL
    from sqlalchemy import select

    from flagperf.results.history import figures, history_engine, runs

    suites, started, results = tmp_path / "suites", tmp_path / "started", tmp_path / "results"
    suites.mkdir()
    (suites / "waiting.yaml").write_text("name: waiting\ndescription: one round that waits\ncases: [waits]\n"
                                         "rounds: 1\n", encoding="utf-8")
    monkeypatch.setenv("FLAGPERF_SUITE_PATH", str(suites))
    proc = flagperf(["nightly", "--suite", "waiting", "--rounds", "1", "--set", "waits.hold_round=1",
                     "--set", f"waits.started={started}", "--set", f"waits.release={tmp_path / 'never'}",
                     "--results", str(results)], tmp_path, api_url=PREFECT_API_URL.value())
    out = ctrl_c_once(proc, started.exists)
    assert "Traceback" not in out, out
    assert [line for line in out.splitlines() if line.startswith("error:")] == [
        "error: interrupted; the night is not judged"], out
    (run_dir,) = results.glob("run*")
    engine = history_engine(None, results)
    with engine.connect() as conn:
        recorded = conn.execute(select(runs.c.run_id, runs.c.outcome, runs.c.reason, runs.c.vendor)).all()
        assert conn.execute(select(figures)).all() == []
    assert recorded == [(run_dir.name, "interrupted", "interrupted (SIGINT)", "cpu")]
    verdict = json.loads((results / "nightly-waiting.json").read_text(encoding="utf-8"))
    assert (verdict["run_id"], verdict["state"], verdict["exit_code"], verdict["verdicts"]) == (
        run_dir.name, "Interrupted", 128 + signal.SIGINT, [])


class HoldingEndpoint(http.server.BaseHTTPRequestHandler):
    """An OpenAI-style endpoint that streams ``max_tokens`` words for every chat request and remembers each one's
    prompt, in the order they arrive; the one numbered ``hold`` (from 0) it holds, unanswered, until ``release``:
    a round then stays mid-point for as long as a test needs."""

    prompts: ClassVar[list[str]] = []
    hold: ClassVar[int] = -1
    held = threading.Event()
    release = threading.Event()
    lock = threading.Lock()

    def do_POST(self) -> None:  # http.server calls it by this name
        asked = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        with self.lock:
            number = len(self.prompts)
            self.prompts.append(asked["messages"][0]["content"])
        if number == self.hold:
            self.held.set()
            self.release.wait()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()  # HTTP/1.0: the stream ends when the connection closes
        tokens = int(asked["max_tokens"])
        events = [{"choices": [{"index": 0, "delta": {"content": f"t{i + 1} "}, "finish_reason": None}]}
                  for i in range(tokens)]
        events += [{"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
                   {"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": tokens}}]
        for event in events:
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.usefixtures("prefect_server")  # the session's: no temporary server to start
def test_ctrl_c_mid_round_at_an_endpoint_and_its_retry_send_no_prompt_twice(tmp_path: Path) -> None:
    """An endpoint keeps every prompt it was sent in its prefix cache. Ctrl-C while a round there is mid-point (the
    endpoint holds its third request): the interrupted run's clean-up removes the half round from the host, but only
    once its attempt's record is in the run folder (prompt_positions/recovered-*.json), beside the reservation the
    controller wrote before it dispatched the round and the round's reach: its stream, the most its 2 attempts may
    send (recorded before it sent), and, its attempt having ended, what it took. `--retry` runs the round again after
    what it took, not after the most it could have sent, and the endpoint never gets one prompt twice across the two
    runs; the retry's round says which reservation it passed, and once stored closes its own, and the interrupted
    round's, which its records pass."""
    from prefect.settings import PREFECT_API_URL

    from flagperf.results.prompt_positions import CLOSED, OPEN, REACH, RECOVERED, RUN_POSITIONS_DIR

    HoldingEndpoint.prompts.clear()
    HoldingEndpoint.hold = 2  # the check is request 0: the second of the point's four timed requests is held
    HoldingEndpoint.held.clear()
    HoldingEndpoint.release.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HoldingEndpoint)  # the port from the OS
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    inventory, results = tmp_path / "inventory.yaml", tmp_path / "results"
    inventory.write_text(json.dumps({"hosts": [{"name": "localhost"}], "endpoints": {"lab": {
        "base_url": f"http://127.0.0.1:{server.server_address[1]}", "model": "m"}}}), encoding="utf-8")
    args = ["run", "--cases", "tiny-llama-serve", "--inventory", str(inventory), "--rounds", "1", "--results",
            str(results), "--run-id", "held-endpoint", *[word for value in (
                "endpoint=lab", "concurrency=[1]", "request_rates=[]", "requests=4", "warmup_requests=0",
                "input_len=8", "max_new_tokens=2", "max_retries=1") for word in ("--set", value)]]
    api_url = PREFECT_API_URL.value()
    try:
        out = ctrl_c_once(flagperf(args, tmp_path, api_url), HoldingEndpoint.held.is_set)
        run_dir = results / "held-endpoint"
        interrupted_in_one_line(out, run_dir)
        records_are_whole(run_dir)
        sent_before = list(HoldingEndpoint.prompts)
        assert len(sent_before) == 3  # the check, the first timed request, the held one
        # Nothing of the half round is left on the host; its attempt's record is in the run folder.
        assert list((tmp_path / "work").rglob("prompt_positions.json")) == []
        assert list(run_dir.rglob("prompt_positions.json")) == []
        (recovered,) = (run_dir / RUN_POSITIONS_DIR).glob(f"{RECOVERED}*.json")
        kept = json.loads(recovered.read_text(encoding="utf-8"))
        assert (kept["first"], kept["reserved"], kept["end"], kept["bound"]) == (0, 5, None, 10)
        reserved = list((run_dir / RUN_POSITIONS_DIR).glob(f"{OPEN}*.json"))
        # Beside the reservation, where the round's prompts lie: the most its 2 attempts may take, as its attempt wrote
        # before it sent, and what it took (the check and 4 timed requests), read once it had ended.
        reach = run_dir / RUN_POSITIONS_DIR / f"{REACH}{reserved[0].name.removeprefix(OPEN)}"
        assert json.loads(reach.read_text(encoding="utf-8")) == {"stream": kept["stream"], "end": 10, "taken": 5,
                                                                     "ended_checked": True,
                                                                     "ended_by_controller": True}
        HoldingEndpoint.release.set()

        retry = flagperf([*args, "--retry", str(run_dir)], tmp_path, api_url)
        out, _ = retry.communicate(timeout=900)
        assert retry.returncode == 0, out
    finally:
        HoldingEndpoint.release.set()
        server.shutdown()
        thread.join()
        server.server_close()
    prompts = HoldingEndpoint.prompts
    assert len(prompts) == 3 + 5 and len(set(prompts)) == len(prompts), prompts  # no prompt sent twice
    assert len(reserved) == 1, reserved
    stored = run_dir / "tiny-llama-serve" / "round1" / "localhost_noderank0"
    assert read_result(stored / RESULT_FILE).status == "success"
    assert "its prompts start at position 5 of its prompt stream" in (stored / "case.log").read_text()
    serving = json.loads((stored / "serving.json").read_text(encoding="utf-8"))
    # After what the interrupted round took (its check and 4 timed requests: its record, and its reach), not after the
    # most its 2 attempts could have sent (10); its reservation then passes nothing further.
    assert serving["prompt_set"]["first_position"] == 5
    assert serving["prompt_set"]["after_reservations"] == []
    assert serving["prompt_set"]["reservation_reaches"] == [
        {"id": reserved[0].name.removeprefix(OPEN).removesuffix(".json"), "stream": kept["stream"], "upto": 5}]
    # The retry's round's reservation is closed once stored; the interrupted round's (its records never came) too, as
    # the retry's records pass its reach: no later round works it out again.
    assert not list((run_dir / RUN_POSITIONS_DIR).glob(f"{OPEN}*.json"))
    assert len(list((run_dir / RUN_POSITIONS_DIR).glob(f"{CLOSED}*.json"))) == 2
    records_are_whole(run_dir)


class LinkLostOnce(LocalHost):
    """A host whose link drops as its first command ends: the case ran and sent, but its end was not seen (as an SSH
    session that closed without an exit status, or a container engine that stopped answering). Its record of prompt
    positions is left as it was read mid-send (its check sent, its end not written): what the retry finds of an
    attempt still sending. Its case forged its end, too: an ended.json (where an older version's controller kept it)
    and a controller-ended.json in its own folder, which must prove nothing."""

    def run(self, argv: list[str], **kwargs: Any) -> CommandResult:
        from flagperf.results.prompt_positions import CONTROLLER_ENDED_FILE, ENDED_FILE, PROMPT_POSITIONS

        outcome = super().run(argv, **kwargs)
        if getattr(self, "lost", False):
            return outcome
        self.lost = True
        record = kwargs["log_path"].with_name(PROMPT_POSITIONS)
        record.write_text(json.dumps({**json.loads(record.read_text()), "reserved": 1, "end": None}))
        for forged in (ENDED_FILE, CONTROLLER_ENDED_FILE):
            record.with_name(forged).write_text('{"exit_code": 0}\n')
        return dataclasses.replace(outcome, exit_code=None, link="the link to the host dropped")


@pytest.mark.usefixtures("prefect_server")  # the session's: run_case is a task
@pytest.mark.parametrize("lost", [False, True], ids=["seen-ended", "link-lost"])
def test_what_an_attempt_took_counts_only_where_its_runtime_saw_it_end(tmp_path: Path, lost: bool) -> None:
    """A round's reach, kept beside its reservation, says what its attempts took only for those whose runtime saw the
    case process end (an exit code, and no word of a lost link); an attempt whose end was not seen may still be
    sending, so its bound counts for it, and the round's reservation stays open once its folder is stored (its reach
    holds round 2 back: the stored record of that attempt need not be final)."""
    from flagperf.hosts.inventory import host_spec
    from flagperf.results.prompt_positions import CLOSED, CONTROLLER_ENDED_FILE, OPEN, RUN_POSITIONS_DIR, Reach
    from flagperf.results.schema import round_dir
    from flows.host_round import node_round
    from tasks.collect import stage_folder
    from tests.unit.test_serving_failed_points import RefusingEndpoint, _endpoint_plan, _sent, served_by

    RefusingEndpoint.refuse = set()
    host = (LinkLostOnce if lost else LocalHost)(work_root=tmp_path / "work")
    run = tmp_path / "run"
    run.mkdir()
    with served_by(RefusingEndpoint) as url:
        plan = _endpoint_plan(url, tmp_path, "requests=2", "max_retries=2", rounds=2)
        cp = plan.cases[0]
        spec = host_spec({"name": "localhost"})
        result = node_round(host, spec, plan, run, cp, 1, {}, None, 1.0, None)
        assert result.status == "success", result.failure
        out = round_dir(run, cp.name, 1, "localhost")
        [kept] = (run / RUN_POSITIONS_DIR).glob("reach-*.json")
        reach = Reach.model_validate_json(kept.read_text())
        opened, closed = ([p.name for p in (run / RUN_POSITIONS_DIR).glob(f"{kind}*.json")] for kind in (OPEN, CLOSED))
        assert not stage_folder(host.work_root, plan.run_id, cp.name, 1, "localhost").exists()
        if not lost:  # its one attempt ended, seen: what it took counts, and its stored records are final
            assert _sent(out) == [0, 1, 2] and (reach.end, reach.taken) == (9, 3)
            assert (out / CONTROLLER_ENDED_FILE).is_file() and (len(opened), len(closed)) == (0, 1), (opened, closed)
            markers = host.ended_path(stage_folder(host.work_root, plan.run_id, cp.name, 1, "localhost"))
            assert markers is not None and not markers.exists()  # its markers went with its folder
            return
        # attempt 1 (its link lost, its record read mid-send) may still send up to its bound: attempt 2 starts after
        # its own share of it (3), not after what its record said then (1), and the round's reach after the bound
        assert _sent(out) == [3, 4, 5] and (reach.end, reach.taken) == (9, 9)
        first = json.loads((out / "attempts" / "attempt1" / "prompt_positions.json").read_text())
        assert (first["bound"], first["attempt_bound"]) == (9, 3)
        # the case's forged controller-ended.json is not brought in; attempt 2's end, seen, is
        assert not (out / "attempts" / "attempt1" / CONTROLLER_ENDED_FILE).exists()
        assert (out / CONTROLLER_ENDED_FILE).is_file()
        # Stored, but attempt 1's end was not seen: its reservation stays open, and round 2 starts after its bound.
        assert (len(opened), len(closed)) == (1, 0), (opened, closed)
        second = node_round(host, spec, plan, run, cp, 2, {}, None, 1.0, None)
    assert second.status == "success", second.failure
    assert _sent(round_dir(run, cp.name, 2, "localhost")) == [9, 10, 11]
