"""Ctrl-C while several hosts' rounds run in their threads: the threads are told to stop (a local command ends, no
new host is opened), the controller waits for them, and a host whose thread still runs is named and left alone.
Real threads, real local commands; every phase is reached on a condition, never on a timer."""

from __future__ import annotations

import contextlib
import http.server
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from flagperf.hosts.fleet import open_host
from flagperf.hosts.inventory import HostSpec
from flagperf.hosts.local import LocalHost
from flagperf.hosts.threads import HOST_THREADS, HostThreads, RoundsStopped
from flows.evaluate import run_concurrently, stop_host_threads

DEADLINE_S = 120  # a guard against a hang, not a timing assumption


class NoPrefectApi(http.server.BaseHTTPRequestHandler):
    """An address for PREFECT_API_URL that answers every request 404 at once: a Prefect task asks the API for its
    default result storage only, and goes on with local storage without it."""

    def do_GET(self) -> None:  # http.server calls them by these names
        self.send_error(404)

    do_POST = do_PATCH = do_PUT = do_DELETE = do_GET

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def no_prefect_server() -> Iterator[None]:
    """Prefect's tasks run outside a flow with no Prefect server: their states, events and logs go nowhere (Prefect
    would otherwise start its own temporary server for them, some 15 s, on the shared ~/.prefect database). What
    those states are is checked on a real server (tests/integration)."""
    from prefect.events.clients import NullEventsClient
    from prefect.events.worker import EventsWorker
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_CLIENT_SERVER_VERSION_CHECK_ENABLED,
        PREFECT_LOGGING_TO_API_ENABLED,
        temporary_settings,
    )

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NoPrefectApi)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{server.server_address[1]}/api",
                                 PREFECT_CLIENT_SERVER_VERSION_CHECK_ENABLED: False,
                                 PREFECT_LOGGING_TO_API_ENABLED: False}):
            previous = EventsWorker._client_override  # another test's (a fixture's) override: given back after
            EventsWorker.set_client_override(NullEventsClient)  # the states' events: dropped, no websocket tried
            try:
                yield
            finally:
                if previous is None:
                    EventsWorker.set_client_override(None)
                else:
                    EventsWorker.set_client_override(previous[0], **dict(previous[1]))
    finally:
        server.shutdown()
        server.server_close()


def test_no_prefect_server_gives_back_the_events_client_override_it_found() -> None:
    """An override set before (a fixture's events client) is the one in place after, not none."""
    from prefect.events.clients import AssertingEventsClient
    from prefect.events.worker import EventsWorker

    before = EventsWorker._client_override
    EventsWorker.set_client_override(AssertingEventsClient, checkpoint_every=3)
    try:
        with no_prefect_server():
            assert EventsWorker._client_override is not None
            assert EventsWorker._client_override[0] is not AssertingEventsClient
        assert EventsWorker._client_override == (AssertingEventsClient, (("checkpoint_every", 3),))
    finally:
        EventsWorker._client_override = before


def wait_until(condition: object, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}: not within {DEADLINE_S} s"
        time.sleep(0.05)


