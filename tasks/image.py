from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NONE

from flagperf.containers import context_digest, engine_client, ensure_image, image_context, image_tag
from flagperf.hosts import Host
from flagperf.inventory import HostSpec
from flagperf.paths import display_path
from flagperf.vendors import load_vendor


@task(name="build_image", task_run_name="build_image[{host.name}]", cache_policy=NONE)
def build_image(host: Host, spec: HostSpec, vendor: str, run_id: str, framework: str | None = None
                ) -> dict[str, Any]:
    """The image the host's cases run in, tagged by the content of its build context: built when that tag is
    missing on the host's engine, else reused. With the process runtime nothing is built (recorded)."""
    logger = get_run_logger()
    loaded = load_vendor(vendor)
    context = image_context(loaded, framework)
    framework = framework or context.name
    digest = context_digest(context, spec.docker.build_args)
    record: dict[str, Any] = {
        "dockerfile": display_path(context / "Dockerfile"),
        "framework": framework,
        "context_sha256": digest,
        "runtime": spec.runtime,
    }
    if spec.runtime == "process":
        record.update(status="skipped", reason=f"host {host.name} runs cases as plain processes (no container "
                                               "engine in use); nothing was built")
        logger.info("skipped: %s", record["reason"])
        return record
    tag = image_tag(vendor, framework, digest)
    client = engine_client(host, spec)
    status = ensure_image(client, context, tag, spec.docker.build_args, on_line=logger.info)
    image = client.images.get(tag)
    record.update(status=status, tag=tag, image_id=image.id, build_args=dict(spec.docker.build_args),
                  engine="controller" if spec.docker.engine == "local" else f"{host.name} over SSH")
    logger.info("%s %s (%s) on %s", status, tag, image.id[:19], record["engine"])
    return record
