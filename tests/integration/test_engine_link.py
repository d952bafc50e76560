"""A rank's own end against the link that carries it: a case round in a container on an SSH host's own engine
(the docker SDK over the host's paramiko connection, tests/testbed/up.sh), where that link drops or the container
drops while the controller waits. The rank's exit code and log lead what the round says; the drop follows as
context."""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from flagperf.config.job import Job
from flagperf.config.vendors import load_vendor
from flagperf.errors import InfrastructureFailure
from flagperf.hosts.docker import MAX_LINK_DROPS, DockerRuntime, container_settings, engine_client
from flagperf.hosts.inventory import HostSpec
from flagperf.hosts.local import LineSink
from flagperf.hosts.ssh import SshHost
from flagperf.results.schema import CASE_LOG_FILE
from tasks.container import verdict
from tests.testbed.bed import Testbed, host_shared_folder, make_testbed_fixture

pytestmark = pytest.mark.integration
testbed = make_testbed_fixture(min_hosts=2)
OWN_ERROR = "RuntimeError: the rank's own failure"
# How long the test's own engine calls wait: removing a container (a whole copy of its image on the test bed's
# vfs storage) can take over a minute on a loaded machine, more than docker's default read timeout of 60 s.
ENGINE_TIMEOUT_S = 600


@pytest.fixture
def engine_host(testbed: Testbed) -> Iterator[tuple[SshHost, DockerRuntime, Path]]:
    """h2 with its engine reached over its SSH connection, a DockerRuntime on it (the bare base image: these
    rounds need no project code) and a round's folder there; the rounds' containers need no project, so its
    root is an empty shared folder."""
    bed_host = testbed.hosts[1]
    with host_shared_folder("flagperf-link-", 0o755) as root:
        spec = HostSpec.model_validate({
            "name": bed_host.name, "address": bed_host.address, "port": bed_host.port, "user": bed_host.user,
            "key_file": bed_host.key_file, "known_hosts": testbed.known_hosts, "python": bed_host.python,
            "project_root": str(root), "connect_timeout_s": 30, "runtime": "docker", "docker": {"engine": "ssh"}})
        host = SshHost(spec)
        user = pwd.getpwnam(bed_host.user)  # the test hosts are this machine's users
        runtime = DockerRuntime(container_settings(load_vendor("cpu"), spec, testbed.base_image),
                                client_factory=partial(engine_client, host, spec),
                                user=f"{user.pw_uid}:{user.pw_gid}",
                                scratch_root=host.work_root / f"link-{uuid.uuid4().hex}")
        job_dir = runtime.scratch_root / "attempt1"
        host.write_text(job_dir / "job.json", "{}")
        try:
            yield host, runtime, job_dir
        finally:
            try:
                host.remove_tree(runtime.scratch_root)
            finally:
                host.close()


def rank_round(host: SshHost, runtime: DockerRuntime, job_dir: Path, name: str, on_ready: LineSink,
               timeout_s: float = 300) -> str:
    """Node rank 1 of 2 of a round, in container ``name``: prints "ready", calls ``on_ready`` (from the log stream),
    waits for ``release`` in its folder, then fails on its own (or runs until its ``timeout_s``). What the round
    then says (verdict's failure), after checking that no container is left."""
    import docker

    release = job_dir / "release"
    program = ("import pathlib, time\nprint('ready', flush=True)\n"
               f"while not pathlib.Path({str(release)!r}).exists():\n    time.sleep(0.05)\n"
               "raise RuntimeError(\"the rank's own failure\")\n")
    try:
        result, lines = runtime._run(host, ["python3", "-c", program], name, {}, timeout_s,
                                     lambda line: on_ready(line) if line == "ready" else None, scratch=True)
        host.write_text(job_dir / CASE_LOG_FILE, "\n".join(lines) + "\n")  # as run_entry does
        job = Job(run_id=runtime.scratch_root.name, case="link-case", family="base", round=1, host=host.name,
                  node_rank=1, nnodes=2, vendor="cpu", config={}, config_origins={}, run_overrides={}, image={})
        with pytest.raises(InfrastructureFailure) as failure:  # retried, as a crash is
            verdict(host, job, job_dir, result, timeout_s)
    finally:
        left = docker.from_env(timeout=ENGINE_TIMEOUT_S).containers.list(all=True, filters={"name": name})
        for container in left:  # not left running after the test, whatever it says (best effort)
            with contextlib.suppress(docker.errors.APIError):  # a removal already under way: it goes on
                container.remove(force=True)
    assert left == [], "a container was left"
    return str(failure.value)


