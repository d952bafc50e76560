from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NONE

from flagperf.hosts import Host
from flagperf.paths import display_path
from flagperf.runtime import Runtime
from flagperf.vendors import load_vendor


def context_digest(folder: Path) -> str:
    """Content hash of a build context: the image tag, so an unchanged image is never rebuilt."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@task(name="build_image", task_run_name="build_image[{host.name}]", cache_policy=NONE)
def build_image(host: Host, vendor: str, runtime: Runtime) -> dict[str, Any]:
    """Record what image the cases would run in; with the process runtime nothing is built."""
    logger = get_run_logger()
    manifest = load_vendor(vendor)
    dockerfile = manifest.folder / manifest.manifest.container.dockerfile
    record: dict[str, Any] = {
        "dockerfile": display_path(dockerfile),
        "context_sha256": context_digest(dockerfile.parent),
        "runtime": runtime.name,
    }
    if runtime.name == "process":
        record.update(status="skipped", reason=f"host {host.name} runs cases as plain processes (no container "
                                               "engine in use); nothing was built")
        logger.info("skipped: %s", record["reason"])
    return record
