"""From inventory entries to the objects the flows act on: a Host and the Runtime that runs cases on it."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from flagperf.config.vendors import Vendor
from flagperf.errors import ConfigError
from flagperf.hosts.container_policy import PathFacts, PolicyError
from flagperf.hosts.docker import ContainerSettings, DockerRuntime, container_settings, engine_client
from flagperf.hosts.inventory import HostSpec, spec_origin
from flagperf.hosts.local import Host, LocalHost, describe_paths
from flagperf.hosts.runtime import ProcessRuntime, Runtime
from flagperf.hosts.slurm import SlurmHost, SlurmRuntime, cancel_jobs
from flagperf.hosts.ssh import SshHost
from flagperf.hosts.threads import RoundsStopped, stop_requested

STOP_PARALLEL_HOSTS = 16  # stop_runs' threads at most
_connections: dict[str, SshHost] = {}
_connections_lock = threading.Lock()


def open_host(spec: HostSpec, on_host: bool = False) -> Host:
    """The host as the controller reaches it; ``on_host``: we are running on that host (its agent).
    SSH hosts are shared per entry within the process: every round of a run reuses one connection. A thread of an
    evaluation that is stopping opens none (RoundsStopped): the controller is about to clean the hosts."""
    if stop_requested():
        raise RoundsStopped(f"the run is stopping: host {spec.name} is not opened again")
    if spec.slurm is not None and not on_host:  # jobs on a cluster; files on its shared folder
        return SlurmHost(spec)
    if spec.transport == "local" or on_host:
        return LocalHost(name=spec.name, work_root=Path(spec.work_root) if spec.work_root else None,
                         env=spec.runtime_env())
    key = spec.model_dump_json()
    with _connections_lock:
        if key not in _connections:
            _connections[key] = SshHost(spec)
        return _connections[key]


def close_hosts() -> None:
    """Close every SSH connection this process opened and cancel every Slurm job it left (the end of an
    evaluation, also an interrupted one)."""
    cancel_jobs()
    with _connections_lock:
        hosts = list(_connections.values())
        _connections.clear()
    for host in hosts:
        host.close()


def master_address(spec: HostSpec) -> str:
    """Where the other nodes reach node 0 (FlagPerf: HOSTS[0])."""
    return "127.0.0.1" if spec.transport == "local" else spec.address


def host_user(host: Host) -> str:
    """uid:gid of the user the host is driven as: a container writes the round's files as that user."""
    if isinstance(host, SshHost):
        info = host.info()
        return f"{info['uid']}:{info['gid']}"
    return f"{os.getuid()}:{os.getgid()}"


def runtime_class(spec: HostSpec) -> type[Runtime]:
    if spec.slurm is not None:
        return SlurmRuntime
    return ProcessRuntime if spec.runtime == "process" else DockerRuntime


def stop_runs(hosts: dict[str, Host], specs: dict[str, HostSpec], run_id: str) -> dict[str, str]:
    """After an interrupt: each host's runtime ends what the run still has running there (Runtime.stop_run), over
    the given (fresh) connections. The hosts where something may still run, each with why: not to be cleaned. A
    host with an agent runs its rounds on its own worker, which cleans them."""
    def stop(name: str) -> str | None:
        try:
            return runtime_class(specs[name]).stop_run(hosts[name], specs[name], run_id)
        except Exception as exc:  # one host's surprise must not cost the others their clean-up or the run its report
            return f"ending what the run left there failed: {type(exc).__name__}: {exc}"

    # all hosts at once: a hung engine costs its own timeout once, not once per host
    names = [name for name in hosts if specs[name].agent is None]
    with ThreadPoolExecutor(max_workers=max(1, min(len(names), STOP_PARALLEL_HOSTS)),
                            thread_name_prefix="stop-run") as pool:
        found = dict(zip(names, pool.map(stop, names), strict=True))
    return {name: why for name, why in found.items() if why}


def runtime_for(host: Host, spec: HostSpec, vendor: Vendor, image: dict[str, Any], run_id: str,
                cases: Sequence[str] = ()) -> Runtime:
    """``cases``: the run's case folders (RunPlan.case_folders), which its containers get where they lie outside
    the host's project (a docker host's, a Slurm entry's container image's)."""
    kind = runtime_class(spec)
    if kind is SlurmRuntime:
        return SlurmRuntime(host.search_mounts(vendor.name, cases) if isinstance(host, SlurmHost) else None)
    if kind is ProcessRuntime:
        return ProcessRuntime()
    settings = checked_on_host(container_settings(vendor, spec, image["tag"], host.project_root, cases,
                                                   host.work_root), host, spec)
    return DockerRuntime(settings, client_factory=partial(engine_client, host, spec), user=host_user(host),
                         scratch_root=host.work_root / run_id)


def checked_on_host(settings: ContainerSettings, host: Host, spec: HostSpec) -> ContainerSettings:
    """The container policy's second look: mounts and devices with their symlinks resolved where the engine
    mounts them (the host's own engine: on the host; the controller's engine: here). ConfigError names the
    inventory file and key."""
    paths = settings.host_paths()
    if not paths:
        return settings
    scan, tree, mounted = settings.scan_paths(), settings.scan_tree(), settings.scan_mounted()
    where = (describe_paths(paths, scan, tree, mounted) if spec.docker.engine == "local" else
             host.describe_paths(paths, scan, tree, mounted))
    facts = {path: PathFacts.of(found) for path, found in where.items()}
    try:
        return settings.resolved(facts)
    except PolicyError as exc:
        source, prefix = spec_origin(spec)
        if exc.source is not None:
            source, prefix = exc.source, ""
        raise ConfigError(source, f"{prefix}{exc.key}" if exc.key else prefix.rstrip(".") or None,
                          f"on host {spec.name}: {exc}") from None