def container_name() -> str:
    return f"flagperf-link-{uuid.uuid4().hex[:12]}"


def drop_link(host: SshHost) -> None:
    """End the SSH connection that carries the host's engine now (its sshd session killed, as a dropped link or a
    restarted sshd looks), and return once the controller's side has seen it end."""
    client = host.client()
    transport = client.get_transport()
    assert transport is not None
    # A command on this same connection names the sshd session that serves it (and the engine's link).
    channel = transport.open_session()
    channel.settimeout(120)  # its line within 120 s, or the test fails (socket.timeout) rather than hangs
    channel.exec_command("exec sh -c 'echo $$; exec sleep 600' flagperf-link-marker")
    command_pid = pid = int(channel.makefile("r").readline())
    while not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sshd:"):
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(ProcessLookupError):  # the marker's sleep: not left behind for its 600 s
        os.kill(command_pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while transport.is_active():
        assert time.monotonic() < deadline, "the SSH connection did not end after its sshd session was killed"
        time.sleep(0.01)


def test_a_dropped_engine_link_does_not_hide_the_ranks_own_failure(
        engine_host: tuple[SshHost, DockerRuntime, Path]) -> None:
    """The SSH connection carrying the engine's API ends (its sshd session killed, as a dropped link or restarted
    sshd looks) while the controller waits on the container; the rank then fails on its own. The round says how
    the rank ended and its last error first; the drop comes after, as context."""
    host, runtime, job_dir = engine_host
    problems: list[str] = []

    def drop_link_then_release(_: str) -> None:
        try:
            drop_link(host)
            # written here, not through the host: its link is what just went away
            (job_dir / "release").write_text("go\n")
        except BaseException as exc:  # the log stream's thread: kept for the test to fail on
            problems.append(f"{type(exc).__name__}: {exc}")

    message = rank_round(host, runtime, job_dir, container_name(), drop_link_then_release)
    assert not problems, problems
    assert "\n" not in message
    head, _, context = message.partition("; meanwhile ")
    assert head.startswith(f"link-case round 1 on {host.name}: node rank 1 of 2 exited 1; last lines of "
                           f"{CASE_LOG_FILE}: "), message
    assert head.endswith(OWN_ERROR), message
    assert context.startswith(f"the link to {host.name}'s container engine dropped while waiting ("), message
    assert "Traceback" not in context



def test_a_rank_whose_container_is_gone_when_the_link_is_made_again_is_lost_and_retried(
        engine_host: tuple[SshHost, DockerRuntime, Path]) -> None:
    """The link drops, and by the time it is made again the container is gone from the host's engine (removed
    there, as an engine restarted with its containers, or someone's docker rm, leaves it): the rank has no exit
    of its own. The round says it was lost, not failed, naming its container, and is retried; what the rank
    printed before the drop stays in its log."""
    import docker

    host, runtime, job_dir = engine_host
    name = container_name()
    make_link = runtime.client_factory
    dropped = threading.Event()
    removed: list[str] = []
    problems: list[str] = []

    def link_made_again() -> Any:  # the controller's next link to the engine: the container is gone by then
        if dropped.is_set() and not removed:
            docker.from_env(timeout=ENGINE_TIMEOUT_S).containers.get(name).remove(force=True)
            removed.append(name)
        return make_link()

    def drop(_: str) -> None:
        try:
            dropped.set()  # first: the controller may make its next link the moment this one ends
            drop_link(host)
        except BaseException as exc:  # the log stream's thread: kept for the test to fail on
            problems.append(f"{type(exc).__name__}: {exc}")

    runtime.client_factory = link_made_again
    message = rank_round(host, runtime, job_dir, name, drop)
    assert not problems, problems
    assert removed == [name], "the controller never made a new link after the drop"
    assert "\n" not in message and "Traceback" not in message, message
    head, _, tail = message.partition(f"; last lines of {CASE_LOG_FILE}: ")
    assert head.startswith(f"link-case round 1 on {host.name}: node rank 1 of 2 lost, not failed: its container "
                           f"{name} was removed from {host.name}'s engine while it ran (the link dropped "), message
    assert tail == "ready", message  # what it printed; the lost line, which the log ends with, is said once
    assert "may still run" not in message, message


def test_a_rank_lost_to_a_flapping_link_is_removed_through_a_new_one(
        engine_host: tuple[SshHost, DockerRuntime, Path]) -> None:
    """The link drops again each time it is made again, until the controller stops waiting on it: the rank is lost,
    not failed (retried), and its container, still running, is removed through a link made anew (left there, it
    would run beside the round's retry, on the same devices)."""
    host, runtime, job_dir = engine_host
    name = container_name()
    drops: list[str] = []
    problems: list[str] = []

    def drop(when: str) -> None:
        try:
            drop_link(host)
            drops.append(when)
        except BaseException as exc:  # another thread's: kept for the test to fail on
            problems.append(f"{type(exc).__name__}: {exc}")

    class DropWhenWaitedOnAgain(logging.Handler):
        """In the controller's thread, as it says it waits on the container again over the new link."""

        def emit(self, record: logging.LogRecord) -> None:
            if "waited on again" in record.getMessage():
                drop("made again")

    handler = DropWhenWaitedOnAgain(logging.WARNING)
    docker_logger = logging.getLogger("flagperf.hosts.docker")
    docker_logger.addHandler(handler)
    try:
        message = rank_round(host, runtime, job_dir, name, lambda _: drop("first"))  # checks no container is left
    finally:
        docker_logger.removeHandler(handler)
    assert not problems, problems
    assert drops.count("made again") == MAX_LINK_DROPS + 1, drops
    assert "\n" not in message and "Traceback" not in message, message
    assert message.startswith(f"link-case round 1 on {host.name}: node rank 1 of 2 lost, not failed: the link to "
                              f"{host.name}'s container engine dropped {MAX_LINK_DROPS + 1} times while waiting on "
                              f"container {name} "), message
    assert "may still run" not in message, message  # it was removed: nothing of it runs beside the retry


def test_a_rank_killed_at_its_timeout_as_the_link_drops_is_killed_through_a_new_one(
        engine_host: tuple[SshHost, DockerRuntime, Path]) -> None:
    """The rank outlives its timeout_s, and the link to the engine drops just as the controller sends the kill: the
    kill is sent again through a link made anew, and the round says it timed out (retried), its log as far as it
    got kept; no link error escapes in its place."""
    host, runtime, job_dir = engine_host
    name = container_name()
    make_link = runtime.client_factory
    ready = threading.Event()
    kills: list[tuple[int, str]] = []  # (which link the kill went over, what came of it)
    links_made: list[Any] = []

    def link_made() -> Any:
        client = make_link()
        links_made.append(client)
        link_number = len(links_made)
        send_kill = client.api.kill

        def kill(*args: Any, **kwargs: Any) -> Any:
            if not kills:  # the first kill: the link drops just as it is sent (once the rank has printed)
                assert ready.wait(ENGINE_TIMEOUT_S), "the rank never said it was ready"
                drop_link(host)
            try:
                answer = send_kill(*args, **kwargs)
            except BaseException as exc:
                kills.append((link_number, type(exc).__name__))
                raise
            kills.append((link_number, "sent"))
            return answer

        client.api.kill = kill
        return client

    runtime.client_factory = link_made
    message = rank_round(host, runtime, job_dir, name, lambda _: ready.set(), timeout_s=1)
    assert len(kills) == 2 and kills[0][1] != "sent" and kills[1][1] == "sent", kills
    assert kills[0][0] != kills[1][0], f"the kill was sent again over the link that dropped: {kills}"
    assert "\n" not in message and "Traceback" not in message, message
    assert message == (f"link-case round 1 on {host.name}: node rank 1 of 2 timed out after 1 s (timeout_s); "
                       "the process group was killed; last line of case.log: ready"), message
    assert host.read_text(job_dir / CASE_LOG_FILE).splitlines()[:1] == ["ready"]
