"""Containers through the docker SDK: images built from vendor_images/<vendor>/<framework>/Dockerfile
(tag from the build context's content and a keyed hash of its build args, so an unchanged image is never
rebuilt and a secret build arg cannot be read back from a tag) and case rounds run in
them, on the controller's engine or on a host's own engine through that host's SSH connection.

What a container gets comes from the vendor's folder (vendor.yaml ``container``) and the inventory
(shm size, visible devices, data mounts, FlagPerf's ACCE_CONTAINER_OPT); it is never privileged unless
the vendor file says so and why.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flagperf.config.files import hash_file, regular_file_problem
from flagperf.config.job import JOB_FILE
from flagperf.config.vendors import HostSpecSettings, Vendor
from flagperf.errors import ConfigError, error_line
from flagperf.hosts.adaptation import CACHE_FOLDER as ADAPTATION_CACHE
from flagperf.hosts.container_policy import (
    ENV_FILE_IN_CONTAINER,
    Mount,
    PathFacts,
    PolicyError,
    SearchMounts,
    device_host_path,
    parse_container_options,
    parse_data_mount,
    resolved_device,
    resolved_mount,
    search_mounts,
    work_root_source_problem,
)
from flagperf.hosts.inventory import HostSpec, check_mount_places, resolve_values, spec_origin
from flagperf.hosts.local import CommandResult, Host, LineSink
from flagperf.hosts.probe import probe_command
from flagperf.hosts.runtime import Runtime
from flagperf.hosts.threads import HOST_THREADS, CaseStopped, HostThreads, RoundsStopped
from flagperf.paths import PROJECT_ROOT, display_path
from flagperf.results.schema import CASE_LOG_FILE

logger = logging.getLogger("flagperf.hosts.docker")
BUILD_TIMEOUT_S = 3600
API_TIMEOUT_S = 120
# A clean-up's own calls: a hung engine costs an interrupted run this much per call, not API_TIMEOUT_S
STOP_TIMEOUT_S = 30
# How long a clean-up looks again at containers whose removal the engine answered late (a large container's files on
# vfs, a loaded machine: the removal goes on there) until each no longer runs: a host's clean-up costs this at most
STOP_WAIT_S = 120
LIVE_STATES = ("running", "paused", "restarting")  # the engine's list State of a container whose processes still run
LABEL = "org.flagperf"
# A value the controller labels every container it starts with (org.flagperf.owner): whoever shares an engine (a test
# bed, a lab's deployments) can find and remove its own containers, and only those.
OWNER_ENV = "FLAGPERF_CONTAINER_OWNER"
OWNER_VALUE = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def owner_labels() -> dict[str, str]:
    """The owner label of every container the controller starts ({} where FLAGPERF_CONTAINER_OWNER is unset or
    empty); ConfigError naming the variable where its value is no label a `docker ps --filter` finds by (a space, a
    '=', a newline) or is longer than 128 characters. `flagperf run`, `flagperf nightly` and the flow's planning
    check it first, before anything starts."""
    value = os.environ.get(OWNER_ENV, "")
    if not value:
        return {}
    if not OWNER_VALUE.fullmatch(value):
        raise ConfigError(OWNER_ENV, None, f"{value[:64]!r} is not a container owner value (1 to 128 of A-Z, a-z, "
                                           "0-9, '_', '.', '-')")
    return {f"{LABEL}.owner": value}
# Variables the container runtime itself reads from a container's config (device selection): these stay there.
RUNTIME_READS = re.compile(r"^(NVIDIA_[A-Z0-9_]*|[A-Z0-9_]*_VISIBLE_DEVICES)$")


class ContainerEngineError(OSError):
    """The engine cannot be reached or refused a request: one line naming the host."""


def require_docker() -> Any:
    try:
        import docker
    except ImportError:
        raise ContainerEngineError("the container runtime needs the 'docker' package (pip install docker)") from None
    return docker


def engine_client(host: Host, spec: HostSpec, timeout: float = API_TIMEOUT_S) -> Any:
    """A docker.DockerClient for the host's engine: the local socket, or the host's engine through the host's
    own (host-key-verified) SSH connection running ``docker system dial-stdio``."""
    docker = require_docker()
    if spec.docker.engine == "local":
        try:
            return docker.DockerClient(base_url=spec.docker.base_url or os.environ.get("DOCKER_HOST")
                                       or "unix:///var/run/docker.sock", timeout=int(timeout))
        except docker.errors.DockerException as exc:
            raise ContainerEngineError(f"host {spec.name}: container engine not reachable: {exc}") from None
    from docker.transport.sshconn import SSHHTTPAdapter

    from flagperf.hosts.ssh import SshHost

    if not isinstance(host, SshHost):
        raise ContainerEngineError(f"host {spec.name}: docker.engine: ssh needs an SSH host")
    ssh_client = host.client()

    class HostConnectionAdapter(SSHHTTPAdapter):  # type: ignore[misc]
        """docker-py's SSH adapter on our connection (docker-py's own would use ~/.ssh and system keys)."""

        def _create_paramiko_client(self, base_url: str) -> None:
            self.ssh_client = ssh_client

        def _connect(self) -> None:
            host.client()  # reconnects (verifying the host key) if the connection dropped

    api = docker.APIClient(base_url=f"ssh://{spec.ssh_user()}@{spec.address}", version="1.41",
                           timeout=int(timeout), use_ssh_client=True)
    adapter = HostConnectionAdapter(api.base_url, timeout=int(timeout))
    api._custom_adapter = adapter
    api.mount("http+docker://ssh", adapter)
    try:
        api._version = api._retrieve_server_version()
    except docker.errors.DockerException as exc:
        raise ContainerEngineError(f"host {spec.name}: container engine not reachable over SSH: "
                                   f"{str(exc).splitlines()[0]}") from None
    client = docker.DockerClient.__new__(docker.DockerClient)
    client.api = api
    return client


# ------------------------------------------------------------------------------------------------ images

def context_digest(folder: Path) -> str:
    """Content hash of a build context's files (recorded: it says which Dockerfile folder an image came from)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        hash_file(digest, path)
        digest.update(b"\0")
    return digest.hexdigest()


