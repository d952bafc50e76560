from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NONE

from flagperf.config.vendors import Vendor
from flagperf.errors import InfrastructureFailure
from flagperf.hosts.buildlog import BuildTranscript
from flagperf.hosts.docker import (
    ContainerEngineError,
    ContainerSettings,
    DockerRuntime,
    container_settings,
    context_digest,
    engine_client,
    ensure_image,
    image_context,
    image_digest,
    image_tag,
)
from flagperf.hosts.fleet import runtime_for
from flagperf.hosts.health import (
    PROBE_TIMEOUT_S,
    device_count_check,
    device_health_check,
    image_probe_check,
    log_check,
    record_image_probe,
)
from flagperf.hosts.inventory import HostSpec, mask_values
from flagperf.hosts.local import Host
from flagperf.paths import display_path


@task(name="build_image", task_run_name="build_image[{host.name}]", cache_policy=NONE)
def build_image(host: Host, spec: HostSpec, vendor: Vendor, run_id: str, framework: str | None = None
                ) -> dict[str, Any]:
    """The image the host's cases run in, tagged by the content of its build context: built when that tag is
    missing on the host's engine, else reused. With the process runtime nothing is built (recorded)."""
    logger = get_run_logger()
    context = image_context(vendor, framework)
    framework = framework or context.name
    build_args = spec.docker.runtime_build_args(host.name) if spec.runtime == "docker" else {}
    record: dict[str, Any] = {
        "dockerfile": display_path(context / "Dockerfile"),
        "framework": framework,
        "context_sha256": context_digest(context),  # the files only: build args never enter a record
        "runtime": spec.runtime,
    }
    if spec.slurm is not None:  # the nodes run the case: their python, or pyxis pulls the entry's image
        image = spec.slurm.container_image
        record.update(runtime="slurm", status="skipped", container_image=image, reason=(
            f"host {host.name} runs cases in Slurm jobs, " + (f"in {image} through pyxis" if image else
                                                             "with the nodes' own python") + "; nothing was built"))
        logger.info("skipped: %s", record["reason"])
        return record
    if spec.runtime == "process":
        record.update(status="skipped", reason=f"host {host.name} runs cases as plain processes (no container "
                                               "engine in use); nothing was built")
        logger.info("skipped: %s", record["reason"])
        return record
    tag = image_tag(vendor.name, framework, image_digest(context, build_args))
    client = engine_client(host, spec)
    transcript = BuildTranscript(logger.info)
    try:
        status = ensure_image(client, context, tag, build_args, on_line=transcript)
    except ContainerEngineError as exc:  # which instruction of which file, and its last output, in one line
        raise ContainerEngineError(f"host {host.name}: {transcript.failure(context / 'Dockerfile', str(exc))}"
                                   ) from None
    image = client.images.get(tag)
    record.update(status=status, tag=tag, image_id=image.id, build_args=mask_values(spec.docker.build_args),
                  engine="controller" if spec.docker.engine == "local" else f"{host.name} over SSH",
                  container=container_record(vendor, container_settings(vendor, spec, tag)))
    logger.info("%s %s (%s) on %s", status, tag, image.id[:19], record["engine"])
    return record


@task(name="probe_image", task_run_name="probe_image[{host.name}]", cache_policy=NONE, retries=0)
def probe_image(host: Host, spec: HostSpec, vendor: Vendor, run_id: str, image: dict[str, Any], run_dir: Path,
                cases: list[str] | None = None) -> dict[str, Any]:
    """The healthcheck's accelerator check where the cases run: the probe inside the vendor image, with the
    rounds' device requests and options (and mounts: ``cases``, the run's case folders, are checked on the host
    before any round). Recorded in hosts/<name>.health.json, under the image's framework (a host's images are
    probed at once: record_image_probe); raises naming the host."""
    logger = get_run_logger()
    runtime = runtime_for(host, spec, vendor, image, run_id, cases or ())
    assert isinstance(runtime, DockerRuntime)
    result, lines = runtime.run_probe(host, vendor.name, spec.host_spec_settings(), timeout_s=PROBE_TIMEOUT_S)
    check, probe = image_probe_check(lines, result.exit_code, result.timed_out, image["tag"], image["dockerfile"],
                                     result.link)
    log_check(logger, host.name, check)
    if probe is not None:  # the reading made where the cases run: a host's own Python may have no NVML binding
        log_check(logger, host.name, device_health_check(probe, vendor, f"device health in the {image['framework']} "
                                                                        "image"))
    # The devices the cases will see, against the inventory's count: counted here, where they run (check_host)
    count = device_count_check(spec, vendor, probe, f"in {image['tag']}") if check.ok and probe is not None \
        and spec.expected_devices is not None else None
    if count is not None:
        log_check(logger, host.name, count)
    record_image_probe(run_dir, host.name, image["framework"], check, probe, count)
    failed = check if not check.ok else count if count is not None and not count.ok else None
    if failed is not None:
        raise InfrastructureFailure(f"host {host.name}: {failed.name}: {failed.detail}")
    assert probe is not None
    return probe


def container_record(vendor: Vendor, settings: ContainerSettings) -> dict[str, Any]:
    """The docker run options the host's rounds get (vendor.yaml, over it the inventory's): what a result
    records of its container. The environment stays out: the inventory's values may be secrets."""
    return {"shm_size": settings.shm_size, "privileged": settings.privileged,
            "privileged_reason": vendor.manifest.container.privileged_reason if settings.privileged else None,
            "ulimits": settings.ulimits, "devices": settings.devices, "device_requests": settings.device_requests,
            "ipc_mode": settings.ipc_mode, "group_add": settings.group_add}