def test_ctrl_c_stops_the_hosts_threads_and_names_the_one_that_still_runs(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    hosts = {name: LocalHost(name=name, work_root=tmp_path / name) for name in ("a", "b")}
    release = threading.Event()
    entered = threading.Event()
    ended: dict[str, BaseException | None] = {}

    def local_round(host: LocalHost) -> None:
        started = host.work_root / "started"
        program = (f"import os, time, pathlib; pathlib.Path({str(started)!r}).write_text(str(os.getpid())); "
                   "time.sleep(600)")
        try:
            host.run([sys.executable, "-c", program], timeout=600, log_path=host.work_root / "case.log")
            ended[host.name] = None
        except BaseException as exc:
            ended[host.name] = exc
            raise
        finally:
            # what a round does after its command: open its host again (stopping: refused)
            try:
                open_host(HostSpec.model_validate({"name": host.name, "transport": "local"}))
            except RoundsStopped as exc:
                ended[f"{host.name} reopened"] = exc

    def stuck_round() -> None:  # a thread that does not look at the stop (a call blocked elsewhere)
        entered.set()
        release.wait()

    def interrupt_once_running() -> None:
        wait_until(lambda: entered.is_set() and all((h.work_root / "started").is_file() for h in hosts.values()),
                   "the rounds start")
        # Ctrl-C: a real SIGINT to the main thread (interrupt_main would not wake its blocked wait)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    threads = HostThreads()
    token = HOST_THREADS.set(threads)
    interrupter = threading.Thread(target=interrupt_once_running)
    interrupter.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_concurrently([lambda: local_round(hosts["a"]), lambda: local_round(hosts["b"]), stuck_round],
                             [["a"], ["b"], ["stuck"]])
        interrupter.join()
        pids = [int((h.work_root / "started").read_text()) for h in hosts.values()]
        # the local commands end (killed by their threads), and with them the threads driving a and b
        wait_until(lambda: set(threads.busy()) == {"stuck"}, "the threads of a and b end")
        assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
        assert all(isinstance(ended[name], RoundsStopped) for name in ("a", "b")), ended
        assert all(isinstance(ended[f"{name} reopened"], RoundsStopped) for name in ("a", "b")), ended
        # nothing new starts on a host once stopping
        with pytest.raises(RoundsStopped):
            threads.run(["c"], lambda: None)
        with caplog.at_level(logging.WARNING):
            left = stop_host_threads(threads, grace_s=0.2)  # "stuck" never ends before release: the grace is moot
        assert left == {"stuck"}
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "left the run's folder on stuck as it is" in warnings[0], warnings
    finally:
        release.set()
        HOST_THREADS.reset(token)
        for started in (h.work_root / "started" for h in hosts.values()):  # a failed test leaves no sleep(600)
            if started.is_file() and psutil.pid_exists(pid := int(started.read_text())):
                with contextlib.suppress(psutil.Error):
                    psutil.Process(pid).kill()
    wait_until(lambda: not threads.busy(), "the stuck thread ends once released")


def test_the_checks_threads_count_as_driving_their_hosts(tmp_path: Path) -> None:
    """The healthchecks, image builds and image probes run in the hosts' threads too (each named by its hosts): an
    interrupt stops them as it stops the rounds, and once stopping none starts on a host."""
    from flagperf.config.plan import plan_run
    from flows.evaluate import build_images, check_hosts, check_images

    specs = {name: HostSpec.model_validate({"name": name, "transport": "local", "runtime": "process",
                                            "work_root": str(tmp_path / name)}) for name in ("a", "b")}
    hosts = {name: open_host(spec) for name, spec in specs.items()}
    plan = plan_run(cases=["computation-FP32"], results_dir=tmp_path / "results", run_id="run-a")
    threads = HostThreads()
    threads.stop()
    token = HOST_THREADS.set(threads)
    try:
        with pytest.raises(RoundsStopped, match="nothing more starts on a"):
            check_hosts(hosts, specs, plan, plan.run_dir)
        with pytest.raises(RoundsStopped, match="nothing more starts on a"):
            build_images(hosts, specs, plan, {})
        images = {(name, None): {"tag": "flagperf-test:none"} for name in hosts}
        docker = {name: spec.model_copy(update={"runtime": "docker"}) for name, spec in specs.items()}
        with pytest.raises(RoundsStopped, match="nothing more starts on a"):
            check_images(hosts, docker, plan, plan.run_dir, images, {"a": None, "b": None})
    finally:
        HOST_THREADS.reset(token)
    assert not (plan.run_dir / "hosts").exists()  # no healthcheck ran


def test_a_round_whose_ssh_channel_the_interrupt_closed_is_stopped_not_failed(tmp_path: Path) -> None:
    """Ctrl-C closes the SSH hosts' connections: the round's command then fails with an SshError. That is the
    interrupt's doing, not a failure of the round: it is not retried, it stops (RoundsStopped), and no failed
    result is written for it. (That its host-round subflow and run_case task end Cancelled is checked on a real
    server: tests/integration/test_deployments.py.)"""
    from flagperf.config.plan import plan_run
    from flagperf.hosts.ssh import SshError
    from flagperf.results.schema import RESULT_FILE, round_dir
    from flows.host_round import node_round
    from tests.unit.rounds import closed_by_interrupt

    threads = HostThreads()
    calls: list[list[str]] = []
    spec, host = closed_by_interrupt(tmp_path, threads, calls)
    plan = plan_run(cases=["computation-FP32"], results_dir=tmp_path / "results", run_id="run-a")
    case = plan.cases[0].model_copy(update={"max_retries": 2})
    token = HOST_THREADS.set(threads)
    try:
        with no_prefect_server(), pytest.raises(RoundsStopped) as stopped:
            node_round(host, spec, plan, plan.run_dir, case, 1, {}, None, 1.0, None)
    finally:
        HOST_THREADS.reset(token)
    assert isinstance(stopped.value.__cause__, SshError)
    assert "round1@a: stopped (SshError: fp-h1: the SSH connection was closed)" in str(stopped.value)
    assert len(calls) == 1  # not retried
    assert not (round_dir(plan.run_dir, case.name, 1, "a", 0) / RESULT_FILE).exists()


def test_a_failed_check_stops_the_other_hosts_checks(tmp_path: Path) -> None:
    """One host's image build fails while another host's still runs: the run's checks stop that one too (its
    command ends, over SSH by the closed connection) and wait for it, instead of leaving it to run on until its own
    timeout while the process waits for it at its exit."""
    from contextvars import copy_context

    from flows.evaluate import stopped_on_failure

    host = LocalHost(name="b", work_root=tmp_path / "b")
    started = tmp_path / "started"
    ended: list[BaseException | None] = []

    def long_build() -> None:
        program = f"import pathlib, time; pathlib.Path({str(started)!r}).write_text('x'); time.sleep(600)"
        try:
            host.run([sys.executable, "-c", program], timeout=600, log_path=tmp_path / "build.log")
            ended.append(None)
        except BaseException as exc:
            ended.append(exc)

    def checks() -> None:
        wait_until(started.is_file, "the other host's build starts")
        raise RuntimeError("host a: the image build failed")

    threads = HostThreads()
    token = HOST_THREADS.set(threads)
    try:
        other = threading.Thread(target=copy_context().run, args=(threads.run, ["b"], long_build))
        other.start()
        with pytest.raises(RuntimeError, match="image build failed"):
            stopped_on_failure(threads, checks)
        # returned only once the other host's thread ended: nothing is left to run on at exit
        assert not threads.busy() and len(ended) == 1 and ended[0] is not None, ended
        other.join(DEADLINE_S)
    finally:
        HOST_THREADS.reset(token)
        threads.stop()


def test_the_clean_up_stops_every_hosts_run_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fleet.stop_runs asks every host's runtime at once: a hung engine costs its timeout once, not once per host
    (each stop_run here returns only once both have been asked; one after the other, the barrier breaks)."""
    from flagperf.hosts import fleet
    from flagperf.hosts.runtime import ProcessRuntime

    both = threading.Barrier(2, timeout=DEADLINE_S)  # a guard: one after the other, it breaks

    def stop_run(cls: type, host: object, spec: HostSpec, run_id: str) -> str | None:
        both.wait()
        return f"left on {spec.name}" if spec.name == "b" else None

    monkeypatch.setattr(ProcessRuntime, "stop_run", classmethod(stop_run))
    specs = {name: HostSpec.model_validate({"name": name, "transport": "local", "runtime": "process",
                                            "work_root": str(tmp_path / name)}) for name in ("a", "b")}
    hosts = {name: LocalHost(name=name, work_root=tmp_path / name) for name in specs}
    assert fleet.stop_runs(hosts, specs, "run-a") == {"b": "left on b"}


def test_one_hosts_surprise_while_stopping_costs_no_other_host_its_stop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error stop_run does not expect (not the engine's nor an OSError) escaped stop_runs, and with it the
    evaluation's clean-up: no host cleaned, no report. It is that host's reason to be left; the others are asked."""
    from flagperf.hosts import fleet
    from flagperf.hosts.runtime import ProcessRuntime

    asked: list[str] = []

    def stop_run(cls: type, host: object, spec: HostSpec, run_id: str) -> str | None:
        asked.append(spec.name)
        if spec.name == "a":
            raise ImportError("no module named acme_engine")
        return None

    monkeypatch.setattr(ProcessRuntime, "stop_run", classmethod(stop_run))
    specs = {name: HostSpec.model_validate({"name": name, "transport": "local", "runtime": "process",
                                            "work_root": str(tmp_path / name)}) for name in ("a", "b")}
    hosts = {name: LocalHost(name=name, work_root=tmp_path / name) for name in specs}
    assert fleet.stop_runs(hosts, specs, "run-a") == {
        "a": "ending what the run left there failed: ImportError: no module named acme_engine"}
    assert sorted(asked) == ["a", "b"]


class EngineContainer:
    """What a local engine's container is to DockerRuntime._wait: a wait that blocks until the container ends
    (here: until it is killed; else the wait's read timeout), and a kill. The local engine's wait is no connection
    the interrupt closes, so only the stop flag can end it early."""

    name = "flagperf-case"
    short_id = "0123456789ab"

    id = "0123456789abcdef"

    def __init__(self) -> None:
        self.killed = threading.Event()
        self.waiting = threading.Event()
        self.removed = threading.Event()
        self.attrs: dict[str, dict[str, object]] = {"State": {"Running": True, "Pid": 4242}}

    def wait(self, timeout: float) -> dict[str, int]:
        import requests

        self.waiting.set()
        if not self.killed.wait(timeout):
            raise requests.exceptions.ReadTimeout("read timed out")
        return {"StatusCode": 137}

    def kill(self) -> None:
        self.attrs = {"State": {"Running": False, "ExitCode": 137}}
        self.killed.set()

    def reload(self) -> None:
        pass

    # what DockerRuntime._run asks of it besides the wait: its start, its log (streamed, then whole), its removal
    def start(self) -> None:
        pass

    def logs(self, stream: bool = False, **options: object) -> object:
        text = b"[case] started\n[case] point 1 sent\n"
        return iter([text]) if stream else text

    def remove(self, force: bool = False) -> None:
        self.removed.set()


class EngineClient:
    """A local engine's client as DockerRuntime._run uses it: it creates the one container given."""

    def __init__(self, container: EngineContainer) -> None:
        self.containers = self
        self.container = container

    def create(self, *args: object, **options: object) -> EngineContainer:
        return self.container

    def get(self, container_id: str) -> EngineContainer:
        return self.container


def docker_runtime(tmp_path: Path, container: EngineContainer | None = None) -> Any:
    from flagperf.hosts.docker import ContainerSettings, DockerRuntime

    settings = ContainerSettings(image="flagperf-test:none", python="python3", shm_size="64m", privileged=False,
                                 env={}, device_requests=[], devices=[], data_mounts=[], extra_mounts=[],
                                 ipc_mode=None, group_add=[], ulimits={})
    client = EngineClient(container) if container is not None else None
    return DockerRuntime(settings, client_factory=lambda: client, user=None, scratch_root=tmp_path / "run-a")


@pytest.mark.parametrize("stopped_before", [False, True], ids=["stop-while-waiting", "stopped-already"])
def test_a_docker_rounds_wait_ends_at_the_stop_not_at_the_grace(tmp_path: Path, stopped_before: bool) -> None:
    """Ctrl-C while a local engine's container runs: its wait ends at once (the container killed, RoundsStopped),
    where it used to go on until the container's end or the controller's 120 s grace."""
    from contextvars import copy_context

    host = LocalHost(name="a", work_root=tmp_path / "a")
    runtime = docker_runtime(tmp_path)
    container = EngineContainer()
    threads = HostThreads()
    if stopped_before:
        threads.stop()
    outcome: list[BaseException | object] = []

    def wait() -> None:
        try:
            outcome.append(runtime._wait(host, container, time.monotonic() + 3600))  # type: ignore[attr-defined]
        except BaseException as exc:
            outcome.append(exc)

    token = HOST_THREADS.set(threads)
    try:
        waiter = threading.Thread(target=copy_context().run, args=(wait,), daemon=True)  # a hang fails, never holds
        waiter.start()
    finally:
        HOST_THREADS.reset(token)
    wait_until(container.waiting.is_set, "the wait starts")
    threads.stop()
    wait_until(lambda: outcome, "the wait ends")  # the old wait went on for the container's whole hour
    waiter.join(DEADLINE_S)
    assert container.killed.is_set()
    assert isinstance(outcome[0], RoundsStopped) and "container flagperf-case on a was ended" in str(outcome[0])


def test_a_docker_rounds_stop_tries_the_kill_again_until_the_container_ends(tmp_path: Path) -> None:
    """The watcher's kill fails at first (the engine's link dropped for a moment): it is tried again at each poll
    until it reaches the container, instead of once, which left the case running until the controller's grace."""
    import requests

    class FlakyKill(EngineContainer):
        def __init__(self) -> None:
            super().__init__()
            self.kills = 0

        def kill(self) -> None:
            self.kills += 1
            if self.kills < 3:
                raise requests.exceptions.ConnectionError("connection reset by peer")
            super().kill()

    from contextvars import copy_context

    host = LocalHost(name="a", work_root=tmp_path / "a")
    container = FlakyKill()
    runtime = docker_runtime(tmp_path)
    threads = HostThreads()
    threads.stop()
    outcome: list[BaseException | object] = []

    def wait() -> None:
        try:
            outcome.append(runtime._wait(host, container, time.monotonic() + 3600))
        except BaseException as exc:
            outcome.append(exc)

    token = HOST_THREADS.set(threads)
    try:  # in a daemon thread: a kill never retried leaves the wait to its hour, which fails here, never hangs
        threading.Thread(target=copy_context().run, args=(wait,), daemon=True).start()
    finally:
        HOST_THREADS.reset(token)
    wait_until(lambda: outcome, "the wait ends")
    assert isinstance(outcome[0], RoundsStopped), outcome
    assert container.killed.is_set() and container.kills == 3


def stopped_docker_round(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: EngineContainer,
                         host: LocalHost | None = None) -> tuple[BaseException | object, LocalHost, Path]:
    """A computation round run through tasks.container._run_case on a local engine's ``engine`` (on ``host``, else
    local host "a"), in a host's thread that is stopped once the container's wait starts: (what _run_case ended
    with, the host, the round's stage folder)."""
    from contextvars import copy_context

    from flagperf.config.job import Job
    from flagperf.config.plan import plan_run
    from tasks import container as container_module

    monkeypatch.setattr(container_module, "get_run_logger", lambda: logging.getLogger("test"))  # no task run around
    host = host or LocalHost(name="a", work_root=tmp_path / "a")
    runtime = docker_runtime(host.work_root, engine)
    plan = plan_run(cases=["computation-FP32"], results_dir=tmp_path / "results", run_id="run-a")
    case = plan.cases[0]
    job = Job(run_id=plan.run_id, case=case.name, family=case.family, round=1, host="a", vendor="cpu",
              config=case.config, config_origins=case.origins, run_overrides=case.run_overrides, image={})
    stage = host.work_root / "run-a" / case.name / "round1"
    threads = HostThreads()
    outcome: list[BaseException | object] = []

    def run_round() -> None:
        try:
            outcome.append(container_module._run_case(host, runtime, job, stage, 3600))
        except BaseException as exc:
            outcome.append(exc)

    token = HOST_THREADS.set(threads)
    try:
        waiter = threading.Thread(target=copy_context().run, args=(run_round,), daemon=True)
        waiter.start()
    finally:
        HOST_THREADS.reset(token)
    wait_until(engine.waiting.is_set, "the container's wait starts")
    threads.stop()
    waiter.join(DEADLINE_S)
    assert outcome, "the round did not end"
    return outcome[0], host, stage


def test_a_docker_round_the_stop_killed_keeps_its_log_and_the_controllers_ended_marker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while a local engine's container runs a round: the watcher kills it and its runtime sees it end
    (status 137). That end is recorded as any seen end is: the controller's ended marker (a serving attempt's record
    of prompt positions is final, so `flagperf run --retry` does not pass over prompts it never sent) and the
    attempt's case.log (what it printed). Both were lost when the stop's RoundsStopped threw the exit code away."""
    import json

    from flagperf.hosts.threads import CaseStopped
    from flagperf.results.schema import CASE_LOG_FILE

    engine = EngineContainer()
    outcome, host, stage = stopped_docker_round(tmp_path, monkeypatch, engine)
    assert isinstance(outcome, CaseStopped) and outcome.exit_code == -9, outcome
    assert engine.killed.is_set() and engine.removed.is_set()
    marker = host.ended_marker(stage / "attempt1")
    assert marker is not None and json.loads(marker.read_text()) == {"exit_code": -9}
    assert (stage / "attempt1" / CASE_LOG_FILE).read_text() == "[case] started\n[case] point 1 sent\n"


def test_a_docker_round_the_stop_killed_keeps_its_ended_marker_when_its_log_cannot_be_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Ctrl-C kills a round's container and its end is seen, but its case.log cannot be written (a full disk, the
    host's link closed): a warning, and the end is still recorded (CaseStopped, the controller's ended marker);
    the write's error used to take CaseStopped's place and lose the marker."""
    from flagperf.hosts.threads import CaseStopped
    from flagperf.results.schema import CASE_LOG_FILE

    class FullDisk(LocalHost):
        def write_text(self, path: Path, text: str, mode: int | None = None) -> None:
            if path.name == CASE_LOG_FILE:
                raise OSError(28, "No space left on device")
            super().write_text(path, text, mode=mode)

    host = FullDisk(name="a", work_root=tmp_path / "a")
    with caplog.at_level(logging.WARNING, logger="flagperf.hosts.docker"):
        outcome, host, stage = stopped_docker_round(tmp_path, monkeypatch, EngineContainer(), host)
    assert isinstance(outcome, CaseStopped) and outcome.exit_code == -9, outcome
    marker = host.ended_marker(stage / "attempt1")
    assert marker is not None and marker.is_file()
    assert not (stage / "attempt1" / CASE_LOG_FILE).exists()
    assert any("could not be kept" in r.getMessage() and "No space left" in r.getMessage() for r in caplog.records)
    assert not outcome.logged and outcome.lines == ["[case] started", "[case] point 1 sent"]  # its only copy