def build_args_key_file() -> Path:
    """This machine's key for build-arg digests: FLAGPERF_DIGEST_KEY_FILE, else flagperf/digest.key in the user's
    config folder (XDG_CONFIG_HOME, ~/.config); outside the project, never copied into a run."""
    configured = os.environ.get("FLAGPERF_DIGEST_KEY_FILE")
    if configured:
        return Path(configured).expanduser()
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "flagperf" / "digest.key"


def build_args_key() -> bytes:
    """The key (32 random bytes, mode 0600), made on first use; processes racing to make it agree on one."""
    path = build_args_key_file()
    problem = regular_file_problem(path, what="the build-arg digest key")  # a FIFO or /dev/zero: never read
    if problem and problem != "file not found":
        raise ConfigError(str(path), None, problem)
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(os.urandom(32))
                out.flush()
                os.fsync(out.fileno())
            with contextlib.suppress(FileExistsError):  # never replaces a key another process made meanwhile
                os.link(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        key = path.read_bytes()
    if len(key) < 16:
        raise ConfigError(str(path), None, "the build-arg digest key is shorter than 16 bytes: remove the file to "
                                           "make a new one")
    return key


def build_args_digest(build_args: dict[str, str]) -> str:
    """A keyed hash (HMAC-SHA256, this machine's key) of the build args: the image tag changes with them, and
    a build arg that is a secret cannot be guessed offline from a tag (a plain hash of a weak one could)."""
    if not build_args:
        return ""
    text = "".join(f"ARG {key}={value}\0" for key, value in sorted(build_args.items()))
    return hmac.new(build_args_key(), text.encode(), hashlib.sha256).hexdigest()


def image_digest(folder: Path, build_args: dict[str, str] | None = None) -> str:
    """What an image tag is made of: the build context's files and (keyed) its build args."""
    files = context_digest(folder)
    if not build_args:
        return files
    return hashlib.sha256(f"{files}\0{build_args_digest(build_args)}".encode()).hexdigest()


def image_context(vendor: Vendor, framework: str | None) -> Path:
    """vendor_images/<vendor>/<framework>/ (the vendor's default framework folder when none is named)."""
    default = (vendor.folder / vendor.manifest.container.dockerfile).parent
    folder = default if framework is None else vendor.folder / framework
    if not (folder / "Dockerfile").is_file():
        raise ConfigError(f"vendor_images/{vendor.name}", framework or vendor.manifest.container.dockerfile,
                          f"no Dockerfile in {folder}")
    return folder


def image_tag(vendor: str, framework: str, digest: str) -> str:
    return f"flagperf/{vendor}-{framework}:{digest[:16]}"


_build_locks: dict[str, threading.Lock] = {}
_build_locks_guard = threading.Lock()


def ensure_image(client: Any, context: Path, tag: str, build_args: dict[str, str], on_line: LineSink,
                 timeout_s: float = BUILD_TIMEOUT_S) -> str:
    """Build the image unless an image with this content tag exists; returns "present" or "built".
    Hosts that turn out to share an engine build a tag once: the others wait and find it present."""
    with _build_locks_guard:
        lock = _build_locks.setdefault(tag, threading.Lock())
    with lock:
        return _ensure_image(client, context, tag, build_args, on_line, timeout_s)


def _ensure_image(client: Any, context: Path, tag: str, build_args: dict[str, str], on_line: LineSink,
                  timeout_s: float) -> str:
    docker = require_docker()
    try:
        client.images.get(tag)
        return "present"
    except docker.errors.ImageNotFound:
        pass
    started = time.monotonic()
    try:
        stream = client.api.build(path=str(context), tag=tag, buildargs=build_args, rm=True, forcerm=True,
                                  decode=True, network_mode="host", pull=False, timeout=int(timeout_s),
                                  labels={f"{LABEL}.tag_digest": tag.rsplit(":", 1)[1]})
        for chunk in stream:
            if "error" in chunk:
                raise ContainerEngineError(f"building {tag} failed: {str(chunk['error']).strip()}")
            text = chunk.get("stream") or chunk.get("status")
            if text and text.strip():
                on_line(text.rstrip())
    except docker.errors.APIError as exc:
        raise ContainerEngineError(f"building {tag} failed: {exc.explanation or exc}") from None
    client.images.get(tag)  # the build said it succeeded: the tag must exist
    on_line(f"built {tag} in {time.monotonic() - started:.0f} s")
    return "built"


# ------------------------------------------------------------------------------------------------ rounds

@dataclass(frozen=True)
class ContainerSettings:
    """docker run options for one host and vendor, resolved before any round."""

    image: str
    python: str
    shm_size: str
    privileged: bool
    env: dict[str, str]
    device_requests: list[dict[str, Any]]
    devices: list[str]
    data_mounts: list[Mount]  # for case rounds only
    extra_mounts: list[Mount]  # from docker.extra_options: every container, the probe's too
    ipc_mode: str | None
    group_add: list[str]
    ulimits: dict[str, int]
    data_roots: tuple[str, ...] = ()
    # The vendor's folders in the host's FLAGPERF_VENDOR_PATH folders that resolve outside its project, and the run's
    # cases' in its FLAGPERF_CASE_PATH folders (<folder>/<family>/<case>), under /flagperf-search: every container
    # (``resolved`` decides them on the host and rewrites the variables that name them in private_env).
    search: SearchMounts = field(default_factory=SearchMounts)
    device_patterns: tuple[str, ...] = ()
    vendor_devices: tuple[str, ...] = ()  # the first of ``devices``: from the vendor file (the rest: extra options)
    vendor_file: str = "vendor.yaml"
    private_env: dict[str, str] = field(default_factory=dict)  # the inventory's other variables: by a file
    privileged_reason: str | None = None
    # The host's work root: no read-write mount's source may be it, above it or in it (work_root_source_problem),
    # checked again once resolved on the host
    work_root: str | None = None

    def host_paths(self) -> list[str]:
        """The host paths the container policy checks on the host: mount sources, data roots, devices; the work
        root only where a mount is read-write (the only ones it is checked against), so that it is not looked up on
        the host for nothing."""
        writable = any(not m.read_only for m in (*self.data_mounts, *self.extra_mounts))
        return sorted({*(m.source for m in (*self.data_mounts, *self.extra_mounts)), *self.data_roots,
                       *(device_host_path(d) for d in self.devices), *self.search.host_paths(),
                       *([self.work_root] if self.work_root is not None and writable else [])})

    def scan_paths(self) -> list[str]:
        """Of host_paths(), the folders whose links the container policy checks too (a search path mount's, the
        project's own vendor and case folders)."""
        return self.search.scan_paths()

    def scan_tree(self) -> str | None:
        """The tree (the project) whose links, not the folder's own, count for a scanned folder that lies in it."""
        return self.search.tree()

    def scan_mounted(self) -> tuple[str, ...]:
        """The container's other mounts (data mounts, -v's; SOURCE:TARGET), into which a scanned folder's link may
        lead."""
        return self.search.mounted

    def resolved(self, facts: Mapping[str, PathFacts]) -> ContainerSettings:
        """These settings with every mount source and device resolved on the host (``facts``: its answer for
        host_paths(), and scan_paths()'s links) and checked again by the container policy; PolicyError says which,
        why and its key."""
        def keyed(key: str, check: Callable[[], Any], source: str | None = None) -> Any:
            try:
                return check()
            except PolicyError as exc:
                raise PolicyError(str(exc), key, source) from None

        data = [keyed(f"docker.data_mounts.{i}", lambda m=m: resolved_mount(m, facts, self.data_roots, "data mount"))
                for i, m in enumerate(self.data_mounts)]
        extra = [keyed("docker.extra_options", lambda m=m: resolved_mount(m, facts, self.data_roots, "-v host path"))
                 for m in self.extra_mounts]
        devices = [keyed("docker.extra_options", lambda d=d: resolved_device(d, facts, self.device_patterns,
                                                                            "--device"))
                   if i >= len(self.vendor_devices) else
                   keyed(f"container.devices.{i}", lambda d=d: resolved_device(d, facts, self.device_patterns,
                                                                            "device"), self.vendor_file)
                   for i, d in enumerate(self.devices)]
        # A link may lead a source onto the work root, or the work root itself be a link: compared as resolved
        work = facts[self.work_root].path if self.work_root is not None and self.work_root in facts else self.work_root
        for key, what, mounts in (*((f"docker.data_mounts.{i}", "data mount", [m]) for i, m in enumerate(data)),
                                  ("docker.extra_options", "-v host path", extra)):
            for mount in mounts:
                problem = None if mount.read_only else work_root_source_problem(mount.source, work)
                if problem:
                    raise PolicyError(f"{what} {mount.source!r} (as resolved) is refused read-write: {problem}", key)
        search = self.search.resolved(facts)  # its PolicyError is keyed env.<variable>
        # The container's search paths name the folders where it has them (decided from the resolved folders).
        return replace(self, data_mounts=data, extra_mounts=extra, devices=devices, search=search,
                       private_env={**self.private_env, **dict(search.env)})


def container_settings(vendor: Vendor, spec: HostSpec, image: str, project_root: Path | None = None,
                       cases: Sequence[str] = (), work_root: Path | None = None) -> ContainerSettings:
    """The container a host's rounds run in, as the inventory and the vendor file ask, checked by the container
    policy as written (ConfigError naming the file and key); ``resolved`` checks it again on the host.
    ``project_root``: the host's deployment (spec.project_root when not given), which every container sees;
    ``cases``: the run's case folders, <family>/<case> (RunPlan.case_folders), found on the host's case path;
    ``work_root``: the host's work root (spec.work_root when not given), where a round's container has its scratch
    folder and the adaptation cache: no data mount or -v may lie there."""
    options = vendor.manifest.container
    roots = spec.docker.allowed_roots()
    patterns = tuple(options.device_patterns)
    source, prefix = spec_origin(spec)
    try:
        extras = parse_container_options(spec.docker.extra_options or "", roots, patterns)
    except PolicyError as exc:
        raise ConfigError(source, f"{prefix}docker.extra_options", str(exc)) from None
    data_mounts = []
    for i, entry in enumerate(spec.docker.data_mounts):
        try:
            data_mounts.append(parse_data_mount(entry, roots))
        except PolicyError as exc:
            raise ConfigError(source, f"{prefix}docker.data_mounts.{i}", str(exc)) from None
    project = str(project_root or spec.project_root or PROJECT_ROOT)
    work = work_root or spec.work_root
    check_mount_places(spec, data_mounts, extras.mounts, project, None if work is None else str(work))
    given = spec.runtime_env()
    given.update(resolve_values(extras.env, spec.name, "docker.extra_options"))
    try:
        # A link in a vendor or case folder may lead into a data mount or a -v's target: SOURCE:TARGET, so that the
        # host follows it on its way as the container would.
        search = search_mounts(given, vendor.name, cases, project,
                               [f"{m.source}:{m.target}" for m in (*data_mounts, *extras.mounts)])
    except PolicyError as exc:
        raise ConfigError(source, f"{prefix}{exc.key}", str(exc)) from None
    env = {name: value for name, value in given.items() if RUNTIME_READS.match(name)}
    private_env = {name: value for name, value in given.items() if name not in env}
    visible_env = spec.visible_devices_env or options.visible_devices_env
    if spec.visible_devices is not None and visible_env:
        env[visible_env] = spec.visible_devices
        private_env.pop(visible_env, None)
    requests = [r.model_dump(exclude_none=True) for r in options.device_requests]
    if extras.gpus is not None:  # --gpus all | --gpus 2 | --gpus device=0,1
        gpus = extras.gpus.strip('"')
        request: dict[str, Any] = {"driver": "nvidia", "capabilities": [["gpu"]]}
        if gpus == "all":
            request["count"] = -1
        elif gpus.startswith("device="):
            request["device_ids"] = gpus.removeprefix("device=").split(",")
        else:
            request["count"] = int(gpus)
        requests = [request]
    return ContainerSettings(
        image=image, python=options.python, shm_size=spec.shm_size or options.shm_size,
        privileged=options.privileged, env=env, private_env=private_env,
        privileged_reason=options.privileged_reason if options.privileged else None, device_requests=requests,
        devices=[*options.devices, *extras.devices], data_mounts=data_mounts,
        extra_mounts=extras.mounts, ipc_mode=extras.ipc or options.ipc, group_add=extras.group_add,
        ulimits=dict(options.ulimits), data_roots=roots, search=search, device_patterns=patterns,
        vendor_devices=tuple(options.devices), vendor_file=display_path(vendor.folder / "vendor.yaml"),
        work_root=None if work is None else str(work))


def exit_code_of(status: int) -> int:
    """A container's status as a process's: 128+N (killed by signal N) becomes -N, as for LocalHost."""
    return -(status - 128) if 128 < status < 160 else status


class DockerRuntime(Runtime):
    name = "docker"

    def __init__(self, settings: ContainerSettings, client_factory: Callable[[], Any], user: str | None,
                 scratch_root: Path) -> None:
        self.settings = settings
        self.client_factory = client_factory
        self.user = user  # uid:gid of the host's user: files in the mounted work root stay theirs
        self.scratch_root = scratch_root

    def run_entry(self, host: Host, job_dir: Path, timeout_s: float, on_line: LineSink | None,
                  pid_file: Path) -> CommandResult:
        argv = [self.settings.python, "-m", "flagperf.entry", "--job", str(job_dir / JOB_FILE)]
        name = "flagperf-" + "-".join(job_dir.relative_to(self.scratch_root.parent).parts)[-200:].replace("_", "-")
        try:
            result, lines = self._run(host, argv, name, {f"{LABEL}.job": str(job_dir)}, timeout_s, on_line,
                                      pid_file=pid_file, scratch=True, data=True)
        except CaseStopped as stopped:  # killed at the stop: its log is kept as any ended round's
            try:
                host.write_text(job_dir / CASE_LOG_FILE, "\n".join(stopped.lines) + ("\n" if stopped.lines else ""))
                stopped.logged = True
            except Exception as exc:  # a full disk, a closed link: its end was still seen (the controller's marker)
                logger.warning("the log of container %s, stopped, could not be kept on %s: %s (its Cancelled state "
                               "keeps it all)", name, host.name, error_line(exc))
            raise
        host.write_text(job_dir / CASE_LOG_FILE, "\n".join(lines) + ("\n" if lines else ""))
        return result

    def run_probe(self, host: Host, vendor: str, settings: HostSpecSettings | None, timeout_s: float
                  ) -> tuple[CommandResult, list[str]]:
        """``python -m flagperf.hosts.probe`` in the image, with the rounds' devices and options and the host's
        spec_settings: the accelerators and peaks the cases will see (and the host needs no torch of its own)."""
        argv = probe_command(self.settings.python, vendor, settings)
        name = f"flagperf-probe-{host.name}-{os.getpid()}-{time.monotonic_ns()}"[:200].replace("_", "-")
        return self._run(host, argv, name, {f"{LABEL}.probe": host.name}, timeout_s, None)

    def _run(self, host: Host, argv: list[str], name: str, labels: dict[str, str], timeout_s: float,
             on_line: LineSink | None, pid_file: Path | None = None, scratch: bool = False, data: bool = False
             ) -> tuple[CommandResult, list[str]]:
        """One container: created, started, waited for (killed at the timeout), its log read, always removed."""
        docker = require_docker()
        from docker.types import DeviceRequest, Ulimit
        from docker.types import Mount as DockerMount

        s = self.settings
        started = time.monotonic()
        client = self.client_factory()
        mounts = [DockerMount(str(host.project_root), str(host.project_root), type="bind", read_only=True)]
        if scratch:
            mounts.append(DockerMount(str(self.scratch_root), str(self.scratch_root), type="bind", read_only=False))
            # Vendor adaptations' installs and builds, kept across rounds and runs on this host (one per content).
            cache = self.scratch_root.parent / ADAPTATION_CACHE
            if not host.exists(cache):
                host.write_text(cache / ".keep", "")
            mounts.append(DockerMount(str(cache), str(cache), type="bind", read_only=False))
        if data:
            mounts += [DockerMount(m.target, m.source, type="bind", read_only=m.read_only) for m in s.data_mounts]
        mounts += [DockerMount(m.target, m.source, type="bind", read_only=True) for m in s.search.all()]
        volumes = [m.volume() for m in s.extra_mounts]  # -v form: keeps options such as z or rshared
        env = {**s.env, "PYTHONPATH": str(host.project_root), "PYTHONUNBUFFERED": "1",
               "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "HOME": "/tmp"}
        command = argv
        env_dir = self.scratch_root.parent / ".env" / name if s.private_env else None
        lines: list[str] = []
        streamed: collections.deque[str] = collections.deque(maxlen=STREAMED_LINES_KEPT)
        container = None
        unseen = False  # its create's answer was lost: the container may be on the engine, by its name
        running = False
        timed_out = False
        exit_code: int | None = None
        link: str | None = None
        try:
            if env_dir is not None:  # the agent sets them and execs argv: pid, signals and exit code are argv's
                host.write_text(env_dir / "env.json", json.dumps(s.private_env), mode=0o600)
                mounts.append(DockerMount(ENV_FILE_IN_CONTAINER, str(env_dir / "env.json"), type="bind",
                                          read_only=True))
                command = [s.python, "-m", "flagperf.hosts.agent", "exec-with-env", ENV_FILE_IN_CONTAINER, "--",
                           *argv]
            # network_mode host for every vendor, by design (docs/hosts-and-containers.md, Options): a multi-node
            # case's MASTER_ADDR and its NCCL/gloo sockets are the host's addresses, which a container on a bridge
            # network does not have; no vendor file may change it (none of FlagPerf's vendors asked for another).
            doing = "creating"
            try:
                container = client.containers.create(
                    s.image, command, name=name, detach=True, init=True, user=self.user,
                    working_dir=str(host.project_root), environment=env, network_mode="host", ipc_mode=s.ipc_mode,
                    shm_size=s.shm_size, privileged=s.privileged, devices=s.devices or None,
                    group_add=s.group_add or None,
                    device_requests=[DeviceRequest(**r) for r in s.device_requests] or None,
                    ulimits=[Ulimit(name=name, soft=value, hard=value) for name, value in s.ulimits.items()] or None,
                    mounts=mounts, volumes=volumes or None,
                    labels={**labels, f"{LABEL}.host": host.name, f"{LABEL}.run": self.scratch_root.name,
                            **owner_labels()})
                doing = "starting"
                container.start()
                running = True
                doing = "inspecting"
                container.reload()
            except docker.errors.APIError:
                raise  # the engine's own answer
            except link_errors() as exc:  # no answer: as a link lost during the wait (the round may be tried again)
                # a start whose answer was lost may have reached the engine: a container left running is said so
                running = running or doing == "starting"
                # a create whose answer was lost most often made the container: it is removed by its name below
                unseen = doing == "creating"
                logger.debug("the link to %s's container engine dropped while %s container %s", host.name, doing,
                             name, exc_info=exc)
                raise _Lost(f"the link to {host.name}'s container engine dropped while {doing} container {name} "
                            f"({error_line(exc)})") from exc
            if pid_file is not None:
                host.write_text(pid_file, str(container.attrs["State"]["Pid"]))  # the monitors follow the case
            logger.info("container %s (%s) started on %s%s", container.short_id, s.image, host.name,
                        f", privileged: {s.privileged_reason}" if s.privileged else "")
            streamer = threading.Thread(target=_stream, args=(container, on_line, streamed), daemon=True)
            streamer.start()
            try:
                container, exit_code, timed_out, link = self._wait(host, container, started + timeout_s)
            except CaseStopped as stopped:  # killed at the stop, its end seen: what it printed is still its log
                streamer.join(timeout=5)  # its last lines: what stands where the engine cannot give the log
                stopped.lines = _container_log(host, container, stopped.exit_code, streamed)
                raise
            streamer.join(timeout=5)
            lines = _container_log(host, container, exit_code, streamed)
        except docker.errors.ImageNotFound:
            raise ContainerEngineError(f"host {host.name}: image {s.image} is not on the engine") from None
        except _Lost as lost:  # what it printed before, then why it is lost: the round may be tried again
            lines, exit_code, link = [*streamed, f"[flagperf] {lost}"], None, str(lost)
        except docker.errors.APIError as exc:
            lines.append(f"container engine error: {exc.explanation or exc}")
            exit_code = None
            if running:  # it started: the engine's answer lost it, it did not fail to start
                link = f"the container engine answered while the case ran: {error_line(exc.explanation or exc)}"
        finally:
            if container is not None and not self._remove(host, container) and running and exit_code is None:
                # lost, and its container not removed either: the round's retry may meet it on the same devices
                link = (f"{link + '; ' if link else ''}container {name} could not be removed from {host.name}'s "
                        "engine and may still run there")
            elif unseen and not self._remove(host, None, name):  # never started: it holds its name, nothing more
                link = (f"{link + '; ' if link else ''}container {name} may have been created and could not be "
                        f"removed from {host.name}'s engine")
            if env_dir is not None:
                host.remove_tree(env_dir)
        return CommandResult(argv, exit_code, timed_out, time.monotonic() - started, link), lines

    @classmethod
    def stop_run(cls, host: Host, spec: HostSpec, run_id: str) -> str | None:
        """Force-remove the run's containers on ``host`` (labels org.flagperf.run and .host, and the owner's) over a
        new link: a round whose connection was closed at an interrupt could not remove its own, which would go on
        writing into the folder the clean-up removes. Why some may still run, or None. A removal answered later than
        STOP_TIMEOUT_S (or one already under way: its round's own try) goes on at the engine, which kills the
        container first: the run's containers are listed again until none asked for still runs (its removal may
        still be under way), for STOP_WAIT_S at most."""
        docker = require_docker()
        wanted = [f"{LABEL}.run={run_id}", f"{LABEL}.host={host.name}",
                  *(f"{key}={value}" for key, value in owner_labels().items())]
        deadline = time.monotonic() + STOP_WAIT_S
        try:
            client = engine_client(host, spec, timeout=STOP_TIMEOUT_S)
            try:
                asked: set[str] = set()
                said = ""
                while True:
                    # sparse: no inspect of each listed container, which one removed meanwhile would fail (NotFound)
                    listed = client.containers.list(all=True, sparse=True, filters={"label": wanted})
                    left = [c for c in listed if c.id not in asked or c.attrs.get("State") in LIVE_STATES]
                    if not left:
                        return None
                    if asked and time.monotonic() >= deadline:
                        return (f"its containers could not be removed: {len(left)} not ended after "
                                f"{STOP_WAIT_S:.0f} s{f' (last: {said})' if said else ''}")
                    pending = False
                    for container in left:
                        if asked and time.monotonic() >= deadline:  # said at the next listing: a hung engine
                            pending = True  # costs STOP_WAIT_S, not STOP_TIMEOUT_S per container
                            break
                        asked.add(container.id)
                        try:
                            container.remove(force=True)
                        except docker.errors.NotFound:  # removed meanwhile (its round's own try)
                            pass
                        except docker.errors.APIError as exc:
                            if not removal_in_progress(exc):  # one under way (its round's own): looked at again
                                raise
                            pending = True
                        except link_errors() as exc:  # answered late: the removal goes on; looked at again
                            said, pending = error_line(exc), True
                    if not pending:
                        return None
                    time.sleep(1.0)  # a poll of the engine's own kill and removal, not a timing assumption
            finally:
                with contextlib.suppress(Exception):  # closing a link that dropped: nothing to keep
                    client.close()
        except (docker.errors.DockerException, *link_errors()) as exc:
            return f"its containers could not be removed: {error_line(exc)}"

    def _wait(self, host: Host, container: Any, deadline: float) -> tuple[Any, int | None, bool, str | None]:
        """Wait for the container to end, killing it at ``deadline``: (the container as last reached, its exit
        code, timed out, what the link said). RoundsStopped when the evaluation stops meanwhile (an interrupt): a
        watcher kills the container then, so that the wait ends at once rather than at the controller's grace (a
        local engine's wait is no connection the interrupt closes); CaseStopped, with its exit code, where its end
        was seen (the controller records it as it records any seen end)."""
        threads = HOST_THREADS.get()
        if threads is None:  # no evaluation around it (a round's steps called alone): nothing stops it
            return self._wait_for(host, [container], deadline)
        followed = [container]  # the container as last reached: the one the watcher kills
        ended = threading.Event()
        threading.Thread(target=_kill_when_stopped, args=(threads, ended, followed), daemon=True,
                         name=f"stop-{container.name}").start()
        try:
            answer = self._wait_for(host, followed, deadline)
        finally:
            ended.set()
        if threads.stopping:  # killed by the watcher (or ended as the stop came): stopped, not the case's end
            message = f"the run is stopping: container {container.name} on {host.name} was ended"
            _, code, _, link = answer
            if code is not None and link is None:  # its end seen: the controller records it (seen_ended)
                raise CaseStopped(message, code)
            raise RoundsStopped(message)
        return answer

    def _wait_for(self, host: Host, followed: list[Any], deadline: float) -> tuple[Any, int | None, bool, str | None]:
        """_wait's wait on ``followed[0]``, kept there as reached again. A wait that ends without the engine's
        answer (the link to the host's engine dropped, or the wait's own read timeout) is not the container's end:
        the engine is reached again and asked for the container's state; _Lost when that cannot be done."""
        docker = require_docker()
        container = followed[0]
        link: str | None = None
        for drops in range(MAX_LINK_DROPS + 1):
            try:
                status = container.wait(timeout=max(1.0, deadline - time.monotonic()))
                return container, exit_code_of(int(status.get("StatusCode", -1))), False, link
            except docker.errors.NotFound:
                raise _Lost(f"its container {container.name} was removed from {host.name}'s engine while it "
                            f"ran") from None
            except docker.errors.APIError:
                raise  # the engine's own answer
            except link_errors() as exc:
                said = error_line(exc)
            overran = time.monotonic() >= deadline
            container = followed[0] = self._reattach(host, container, said)
            state = container.attrs["State"]
            if overran and state.get("Running"):  # the wait's read timeout, the case still running: it overran
                return self._kill_overran(host, container, link)
            if not overran:
                link = (f"the link to {host.name}'s container engine dropped while waiting ({said}) and was made "
                        "again" + (f" ({drops + 1} times)" if drops else ""))
                logger.warning("%s: container %s %s", link, container.short_id,
                               "waited on again" if state.get("Running") else "had ended")
            if not state.get("Running"):  # it ended meanwhile: its own status stands
                return container, exit_code_of(int(state.get("ExitCode", -1))), False, link
        raise _Lost(f"the link to {host.name}'s container engine dropped {MAX_LINK_DROPS + 1} times while waiting "
                    f"on container {container.name} (last: {said})")

    def _kill_overran(self, host: Host, container: Any, link: str | None) -> tuple[Any, int | None, bool, str | None]:
        """Kill the container that ran past its deadline and wait for its end, as _wait answers. A link that drops
        meanwhile (or a wait that ends without the engine's answer) is made again and the container's state asked:
        killed already, or killed again there; _Lost when the engine cannot be reached again (the round's removal
        of the container then tries a new link too)."""
        docker = require_docker()
        for drops in range(MAX_LINK_DROPS + 1):
            try:
                container.kill()
                status = container.wait(timeout=KILL_WAIT_S)
                return container, exit_code_of(int(status.get("StatusCode", 137))), True, link
            except docker.errors.NotFound:
                raise _Lost(f"its container {container.name} was removed from {host.name}'s engine as it was "
                            "killed at its timeout") from None
            except docker.errors.APIError as exc:
                if exc.status_code != 409:
                    raise  # the engine's own answer
                said = error_line(exc)  # 409: not running; it ended between its deadline and the kill
                container = self._reattach(host, container, said)
                if not container.attrs["State"].get("Running"):
                    return container, exit_code_of(int(container.attrs["State"].get("ExitCode", 137))), True, link
                continue
            except link_errors() as exc:
                said = error_line(exc)
            container = self._reattach(host, container, said)
            link = (f"the link to {host.name}'s container engine dropped while killing it at its timeout ({said}) "
                    "and was made again" + (f" ({drops + 1} times)" if drops else ""))
            state = container.attrs["State"]
            logger.warning("%s: container %s %s", link, container.short_id,
                           "still running" if state.get("Running") else "had ended")
            if not state.get("Running"):  # the kill reached it before the answer was lost
                return container, exit_code_of(int(state.get("ExitCode", 137))), True, link
        raise _Lost(f"it ran past its timeout and the link to {host.name}'s container engine dropped "
                    f"{MAX_LINK_DROPS + 1} times while killing container {container.name} (last: {said})")

    def _remove(self, host: Host, container: Any | None, name: str | None = None) -> bool:
        """Force-remove the container, through a new link if its own dropped (one left running beside the
        round's retry would share its devices); whether it is gone. No ``container`` (its create's answer was
        lost): the one ``name`` names, if the engine has it, through a new link. A failure is a warning, never in
        place of the round's outcome."""
        docker = require_docker()
        said = ""
        ref = container.id if container is not None else name
        for fresh in (False, True) if container is not None else (True,):
            client = None
            try:
                if fresh:
                    client = self.client_factory()  # a new link (an SSH engine's: a connection), closed below
                (client.containers.get(ref) if client is not None else container).remove(force=True)
                return True
            except docker.errors.NotFound:  # gone, or never made
                return True
            except docker.errors.APIError as exc:
                said = error_line(exc)
                if removal_in_progress(exc):  # the first try's, slower than its link's
                    if self._removed_meanwhile(ref):  # timeout (a large container on vfs): it is killed
                        return True
                    break
            except (docker.errors.DockerException, *link_errors()) as exc:
                said = error_line(exc)
            finally:
                if client is not None:
                    with contextlib.suppress(Exception):  # closing a link that dropped: nothing to keep
                        client.close()
        logger.warning("could not remove container %s on %s (%s): it may still run there",
                       container.short_id if container is not None else name, host.name, said)
        return False

    def _removed_meanwhile(self, ref: str) -> bool:
        """Whether a removal the engine has under way (of the container ``ref``, an id or name) ends within
        API_TIMEOUT_S (its container is already killed, so nothing of it runs meanwhile)."""
        docker = require_docker()
        deadline = time.monotonic() + API_TIMEOUT_S
        try:
            client = self.client_factory()
        except (docker.errors.DockerException, *link_errors()):
            return False
        try:
            while time.monotonic() < deadline:
                try:
                    client.containers.get(ref)
                except docker.errors.NotFound:
                    return True
                except (docker.errors.DockerException, *link_errors()):
                    return False
                time.sleep(1.0)  # a poll of the engine's own removal, not a timing assumption
            return False
        finally:
            with contextlib.suppress(Exception):  # closing a link that dropped: nothing to keep
                client.close()

    def _reattach(self, host: Host, container: Any, said: str) -> Any:
        """The container, its state fresh from the host's engine: on the same link, else on a new one (the host's
        SSH connection made again); _Lost naming the host when the engine cannot be reached or has no such
        container."""
        docker = require_docker()
        try:
            container.reload()
            return container
        except docker.errors.NotFound:
            raise _Lost(f"its container {container.name} was removed from {host.name}'s engine while it ran "
                        f"(the wait ended: {said})") from None
        except (docker.errors.APIError, *link_errors()):
            pass  # the link is gone: a new one
        try:
            return self.client_factory().containers.get(container.id)
        except docker.errors.NotFound:
            raise _Lost(f"its container {container.name} was removed from {host.name}'s engine while it ran "
                        f"(the link dropped first: {said})") from None
        except (docker.errors.DockerException, *link_errors()) as exc:
            raise _Lost(f"the link to {host.name}'s container engine dropped while waiting ({said}) and could not be "
                        f"made again: {error_line(exc)}") from None


class _Lost(Exception):
    """The container cannot be followed any more (the link to its engine is gone, or it was removed): one line."""


# The lines the live stream keeps: what a container lost to its link printed before (its log went with it).
STREAMED_LINES_KEPT = 200
MAX_LINK_DROPS = 3  # a link that drops more often during one wait is no link to wait on
KILL_WAIT_S = 60  # how long a killed container's end is waited for before its state is asked again
OOM_LINE = "[flagperf] the container engine says the container was killed for want of memory (OOMKilled)"


def link_errors() -> tuple[type[BaseException], ...]:
    """What the docker SDK raises when an answer is lost on the way (requests over a socket, or over a paramiko
    channel for an SSH host): not the engine's own answer, which is docker.errors.APIError (an HTTPError, so
    catch it before these)."""
    import paramiko
    import requests

    return requests.exceptions.RequestException, paramiko.SSHException, OSError, EOFError


def removal_in_progress(exc: Any) -> bool:
    """Whether the engine's answer to a removal (an APIError) says another removal of the container is under way
    (409): the engine has killed the container already, and that removal goes on."""
    return exc.status_code == 409 and "in progress" in error_line(exc)


def _container_log(host: Host, container: Any, exit_code: int | None, streamed: collections.deque[str]) -> list[str]:
    """The ended container's own log, from the host's engine (the live stream may have dropped with the link); what
    the stream got, and why, where the engine cannot give it (its link dropped, or its answer was an error: the
    container removed meanwhile, NotFound)."""
    docker = require_docker()
    try:
        lines: list[str] = container.logs(stdout=True, stderr=True).decode("utf-8", "replace").splitlines()
        if exit_code != 0 and _oom_killed(container):
            lines.append(OOM_LINE)
    except (docker.errors.APIError, *link_errors()) as exc:  # its exit code stands; its log, as the stream got it
        lines = [*streamed, f"[flagperf] its log could not be read from {host.name}'s engine: {error_line(exc)}"]
    return lines


def _oom_killed(container: Any) -> bool:
    """Whether the engine killed the container for memory (asked again: best effort, the exit code stands)."""
    docker = require_docker()
    try:
        container.reload()
    except (docker.errors.APIError, *link_errors()):
        return False
    return bool(container.attrs.get("State", {}).get("OOMKilled"))


STOP_POLL_S = 0.5  # how often a stop watcher looks whether its container's wait has ended


def _kill_when_stopped(threads: HostThreads, ended: threading.Event, followed: list[Any]) -> None:
    """Kill ``followed[0]`` once the evaluation stops, unless its wait ``ended`` first. A kill that fails (a link
    that dropped, made again by the wait; an engine busy) is tried again at each poll until the wait ends: one
    passing error must not leave the case running until the controller's grace. A link the interrupt closed fails
    the wait itself, and the run's clean-up (stop_run) removes what is left."""
    while not ended.is_set():
        if not threads.wait_stopping(STOP_POLL_S) or ended.is_set():
            continue
        container = followed[0]  # as the wait last reached it
        try:
            container.kill()
            return
        except Exception as exc:  # ended meanwhile (409: its wait ends too), or its link is gone for now
            logger.debug("container %s not killed at the stop (%s): tried again", container.name, error_line(exc))
        ended.wait(STOP_POLL_S)


def _stream(container: Any, on_line: LineSink | None, kept: collections.deque[str]) -> None:
    """Live log lines into the task log (and the last of them into ``kept``); the authoritative log is read in
    full after the container ends."""
    if on_line is None:
        return
    pending = b""
    try:
        for chunk in container.logs(stream=True, follow=True):
            pending += chunk
            *done, pending = pending.split(b"\n")
            for line in done:
                text = line.decode("utf-8", "replace")
                kept.append(text)
                on_line(text)
    except Exception as exc:  # a dropped stream loses live lines only
        logger.debug("log stream ended: %s", exc)
