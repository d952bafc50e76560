"""What the hosts can hold, against what the plan asks: checked before any round, with each host's probe.

`flagperf run` probes the hosts it runs as the controller itself before any server starts; the flow checks
again with every host's healthcheck probe, and with the probe inside each docker host's image. A case that
asks for more than a host has (nodes, processes per node, memory) is bad input: one line naming the setting
and where it came from, and nothing runs.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from flagperf.config.cases import load_case
from flagperf.config.memory import USABLE_SHARE, DeviceMemory, MemoryNeed, memory_need
from flagperf.config.plan import CasePlan, RunPlan
from flagperf.errors import ConfigError
from flagperf.hosts.health import PROBE_TIMEOUT_S
from flagperf.hosts.inventory import HostSpec
from flagperf.hosts.local import LocalHost
from flagperf.hosts.probe import probe_command

log = logging.getLogger(__name__)
RUN_OVERRIDE_SOURCE = "--set"


def check_capacity(plan: RunPlan, hosts: list[str], probes: dict[str, dict[str, Any] | None]) -> None:
    """Every case against every host whose probe is known (a host without one is not judged here)."""
    check_scale(plan, hosts, probes)
    check_memory(plan, hosts, probes)


def check_scale(plan: RunPlan, hosts: list[str], probes: dict[str, dict[str, Any] | None]) -> None:
    """A case may not ask for more nodes than hosts, or more processes per node than a host has devices
    (cores, where the device is the host's CPU)."""
    shares_host = plan.vendor.manifest.shares_host_memory
    for case in plan.cases:
        nnodes, nproc = int(case.config.get("nnodes", 1)), int(case.config.get("nproc_per_node", 1))
        if nnodes > len(hosts):
            raise ConfigError(case.origins.get("nnodes", case.name), "nnodes",
                              f"{case.name} asks for {nnodes} nodes; the inventory has {len(hosts)} host(s)")
        for host in hosts:
            probe = probes.get(host) or {}
            capacity = (probe.get("host") or {}).get("usable_cpus") if shares_host else probe.get("device_count")
            if capacity is not None and nproc > capacity:
                what = "usable CPU cores" if shares_host else "visible devices"
                raise ConfigError(case.origins.get("nproc_per_node", case.name), "nproc_per_node",
                                  f"{case.name} asks for {nproc} processes per node; host {host} has "
                                  f"{capacity} {what}")


def check_memory(plan: RunPlan, hosts: list[str], probes: dict[str, dict[str, Any] | None]) -> None:
    """A case whose configuration tells its memory (a GEMM's operands, a copy's buffers) must fit in the
    usable share of every host's device memory, as the case itself checks when its round starts. A need that
    depends on the device (a cache flush twice a memory-side cache) is taken on each host's, by its probe."""
    shares_host = plan.vendor.manifest.shares_host_memory
    for case in plan.cases:
        declared = _need(case)
        if declared is None:
            continue
        for host in hosts:
            memory = (probes.get(host) or {}).get("device_memory_bytes")
            if not isinstance(memory, int):
                continue
            need = declared.on(DeviceMemory.from_probe(probes.get(host) or {}, shares_host))
            if need.bytes <= USABLE_SHARE * memory:
                continue
            # Name the setting the user gave where there is one (--set m=...), else the first size key.
            key = next((k for k in need.keys if case.origins.get(k) == RUN_OVERRIDE_SOURCE), need.keys[0])
            device = (probes.get(host) or {}).get("device") or plan.vendor.manifest.torch_device
            raise ConfigError(case.origins.get(key, case.name), f"{case.name}.{key}",
                              f"{need.what} needs {need.bytes / 2**30:.2f} GiB, more than {USABLE_SHARE:.0%} of "
                              f"the {memory / 2**30:.2f} GiB on host {host} ({device})")


def check_capacity_here(plan: RunPlan, specs: list[HostSpec]) -> None:
    """`flagperf run`, before any server starts: the plan against the hosts the controller runs as itself
    (the flow checks every host again after its healthcheck)."""
    if not any(int(case.config.get("nproc_per_node", 1)) > 1 or _need(case) is not None for case in plan.cases):
        return  # nothing a probe could refuse: spare its seconds
    probes = {spec.name: probe_local_host(spec, plan.vendor.name) for spec in specs}
    check_capacity(plan, [spec.name for spec in specs], probes)


def _need(case: CasePlan) -> MemoryNeed | None:
    return memory_need(load_case(case.name).config_model.model_validate(case.config))


def probe_local_host(spec: HostSpec, vendor: str) -> dict[str, Any] | None:
    """The probe's answer on a host the controller runs as itself (no SSH, no agent), before any server
    starts; None when it gives none (the flow's healthcheck then says why, in its own words)."""
    if spec.transport != "local" or spec.agent is not None:
        return None
    lines: list[str] = []
    try:
        host = LocalHost(name=spec.name, work_root=spec.work_root, env=spec.runtime_env())
        result = host.run(probe_command(host.python, vendor, spec.host_spec_settings()),
                          timeout=PROBE_TIMEOUT_S, on_line=lines.append)
    except (OSError, ValueError) as exc:  # no private work root, a bad name: the healthcheck says so
        log.info("no probe of %s before the run (%s); left to the healthcheck", spec.name, exc)
        return None
    answer = next((line for line in reversed(lines) if line.startswith("{")), None)
    if result.exit_code != 0 or answer is None:
        log.info("no probe of %s before the run (exit %s); left to the healthcheck", spec.name, result.exit_code)
        return None
    try:
        probe = json.loads(answer)
    except json.JSONDecodeError:
        return None
    # A host whose devices torch cannot see fails its healthcheck, with the reason; its zero devices are
    # not a size the user asked for.
    return probe if isinstance(probe, dict) and probe.get("device_visible") else None