def test_a_docker_round_the_stop_killed_keeps_its_ended_marker_when_its_log_is_gone_from_the_engine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C kills a round's container and its end is seen, but the engine no longer has its log (NotFound: the
    run's clean-up removed it meanwhile): what the live stream got, with why, is its case.log, and the end is still
    recorded (CaseStopped, the controller's ended marker); the engine's error used to take CaseStopped's place."""
    import docker

    from flagperf.hosts.threads import CaseStopped
    from flagperf.results.schema import CASE_LOG_FILE

    class LogGone(EngineContainer):
        def logs(self, stream: bool = False, **options: object) -> object:
            if stream:
                return super().logs(stream=True, **options)
            raise docker.errors.NotFound("No such container: flagperf-case")

    outcome, host, stage = stopped_docker_round(tmp_path, monkeypatch, LogGone())
    assert isinstance(outcome, CaseStopped) and outcome.exit_code == -9, outcome
    marker = host.ended_marker(stage / "attempt1")
    assert marker is not None and marker.is_file()
    log = (stage / "attempt1" / CASE_LOG_FILE).read_text().splitlines()
    assert log[:2] == ["[case] started", "[case] point 1 sent"]
    assert log[2].startswith("[flagperf] its log could not be read from a's engine: NotFound"), log


def test_a_docker_round_the_stop_killed_with_its_link_dropped_keeps_no_ended_marker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while a container runs, and its wait's link drops as the watcher kills it: the engine, reached again,
    says the container has ended, but a wait that lost its link is no seen end (the link's word stands, as
    outside a stop). A plain RoundsStopped: no controller's ended marker, so the attempt's record of prompt
    positions stays held at its bound."""
    import requests

    from flagperf.hosts.threads import CaseStopped

    class DroppedWait(EngineContainer):
        def wait(self, timeout: float) -> dict[str, int]:
            super().wait(timeout)  # until the watcher's kill
            raise requests.exceptions.ConnectionError("connection reset by peer")  # its answer lost on the way

    engine = DroppedWait()
    outcome, host, stage = stopped_docker_round(tmp_path, monkeypatch, engine)
    assert isinstance(outcome, RoundsStopped) and not isinstance(outcome, CaseStopped), outcome
    assert engine.killed.is_set() and engine.removed.is_set()
    marker = host.ended_marker(stage / "attempt1")
    assert marker is not None and not marker.exists()


def test_a_stopped_rounds_cancelled_state_keeps_the_end_of_its_log_and_its_case_log_all(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C kills a round's container that printed a long log: its case.log has every line, and the Cancelled state
    of its task (whose data Prefect stores and shows) keeps the last lines only; it carried the whole log."""
    import pickle

    from flagperf.hosts.threads import STOPPED_TAIL_BYTES, STOPPED_TAIL_LINES, CaseStopped
    from flagperf.results.schema import CASE_LOG_FILE
    from tasks.container import stopped_state

    printed = [f"[case] point {i} sent" for i in range(5000)]

    class Talkative(EngineContainer):
        def logs(self, stream: bool = False, **options: object) -> object:
            text = "".join(f"{line}\n" for line in printed).encode()
            return iter([text]) if stream else text

    outcome, _, stage = stopped_docker_round(tmp_path, monkeypatch, Talkative())
    assert isinstance(outcome, CaseStopped), outcome
    assert (stage / "attempt1" / CASE_LOG_FILE).read_text().splitlines() == printed
    state = stopped_state(outcome, "computation-FP32 round 1 on a")
    assert state.is_cancelled()
    kept = pickle.loads(pickle.dumps(state.data))  # as stored
    assert isinstance(kept, CaseStopped) and kept.exit_code == -9
    assert kept.lines == printed[-STOPPED_TAIL_LINES:]
    assert sum(len(line.encode()) for line in kept.lines) <= STOPPED_TAIL_BYTES


def test_a_stopped_cases_kept_tail_is_bounded_in_bytes_too() -> None:
    """Long lines: the tail keeps whole lines up to its size in UTF-8 bytes (what is stored), not in characters, and
    a last line longer than that by its end, cut on a character's boundary."""
    from flagperf.hosts.threads import STOPPED_TAIL_BYTES, CaseStopped

    wide = CaseStopped("the run is stopping", -9, ["a" * 1000, "b" * 1000, *["c" * 1500] * 2], logged=True)
    wide.keep_tail()
    assert wide.lines == ["b" * 1000, *["c" * 1500] * 2]
    # 700 characters of three bytes each: 2100 bytes a line, so one fits, where counting characters kept all five
    chinese = CaseStopped("the run is stopping", -9, ["\u6d4b" * 700] * 5, logged=True)
    chinese.keep_tail()
    assert chinese.lines == ["\u6d4b" * 700]
    one = CaseStopped("the run is stopping", -9, ["x", "y" * 10 + "\u00e9" * STOPPED_TAIL_BYTES], logged=True)
    one.keep_tail()
    assert one.lines == ["\u00e9" * (STOPPED_TAIL_BYTES // 2)]
    # a lone surrogate (a line decoded from bytes that were no UTF-8 by other means than surrogateescape) is no error
    odd = CaseStopped("the run is stopping", -9, ["x", "\ud800 point 1 sent"], logged=True)
    odd.keep_tail()
    assert odd.lines == ["x", "\ud800 point 1 sent"]


def test_a_stopped_case_whose_case_log_was_not_written_keeps_its_whole_log_in_its_state() -> None:
    """Its case.log could not be written (a full disk): the Cancelled state's copy is the only one, kept whole."""
    from flagperf.hosts.threads import STOPPED_TAIL_LINES, CaseStopped

    printed = [f"[case] point {i} sent" for i in range(STOPPED_TAIL_LINES * 3)]
    unlogged = CaseStopped("the run is stopping", -9, printed)
    unlogged.keep_tail()
    assert unlogged.lines == printed


@pytest.mark.parametrize("step", ["create", "start", "reload"])
@pytest.mark.parametrize("error", ["requests", "paramiko"])
def test_a_link_lost_as_a_container_is_created_or_started_fails_the_round_in_one_line_to_be_retried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, error: str) -> None:
    """The link to a host's engine drops (its engine gone, or the SSH connection that carries it) while a round's
    container is created, started or looked at after its start: the attempt fails as a lost link (an
    InfrastructureFailure, which is retried) in one line naming the host and the step, as a link lost during the wait
    does; it was the SDK's raw requests or paramiko error, which no retry took. A container that may be there is
    removed: one whose create's answer was lost (most often it was made) by its name, through a new link; it was left
    on the engine. The lost line is said once, not again as the log's last line."""
    import paramiko
    import requests

    lost = (requests.exceptions.ConnectionError("('Connection aborted.', ConnectionResetError(104))")
            if error == "requests" else paramiko.SSHException("SSH session not active"))

    class Dropping(EngineContainer):
        def start(self) -> None:
            if step == "start":
                raise lost

        def reload(self) -> None:
            if step == "reload":
                raise lost

    class DroppingClient(EngineClient):
        def __init__(self, container: EngineContainer) -> None:
            super().__init__(container)
            self.created: list[str] = []
            self.asked: list[str] = []

        def create(self, *args: object, name: str = "", **options: object) -> EngineContainer:
            self.created.append(name)  # it reaches the engine; its answer may not come back
            if step == "create":
                raise lost
            return self.container

        def get(self, container_id: str) -> EngineContainer:
            self.asked.append(container_id)
            return self.container

    engine = Dropping()
    client = DroppingClient(engine)
    line = lost_round_line(tmp_path, monkeypatch, engine, client)
    doing = {"create": "creating", "start": "starting", "reload": "inspecting"}[step]
    assert line.startswith("computation-FP32 round 1 on a: lost, not failed: the link to a's container engine "
                           f"dropped while {doing} container flagperf-"), line
    assert type(lost).__name__ in line and "\n" not in line, line
    assert line.count("dropped while") == 1 and "case.log" not in line, line  # the log held the lost line alone
    assert engine.removed.is_set()
    if step == "create":  # removed by its name, through a new link
        assert client.asked == client.created and client.created[0].startswith("flagperf-"), client.asked


def lost_round_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: EngineContainer, client: Any,
                    factory: Any = None) -> str:
    """The failure line of a docker round on host "a" whose engine is ``client`` (its new links too; or each one
    ``factory`` makes), which loses it."""
    from flagperf.config.job import Job
    from flagperf.config.plan import plan_run
    from flagperf.errors import InfrastructureFailure
    from tasks import container as container_module

    monkeypatch.setattr(container_module, "get_run_logger", lambda: logging.getLogger("test"))  # no task run around
    host = LocalHost(name="a", work_root=tmp_path / "a")
    runtime = docker_runtime(host.work_root, engine)
    runtime.client_factory = factory or (lambda: client)
    plan = plan_run(cases=["computation-FP32"], results_dir=tmp_path / "results", run_id="run-a")
    case = plan.cases[0]
    job = Job(run_id=plan.run_id, case=case.name, family=case.family, round=1, host="a", vendor="cpu",
              config=case.config, config_origins=case.origins, run_overrides=case.run_overrides, image={})
    with pytest.raises(InfrastructureFailure) as failed:
        container_module._run_case(host, runtime, job, host.work_root / "run-a" / case.name / "round1", 3600)
    return str(failed.value)


@pytest.mark.parametrize("engine_has", ["none", "no-link"])
def test_a_container_whose_create_answer_was_lost_is_looked_for_by_name_and_said_when_it_may_be_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine_has: str) -> None:
    """The link drops as a round's container is created: the engine's NotFound for its name means it was never made
    (nothing to say); where no new link can ask, the line says it may have been made and not removed."""
    import docker
    import requests

    class Unmade(EngineClient):
        def create(self, *args: object, **options: object) -> EngineContainer:
            raise requests.exceptions.ConnectionError("('Connection aborted.', ConnectionResetError(104))")

        def get(self, container_id: str) -> EngineContainer:
            if engine_has == "none":
                raise docker.errors.NotFound(f"No such container: {container_id}")
            raise requests.exceptions.ConnectionError("Connection refused")

        closed = False

        def close(self) -> None:
            self.closed = True

    links: list[Unmade] = []

    def new_link() -> Unmade:
        links.append(Unmade(EngineContainer()))
        return links[-1]

    line = lost_round_line(tmp_path, monkeypatch, EngineContainer(), None, new_link)
    assert line.startswith("computation-FP32 round 1 on a: lost, not failed: the link to a's container engine "
                           "dropped while creating container flagperf-"), line
    left = "may have been created and could not be removed from a's engine"
    assert (left in line) == (engine_has == "no-link"), line
    # the round's own link, then the removal's new one, closed (an SSH engine's link is a connection of its own)
    assert len(links) >= 2 and links[1].closed, [link.closed for link in links]


