"""FlagPerf's vendor guide on the test bed: `flagperf vendor new acme`, filled in, checked, then a base-spec case
and the digits case on a Docker host (the controller's engine) and an SSH host (its engine over SSH), each in the
vendor's own image built from its Dockerfile: built once for its inputs, recorded by digest with the container
options the vendor asked for."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect_api import all_task_runs, run_evaluate, task_logs

from flagperf.config.plan import read_plan
from flagperf.results.provenance import source_digest
from flagperf.results.schema import read_result
from tests.testbed.bed import Testbed, deploy_project, make_testbed_fixture

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]
testbed = make_testbed_fixture(min_hosts=2)
ROOT = Path(__file__).resolve().parents[2]
CASES = ("computation-FP32", "digits-mlp")


@pytest.fixture
def walk_deployment(testbed: Testbed) -> Iterator[tuple[Path, Path]]:
    """This session's deployment and vendor folder, named by its pid and removed after: the test bed is shared,
    and another session's run of this test rewrote a fixed-name vendor folder under this one's rounds (its
    scaffold's acme, not this checkout's: the plan's source digest then disagreed with this one's)."""
    deployed = deploy_project(ROOT, testbed, name=f"vendor-walk-{os.getpid()}")
    vendors = deployed.with_name(f"vendor-walk-{os.getpid()}-vendors") / "walk_vendors"
    shutil.rmtree(vendors.parent, ignore_errors=True)
    vendors.mkdir(parents=True)
    vendors.parent.chmod(0o755)
    try:
        yield deployed, vendors
    finally:
        shutil.rmtree(deployed, ignore_errors=True)
        shutil.rmtree(vendors.parent, ignore_errors=True)


def test_a_scaffolded_vendor_runs_in_its_image_on_a_docker_host_and_an_ssh_host(
        flagperf_env: Path, tmp_path: Path, testbed: Testbed, monkeypatch: pytest.MonkeyPatch,
        walk_deployment: tuple[Path, Path]) -> None:
    from flagperf.hosts.vendorcheck import check_vendor_folder
    from flagperf.hosts.vendorscaffold import write_vendor_folder

    # The vendor's own repository, outside the deployment (`vendor new --into DIR`): the hosts find it through
    # their FLAGPERF_VENDOR_PATH, and their containers see it only as a read-only mount of its own, under
    # /flagperf-search (their FLAGPERF_VENDOR_PATH names it there).
    deployed, vendors = walk_deployment
    folder = write_vendor_folder(vendors, "acme")
    manifest = yaml.safe_load((folder / "vendor.yaml").read_text())
    # Filled in as a vendor would: its container options (the device is the CPU, so no device files here). Limits
    # under the engine's own: the test bed's engine may not raise one (memlock: -1 needs CAP_SYS_RESOURCE there).
    manifest["container"].update(shm_size="256m", ulimits={"memlock": 1048576, "nofile": 4096})
    # A spec setting: each round records the vendor.yaml it came from, as the round found the folder.
    manifest["spec_settings"] = {"clock_ghz": 2.5}
    (folder / "vendor.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    # Its adaptation of the digits case, kept in its own repository too (cases/<family>/<case>/ of its folder): the
    # rounds' containers read it from the vendor's mount.
    adapted = folder / "cases" / "training" / "digits-mlp"
    adapted.mkdir(parents=True)
    (adapted / "environment_variables.sh").write_text("export ACME_TUNING=fast\n")
    found = check_vendor_folder(folder, monitor_seconds=1.0)
    assert found.problems == [], found.problems
    assert "adaptation of digits-mlp: environment file" in found.passed, found.passed
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(vendors))

    env = {"FLAGPERF_CASE_PATH": str(deployed / "tests" / "fixtures" / "cases"),
           "FLAGPERF_VENDOR_PATH": str(vendors)}

    def entry(index: int, engine: str) -> dict[str, Any]:
        host = testbed.hosts[index]
        return {"name": host.name, "address": host.address, "port": host.port, "user": host.user,
                "key_file": host.key_file, "known_hosts": testbed.known_hosts, "python": host.python,
                "project_root": str(deployed), "connect_timeout_s": 30, "env": env, "runtime": "docker",
                "docker": {"engine": engine, "build_args": {"BASE_IMAGE": testbed.base_image}}}

    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": [entry(0, "local"), entry(1, "ssh")]}))
    fast = [f"computation-FP32.{o}" for o in ("min_duration_s=0.3", "warmup_iters=0", "min_iters=2")]
    state, run_dir = run_evaluate(flagperf_env, cases=list(CASES), vendor="acme", rounds=1, overrides=fast,
                                  inventory=str(inventory))
    assert state.is_completed(), state.message
    plan = read_plan(run_dir)
    assert {case.name: case.vendor_folder for case in plan.cases} == {"computation-FP32": None,
                                                                      "digits-mlp": str(adapted)}
    # The code every round ran, as the plan and a process here see it (the vendor at its path on this machine),
    # whatever path the round's container had it at.
    assert plan.source_digest == source_digest(vendor="acme", cases=plan.case_folders) and plan.source_digest
    tasks = {run.name: run for run in all_task_runs(state.state_details.flow_run_id)}
    images = set()
    for host in testbed.hosts[:2]:
        health = json.loads((run_dir / "hosts" / f"{host.name}.health.json").read_text())
        checks = {c["name"]: c for c in health["checks"]}
        assert checks["accelerators in image"]["ok"], checks["accelerators in image"]
        assert "in flagperf/acme-pytorch:" in checks["accelerators in image"]["detail"]
        # The probe ran in a container with the vendor's options: they took effect there.
        (image_probe,) = health["image_probes"].values()  # by framework: the cases here use one
        limits = image_probe["limits"]
        assert limits["shm_bytes"] == 256 * 2**20 and limits["memlock"] == [1048576, 1048576]
        assert limits["nofile"] == [4096, 4096], limits
        build_logs = task_logs(tasks[f"build_image[{host.name}]"].id)
        assert any(line.startswith(("built flagperf/acme-pytorch:", "present flagperf/acme-pytorch:"))
                   for line in build_logs), build_logs
        for case in CASES:
            result = read_result(run_dir / case / "round1" / f"{host.name}_noderank0" / "result.json")
            assert result.status == "success", result.failure
            image = result.provenance.image
            assert image["runtime"] == "docker" and image["tag"].startswith("flagperf/acme-pytorch:")
            assert image["dockerfile"].endswith("walk_vendors/acme/pytorch/Dockerfile")
            assert image["image_id"].startswith("sha256:")
            assert image["container"] == {"shm_size": "256m", "privileged": False, "privileged_reason": None,
                                          "ulimits": {"memlock": 1048576, "nofile": 4096}, "devices": [],
                                          "device_requests": [], "ipc_mode": None, "group_add": []}
            images.add((image["tag"], image["image_id"]))
            # The round's container found the vendor under flagperf's own folder, not at the host's path.
            assert result.provenance.spec_settings_origins == {
                "clock_ghz": "/flagperf-search/vendor/0/acme/vendor.yaml"}, result.provenance.spec_settings_origins
            assert result.provenance.source_digest == plan.source_digest
        digits = read_result(run_dir / "digits-mlp" / "round1" / f"{host.name}_noderank0" / "result.json")
        assert digits.convergence is not None and digits.convergence.converged
        adaptation = digits.provenance.adaptation
        assert adaptation is not None and adaptation["env_applied"] == {"ACME_TUNING": "fast"}, adaptation
        assert adaptation["folder"] == "/flagperf-search/vendor/0/acme/cases/training/digits-mlp", adaptation
    # One engine behind both hosts: one image for the same inputs, built at most once.
    assert len(images) == 1, images
    statuses = [read_result(run_dir / "computation-FP32" / "round1" / f"{h.name}_noderank0" / "result.json")
                .provenance.image["status"] for h in testbed.hosts[:2]]
    assert statuses.count("built") <= 1, statuses

    # Asked again with nothing changed, nothing is built; a changed input is another tag.
    import docker

    from flagperf.config.vendors import load_vendor
    from flagperf.hosts.docker import ensure_image, image_context, image_digest, image_tag

    context = image_context(load_vendor("acme"), "pytorch")
    build_args = {"BASE_IMAGE": testbed.base_image}
    tag = image_tag("acme", "pytorch", image_digest(context, build_args))
    assert tag == next(iter(images))[0]
    lines: list[str] = []
    assert ensure_image(docker.from_env(), context, tag, build_args, lines.append) == "present" and lines == []
    requirements = context / "requirements.txt"
    requirements.write_text(requirements.read_text() + "scikit-learn\n")
    assert image_tag("acme", "pytorch", image_digest(context, build_args)) != tag

    # A file of the vendor folder that links outside it: the host follows the link, a container (which has the
    # folder alone, under /flagperf-search) would find it dangling. The SSH host's agent lists it as it resolves
    # the folder, so the checks before any container starts refuse it in one line naming the file and the key.
    from flagperf.errors import ConfigError
    from flagperf.hosts.docker import container_settings
    from flagperf.hosts.fleet import checked_on_host
    from flagperf.hosts.inventory import load_inventory
    from flagperf.hosts.ssh import SshHost

    spec = load_inventory(inventory).hosts[1]
    outside = vendors.parent / "lab-notes.md"
    outside.write_text("notes\n")
    (folder / "notes.md").symlink_to(outside)
    host = SshHost(spec)
    try:
        with pytest.raises(ConfigError) as info:
            checked_on_host(container_settings(load_vendor("acme"), spec, tag, deployed, plan.case_folders), host,
                            spec)
    finally:
        host.close()
        (folder / "notes.md").unlink()
    assert info.value.key == "hosts.1.env.FLAGPERF_VENDOR_PATH", str(info.value)
    assert (f"on host {spec.name}: FLAGPERF_VENDOR_PATH vendor 'acme': {folder}/notes.md links outside its folder "
            f"(to {outside}); in a container it would dangle") in info.value.message, str(info.value)