def test_a_case_stopped_survives_pickling_and_deep_copy() -> None:
    """CaseStopped crosses Prefect's state storage (pickled) and deep copies with its exit code and log lines: its
    args hold only the message, so the default reduce called it without them (TypeError)."""
    import copy
    import pickle

    from flagperf.hosts.threads import CaseStopped

    stopped = CaseStopped("the run is stopping", -9, ["[case] started"], logged=True)
    for again in (pickle.loads(pickle.dumps(stopped)), copy.deepcopy(stopped)):
        assert type(again) is CaseStopped and str(again) == "the run is stopping"
        assert again.exit_code == -9 and again.lines == ["[case] started"] and again.logged


def test_a_docker_rounds_wait_outside_a_stop_is_the_containers_own(tmp_path: Path) -> None:
    """No stop: the wait is the container's, and its watcher kills nothing and ends with the wait (a watcher left
    behind per round would pile up, and could kill at a later stop)."""
    host = LocalHost(name="a", work_root=tmp_path / "a")
    container = EngineContainer()
    threading.Timer(0.0, container.killed.set).start()  # the container ends on its own (status 137 here)
    threads = HostThreads()
    token = HOST_THREADS.set(threads)
    try:
        answer = docker_runtime(tmp_path)._wait(host, container, time.monotonic() + 3600)  # type: ignore[attr-defined]
    finally:
        HOST_THREADS.reset(token)
    assert answer[1:] == (-9, False, None)
    assert container.attrs["State"]["Running"]  # not killed by the watcher
    wait_until(lambda: not [t for t in threading.enumerate() if t.name == f"stop-{container.name}"],
               "the container's stop watcher ends with its wait")


@contextlib.contextmanager
def unanswering_server(server: str, on_accept: Any = None) -> Iterator[list[object]]:
    """PREFECT_API_URL at a Prefect server that does not answer: "closed", its port refuses every connection (the port
    stays bound to a socket that never listens, so no other process can take it: Linux); "hangs-up", it takes each
    connection and hangs up without an answer (a retryable error), calling ``on_accept`` with how many it took first.
    Yields the connections taken."""
    import socket

    from prefect.settings import PREFECT_API_URL, temporary_settings

    accepted: list[object] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    if server == "hangs-up":
        listener.listen(16)

        def hang_up() -> None:
            with contextlib.suppress(OSError):
                while True:
                    connection, _ = listener.accept()
                    accepted.append(connection)
                    if on_accept is not None:
                        on_accept(len(accepted))
                    connection.close()

        threading.Thread(target=hang_up, daemon=True).start()
    try:
        with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{port}/api"}):
            yield accepted
    finally:
        listener.close()


@pytest.mark.usefixtures("patient_looks")
@pytest.mark.parametrize("server", ["closed", "hangs-up"])
def test_cancelling_a_dispatched_run_at_an_interrupt_with_the_server_down_names_it_in_one_line(
        server: str, caplog: pytest.LogCaptureFixture) -> None:
    """Ctrl-C while a round runs on a host's worker, and the Prefect server does not answer: the cancel is tried
    once (the client's retries held the interrupt about a minute per call) and the run it could not cancel is
    named in one warning line, with its host, instead of being passed over in silence."""
    import uuid

    from flows.evaluate import cancel_at_interrupt

    spec = HostSpec.model_validate({"name": "far", "address": "localhost", "agent": {}})
    run_id = uuid.uuid4()
    with unanswering_server(server) as accepted, caplog.at_level(logging.WARNING):
        cancel_at_interrupt(spec, run_id, "host-round/host-round")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert f"could not cancel host-round/host-round run {run_id} on host far" in warnings[0], warnings
    assert "no answer within" not in warnings[0], warnings  # the one attempt failed, not the deadline
    if server == "hangs-up":
        assert len(accepted) == 1  # one attempt, not the client's retries


@pytest.mark.usefixtures("patient_looks")
def test_a_stop_while_the_server_does_not_answer_ends_the_wait_for_a_dispatched_run_at_its_next_look(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The Prefect server hangs up on every read of a host's dispatched run, and the run is stopped (Ctrl-C) during
    the second: the wait ends at that look (RoundsStopped), each read one connection, where the client's own retries
    held one read about a minute, and the stop with it. Its cancel, which fails too, is said at the threads' end."""
    import uuid

    from flows import evaluate

    monkeypatch.setattr(evaluate, "AGENT_POLL_S", 0.01)
    spec = HostSpec.model_validate({"name": "far", "address": "localhost", "agent": {"start_timeout_s": 3600}})
    run_id = uuid.uuid4()
    threads = HostThreads()
    token = HOST_THREADS.set(threads)
    try:
        with unanswering_server("hangs-up", lambda taken: taken == 2 and threads.stop()) as accepted, \
                caplog.at_level(logging.WARNING), pytest.raises(RoundsStopped, match="run is stopping"):
            threads.run(["far"], lambda: evaluate.wait_for_agent(spec, run_id, "host-round/host-round"))
        assert len(accepted) == 3  # two reads, the second stopped; then the one try at cancelling
        assert not [r for r in caplog.records if r.levelno == logging.WARNING]  # said once the threads have ended
        evaluate.stop_host_threads(threads, grace_s=0)
    finally:
        HOST_THREADS.reset(token)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"could not cancel host-round/host-round run {run_id} on host far" in warnings[0]


@pytest.fixture
def patient_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each look at a dispatched run and each cancel waited for as long as a guard allows: the tests' servers answer
    (refuse, hang up, say busy) at once, and a loaded machine must not turn that answer into "no answer within 5 s"."""
    from flows import evaluate

    monkeypatch.setattr(evaluate, "POLL_TIMEOUT_S", float(DEADLINE_S))
    monkeypatch.setattr(evaluate, "CANCEL_DEADLINE_S", float(DEADLINE_S))


class LookClock:
    """flows.evaluate's clock (its ``time``) for a wait on a dispatched run: it moves ``step_s`` at each look
    (``advance``, called where the run is read) and at nothing else; its sleep returns at once. A wait's verdict
    then depends on how many looks it took, not on the speed of the machine."""

    def __init__(self, step_s: float) -> None:
        self.now, self.step_s = 0.0, step_s

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        pass

    def advance(self) -> None:
        self.now += self.step_s


class ReadsCounted:
    """A Prefect client whose read of a flow run moves ``clock`` a look on and then answers ``answers`` in turn (a
    FlowRun; an exception, raised; None: the client's own answer), the client's own once they are spent."""

    def __init__(self, client: Any, clock: LookClock, answers: list[Any] | None = None) -> None:
        self.client, self.clock, self.answers = client, clock, list(answers or [])
        self.set_states: list[tuple[str, bool]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.client, name)

    def read_flow_run(self, flow_run_id: object) -> object:
        self.clock.advance()
        answer = self.answers.pop(0) if self.answers else None
        if isinstance(answer, BaseException):
            raise answer
        return answer if answer is not None else self.client.read_flow_run(flow_run_id)

    def set_flow_run_state(self, flow_run_id: object, state: Any, force: bool = False) -> object:
        self.set_states.append((state.name, force))
        return self.client.set_flow_run_state(flow_run_id, state, force=force)


@pytest.mark.usefixtures("patient_looks")
@pytest.mark.parametrize("picked_up", [False, True], ids=["waiting", "running"])
def test_a_dispatched_runs_timeout_while_the_server_does_not_answer_fails_the_host_in_one_line(
        picked_up: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The Prefect server stops answering while the controller waits on a host's dispatched run: at
    agent.start_timeout_s (no worker seen to pick it up) or agent.timeout_s the host fails in one line that says the
    server has not answered, and that the run could not be cancelled and how to, not with httpx's error; the silence
    was said once, in a warning, when it passed a minute (it was silent up to agent.timeout_s, a day)."""
    import uuid

    from prefect.client.schemas.objects import FlowRun
    from prefect.states import Running, Scheduled

    from flagperf.errors import InfrastructureFailure
    from flows import evaluate

    clock = LookClock(step_s=20)
    monkeypatch.setattr(evaluate, "time", clock)
    run_id = uuid.uuid4()
    seen = FlowRun(id=run_id, name="quiet-fox", flow_id=uuid.uuid4(), state=Running() if picked_up else Scheduled())
    spec = HostSpec.model_validate({"name": "far", "address": "localhost",
                                    "agent": {"start_timeout_s": 100, "timeout_s": 200 if picked_up else 3600}})
    with unanswering_server("closed"), evaluate.one_try_client(evaluate.POLL_TIMEOUT_S) as client, \
            caplog.at_level(logging.INFO), pytest.raises(InfrastructureFailure) as failed:
        # the server's first answer (the run as dispatched, or picked up), then none
        evaluate._wait_for_agent(ReadsCounted(client, clock, [seen]), spec, run_id,  # type: ignore[arg-type]
                                 "host-round/host-round")
    line = str(failed.value)
    assert "\n" not in line
    # looks at 20 s (answered), 40 s (silent since), 60 s...: past the timeout at 120 s (220 s) the host fails
    if picked_up:
        assert line.startswith("host far: host-round/host-round run quiet-fox did not end within agent.timeout_s = "
                               "200 s; the Prefect server has not answered for 180 s (ConnectError"), line
    else:
        assert line.startswith("host far: no worker on work queue host-far picked up host-round/host-round within "
                               "100 s; the Prefect server has not answered for 80 s (ConnectError"), line
    assert "could not be cancelled (ConnectError" in line and f"prefect flow-run cancel {run_id}" in line, line
    said = [r for r in caplog.records if r.name != "httpx" and r.levelno >= logging.INFO]
    assert len(said) == 1 and said[0].levelno == logging.WARNING, [r.getMessage() for r in said]
    assert said[0].getMessage().startswith("host far: the Prefect server has not answered for 60 s (ConnectError")


def running_then_done(monkeypatch: pytest.MonkeyPatch, step_s: float) -> tuple[Any, ...]:
    """A wait on host far's dispatched run under a LookClock of ``step_s``: the clock, the host, the run's id, and the
    run read Running and read Completed."""
    import uuid

    from prefect.client.schemas.objects import FlowRun
    from prefect.states import Completed, Running

    from flows import evaluate

    clock = LookClock(step_s=step_s)
    monkeypatch.setattr(evaluate, "time", clock)
    run_id = uuid.uuid4()
    spec = HostSpec.model_validate({"name": "far", "address": "localhost", "agent": {}})
    running, done = (FlowRun(id=run_id, name="quiet-fox", flow_id=uuid.uuid4(), state=state)
                     for state in (Running(), Completed()))
    return clock, spec, run_id, running, done


def test_a_server_that_answers_again_is_said_once_and_the_wait_goes_on(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The Prefect server is silent for two minutes while a host's run runs, then answers: one warning when the
    silence passed a minute, one line when it answers again, and the wait ends with the run's end."""

    import httpx

    from flows import evaluate

    clock, spec, run_id, running, done = running_then_done(monkeypatch, step_s=10)
    silence = [httpx.ConnectError("[Errno 111] Connection refused")] * 12  # 120 s
    client = ReadsCounted(object(), clock, [running, *silence, running, running, done])
    with caplog.at_level(logging.INFO):
        ended = evaluate._wait_for_agent(client, spec, run_id, "host-round/host-round")  # type: ignore[arg-type]
    assert ended is done
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    assert [level for level, _ in said] == [logging.WARNING, logging.INFO], said
    assert said[0][1].startswith("host far: the Prefect server has not answered for 60 s (ConnectError: [Errno 111] "
                                 "Connection refused)"), said
    assert said[1][1] == (f"host far: the Prefect server answers again after 120 s; host-round/host-round run "
                          f"{run_id} is Running"), said


def orchestration(status: str, state: Any) -> Any:
    """The Prefect server's answer to a proposed state: ``status`` (ACCEPT, REJECT, ABORT), the run then ``state``."""
    from prefect.client.schemas.responses import OrchestrationResult, SetStateStatus, StateRejectDetails

    return OrchestrationResult(state=state, status=SetStateStatus(status), details=StateRejectDetails(reason="said"))


@pytest.mark.parametrize("now", ["scheduled", "pending", "running", "completed", "ends-before-the-proposal",
                                 "refused"])
def test_a_timeout_cancels_the_run_as_it_is_now_not_as_last_seen(
        now: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """agent.start_timeout_s passes with a host's run last seen waiting: the run is read again first. Not ended: it is
    proposed Cancelling, never forced, as `prefect flow-run cancel` does: the server makes one no worker took
    Cancelled itself (a REJECT into Cancelled), and a worker ends a process it started (a forced Cancelled on a
    Pending run let its process go on Running, unseen). Ended since, or between the read and the proposal (the server
    refused it: ABORT): left as it ended, and the wait ends with it (it counted as cancelled, and the host failed). A
    refusal on a run that goes on is said in the host's line: it may still run."""
    import types
    import uuid

    from prefect.client.schemas.objects import FlowRun
    from prefect.states import Cancelled, Cancelling, Completed, Pending, Running, Scheduled

    from flagperf.errors import InfrastructureFailure
    from flows import evaluate

    clock = LookClock(step_s=20)
    monkeypatch.setattr(evaluate, "time", clock)
    run_id = uuid.uuid4()
    spec = HostSpec.model_validate({"name": "far", "address": "localhost", "agent": {"start_timeout_s": 100}})

    def seen(state: Any) -> FlowRun:
        return FlowRun(id=run_id, name="quiet-fox", flow_id=uuid.uuid4(), state=state)

    as_read, answer, read_again = {
        "scheduled": (Scheduled(), orchestration("REJECT", Cancelled()), None),
        "pending": (Pending(), orchestration("ACCEPT", Cancelling()), None),
        "running": (Running(), orchestration("ACCEPT", Cancelling()), None),
        "completed": (Completed(), None, None),
        "ends-before-the-proposal": (Running(), orchestration("ABORT", None), Completed()),
        "refused": (Running(), orchestration("REJECT", Running()), Running())}[now]
    # looks at 20 s ... 120 s see it waiting; the timeout's read finds it as it is now (and, refused, again)
    client = ReadsCounted(types.SimpleNamespace(set_flow_run_state=lambda *args, **options: answer), clock,
                          [seen(Scheduled())] * 6 + [seen(as_read)] + ([seen(read_again)] if read_again else []))
    if now in ("completed", "ends-before-the-proposal"):
        ended = evaluate._wait_for_agent(client, spec, run_id, "host-round/host-round")  # type: ignore[arg-type]
        assert ended.state is not None and ended.state.is_completed(), ended
        assert client.set_states == ([] if now == "completed" else [("Cancelling", False)])
        return
    with pytest.raises(InfrastructureFailure, match="no worker on work queue host-far picked up") as failed:
        evaluate._wait_for_agent(client, spec, run_id, "host-round/host-round")  # type: ignore[arg-type]
    assert client.set_states == [("Cancelling", False)]
    assert ("could not be cancelled (NotCancelled: the Prefect server refused: said)" in str(failed.value)) == (
        now == "refused"), failed.value


def test_a_look_at_a_dispatched_run_tries_a_refused_connection_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """One look at a dispatched run is one connection: Prefect's client turned its own retries off, and its
    connection pool's too (it tried a refused connection 3 more times, a second and a half; with a server that drops
    the connection silently, 4 connect timeouts)."""
    import uuid

    import httpcore._backends.sync as sync_backend
    import httpx

    from flows import evaluate

    tried: list[object] = []
    connect = sync_backend.SyncBackend.connect_tcp

    def counted(self: Any, *args: Any, **options: Any) -> Any:
        tried.append(args)
        return connect(self, *args, **options)

    monkeypatch.setattr(sync_backend.SyncBackend, "connect_tcp", counted)
    with unanswering_server("closed"), evaluate.one_try_client(evaluate.POLL_TIMEOUT_S) as client, \
            pytest.raises(httpx.ConnectError):
        client.read_flow_run(uuid.uuid4())
    assert len(tried) == 1, tried


@contextlib.contextmanager
def answering_server(status: int, headers: dict[str, str], on_request: Any = None,
                     userinfo: str = "") -> Iterator[list[str]]:
    """PREFECT_API_URL (with ``userinfo``, e.g. "user:secret@") at a server that answers every request ``status`` with
    ``headers``, calling ``on_request`` with how many it got first. Yields the requests' paths."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    asked: list[str] = []

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server calls them by these names
            asked.append(self.path)
            if on_request is not None:
                on_request(len(asked))
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_PATCH = do_PUT = do_DELETE = do_GET

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with temporary_settings({PREFECT_API_URL: f"http://{userinfo}127.0.0.1:{server.server_port}/api"}):
            yield asked
    finally:
        server.shutdown()
        server.server_close()


MAINTENANCE = {"Retry-After": "3600", "Prefect-Maintenance": "true"}  # sleep an hour, then ask again, not counted


@pytest.mark.parametrize("headers", [{"Retry-After": "3600"}, MAINTENANCE], ids=["retry-after", "maintenance"])
@pytest.mark.parametrize("status", [503, 429])
def test_a_busy_answer_is_one_request_raised_as_it_comes(status: int, headers: dict[str, str]) -> None:
    """The client a dispatched run's wait uses raises a busy answer at once, after one request: Prefect's, even with
    its retries off, slept an answer's Retry-After (an hour here) on the caller's thread, and sent one marked
    Prefect-Maintenance again every second without end (each look abandoned so kept a thread and its requests)."""
    import uuid

    import httpx

    from flows import evaluate

    run_id = uuid.uuid4()

    def read() -> None:
        with evaluate.one_try_client(evaluate.POLL_TIMEOUT_S) as client:
            client.read_flow_run(run_id)

    with answering_server(status, headers) as asked, pytest.raises(httpx.HTTPStatusError) as raised:
        evaluate.answered_within(read, DEADLINE_S)  # a guard against the hour's sleep, not a timing assumption
    assert raised.value.response.status_code == status
    assert asked == [f"/api/flow_runs/{run_id}"], asked


@pytest.mark.usefixtures("patient_looks")
def test_a_stop_while_the_server_is_under_maintenance_ends_the_wait_and_says_the_uncancelled_run(
        caplog: pytest.LogCaptureFixture) -> None:
    """The Prefect server answers every request 503, under maintenance, asking to be asked again in an hour, and the
    evaluation stops during the first look at a host's run: the wait ends (RoundsStopped) after that one request, and
    its cancel, answered busy too, is said with the server's answer."""
    import uuid
    from contextvars import copy_context

    from flows import evaluate

    spec = HostSpec.model_validate({"name": "far", "address": "localhost", "agent": {}})
    run_id = uuid.uuid4()
    threads = HostThreads()
    token = HOST_THREADS.set(threads)
    ended: list[BaseException] = []

    def wait() -> None:
        try:
            threads.run(["far"], lambda: evaluate.wait_for_agent(spec, run_id, "host-round/host-round"))
        except BaseException as exc:
            ended.append(exc)

    try:
        with answering_server(503, MAINTENANCE, lambda asked: asked == 1 and threads.stop()) as asked, \
                caplog.at_level(logging.WARNING):
            waiter = threading.Thread(target=copy_context().run, args=(wait,), daemon=True)
            waiter.start()
            waiter.join(DEADLINE_S)  # a guard against the hour's hang, not a timing assumption
            assert not waiter.is_alive(), "the wait held the stop while the server asked to be asked again later"
            evaluate.stop_host_threads(threads, grace_s=0)
    finally:
        HOST_THREADS.reset(token)
    assert len(ended) == 1 and isinstance(ended[0], RoundsStopped), ended
    assert asked == [f"/api/flow_runs/{run_id}"] * 2, asked  # the look, then the cancel's read: each answered once
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(
        f"could not cancel host-round/host-round run {run_id} on host far (PrefectHTTPStatusError: 503 Service "
        "Unavailable)"), warnings


def test_a_look_the_server_holds_is_waited_on_again_not_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Prefect server holds a look at a host's run past POLL_TIMEOUT_S, look after look: the wait waits on that
    same request again instead of sending another (each unanswered look kept a thread and a request of its own), and
    takes its answer once it comes."""
    import types
    import uuid

    from prefect.client.schemas.objects import FlowRun
    from prefect.states import Completed

    from flows import evaluate

    run_id = uuid.uuid4()
    done = FlowRun(id=run_id, name="quiet-fox", flow_id=uuid.uuid4(), state=Completed())
    answered = threading.Event()
    reads: list[object] = []
    sleeps: list[float] = []

    def read_flow_run(flow_run_id: object) -> FlowRun:
        reads.append(flow_run_id)
        assert answered.wait(DEADLINE_S)  # a guard against a hang, not a timing assumption
        return done

    def sleep(seconds: float) -> None:  # the wait's pause between looks: the fifth lets the server answer
        sleeps.append(seconds)
        if len(sleeps) == 5:
            answered.set()

    monkeypatch.setattr(evaluate, "POLL_TIMEOUT_S", 0.01)
    monkeypatch.setattr(evaluate, "time", types.SimpleNamespace(monotonic=lambda: 0.0, sleep=sleep))
    spec = HostSpec.model_validate({"name": "far", "address": "localhost", "agent": {}})
    client = types.SimpleNamespace(read_flow_run=read_flow_run)
    assert evaluate._wait_for_agent(client, spec, run_id, "host-round/host-round") is done  # type: ignore[arg-type]
    assert len(sleeps) >= 5 and reads == [run_id], reads


def server_error(status: int) -> BaseException:
    """The error Prefect's client raises for a ``status`` answer."""
    import httpx
    from prefect.exceptions import PrefectHTTPStatusError

    request = httpx.Request("GET", "http://127.0.0.1/api/flow_runs/x")
    return PrefectHTTPStatusError.from_httpx_error(httpx.HTTPStatusError(
        "failed", request=request, response=httpx.Response(status, request=request)))


def test_server_errors_fewer_than_the_limit_in_a_row_are_waited_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Prefect server answers a few looks at a host's run 500 (an overload: its database's connection pool timed
    out), then answers: the wait goes on to the run's end (one 500 cancelled a healthy round)."""

    from flows import evaluate

    clock, spec, run_id, running, done = running_then_done(monkeypatch, step_s=1)
    errors = [server_error(500)] * (evaluate.SERVER_ERRORS_WAITED - 1)
    client = ReadsCounted(object(), clock, [*errors, running, *errors, done])
    assert evaluate._wait_for_agent(client, spec, run_id, "host-round/host-round") is done  # type: ignore[arg-type]


@pytest.mark.usefixtures("patient_looks")
def test_a_server_error_on_a_look_fails_the_host_in_one_line_without_the_apis_credentials(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The Prefect server answers looks at a host's run 500, SERVER_ERRORS_WAITED in a row (its own failure, no
    overload that passes): the host fails then in one line with the status, not the URL, which held
    PREFECT_API_URL's user and password."""
    import uuid

    from flagperf.errors import InfrastructureFailure
    from flows import evaluate

    monkeypatch.setattr(evaluate, "time", LookClock(step_s=0))  # no sleep between looks
    spec = HostSpec.model_validate({"name": "far", "address": "localhost", "agent": {}})
    run_id = uuid.uuid4()
    with answering_server(500, {}, userinfo="flagperf:s3cret-word@") as asked, \
            pytest.raises(InfrastructureFailure) as failed:
        evaluate.wait_for_agent(spec, run_id, "host-round/host-round")
    line = str(failed.value)
    assert line.startswith(f"host far: the Prefect server's answer to a look at host-round/host-round run {run_id} "
                           "was PrefectHTTPStatusError: 500 Internal Server Error; it could not be cancelled "
                           "(PrefectHTTPStatusError: 500 Internal Server Error)"), line
    assert "s3cret" not in line and "flagperf:" not in line and "\n" not in line, line
    assert asked == [f"/api/flow_runs/{run_id}"] * (evaluate.SERVER_ERRORS_WAITED + 1), asked  # then the cancel's


def test_the_runs_an_interrupt_could_not_cancel_are_named_in_one_line_for_all_hosts(
        caplog: pytest.LogCaptureFixture) -> None:
    """Ctrl-C with rounds on two hosts' workers and the Prefect server down: each host's thread fails to cancel its
    run; one warning line names both hosts and both runs (it was one line per host)."""
    import uuid

    from flows import evaluate

    specs = [HostSpec.model_validate({"name": name, "address": "localhost", "agent": {}}) for name in ("a", "b")]
    runs = {spec.name: uuid.uuid4() for spec in specs}
    threads = HostThreads()
    threads.stop()
    token = HOST_THREADS.set(threads)
    try:
        with unanswering_server("closed"), caplog.at_level(logging.WARNING):
            evaluate.run_concurrently([lambda spec=spec: evaluate.cancel_at_interrupt(spec, runs[spec.name],
                                                                                      "host-round/host-round")
                                       for spec in specs])
            evaluate.stop_host_threads(threads, grace_s=0)
    finally:
        HOST_THREADS.reset(token)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("could not cancel 2 dispatched runs, on hosts a, b (ConnectError"), warnings
    assert f"a: host-round/host-round run {runs['a']}; b: host-round/host-round run {runs['b']}" in warnings[0]


def test_a_check_that_outlives_the_stop_is_named_as_a_check(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """One host's check fails while another's does not look at the stop (a call blocked elsewhere): the warning
    names that host's check, which may run on; not "the run's folder" left as it is, which is the rounds' clean-up
    (nothing is cleaned after the checks)."""
    from contextvars import copy_context

    from flows import evaluate

    monkeypatch.setattr(evaluate, "CHECKS_GRACE_S", 0.2)  # the stuck check never ends before release: moot
    release = threading.Event()
    entered = threading.Event()

    def stuck_check() -> None:
        entered.set()
        release.wait()

    def checks() -> None:
        wait_until(entered.is_set, "the other host's check starts")
        raise RuntimeError("host a: the image build failed")

    threads = HostThreads()
    token = HOST_THREADS.set(threads)
    other = threading.Thread(target=copy_context().run, args=(threads.run, ["b"], stuck_check))
    try:
        other.start()
        with caplog.at_level(logging.WARNING), pytest.raises(RuntimeError, match="image build failed"):
            evaluate.stopped_on_failure(threads, checks)
    finally:
        release.set()
        HOST_THREADS.reset(token)
        other.join(DEADLINE_S)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("stopped waiting for the checks on b (b: a check's thread still drives it"), warnings
    assert "may go on until its own timeout" in warnings[0] and "folder" not in warnings[0], warnings


def test_a_host_whose_runs_stop_fails_keeps_its_folder_and_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The clean-up after an interrupt: a host whose runtime could not end what the run left there (its containers
    could not be removed) keeps the run's folder (a container may still write into it) and is named; the others'
    folders are removed."""
    from flagperf.config.plan import plan_run
    from flagperf.hosts.runtime import ProcessRuntime
    from flows.evaluate import clean_work_roots, stopped_hosts

    def stop_run(cls: type, host: object, spec: HostSpec, run_id: str) -> str | None:
        return "its containers could not be removed: ConnectionError: engine gone" if spec.name == "a" else None

    monkeypatch.setattr(ProcessRuntime, "stop_run", classmethod(stop_run))
    specs = {name: HostSpec.model_validate({"name": name, "transport": "local", "runtime": "process",
                                            "work_root": str(tmp_path / name)}) for name in ("a", "b")}
    plan = plan_run(cases=["computation-FP32"], results_dir=tmp_path / "results", run_id="run-a")
    for name in specs:
        (tmp_path / name / plan.run_id).mkdir(parents=True)
    with caplog.at_level(logging.WARNING):
        hosts = stopped_hosts(HostThreads(), specs, plan.run_id)
        clean_work_roots(hosts, specs, plan, [])
    assert (tmp_path / "a" / plan.run_id).is_dir() and not (tmp_path / "b" / plan.run_id).exists()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["left the run's folder on a as it is (a: its containers could not be removed: "
                        "ConnectionError: engine gone)"], warnings


def test_a_removal_already_in_progress_is_told_from_other_conflicts() -> None:
    """The engine's 409 for a removal under way (its container killed already) is one case, found by one helper
    for both the round's removal and the clean-up's; another conflict (or a 500) is not it."""
    import requests
    from docker.errors import APIError

    from flagperf.hosts.docker import removal_in_progress

    def answer(status: int, explanation: str) -> APIError:
        response = requests.Response()
        response.status_code = status
        return APIError(f"{status} Client Error", response=response, explanation=explanation)

    assert removal_in_progress(answer(409, "removal of container 0123 is already in progress"))
    assert not removal_in_progress(answer(409, "container 0123 is not running"))
    assert not removal_in_progress(answer(500, "removal of container 0123 is already in progress"))


class SlowRemovalEngine:
    """An engine as a loaded machine's vfs one answers: a forced removal kills the container at once, but deleting
    its files outlasts the call's timeout (ReadTimeout) and goes on there; ``kills`` False: one that never kills."""

    def __init__(self, kills: bool = True) -> None:
        self.kills = kills
        self.state = "running"
        self.lists = 0
        self.containers = self

    def list(self, all: bool, sparse: bool, filters: dict[str, Any]) -> list[Any]:
        self.lists += 1
        return [self]

    @property
    def id(self) -> str:
        return "0123"

    @property
    def attrs(self) -> dict[str, Any]:
        return {"Id": self.id, "State": self.state}

    def remove(self, force: bool) -> None:
        import requests

        if self.kills:
            self.state = "removing"
        raise requests.exceptions.ReadTimeout("SSHConnectionPool(host='localhost', port=None): Read timed out.")

    def close(self) -> None:
        pass


@pytest.mark.parametrize("kills", [True, False])
def test_a_removal_answered_late_counts_once_its_container_no_longer_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kills: bool) -> None:
    """The clean-up's removal of a round's container (stop_run) that the engine answers later than its timeout (a
    1.7 GB container's files on a loaded machine's vfs) is no failure: the engine killed it and goes on removing it,
    and the host counts as cleanable once the container is listed as no longer running. One that still runs after
    STOP_WAIT_S is named (its host's folder is kept)."""
    from flagperf.hosts import docker as docker_runtime

    engine = SlowRemovalEngine(kills=kills)
    monkeypatch.setattr(docker_runtime, "engine_client", lambda host, spec, timeout: engine)
    monkeypatch.setattr(docker_runtime, "STOP_WAIT_S", 0.0 if not kills else docker_runtime.STOP_WAIT_S)
    host = LocalHost(name="h1", work_root=tmp_path)
    spec = HostSpec.model_validate({"name": "h1", "transport": "local", "runtime": "docker"})
    said = docker_runtime.DockerRuntime.stop_run(host, spec, "run-a")
    if kills:
        assert said is None and engine.state == "removing" and engine.lists == 2, said
    else:
        assert said == ("its containers could not be removed: 1 not ended after 0 s (last: ReadTimeout: "
                        "SSHConnectionPool(host='localhost', port=None): Read timed out.)"), said


SECRET_URL = "http://flagperf:s3cret-word@127.0.0.1:4200/api/flow_runs/x"


def test_a_host_round_that_failed_on_its_worker_is_recorded_without_the_apis_password(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A round's host-round fails on its host's worker, leaving no result: its state's message (Prefect's, naming the
    client's error whole: its URL with PREFECT_API_URL's user and password) goes into the round's result.json masked."""
    import json

    from prefect.states import Failed

    from flagperf.config.plan import PLAN_FILE, plan_run
    from flagperf.results.schema import RESULT_FILE, round_dir
    from flows import evaluate

    plan = plan_run(cases=["computation-FP32"], results_dir=tmp_path / "results", run_id="run-a")
    run_dir = tmp_path / "results" / "run-a"
    run_dir.mkdir(parents=True)
    (run_dir / PLAN_FILE).write_text(plan.model_dump_json())
    label = f"{plan.cases[0].name} round 1 on far"
    monkeypatch.setattr(evaluate, "dispatch", lambda *args: Failed(
        message=f"{label}: Flow run encountered an exception: HTTPStatusError: Server error '500' for url "
                f"'{SECRET_URL}'\nTraceback ..."))
    monkeypatch.setattr(evaluate, "get_run_logger", lambda: logging.getLogger("test"))  # no flow run around
    spec = HostSpec.model_validate({"name": "far", "address": "localhost", "agent": {}})
    result = evaluate.run_node(spec, {"run_dir": str(run_dir), "case": plan.cases[0].name, "round_no": 1,
                                      "node_rank": 0, "command": None, "image": None})
    assert result.failure is not None and "http://***@127.0.0.1:4200/api" in result.failure.message, result.failure
    written = (round_dir(run_dir, plan.cases[0].name, 1, "far", 0) / RESULT_FILE).read_text()
    assert "s3cret" not in written and "flagperf:" not in json.loads(written)["failure"]["message"]


def test_a_nights_verdict_never_names_the_apis_password(tmp_path: Path) -> None:
    """A night whose evaluation failed with a client's error naming PREFECT_API_URL whole: its verdict file holds the
    message with the URL's user and password masked."""
    import json

    from prefect.states import Failed

    from flows.nightly import publish_night

    results = tmp_path / "results"
    (results / "run-a").mkdir(parents=True)
    publish_night(str(results), "tiny", results / "run-a",
                  Failed(message=f"the evaluation failed: HTTPStatusError for url '{SECRET_URL}'"), [], None)
    verdict = json.loads((results / "nightly-tiny.json").read_text())
    assert verdict["message"] == ("the evaluation failed: HTTPStatusError for url "
                                  "'http://***@127.0.0.1:4200/api/flow_runs/x'")
