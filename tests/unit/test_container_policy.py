"""The container policy is an allow-list: mounts from data roots (resolved on the host, read-only unless asked),
accelerator and RDMA devices by pattern plus a vendor's own. Each hole the old deny-list had is a case here."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from flagperf.config.vendors import load_vendor
from flagperf.errors import ConfigError
from flagperf.hosts import container_policy
from flagperf.hosts.container_policy import Mount, PathFacts, PolicyError, parse_container_options
from flagperf.hosts.docker import ContainerSettings, container_settings
from flagperf.hosts.fleet import checked_on_host
from flagperf.hosts.inventory import load_inventory
from flagperf.hosts.local import LocalHost, describe_paths
from flagperf.paths import PROJECT_ROOT


def inventory(tmp_path: Path, docker: dict[str, object], vendor: str | None = None) -> Path:
    path = tmp_path / "inv.yaml"
    body: dict[str, object] = {"hosts": [{"name": "a", "address": "h", "runtime": "docker", "docker": docker}]}
    if vendor:
        body["vendor"] = vendor
    path.write_text(yaml.safe_dump(body))
    return path


def refused(path: Path, key: str, *words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_inventory(path).resolve_vendor(None)
    assert info.value.key == key, str(info.value)
    assert str(info.value).startswith(f"{path}: {key}: ") and "\n" not in str(info.value)
    assert all(word in info.value.message for word in words), str(info.value)


@pytest.mark.parametrize("source", ["/root/.ssh", "/home/bench/.ssh", "/usr/bin", "/var", "/var/lib/kubelet",
                                    "/", "/etc", "/var/run/docker.sock", "/run/containerd", "/proc", "/tmp",
                                    "/data/../etc", "/data/team/.ssh", "relative/data"])
def test_mounts_outside_the_data_roots_are_refused(tmp_path: Path, source: str) -> None:
    refused(inventory(tmp_path, {"data_mounts": [source]}), "hosts.0.docker.data_mounts")
    refused(inventory(tmp_path, {"extra_options": f"-v {source}:/in:ro"}), "hosts.0.docker.extra_options")


@pytest.mark.parametrize("root", ["/", "/home", "/home/bench", "/etc", "/var/lib", "/usr/share/data", "/tmp/x",
                                  "/root/data", "/srv/team/.aws"])
def test_a_data_root_cannot_open_a_system_or_home_folder(tmp_path: Path, root: str) -> None:
    refused(inventory(tmp_path, {"data_roots": [root]}), "hosts.0.docker.data_roots", "data root")


def test_data_roots_allow_what_a_benchmark_needs_read_only_unless_rw(tmp_path: Path) -> None:
    spec = load_inventory(inventory(tmp_path, {
        "data_roots": ["/home/bench/datasets", "/srv/weights"],
        "data_mounts": ["/data/imagenet", "/home/bench/datasets/coco", "/mnt/results:rw"],
        "extra_options": "-v /srv/weights/llama:/weights -v /raid/out:/out:rw,z"}, vendor="cpu")).hosts[0]
    settings = container_settings(load_vendor("cpu"), spec, "img:1")
    assert [(m.source, m.read_only) for m in settings.data_mounts] == [
        ("/data/imagenet", True), ("/home/bench/datasets/coco", True), ("/mnt/results", False)]
    assert [m.volume() for m in settings.extra_mounts] == ["/srv/weights/llama:/weights:ro", "/raid/out:/out:rw,z"]
    # A home's credentials stay out even when a folder of that home is a data root.
    refused(inventory(tmp_path, {"data_roots": ["/home/bench/work"], "data_mounts": ["/home/bench/work/.ssh"]}),
            "hosts.0.docker.data_mounts", "credentials")


@pytest.mark.parametrize("device", ["/dev/sg0", "/dev/mmcblk0", "/dev/nbd0", "/dev/root", "/dev/kvm", "/dev/sda",
                                    "/dev/mem", "/dev/nvme0n1", "/dev/dri/../sda", "/dev/davinci0"])
def test_devices_outside_the_patterns_are_refused(tmp_path: Path, device: str) -> None:
    refused(inventory(tmp_path, {"extra_options": f"--device {device}"}, vendor="cpu"),
            "hosts.0.docker.extra_options", device.split("/..")[0])


@pytest.mark.parametrize(("device", "vendor"), [
    ("/dev/nvidia0", "nvidia"), ("/dev/nvidiactl", "nvidia"), ("/dev/nvidia-uvm", "nvidia"),
    ("/dev/nvidia-caps/nvidia-cap1", "nvidia"), ("/dev/kfd", "amd"), ("/dev/dri", "amd"),
    ("/dev/dri/renderD128", "amd"), ("/dev/infiniband/uverbs0", "cpu")])
def test_accelerator_and_rdma_devices_are_allowed(tmp_path: Path, device: str, vendor: str) -> None:
    """RDMA devices for every vendor; an accelerator's own device files as its vendor folder declares them."""
    load_inventory(inventory(tmp_path, {"extra_options": f"--device {device}:{device}:rw"}, vendor=vendor)
                   ).resolve_vendor(None)


def test_an_accelerators_devices_are_its_vendors_not_every_vendors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="/dev/kfd"):
        load_inventory(inventory(tmp_path, {"extra_options": "--device /dev/kfd:/dev/kfd:rw"}, vendor="nvidia")
                       ).resolve_vendor(None)


def test_a_vendor_folder_declares_its_own_device_patterns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "vendors" / "npu"
    (folder / "pytorch").mkdir(parents=True)
    (folder / "pytorch" / "Dockerfile").write_text("FROM scratch\n")
    (folder / "spec.py").write_text((load_vendor("cpu").folder / "spec.py").read_text())
    (folder / "vendor.yaml").write_text(yaml.safe_dump({
        "name": "npu", "description": "a vendor with its own device files", "torch_device": "cpu",
        "shares_host_memory": True, "container": {"dockerfile": "pytorch/Dockerfile", "devices": ["/dev/davinci0"],
                                                  "device_patterns": ["/dev/davinci*", "/dev/devmm_svm"]}}))
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(tmp_path / "vendors"))
    options = {"extra_options": "--device /dev/davinci1 --device /dev/devmm_svm"}
    load_inventory(inventory(tmp_path, options)).resolve_vendor("npu")
    # The same options for another vendor: its patterns are its own.
    refused(inventory(tmp_path, options, vendor="cpu"), "hosts.0.docker.extra_options", "/dev/davinci1")
    # FlagPerf's host.yaml names its vendor: checked as it is read, under its own key.
    host_yaml = tmp_path / "host.yaml"
    host_yaml.write_text("VENDOR: cpu\nHOSTS: [h]\nCASES: {computation-FP32: pytorch}\n"
                         "ACCE_CONTAINER_OPT: ' --device /dev/kvm'\n")
    with pytest.raises(ConfigError) as info:
        load_inventory(host_yaml)
    assert info.value.key == "ACCE_CONTAINER_OPT" and "/dev/kvm" in info.value.message
    # A pattern that reaches beyond /dev is refused where the vendor file is read.
    manifest = yaml.safe_load((folder / "vendor.yaml").read_text())
    manifest["container"]["device_patterns"] = ["/dev/../etc/*"]
    (folder / "vendor.yaml").write_text(yaml.safe_dump(manifest))
    with pytest.raises(ConfigError) as info:
        load_vendor("npu")
    assert info.value.key == "container.device_patterns" and "must name files under /dev" in info.value.message


def test_a_link_in_a_data_root_is_resolved_before_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The test's folders live in the shared temp dir, which is no data root: let it be one for this test only.
    monkeypatch.setattr(container_policy, "SYSTEM_FOLDERS",
                        tuple(f for f in container_policy.SYSTEM_FOLDERS if f != "/tmp"))
    root = tmp_path / "data"
    (root / "real").mkdir(parents=True)
    (root / "to-etc").symlink_to("/etc")
    (root / "to-real").symlink_to(root / "real")
    os.mkfifo(root / "pipe")
    spec = load_inventory(inventory(tmp_path, {"data_roots": [str(root)], "data_mounts": [
        str(root / "to-real"), str(root / "real")]}, vendor="cpu")).hosts[0]
    settings = checked_on_host(container_settings(load_vendor("cpu"), spec, "img:1"), LocalHost(), spec)
    # What is mounted is the resolved folder: a link swapped after the check cannot redirect it.
    assert [m.source for m in settings.data_mounts] == [str(root / "real")] * 2
    for name, words in (("to-etc", ("resolves to /etc", "outside the data roots")), ("pipe", ("other",)),
                        ("missing", ("does not exist",))):
        path = inventory(tmp_path, {"data_roots": [str(root)], "data_mounts": [str(root / name)]}, vendor="cpu")
        spec = load_inventory(path).hosts[0]
        with pytest.raises(ConfigError) as info:
            checked_on_host(container_settings(load_vendor("cpu"), spec, "img:1"), LocalHost(), spec)
        assert info.value.key == "hosts.0.docker.data_mounts.0" and str(path) in str(info.value)
        assert all(word in info.value.message for word in words), str(info.value)


@pytest.mark.parametrize(("variable", "kind", "ours", "other", "inside"), [
    ("FLAGPERF_VENDOR_PATH", "vendor", "cpu", "acme", "tests/fixtures/vendors"),
    ("FLAGPERF_CASE_PATH", "case", "base/killed-once", "base/not-in-the-run", "tests/fixtures/cases"),
])
def test_a_vendor_or_case_folder_outside_the_project_is_mounted_read_only_under_flagperfs_own_folder(
        tmp_path: Path, variable: str, kind: str, ours: str, other: str, inside: str) -> None:
    """A vendor's own repository on the host's FLAGPERF_VENDOR_PATH, a lab's own cases on its FLAGPERF_CASE_PATH:
    of each folder, only the run's vendor's folder (<vendor>) or its cases' (<family>/<case>), not the others
    beside them, reaches every container read-only, at /flagperf-search/<kind>/<index>/<name> (index: the folder's
    place in the variable), and the container's variable names those folders in the host's order, the project's
    own as written; a link (of the folder or, for a case, its family) out of its search path folder is refused
    naming the inventory's key."""
    outside, empty, escape = tmp_path / "outside", tmp_path / "nothing-of-the-run-here", tmp_path / "escape"
    (outside / ours).mkdir(parents=True)
    (outside / other).mkdir(parents=True)
    empty.mkdir()
    (tmp_path / "linked").symlink_to(outside)
    cases = ["base/killed-once", "base/computation-FP32"]  # the run's: the second is nowhere outside the project

    def settings(search_path: str) -> ContainerSettings:
        path = tmp_path / "inv.yaml"
        path.write_text(yaml.safe_dump({"hosts": [{"name": "a", "address": "h", "runtime": "docker",
                                                   "project_root": str(PROJECT_ROOT),
                                                   "env": {variable: search_path}}]}))
        spec = load_inventory(path).hosts[0]
        return checked_on_host(container_settings(load_vendor("cpu"), spec, "img:1", PROJECT_ROOT, cases),
                               LocalHost(), spec)

    # the project's own folders (every container sees the project already: absolute or relative) are not mounted
    # again, nor renamed; a relative folder outside the project is the project's neighbour, and is
    relative_outside = os.path.relpath(outside, PROJECT_ROOT)
    found = settings(os.pathsep.join([str(outside), str(empty), str(PROJECT_ROOT / inside), str(tmp_path / "linked"),
                                      "", inside, relative_outside]))
    where = f"/flagperf-search/{kind}"
    assert found.search.all() == [Mount(str(outside / ours), f"{where}/0/{ours}", read_only=True),
                                  Mount(str(outside / ours), f"{where}/3/{ours}", read_only=True),
                                  Mount(str(outside / ours), f"{where}/5/{ours}", read_only=True)]
    assert found.private_env[variable] == os.pathsep.join(
        [f"{where}/0", f"{where}/1", str(PROJECT_ROOT / inside), f"{where}/3", inside, f"{where}/5"])
    assert found.search.env == ((variable, found.private_env[variable]),)
    parts = Path(ours).parts
    for level in range(1, len(parts) + 1):  # the folder itself, and for a case its family, linked out
        link = escape / str(level) / Path(*parts[:level])
        link.parent.mkdir(parents=True)
        link.symlink_to(outside / Path(*parts[:level]))
        with pytest.raises(ConfigError) as info:
            settings(str(escape / str(level)))
        assert info.value.key == f"hosts.0.env.{variable}", str(info.value)
        assert f"resolves to {outside / ours}" in info.value.message and f"outside its {variable} folder" \
            in info.value.message and "\n" not in str(info.value)
    for written, words in (("/", "the file system's root"), (str(tmp_path / ".ssh"), "credentials"),
                           (f"{outside}\nx", "control character")):
        with pytest.raises(ConfigError) as info:
            settings(written)
        assert info.value.key == f"hosts.0.env.{variable}" and words in info.value.message, str(info.value)
    # Only the project's own folders: nothing mounted, the variable as the host has it.
    found = settings(os.pathsep.join([inside, str(PROJECT_ROOT / inside)]))
    assert found.search.all() == [] and found.search.env == ()
    assert found.private_env[variable] == os.pathsep.join([inside, str(PROJECT_ROOT / inside)])


def as_written(paths: list[str]) -> dict[str, PathFacts]:
    """A host's answer where every path is a folder and no link."""
    return {path: PathFacts(path, "folder") for path in paths}


def test_a_search_path_folder_never_hides_what_the_image_has_at_the_hosts_path(tmp_path: Path) -> None:
    """FLAGPERF_VENDOR_PATH=/opt and vendor nvidia: mounted at /opt/nvidia it would hide an NGC image's own
    /opt/nvidia; a case folder under /usr/local would hide the image's files there. Every search path mount lands
    under /flagperf-search, and the container's variables name the folders there, in the host's order."""
    written = container_policy.search_mounts(
        {"FLAGPERF_VENDOR_PATH": "/opt:/srv/vendors", "FLAGPERF_CASE_PATH": "/usr/local/lab-cases",
         "OTHER": "/opt"}, "nvidia", ["base/gemm", "training/bert"], "/deploy/flagperf")
    # What the host is asked: the project and its own folders of the run's names, each folder, and the run's
    # names in it (of a vendor's, whether it holds a vendor.yaml).
    assert written.host_paths() == sorted({"/deploy/flagperf", "/deploy/flagperf/vendor_images/nvidia",
                                           "/deploy/flagperf/vendor_images/nvidia/vendor.yaml",
                                           "/deploy/flagperf/cases/base/gemm", "/deploy/flagperf/cases/training/bert",
                                           "/deploy/flagperf/cases/base/gemm/case.yaml",
                                           "/deploy/flagperf/cases/training/bert/case.yaml",
                                           "/opt/nvidia", "/opt/nvidia/vendor.yaml", "/opt", "/srv/vendors/nvidia",
                                           "/srv/vendors/nvidia/vendor.yaml",
                                           "/srv/vendors", "/usr/local/lab-cases/base/gemm",
                                           "/usr/local/lab-cases/base/gemm/case.yaml",
                                           "/usr/local/lab-cases/training/bert/case.yaml",
                                           "/usr/local/lab-cases/training/bert", "/usr/local/lab-cases"})
    assert written.all() == [] and written.env == ()  # nothing is decided before the host answers
    search = written.resolved(as_written(written.host_paths()))
    assert search.all() == [
        Mount("/opt/nvidia", "/flagperf-search/vendor/0/nvidia", read_only=True),
        Mount("/srv/vendors/nvidia", "/flagperf-search/vendor/1/nvidia", read_only=True),
        Mount("/usr/local/lab-cases/base/gemm", "/flagperf-search/case/0/base/gemm", read_only=True),
        Mount("/usr/local/lab-cases/training/bert", "/flagperf-search/case/0/training/bert", read_only=True)]
    assert dict(search.env) == {"FLAGPERF_VENDOR_PATH": "/flagperf-search/vendor/0:/flagperf-search/vendor/1",
                                "FLAGPERF_CASE_PATH": "/flagperf-search/case/0"}
    assert all(m.target.startswith(container_policy.SEARCH_MOUNT_ROOT + "/") for m in search.all())
    # The same through a docker host's settings: the rewritten variable is what the container's env file holds.
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"hosts": [{"name": "a", "address": "h", "runtime": "docker",
                                               "project_root": "/deploy/flagperf",
                                               "env": {"FLAGPERF_VENDOR_PATH": "/opt"}}]}))
    spec = load_inventory(path).hosts[0]
    settings = container_settings(load_vendor("cpu"), spec, "img:1")
    settings = settings.resolved(as_written(settings.host_paths()))
    assert settings.search.all() == [Mount("/opt/cpu", "/flagperf-search/vendor/0/cpu", read_only=True)]
    assert settings.private_env["FLAGPERF_VENDOR_PATH"] == "/flagperf-search/vendor/0"


def test_a_device_link_is_resolved_and_must_be_a_device() -> None:
    settings_facts = {"/dev/nvidia0": PathFacts("/dev/sda", "other"), "/dev/dri/by-path/card": PathFacts(
        "/dev/dri/card0", "char-device")}
    patterns = ("/dev/dri", "/dev/dri/*", "/dev/nvidia*")  # as the amd and nvidia folders declare them
    assert container_policy.resolved_device("/dev/dri/by-path/card", settings_facts, patterns, "--device") == \
        "/dev/dri/card0:/dev/dri/by-path/card"
    with pytest.raises(PolicyError, match="resolves to /dev/sda"):
        container_policy.resolved_device("/dev/nvidia0", settings_facts, patterns, "--device")
    # What describe_paths says about real files here: a character device, a folder, a missing path.
    found = describe_paths(["/dev/null", "/dev", "/dev/no-such-device"])
    assert [found[p]["kind"] for p in ("/dev/null", "/dev", "/dev/no-such-device")] == [
        "char-device", "folder", "missing"]


def test_options_beyond_the_allow_list_are_refused_by_name() -> None:
    with pytest.raises(PolicyError, match="unsupported docker option '--cap-add'"):
        parse_container_options("--cap-add ALL")
    with pytest.raises(PolicyError, match="vendor file declares"):
        parse_container_options("--privileged")
    with pytest.raises(PolicyError, match="ro and rw"):
        parse_container_options("-v /data/a:/a:ro,rw")
    # what is attached to an option, or a word that is none, may be a secret: never said (docker takes -eNAME=V)
    for text, said in (("-eHF_TOKEN=hf_secret123", "'-e' (with what is attached to it, not shown)"),
                       ("--token=hf_secret123", "'--token'"), ("hf_secret123", "a word that is no option"),
                       ("-e hf_secret123", "-e needs NAME=VALUE"), ("--env=hf_secret123", "--env needs NAME=VALUE")):
        with pytest.raises(PolicyError) as refused:
            parse_container_options(text)
        assert said in str(refused.value) and "secret" not in str(refused.value), refused.value


def test_a_search_path_folders_index_counts_non_empty_entries_only() -> None:
    """docs/hosts-and-containers.md: in `/a::/b`, `/b` is index 1 (an empty entry names no folder)."""
    search = container_policy.search_mounts({"FLAGPERF_VENDOR_PATH": "/a::/b"}, "acme", [], str(PROJECT_ROOT))
    search = search.resolved(as_written(search.host_paths()))
    assert [(m.source, m.target) for m in search.all()] == [("/a/acme", "/flagperf-search/vendor/0/acme"),
                                                            ("/b/acme", "/flagperf-search/vendor/1/acme")]
    assert dict(search.env) == {"FLAGPERF_VENDOR_PATH": "/flagperf-search/vendor/0:/flagperf-search/vendor/1"}


def container_view(settings: ContainerSettings, variables: tuple[str, ...], seen: Path) -> dict[str, str]:
    """What a container of ``settings`` has of its search paths, here: each mount's source copied to its target
    under ``seen`` (for /flagperf-search), and the variables as its env file gives them, pointed there."""
    import shutil

    for mount in settings.search.all():
        shutil.copytree(mount.source, seen / mount.target.lstrip("/"))
    root = container_policy.SEARCH_MOUNT_ROOT
    return {name: settings.private_env[name].replace(root, str(seen / root.lstrip("/"))) for name in variables
            if name in settings.private_env}


def test_a_search_path_folder_is_mounted_or_kept_by_where_it_resolves(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside or outside the project is decided from the folder the host resolves, as the source digest decides:
    a link elsewhere to the project's own vendor_images is named in the project (the digest skips it, counted with
    the project's code, on the host and in the container alike: no copy under /flagperf-search); a project-relative
    entry that links out of the project is mounted (never a dangling link in the container); a folder reached through
    a link to the project is named at the project's path, where the container has it."""
    from flagperf.results.provenance import source_digest

    def settings(project: Path, **env: str) -> ContainerSettings:
        path = tmp_path / "inv.yaml"
        path.write_text(yaml.safe_dump({"hosts": [{"name": "a", "address": "h", "runtime": "docker",
                                                   "project_root": str(project), "env": env}]}))
        spec = load_inventory(path).hosts[0]
        return checked_on_host(container_settings(load_vendor("cpu"), spec, "img:1", project, ["base/x"]),
                               LocalHost(), spec)

    # A: FLAGPERF_VENDOR_PATH=/tmp/.../link, link -> <project>/vendor_images.
    (tmp_path / "link").symlink_to(PROJECT_ROOT / "vendor_images")
    found = settings(PROJECT_ROOT, FLAGPERF_VENDOR_PATH=str(tmp_path / "link"))
    assert found.search.all() == []
    assert found.private_env["FLAGPERF_VENDOR_PATH"] == str(PROJECT_ROOT / "vendor_images")
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(tmp_path / "link"))
    on_host = source_digest(vendor="cpu", cases=["base/x"])
    for name, value in container_view(found, ("FLAGPERF_VENDOR_PATH",), tmp_path / "container").items():
        monkeypatch.setenv(name, value)
    assert source_digest(vendor="cpu", cases=["base/x"]) == on_host

    # B: FLAGPERF_CASE_PATH=labcases in a project where labcases -> a lab's folder outside it.
    project, lab = tmp_path / "project", tmp_path / "srv" / "labcases"
    (lab / "base" / "x").mkdir(parents=True)
    (lab / "base" / "x" / "case.yaml").write_text("name: x\n")
    project.mkdir()
    (project / "labcases").symlink_to(lab)
    found = settings(project, FLAGPERF_CASE_PATH="labcases")
    assert found.search.all() == [Mount(str(lab / "base" / "x"), "/flagperf-search/case/0/base/x", read_only=True)]
    assert found.private_env["FLAGPERF_CASE_PATH"] == "/flagperf-search/case/0"
    # A process round on the host reads the relative entry in its project (search_path_folders), which is
    # <project>/labcases there: this test's project is not the one running, so named here in full.
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(project / "labcases"))
    on_host = source_digest(vendor="cpu", cases=["base/x"])
    for name, value in container_view(found, ("FLAGPERF_CASE_PATH",), tmp_path / "container-b").items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)  # not through the host's link
    assert source_digest(vendor="cpu", cases=["base/x"]) == on_host

    # A folder inside the project through a link to it: named at the project's path (the container has no other).
    (tmp_path / "deploy").symlink_to(project)
    (project / "own" / "base" / "x").mkdir(parents=True)
    found = settings(tmp_path / "deploy", FLAGPERF_CASE_PATH=f"{project / 'own'}:own")
    assert found.search.all() == [] and found.private_env["FLAGPERF_CASE_PATH"] == f"{tmp_path / 'deploy' / 'own'}:own"
    # Inside the project, but the run's case there links out of it: the container would not find it.
    (project / "own" / "base" / "x").rmdir()
    (project / "own" / "base" / "x").symlink_to(lab / "base" / "x")
    with pytest.raises(ConfigError) as info:
        settings(tmp_path / "deploy", FLAGPERF_CASE_PATH="own")
    assert info.value.key == "hosts.0.env.FLAGPERF_CASE_PATH" and f"resolves to {lab / 'base' / 'x'}" in \
        info.value.message and "outside the project" in info.value.message, str(info.value)


def test_a_link_that_leaves_a_mounted_search_path_folder_is_refused_before_a_container_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lab's case folder outside the project reaches a docker host's containers alone, at another path. A link in
    it to a file outside it is followed on the host (a process round reads the target, the source digest counts its
    bytes) but would dangle in the container: refused when the host's folders are checked, before a container
    starts, in one line naming the file, where it leads, the variable and the inventory's key. So are a linked
    folder out of it, a link by the folder's own absolute path (the container has it elsewhere) and one that
    leaves and comes back; relative links inside it stay fine, and a process host runs it as before."""
    from flagperf.hosts.fleet import runtime_for
    from flagperf.hosts.runtime import ProcessRuntime
    from flagperf.results.provenance import source_digest

    lab = tmp_path / "lab"
    case = lab / "base" / "x"
    (case / "sub").mkdir(parents=True)
    (case / "case.yaml").write_text("name: x\n")
    (case / "real.bin").write_bytes(b"kept inside")
    (case / "same.bin").symlink_to("real.bin")  # inside: a container follows it as the host does
    (case / "sub" / "up.bin").symlink_to("../real.bin")
    outside = tmp_path / "datasets" / "big.bin"
    outside.parent.mkdir()
    outside.write_bytes(b"outside")
    path = tmp_path / "inv.yaml"

    def settings(runtime: str = "docker") -> Any:
        path.write_text(yaml.safe_dump({"hosts": [{"name": "a", "address": "h", "runtime": runtime,
                                                   "project_root": str(PROJECT_ROOT),
                                                   "env": {"FLAGPERF_CASE_PATH": str(lab)}}]}))
        spec = load_inventory(path).hosts[0]
        if runtime != "docker":
            return runtime_for(LocalHost(), spec, load_vendor("cpu"), {"tag": "img:1"}, "run-a", ["base/x"])
        return checked_on_host(container_settings(load_vendor("cpu"), spec, "img:1", PROJECT_ROOT, ["base/x"]),
                               LocalHost(), spec)

    assert settings().search.all() == [Mount(str(case), "/flagperf-search/case/0/base/x", read_only=True)]
    # What the source digest skips, the scan skips: a lab's .venv (its bin/python links to the host's Python by its
    # absolute path), a link out in __pycache__ or a dot-file: none of it is the code a round runs.
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(lab))
    digest = source_digest(vendor="cpu", cases=["base/x"])
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(case / ".venv")], capture_output=True,
                          text=True, timeout=120)
    assert made.returncode == 0 and os.path.isabs(os.readlink(case / ".venv" / "bin" / "python")), made.stderr
    (case / "__pycache__").mkdir()
    (case / "__pycache__" / "old.pyc").symlink_to(outside)
    (case / "sub" / ".envrc").symlink_to(outside)
    assert settings().search.all() == [Mount(str(case), "/flagperf-search/case/0/base/x", read_only=True)]
    assert source_digest(vendor="cpu", cases=["base/x"]) == digest
    # A build output is left out of the digest (it is made from the code), not out of the link check: a round loads
    # a case's fast.so through its link as any other file.
    (case / "sub" / "fast.so").symlink_to(outside)
    assert source_digest(vendor="cpu", cases=["base/x"]) == digest
    with pytest.raises(ConfigError) as info:
        settings()
    assert f"'base/x': {case}/sub/fast.so links outside its folder (to {outside})" in info.value.message, \
        str(info.value)
    (case / "sub" / "fast.so").unlink()
    (case / "data.bin").symlink_to(outside)
    with pytest.raises(ConfigError) as info:
        settings()
    assert info.value.source == str(path) and info.value.key == "hosts.0.env.FLAGPERF_CASE_PATH", str(info.value)
    assert (f"on host a: FLAGPERF_CASE_PATH case 'base/x': {case}/data.bin links outside its folder (to {outside}); "
            "in a container it would dangle") in info.value.message and "\n" not in str(info.value), str(info.value)
    # A process host reads the target where it is: it runs as before, and the digest counts the target's bytes.
    assert isinstance(settings("process"), ProcessRuntime)
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(lab))
    before = source_digest(vendor="cpu", cases=["base/x"])
    outside.write_bytes(b"outside, edited")
    assert source_digest(vendor="cpu", cases=["base/x"]) != before
    (case / "data.bin").unlink()
    for name, target, words in (
            ("datasets", outside.parent, f"sub/datasets links outside its folder (to {outside.parent})"),
            ("abs.bin", case / "real.bin", f"sub/abs.bin links to {case / 'real.bin'} by its path on this host"),
            ("back.bin", "../../x/real.bin", "sub/back.bin links out of its folder and back (to ../../x/real.bin)")):
        (case / "sub" / name).symlink_to(target)
        with pytest.raises(ConfigError) as info:
            settings()
        assert f"'base/x': {case}/{words}" in info.value.message, str(info.value)
        (case / "sub" / name).unlink()
    assert settings().search.all() == [Mount(str(case), "/flagperf-search/case/0/base/x", read_only=True)]
    # An SSH host's answer comes from its agent: the same facts, the links of the folders asked for only.
    (case / "data.bin").symlink_to(outside)
    done = subprocess.run([sys.executable, "-m", "flagperf.hosts.agent", "describe-paths", f"--scan={case}", "--",
                           str(case), str(lab)], capture_output=True, text=True, timeout=60, cwd=PROJECT_ROOT)
    assert done.returncode == 0, done.stderr
    paths = json.loads(done.stdout.splitlines()[-1])["paths"]
    assert paths[str(case)]["links_out"] == [["data.bin", str(outside), str(outside)]], paths
    assert "links_out" not in paths[str(lab)]


@pytest.mark.parametrize(("name", "shown"), [(b"two\nlines.bin", "two\\nlines.bin"),
                                              (b"bad\xffname.bin", "bad\\xffname.bin"),
                                              (b"esc\x1b[31m.bin", "esc\\x1b[31m.bin")])
def test_a_leaving_links_odd_file_name_is_shown_escaped_in_one_line(tmp_path: Path, name: bytes, shown: str) -> None:
    """A file name from the link scan reaches the error as the folder holds it: a newline in it would make the
    error two lines, a byte that is no UTF-8 arrives as a lone surrogate (which the JSON of a Prefect state
    refuses), a terminal escape would colour the terminal. Each is shown escaped, in one line."""
    import orjson

    case = tmp_path / "lab" / "base" / "x"
    case.mkdir(parents=True)
    (case / "case.yaml").write_text("name: x\n")
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"outside")
    try:
        os.symlink(bytes(outside), os.fsencode(case) + b"/" + name)
    except OSError as exc:  # a file system that refuses such names (EILSEQ) has none to show
        pytest.skip(f"this file system refuses the name {name!r}: {exc}")
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"hosts": [{"name": "a", "address": "h", "runtime": "docker",
                                               "project_root": str(PROJECT_ROOT),
                                               "env": {"FLAGPERF_CASE_PATH": str(tmp_path / "lab")}}]}))
    spec = load_inventory(path).hosts[0]
    with pytest.raises(ConfigError) as info:
        checked_on_host(container_settings(load_vendor("cpu"), spec, "img:1", PROJECT_ROOT, ["base/x"]), LocalHost(),
                        spec)
    message = info.value.message
    assert f"{case}/{shown} links outside its folder (to {outside})" in message, message
    assert message.isprintable() and orjson.loads(orjson.dumps(message)) == message, repr(message)


def test_a_link_that_leaves_the_project_from_a_case_or_vendor_folder_in_it_is_refused_before_a_container_runs(
        tmp_path: Path) -> None:
    """A container has the project whole, at project_root, read-only: a case or vendor folder inside it (the project's
    own cases/ and vendor_images/, or a FLAGPERF_CASE_PATH / FLAGPERF_VENDOR_PATH folder in it) that holds a link out
    of the project would find it dangling, as an outside folder's link out of its folder would. Refused when the
    host's folders are checked, before a container starts, in the same one line: the project's own folder named by
    the inventory's project_root, a search path folder by its variable. Links that stay in the project are fine, even
    out of their folder, and so is an absolute one by the project's path as the container has it; one by the path the
    project resolves to on the host (project_root a link), or out and back, is not. A process host runs as before."""
    from flagperf.hosts.fleet import runtime_for
    from flagperf.hosts.runtime import ProcessRuntime

    real = tmp_path / "srv" / "flagperf"  # the deployment; project_root names it through a link
    (tmp_path / "opt").mkdir()
    project = tmp_path / "opt" / "flagperf"
    project.symlink_to(real)
    own, lab = real / "cases" / "base" / "x", real / "labcases" / "base" / "y"
    for folder in (own, lab, real / "common"):
        folder.mkdir(parents=True)
    for folder in (own, lab):  # a case (a folder of the name without one is none, and none of the run's)
        (folder / "case.yaml").write_text(f"name: {folder.name}\n")
    (real / "common" / "util.py").write_text("# shared in the project\n")
    (own / "util.py").symlink_to("../../../common/util.py")  # out of its folder, in the project: fine
    (lab / "util.py").symlink_to(project / "common" / "util.py")  # absolute, by project_root: the container has it
    outside = tmp_path / "datasets" / "big.bin"
    outside.parent.mkdir()
    outside.write_bytes(b"outside")
    path = tmp_path / "inv.yaml"

    def settings(runtime: str = "docker") -> Any:
        path.write_text(yaml.safe_dump({"hosts": [{"name": "a", "address": "h", "runtime": runtime,
                                                   "project_root": str(project),
                                                   "env": {"FLAGPERF_CASE_PATH": "labcases"}}]}))
        spec = load_inventory(path).hosts[0]
        if runtime != "docker":
            return runtime_for(LocalHost(), spec, load_vendor("cpu"), {"tag": "img:1"}, "run-a", ["base/x", "base/y"])
        return checked_on_host(container_settings(load_vendor("cpu"), spec, "img:1", project, ["base/x", "base/y"]),
                               LocalHost(), spec)

    assert settings().search.all() == []  # all in the project: nothing mounted besides it
    for folder, name, target, key, words in (
            (own, "data.bin", outside, "project_root",
             f"the project's case 'base/x': {project}/cases/base/x/data.bin links outside the project (to {outside})"),
            (lab, "data.bin", outside, "env.FLAGPERF_CASE_PATH",
             f"FLAGPERF_CASE_PATH case 'base/y': {project}/labcases/base/y/data.bin links outside the project (to "
             f"{outside})"),
            (own, "abs.py", real / "common" / "util.py", "project_root",
             f"the project's case 'base/x': {project}/cases/base/x/abs.py links to {real}/common/util.py by its path "
             f"on this host, where a container has the project at {project}"),
            (lab, "back.py", "../../../../flagperf/common/util.py", "env.FLAGPERF_CASE_PATH",
             f"FLAGPERF_CASE_PATH case 'base/y': {project}/labcases/base/y/back.py links out of the project and back "
             "(to ../../../../flagperf/common/util.py)")):
        (folder / name).symlink_to(target)
        with pytest.raises(ConfigError) as info:
            settings()
        assert info.value.source == str(path) and info.value.key == f"hosts.0.{key}", str(info.value)
        assert f"on host a: {words}; in a container it would dangle: copy the file into the project, or make the " \
            "link relative and inside it" == info.value.message and "\n" not in str(info.value), str(info.value)
        assert isinstance(settings("process"), ProcessRuntime)  # a process host reads the target where it is
        (folder / name).unlink()
    assert settings().search.all() == []
    # The project's own case folder itself a link out of the project: the container would have a dangling link.
    (tmp_path / "lab-x").mkdir()
    (tmp_path / "lab-x" / "case.yaml").write_text("name: x\n")
    shutil.rmtree(own)
    own.symlink_to(tmp_path / "lab-x")
    with pytest.raises(ConfigError) as info:
        settings()
    assert info.value.key == "hosts.0.project_root" and (
        f"on host a: the project's case 'base/x': {project}/cases/base/x (it resolves to {tmp_path / 'lab-x'}) is "
        f"outside the project {real}, which is all a container has of it") == info.value.message, str(info.value)
    own.unlink()
    own.mkdir()
    # An SSH host's agent gives the same facts: with --tree, a folder in the tree lists the links leaving the tree.
    (own / "data.bin").symlink_to(outside)
    (own / "util.py").symlink_to("../../../common/util.py")
    done = subprocess.run([sys.executable, "-m", "flagperf.hosts.agent", "describe-paths", f"--scan={own}",
                           f"--tree={project}", "--", str(own)], capture_output=True, text=True, timeout=60,
                          cwd=PROJECT_ROOT)
    assert done.returncode == 0, done.stderr
    paths = json.loads(done.stdout.splitlines()[-1])["paths"]
    assert paths[str(own)]["links_out"] == [["data.bin", str(outside), str(outside)]], paths


def test_a_name_found_earlier_on_the_search_path_is_not_checked_again_where_the_round_never_reads_it(
        tmp_path: Path) -> None:
    """The round finds a case in the first place its search path has it (the project's own cases/, then the
    variable's folders in order): the same <family>/<case> in a later folder is never read, in a container as on
    the host, so a link out in it refuses nothing, for a folder in the project and one outside it (mounted all the
    same, so that the container's folders are the host's). Where no earlier place has it, the link is refused.
    A folder of the name is the case where it holds a case.yaml (an inference case: or configurations.yaml), as case
    lookup and the source digest take it (flagperf.paths.is_case_folder): one without is no case and hides none."""
    project, lab = tmp_path / "flagperf", tmp_path / "lab"
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"outside")
    for folder in (project / "cases" / "base" / "x", project / "labcases" / "base" / "x",
                   project / "more" / "base" / "x", project / "more" / "base" / "y", lab / "base" / "x"):
        folder.mkdir(parents=True)
        (folder / "case.yaml").write_text("name: x\n")
    for folder in (project / "labcases" / "base" / "x", project / "more" / "base" / "x", lab / "base" / "x"):
        (folder / "data.bin").symlink_to(outside)
    path = tmp_path / "inv.yaml"

    def settings(case_path: str, cases: list[str], **env: str) -> Any:
        path.write_text(yaml.safe_dump({"hosts": [{"name": "a", "address": "h", "runtime": "docker",
                                                   "project_root": str(project),
                                                   "env": {"FLAGPERF_CASE_PATH": case_path, **env}}]}))
        spec = load_inventory(path).hosts[0]
        return checked_on_host(container_settings(load_vendor("cpu"), spec, "img:1", project, cases), LocalHost(),
                               spec)

    # base/x: the project's own cases/ has it first; base/y in more/, which no earlier place has.
    found = settings(f"labcases:{lab}:more", ["base/x", "base/y"])
    assert found.search.all() == [Mount(str(lab / "base" / "x"), "/flagperf-search/case/1/base/x", read_only=True)]
    # The project's own folder of the name without its case.yaml is no case: labcases/ has it first.
    (project / "cases" / "base" / "x" / "case.yaml").unlink()
    with pytest.raises(ConfigError) as info:
        settings(f"labcases:{lab}:more", ["base/x"])
    assert f"{project}/labcases/base/x/data.bin links outside the project" in info.value.message, str(info.value)
    (project / "cases" / "base" / "x").rmdir()  # now labcases/ has it first: its link counts, more/'s does not
    with pytest.raises(ConfigError) as info:
        settings(f"labcases:{lab}:more", ["base/x"])
    assert info.value.key == "hosts.0.env.FLAGPERF_CASE_PATH" and (
        f"{project}/labcases/base/x/data.bin links outside the project" in info.value.message), str(info.value)
    (project / "labcases" / "base" / "x" / "data.bin").unlink()
    assert settings(f"labcases:{lab}:more", ["base/x"]).search.all() == [
        Mount(str(lab / "base" / "x"), "/flagperf-search/case/1/base/x", read_only=True)]
    # Without its case.yaml labcases/'s is no case: the lab has it first now, and its link would dangle.
    (project / "labcases" / "base" / "x" / "case.yaml").unlink()
    with pytest.raises(ConfigError) as info:
        settings(f"labcases:{lab}:more", ["base/x"])
    assert f"{lab}/base/x/data.bin links outside its folder" in info.value.message, str(info.value)
    # An inference case is one by its configurations.yaml as well: an earlier one hides the lab's.
    for folder in (project / "cases" / "inference" / "x", lab / "inference" / "x"):
        folder.mkdir(parents=True)
    (lab / "inference" / "x" / "data.bin").symlink_to(outside)
    (lab / "inference" / "x" / "configurations.yaml").write_text("{}\n")
    with pytest.raises(ConfigError) as info:
        settings(str(lab), ["inference/x"])
    assert f"{lab}/inference/x/data.bin links outside its folder" in info.value.message, str(info.value)
    (project / "cases" / "inference" / "x" / "configurations.yaml").write_text("{}\n")
    assert settings(str(lab), ["inference/x"]).search.all() == [
        Mount(str(lab / "inference" / "x"), "/flagperf-search/case/0/inference/x", read_only=True)]
    # A vendor's later copy is read for the engines the earlier ones lack (the first place with an engine's name
    # wins): the project's own vendor_images/cpu first does not spare a lab's cpu/generate/mine its check.
    (project / "vendor_images" / "cpu").mkdir(parents=True)
    (project / "vendor_images" / "cpu" / "vendor.yaml").write_text("name: cpu\n")
    engine = tmp_path / "vendors" / "cpu" / "generate" / "mine"
    engine.mkdir(parents=True)
    (engine / "engine.yaml").write_text("name: mine\n")
    (engine / "engine.py").symlink_to(outside)
    with pytest.raises(ConfigError) as info:
        settings("", ["base/y"], FLAGPERF_VENDOR_PATH=str(tmp_path / "vendors"))
    assert info.value.key == "hosts.0.env.FLAGPERF_VENDOR_PATH" and (
        f"{engine}/engine.py links outside its folder" in info.value.message), str(info.value)



def test_a_case_folder_without_its_case_yaml_is_no_case_and_its_links_are_not_checked(tmp_path: Path) -> None:
    """A folder of a case's name without case.yaml (a leftover holding data links) is no case: case lookup passes it
    by, so the round reads nothing of it, in the project's own cases/ as in a search path folder; its link out
    refuses nothing (it did, for the project's own). A vendor folder without vendor.yaml is still read (its
    engines) and checked."""
    project, lab, outside = tmp_path / "flagperf", tmp_path / "lab", tmp_path / "outside.bin"
    outside.write_bytes(b"outside")
    leftovers = (project / "cases" / "base" / "x", project / "labcases" / "base" / "x")
    for folder in (*leftovers, lab / "base" / "x"):
        folder.mkdir(parents=True)
    for folder in leftovers:
        (folder / "data.bin").symlink_to(outside)
    (lab / "base" / "x" / "case.yaml").write_text("name: x\n")
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"hosts": [{"name": "a", "address": "h", "runtime": "docker",
                                               "project_root": str(project),
                                               "env": {"FLAGPERF_CASE_PATH": f"labcases:{lab}"}}]}))
    spec = load_inventory(path).hosts[0]

    def settings() -> Any:
        return checked_on_host(container_settings(load_vendor("cpu"), spec, "img:1", project, ["base/x"]),
                               LocalHost(), spec)

    assert settings().search.all() == [Mount(str(lab / "base" / "x"), "/flagperf-search/case/1/base/x",
                                             read_only=True)]
    (project / "cases" / "base" / "x" / "case.yaml").write_text("name: x\n")  # now it is the case: checked
    with pytest.raises(ConfigError) as info:
        settings()
    assert info.value.key == "hosts.0.project_root" and (
        f"{project}/cases/base/x/data.bin links outside the project" in info.value.message), str(info.value)
    (project / "vendor_images" / "cpu").mkdir(parents=True)  # engines alone, no vendor.yaml: read, so checked
    (project / "vendor_images" / "cpu" / "data.bin").symlink_to(outside)
    (project / "cases" / "base" / "x" / "case.yaml").unlink()
    with pytest.raises(ConfigError) as info:
        settings()
    assert f"{project}/vendor_images/cpu/data.bin links outside the project" in info.value.message, str(info.value)


def test_which_vendor_folder_the_round_reads_goes_by_its_vendor_yaml(tmp_path: Path) -> None:
    """The round takes the first folder of the vendor with a vendor.yaml for the vendor's, and reads every folder of
    the name without one too (its engines): the link check goes by the same rule, on facts that say whether each
    folder holds a vendor.yaml. It went by "a folder": a folder of engines alone before the vendor's own hid the
    vendor's from the check, and one after it was never checked, though the round reads both. A later copy with a
    vendor.yaml of its own is never read (its links count for nothing); a vendor.yaml that is a dangling link still
    makes its folder the vendor's (flagperf.config.vendors.vendor_search)."""
    from flagperf.config.vendors import MANIFEST

    assert container_policy.VENDOR_MANIFEST == MANIFEST
    project, outside = tmp_path / "flagperf", tmp_path / "outside.bin"
    (project / "vendor_images").mkdir(parents=True)  # the project's own has no cpu: the search path's first is it
    outside.write_bytes(b"outside")
    engines_first, own, copy, engines_after = (tmp_path / name / "cpu" for name in ("lab1", "lab2", "lab3", "lab4"))
    for folder in (engines_first, own, copy, engines_after):
        (folder / "operation").mkdir(parents=True)
    for folder in (own, copy):
        (folder / "vendor.yaml").write_text("name: cpu\n")
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"hosts": [{"name": "a", "address": "h", "runtime": "docker",
                                               "project_root": str(project), "env": {"FLAGPERF_VENDOR_PATH": ":".join(
                                                   str(folder.parent) for folder in (engines_first, own, copy,
                                                                                     engines_after))}}]}))
    spec = load_inventory(path).hosts[0]

    def settings() -> Any:
        return checked_on_host(container_settings(load_vendor("cpu"), spec, "img:1", project, []), LocalHost(), spec)

    assert [mount.source for mount in settings().search.all()] == [str(folder) for folder in (
        engines_first, own, copy, engines_after)]  # each mounted: the container's search path is the host's
    for folder, read in ((engines_first, True), (own, True), (copy, False), (engines_after, True)):
        (folder / "data.bin").symlink_to(outside)
        if read:
            with pytest.raises(ConfigError) as info:
                settings()
            assert info.value.key == "hosts.0.env.FLAGPERF_VENDOR_PATH" and (
                f"{folder}/data.bin links outside its folder (to {outside})" in info.value.message), str(info.value)
        else:
            settings()
        (folder / "data.bin").unlink()
    # The vendor's own vendor.yaml a link to nothing: its folder is still the vendor's, the copy still never read.
    (copy / "data.bin").symlink_to(outside)
    (own / "vendor.yaml").unlink()
    (own / "vendor.yaml").symlink_to("gone.yaml")
    settings()
    (own / "vendor.yaml").unlink()  # now the copy is the vendor's: its link is refused
    with pytest.raises(ConfigError) as info:
        settings()
    assert f"{copy}/data.bin links outside its folder" in info.value.message, str(info.value)

def test_the_projects_own_folder_resolving_outside_it_is_named_in_one_printable_line(tmp_path: Path) -> None:
    """The project's own case folder, a link out of the project to a folder whose name holds a newline: the error
    names where it resolves escaped (\\n), in one line, as every other path from a host's folder."""
    project = tmp_path / "flagperf"
    (project / "cases" / "base").mkdir(parents=True)
    odd = tmp_path / "two\nlines"
    odd.mkdir()
    (odd / "case.yaml").write_text("name: x\n")
    (project / "cases" / "base" / "x").symlink_to(odd)
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"hosts": [{"name": "a", "address": "h", "runtime": "docker",
                                               "project_root": str(project)}]}))
    spec = load_inventory(path).hosts[0]
    with pytest.raises(ConfigError) as info:
        checked_on_host(container_settings(load_vendor("cpu"), spec, "img:1", project, ["base/x"]), LocalHost(), spec)
    assert info.value.key == "hosts.0.project_root" and "\n" not in str(info.value), repr(str(info.value))
    assert f"(it resolves to {tmp_path}/two\\nlines) is outside the project {project}" in info.value.message, \
        info.value.message


def test_a_link_into_a_place_the_container_has_mounted_and_an_installed_environment_are_no_link_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The container has the data mounts (and a -v's target) at their places: a case folder's link to a place under
    one (data -> /datasets/imagenet) leads there in the container as on the host, in the project's own case folders
    and in a lab's outside the project alike; the same link without that mount is refused. A venv or node_modules in
    a case folder (bin/python links to the host's Python) is skipped by the link check as by the source digest,
    whose one walk both share: none of it is the code, and neither counts it; a case that is merely called venv
    counts."""
    from flagperf.results.provenance import folders_digest

    monkeypatch.setattr(container_policy, "SYSTEM_FOLDERS",  # tmp_path's data root: /tmp is none elsewhere
                        tuple(f for f in container_policy.SYSTEM_FOLDERS if f != "/tmp"))
    project, data, lab = tmp_path / "flagperf", tmp_path / "data", tmp_path / "lab"
    own, labcase = project / "cases" / "base" / "x", lab / "base" / "y"
    for folder in (own, labcase, data / "imagenet", data / "coco", data / "other"):
        folder.mkdir(parents=True)
    for folder in (own, labcase):
        (folder / "case.yaml").write_text(f"name: {folder.name}\n")
    (own / "bench.py").write_text("# the case\n")
    (own / "data").symlink_to(data / "imagenet")
    (labcase / "data").symlink_to(data / "imagenet" / "train")
    (own / "coco").symlink_to("/datasets/coco/val")  # where the -v below has it in the container
    path = tmp_path / "inv.yaml"

    def settings(**docker: Any) -> Any:
        path.write_text(yaml.safe_dump({"hosts": [{
            "name": "a", "address": "h", "runtime": "docker", "project_root": str(project),
            "env": {"FLAGPERF_CASE_PATH": str(lab)},
            "docker": {"data_roots": [str(data)], **docker}}]}))
        spec = load_inventory(path).hosts[0]
        return checked_on_host(container_settings(load_vendor("cpu"), spec, "img:1", project, ["base/x", "base/y"]),
                               LocalHost(), spec)

    mounts = {"data_mounts": [str(data / "imagenet")], "extra_options": f"-v {data}/coco:/datasets/coco:ro"}
    assert settings(**mounts).search.all() == [Mount(str(labcase), "/flagperf-search/case/0/base/y", read_only=True)]
    for without, key, words in (
            ({"extra_options": mounts["extra_options"]}, "project_root",
             f"the project's case 'base/x': {own}/data links outside the project (to {data}/imagenet)"),
            ({"data_mounts": mounts["data_mounts"]}, "project_root",
             f"the project's case 'base/x': {own}/coco links outside the project (to /datasets/coco/val)")):
        with pytest.raises(ConfigError) as info:
            settings(**without)
        assert info.value.key == f"hosts.0.{key}" and words in info.value.message, str(info.value)
    (own / "coco").unlink()
    (own / "data").unlink()
    with pytest.raises(ConfigError) as info:  # a lab's case folder, mounted alone: the same rule
        settings(extra_options=mounts["extra_options"])
    assert info.value.key == "hosts.0.env.FLAGPERF_CASE_PATH" and (
        f"FLAGPERF_CASE_PATH case 'base/y': {labcase}/data links outside its folder (to {data}/imagenet/train)"
        in info.value.message), str(info.value)
    (own / "data").symlink_to(data / "imagenet")
    # A sibling of the mounted folder is not in the container: still refused.
    (own / "other").symlink_to(data / "other")
    with pytest.raises(ConfigError) as info:
        settings(**mounts)
    assert f"{own}/other links outside the project (to {data}/other)" in info.value.message, str(info.value)
    (own / "other").unlink()
    # Every link on the way counts, not the first only: a link in a data mount to a place the container lacks
    # dangles there; one to a place under another mount, by the path the container has it at, does not.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (data / "imagenet" / "val").symlink_to(elsewhere)
    (own / "val").symlink_to(data / "imagenet" / "val")
    with pytest.raises(ConfigError) as info:
        settings(**mounts)
    assert f"the project's case 'base/x': {own}/val links outside the project (to {elsewhere})" in \
        info.value.message, str(info.value)
    (data / "imagenet" / "val").unlink()
    (data / "imagenet" / "val").symlink_to("/datasets/coco")  # the -v's target: the container has it there
    assert settings(**mounts).search.all() == [Mount(str(labcase), "/flagperf-search/case/0/base/y", read_only=True)]
    # The -v's source is where the host looks for what the container has at its target: data/coco/val, a link to
    # ../other, is /datasets/other in the container, which nothing mounts.
    (data / "coco" / "val").symlink_to("../other")
    (own / "coco").symlink_to("/datasets/coco/val")
    with pytest.raises(ConfigError) as info:
        settings(**mounts)
    assert f"{own}/coco links outside the project (to /datasets/coco/val)" in info.value.message, str(info.value)
    (data / "coco" / "val").unlink()
    assert settings(**mounts).search.all() == [Mount(str(labcase), "/flagperf-search/case/0/base/y", read_only=True)]
    (own / "coco").unlink()
    (own / "val").unlink()
    # The agent (an SSH host's answer) gives the same facts with the container's mount targets (--mounted).
    agent = [sys.executable, "-m", "flagperf.hosts.agent", "describe-paths", f"--scan={own}", f"--tree={project}"]
    for mounted, links in (([], [["data", str(data / "imagenet"), str(data / "imagenet")]]),
                           ([f"--mounted={data}/imagenet"], []), ([f"--bind={data}/imagenet:{data}/imagenet"], []),
                           ([f"--bind={data}/coco:{data}/imagenet"], []),
                           ([f"--bind={tmp_path}/elsewhere:{data}/imagenet"], [])):
        done = subprocess.run([*agent, *mounted, "--", str(own)], capture_output=True, text=True, timeout=60,
                              cwd=PROJECT_ROOT)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.splitlines()[-1])["paths"][str(own)]["links_out"] == links, done.stdout

    # An installed environment in a case folder: its links to the host's Python are none of the code's.
    digest = folders_digest(((project / "cases", "cases"),))
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(own / "venv")], capture_output=True,
                          text=True, timeout=120)
    assert made.returncode == 0 and os.path.isabs(os.readlink(own / "venv" / "bin" / "python")), made.stderr
    (own / "node_modules" / ".bin").mkdir(parents=True)
    (own / "node_modules" / ".bin" / "env").symlink_to("/usr/bin/env")
    (own / "node_modules" / "index.js").write_text("// installed by npm\n")
    assert settings(**mounts).search.all() == [Mount(str(labcase), "/flagperf-search/case/0/base/y", read_only=True)]
    assert folders_digest(((project / "cases", "cases"),)) == digest
    # Skipped by what it is, not by its name: a case called venv is code.
    (project / "cases" / "base" / "venv").mkdir()
    (project / "cases" / "base" / "venv" / "bench.py").write_text("# a case called venv\n")
    assert folders_digest(((project / "cases", "cases"),)) != digest


def test_a_dot_dot_after_a_link_into_a_mount_goes_up_from_where_the_link_leads(tmp_path: Path) -> None:
    """A link to /data/imagenet/esc/../x, where /data/imagenet is mounted and esc a link to a place no mount has:
    the container follows esc before the '..' (as the host does), so it leads out of the mounts and dangles there;
    read lexically (/data/imagenet/x) it passed."""
    from flagperf.hosts.local import links_leaving

    data, elsewhere, case = tmp_path / "data", tmp_path / "elsewhere", tmp_path / "case"
    for folder in (data / "imagenet" / "x", elsewhere / "deep", elsewhere / "x", case):
        folder.mkdir(parents=True)
    (data / "imagenet" / "esc").symlink_to(elsewhere / "deep")
    (case / "val").symlink_to(f"{data}/imagenet/esc/../x")
    (case / "train").symlink_to(f"{data}/imagenet/x/../x")  # no link on the way: in the mount
    assert links_leaving(str(case), mounted=[f"{data}/imagenet"]) == [
        ["val", f"{data}/imagenet/esc/../x", str(elsewhere / "x")]]


def test_a_link_whose_first_hop_stays_in_the_project_is_followed_into_a_mount_as_the_container_would(
        tmp_path: Path) -> None:
    """A case folder's link to a place in the project (data -> ../../../shared/imagenet) that is itself a link to a data
    mount leads, hop by hop, where the container has that mount: no link out (it was refused, on the safe side). A
    link whose way leaves every place the container has at some hop is still refused: to a folder nothing mounts, or
    into a mount and out of it again. A lab's folder mounted alone goes by the same rule."""
    from flagperf.hosts.local import describe_paths, links_leaving

    project, data, elsewhere, lab = (tmp_path / name for name in ("flagperf", "data", "elsewhere", "lab"))
    case, labcase = project / "cases" / "base" / "x", lab / "base" / "y"
    for folder in (case, labcase / "sub", project / "shared", data / "imagenet", elsewhere):
        folder.mkdir(parents=True)
    (project / "shared" / "imagenet").symlink_to(data / "imagenet")
    (case / "data").symlink_to("../../../shared/imagenet")
    (case / "train").symlink_to(f"{project}/shared/imagenet/train")  # by the project's path, as the container has it
    mounted = [str(data / "imagenet")]
    assert links_leaving(str(case), tree=str(project), mounted=mounted) == []
    assert describe_paths([str(case)], scan=[str(case)], tree=str(project), mounted=mounted)[str(case)][
        "links_out"] == []  # the host's answer (the agent's describe-paths)
    assert [link[0] for link in links_leaving(str(case), tree=str(project))] == ["data", "train"]  # nothing mounted
    # Escapes: a hop to a place no mount has, directly or out of a mount again.
    (project / "shared" / "out").symlink_to(elsewhere)
    (data / "imagenet" / "esc").symlink_to(elsewhere)
    (case / "out").symlink_to("../../../shared/out")
    (case / "through").symlink_to("../../../shared/imagenet/esc")
    assert links_leaving(str(case), tree=str(project), mounted=mounted) == [
        ["out", "../../../shared/out", str(elsewhere)], ["through", "../../../shared/imagenet/esc", str(elsewhere)]]
    # A lab's case folder, mounted alone (no tree): its own link to the mount, and one through it.
    (labcase / "sub" / "imagenet").symlink_to(data / "imagenet")
    (labcase / "data").symlink_to("sub/imagenet")
    (labcase / "out").symlink_to("sub/out")
    (labcase / "sub" / "out").symlink_to(elsewhere)
    assert links_leaving(str(labcase), mounted=mounted) == [
        ["out", "sub/out", str(elsewhere)], ["sub/out", str(elsewhere), str(elsewhere)]]
    assert [link[0] for link in links_leaving(str(labcase))] == ["data", "out", "sub/imagenet", "sub/out"]
    for link in ("out", "sub/out"):
        (labcase / link).unlink()
    # A '..' up from a mount ends in the folder the engine makes for its mount point: the host reads the real parent
    # with all it holds, the container an empty folder. Through the project, through a lab's folder, and through a
    # link in the mount (/data/imagenet/up -> ../..).
    (case / "parent").symlink_to("../../../shared/imagenet/..")
    (labcase / "parent").symlink_to("sub/imagenet/..")
    (data / "imagenet" / "up").symlink_to("../..")
    (case / "above").symlink_to(f"{data}/imagenet/up")
    assert links_leaving(str(case), tree=str(project), mounted=mounted) == [
        ["above", f"{data}/imagenet/up", str(tmp_path)], ["out", "../../../shared/out", str(elsewhere)],
        ["parent", "../../../shared/imagenet/..", str(data)],
        ["through", "../../../shared/imagenet/esc", str(elsewhere)]]
    assert links_leaving(str(labcase), mounted=mounted) == [["parent", "sub/imagenet/..", str(data)]]
    # The stand-in path of a folder mounted alone is no place to climb out of and back into by its name: a link in a
    # skipped dot-folder that goes up past the folder and down again (.h/up -> ../../../7/8/f).
    (labcase / "parent").unlink()
    (labcase / ".h").mkdir()
    (labcase / ".h" / "up").symlink_to("../f")  # up to the folder, not above it
    (labcase / "f").write_text("x\n")
    (labcase / "x").symlink_to(".h/up")
    assert links_leaving(str(labcase), mounted=mounted) == []
    (labcase / ".h" / "up").unlink()
    (labcase / ".h" / "up").symlink_to("../../../7/8/f")  # the stand-in's last parts: lab/7/8/f on the host
    assert links_leaving(str(labcase), mounted=mounted) == [["x", ".h/up", str(lab / "7" / "8" / "f")]]


def test_a_later_hop_back_into_the_project_by_the_hosts_own_path_is_followed(tmp_path: Path) -> None:
    """project_root written as a link (/opt/flagperf -> /real/flagperf): a case's data -> ../../../shared/x, where
    shared/x is a link to /real/flagperf/shared/other, ends in the project on the host, but a container has the
    project at /opt/flagperf only, so there the link dangles: every link whose first hop stays in is followed hop by
    hop, not only one that ends outside the project on the host."""
    from flagperf.hosts.local import links_leaving

    real, written = tmp_path / "real", tmp_path / "opt"
    case = real / "cases" / "base" / "x"
    for folder in (case, real / "shared" / "other"):
        folder.mkdir(parents=True)
    written.symlink_to(real)
    (real / "shared" / "x").symlink_to(real / "shared" / "other")  # by the host's own path
    (real / "shared" / "y").symlink_to(written / "shared" / "other")  # by the path the container has
    (case / "data").symlink_to("../../../shared/x")
    (case / "train").symlink_to("../../../shared/y")
    assert links_leaving(str(case), tree=str(written)) == [
        ["data", "../../../shared/x", str(real / "shared" / "other")]]


def test_a_mount_from_another_host_path_goes_to_the_agent_under_an_option_an_older_agent_refuses() -> None:
    """An agent older than SOURCE:TARGET pairs took a --mounted value for one path (and refused every link into a data
    mount with a misleading message): a mount from the same path goes as --mounted=TARGET, which every agent reads so,
    and a pair from another path as --bind (no abbreviation of --mounted, which argparse would take for it), which an
    older agent refuses in argparse (SshHost: 'deployment is older')."""
    from flagperf.hosts.local import describe_paths_args
    from flagperf.hosts.ssh import older_agent

    assert describe_paths_args(["/p"], mounted=["/data/imagenet:/data/imagenet", "/data/coco/:/data/coco",
                                                "/data/x"]) == \
        ["describe-paths", "--mounted=/data/imagenet", "--mounted=/data/coco", "--mounted=/data/x", "--", "/p"]
    assert describe_paths_args(["/p"], mounted=["/data/coco:/datasets/coco"]) == \
        ["describe-paths", "--bind=/data/coco:/datasets/coco", "--", "/p"]
    assert older_agent("describe-paths", "agent.py: error: unrecognized arguments: --bind=/data/coco:/datasets/coco") \
        == "describe-paths does not know --bind"


def test_an_older_host_agents_refusal_names_what_it_lacks() -> None:
    """What argparse says when the host agent lacks an option or a command the controller's version has (a host
    whose deployment is older): the options by name (never the paths after '='), or the command; any other failure
    is not put down to the deployment's age."""
    from flagperf.hosts.ssh import ARGPARSE_EXIT, older_agent

    for argv, said in ((["describe-paths", "--no-such=/data/x", "--nor-this", "--", "/x"],
                        "describe-paths does not know --no-such, --nor-this"),
                       (["no-such-command"], "has no command no-such-command")):
        done = subprocess.run([sys.executable, "-m", "flagperf.hosts.agent", *argv], capture_output=True, text=True,
                              timeout=60, cwd=PROJECT_ROOT)
        assert done.returncode == ARGPARSE_EXIT, done
        assert older_agent(argv[0], done.stderr.strip().splitlines()[-1]) == said, done.stderr
    assert older_agent("describe-paths", "PermissionError: [Errno 13] Permission denied: '/x'") is None


def test_a_dot_dot_up_from_a_mount_point_is_refused_where_the_host_goes_up_elsewhere(tmp_path: Path) -> None:
    """The container goes up from a mount point lexically, the host from where that path resolves: with
    /datasets/imagenet a link to /nfs/imagenet (mounted from the same path) and /datasets/coco mounted too, a link to
    /datasets/imagenet/../coco/f is /datasets/coco/f in the container but /nfs/coco/f on the host; with
    project_root /opt a link to /r/real, a case's ../../../../data/f (and shared/up -> ../../data/f on the way) is
    /data/f in the container but /r/data/f on the host. Where the parents agree the link passes."""
    from flagperf.hosts.local import links_leaving

    nfs, datasets, case = tmp_path / "nfs", tmp_path / "datasets", tmp_path / "proj" / "cases" / "base" / "x"
    for folder in (nfs / "imagenet", nfs / "coco", datasets / "coco", case, tmp_path / "ds"):
        folder.mkdir(parents=True)
    (datasets / "imagenet").symlink_to(nfs / "imagenet")
    (case / "abs").symlink_to(f"{datasets}/imagenet/../coco/f")
    mounted = [str(datasets / "imagenet"), str(datasets / "coco")]
    assert links_leaving(str(case), tree=str(tmp_path / "proj"), mounted=mounted) == [
        ["abs", f"{datasets}/imagenet/../coco/f", str(nfs / "coco" / "f")]]
    # A folder the engine makes on the way to a mount point, a link on the host: the same.
    (tmp_path / "moved" / "in" / "coco").mkdir(parents=True)
    (tmp_path / "via").symlink_to(tmp_path / "moved" / "in")  # the host goes up to moved, the container to tmp_path
    (case / "abs").unlink()
    (case / "abs").symlink_to(f"{tmp_path}/via/../ds/f")
    assert links_leaving(str(case), tree=str(tmp_path / "proj"), mounted=[f"{tmp_path}/via/coco",
                                                                           str(tmp_path / "ds")]) == [
        ["abs", f"{tmp_path}/via/../ds/f", str(tmp_path / "moved" / "ds" / "f")]]
    # Where the host's parent is the container's (the mount point a real folder): no link out.
    (datasets / "imagenet").unlink()
    (datasets / "imagenet").mkdir()
    (case / "abs").unlink()
    (case / "abs").symlink_to(f"{datasets}/imagenet/../coco/f")
    assert links_leaving(str(case), tree=str(tmp_path / "proj"), mounted=mounted) == []

    real, written, data = tmp_path / "r" / "real", tmp_path / "opt", tmp_path / "data"
    own = real / "cases" / "base" / "x"
    for folder in (own, real / "shared", data, tmp_path / "r" / "data"):
        folder.mkdir(parents=True)
    written.symlink_to(real)
    (own / "rel").symlink_to("../../../../data/f")
    (real / "shared" / "up").symlink_to("../../data/f")
    (own / "via").symlink_to("../../../shared/up")
    host_side = str(tmp_path / "r" / "data" / "f")
    assert links_leaving(str(own), tree=str(written), mounted=[str(data)]) == [
        ["rel", "../../../../data/f", host_side], ["via", "../../../shared/up", host_side]]


def test_a_mount_at_a_doubled_slash_is_the_root_and_stands_for_no_place_a_link_may_lead(tmp_path: Path) -> None:
    """normpath keeps a leading '//' (POSIX lets it mean something else than '/'): a mount whose container path is
    '//' (or '//data') is normalised like any other, so a mount at the root counts as none, and every absolute link
    is still checked; '//data' is /data."""
    from flagperf.hosts.local import links_leaving, mount_view

    lab, data = tmp_path / "lab", tmp_path / "data"
    lab.mkdir()
    data.mkdir()
    (lab / "pw").symlink_to("/etc/passwd")
    for mounted in ([f"{data}://"], ["//"], [f"{data}:///"]):
        assert links_leaving(str(lab), mounted=mounted) == [["pw", "/etc/passwd", "/etc/passwd"]], mounted
    assert mount_view(f"{data}://data") == (str(data), "/data")
    assert container_policy.search_mounts({}, "cpu", [], "/p", mounted=[f"{data}://", "/x", f"{data}:/"]).mounted \
        == ("/x",)


@pytest.mark.parametrize("links", [40, 41])
def test_a_chain_of_links_counts_the_scanned_link_against_the_kernels_forty(tmp_path: Path, links: int) -> None:
    """Linux follows 40 links in one lookup (ELOOP after): a chain of 40, the scanned link included, opens; one of 41
    does not, on the host as in a container, so the check refuses it. In the folder itself (mounted alone) and
    into a mount."""
    from flagperf.hosts.local import links_leaving

    lab, data = tmp_path / "lab", tmp_path / "data"
    for folder in (lab, data):
        (folder / ".c").mkdir(parents=True)
        (folder / "f").write_text("x\n")
        previous = "../f"
        for i in range(links - 1):  # in a dot-folder, which the check does not scan itself
            (folder / ".c" / f"l{i}").symlink_to(previous)
            previous = f"l{i}"
    (lab / "start").symlink_to(f".c/{previous}")
    (lab / "mounted").symlink_to(f"{data}/.c/{previous}")
    opens = []
    for name in ("mounted", "start"):
        try:
            opens.append((lab / name).read_text() == "x\n")
        except OSError as exc:
            assert exc.errno == errno.ELOOP, exc
            opens.append(False)
    assert opens == [links <= 40] * 2
    assert [link[0] for link in links_leaving(str(lab), mounted=[str(data)])] == \
        ([] if links <= 40 else ["mounted", "start"])


@pytest.mark.parametrize(("docker", "key", "words"), [
    ({"data_mounts": ["/data/proj"]}, "hosts.0.docker.data_mounts.0", "data mount '/data/proj' is refused: it is the "
                                                                      "project (/data/proj)"),
    ({"data_mounts": ["/data/x", "/data/proj/cases:rw"]}, "hosts.0.docker.data_mounts.1",
     "data mount '/data/proj/cases' is refused: it is in the project (/data/proj)"),
    ({"extra_options": "-v /data/x:/data/proj/cases/base"}, "hosts.0.docker.extra_options",
     "-v container path '/data/proj/cases/base' is refused: it is in the project (/data/proj)"),
    ({"extra_options": "-v /data/x:/flagperf-search/case/0:ro"}, "hosts.0.docker.extra_options",
     "-v container path '/flagperf-search/case/0' is refused: it is in FlagPerf's folder of the run's vendor and "
     "case folders (/flagperf-search)"),
    ({"extra_options": "-v /data/x:/flagperf-search"}, "hosts.0.docker.extra_options", "it is FlagPerf's folder"),
    ({"extra_options": "-v /data/x://"}, "hosts.0.docker.extra_options", "it is the container's root"),
])
def test_a_mount_over_the_project_or_the_search_folders_is_refused(tmp_path: Path, docker: dict[str, object],
                                                                   key: str, words: str) -> None:
    """The container has the project read-only at project_root and the run's vendor and case folders under
    /flagperf-search: a data mount or a -v whose container path is one of those, or in one, would put other files
    in place of the code a round runs (a data mount has its host path there too: then read-write)."""
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"hosts": [{"name": "a", "address": "h", "runtime": "docker",
                                               "project_root": "/data/proj", "docker": docker}]}))
    spec = load_inventory(path).hosts[0]
    with pytest.raises(ConfigError) as info:
        container_settings(load_vendor("cpu"), spec, "img:1")
    assert info.value.key == key and words in info.value.message and "\n" not in str(info.value), str(info.value)
    assert str(info.value).startswith(f"{path}: {key}: "), str(info.value)
    # Beside it: a mount like any other.
    path.write_text(yaml.safe_dump({"hosts": [{"name": "a", "address": "h", "runtime": "docker",
                                               "project_root": "/data/proj", "docker": {
                                                   "data_mounts": ["/data/projects"],
                                                   "extra_options": "-v /data/x:/flagperf-searched"}}]}))
    assert [m.target for m in container_settings(load_vendor("cpu"), load_inventory(path).hosts[0], "img:1")
            .extra_mounts] == ["/flagperf-searched"]


@pytest.mark.parametrize(("docker", "work_root", "key", "words"), [
    ({"data_mounts": ["/data/work/run-1"]}, None, "hosts.0.docker.data_mounts.0",
     "data mount '/data/work/run-1' is refused: it is in the host's work root (/data/work), where the job's scratch "
     "folder and the adaptation cache are mounted"),
    ({"extra_options": "-v /data/x:/data/work"}, None, "hosts.0.docker.extra_options",
     "-v container path '/data/work' is refused: it is the host's work root (/data/work)"),
    ({"extra_options": "-v /data/x:/srv/fp/adaptation-cache"}, "/srv/fp", "hosts.0.docker.extra_options",
     "-v container path '/srv/fp/adaptation-cache' is refused: it is in the host's work root (/srv/fp)"),
    ({"extra_options": "-v /data/env.json:/run/flagperf-env.json:ro"}, None, "hosts.0.docker.extra_options",
     "-v container path '/run/flagperf-env.json' is refused: it is the file FlagPerf hands the container's private "
     "variables in (/run/flagperf-env.json)"),
    # A read-write source at the work root, above it or in it: the container could write the controller's ended
    # markers (<work root>/.ended) though its target lies elsewhere
    ({"data_mounts": ["/data:rw"]}, None, "hosts.0.docker.data_mounts.0",
     "data mount '/data' is refused read-write: it is a folder above the host's work root (/data/work), where the "
     "controller keeps its own records of which attempts ended (.ended): mount it read-only, or set work_root outside "
     "it"),
    ({"extra_options": "-v /data:/all:rw"}, None, "hosts.0.docker.extra_options",
     "-v host path '/data' is refused read-write: it is a folder above the host's work root (/data/work)"),
    ({"extra_options": "-v /data/work:/w:rw"}, None, "hosts.0.docker.extra_options",
     "-v host path '/data/work' is refused read-write: it is the host's work root (/data/work)"),
    ({"extra_options": "-v /scratch/fp/.ended:/e:rw"}, "/scratch/fp", "hosts.0.docker.extra_options",
     "-v host path '/scratch/fp/.ended' is refused read-write: it is in the host's work root (/scratch/fp)"),
])
def test_a_mount_over_the_scratch_the_cache_or_the_env_file_is_refused(tmp_path: Path, docker: dict[str, object],
                                                                       work_root: str | None, key: str,
                                                                       words: str) -> None:
    """A round's container has the job's scratch folder (<work root>/<run>) and the adaptation cache
    (<work root>/<cache>) at their host paths, read-write, and its private variables in /run/flagperf-env.json: a
    data mount or a -v there replaced what the round writes and reads back. The work root is the inventory's
    work_root, or the host's own (``work_root``: what runtime_for passes, the host's default)."""
    path = tmp_path / "inv.yaml"
    written = {"work_root": "/data/work"} if work_root is None else {}  # else the host's default: the entry names none
    path.write_text(yaml.safe_dump({"hosts": [{"name": "a", "address": "h", "runtime": "docker", **written,
                                               "docker": docker}]}))
    with pytest.raises(ConfigError) as info:  # a work_root the entry writes: already when the inventory is read
        spec = load_inventory(path).hosts[0]
        container_settings(load_vendor("cpu"), spec, "img:1", work_root=Path(work_root) if work_root else None)
    assert info.value.key == key and words in info.value.message and "\n" not in str(info.value), str(info.value)
    assert str(info.value).startswith(f"{path}: {key}: "), str(info.value)


def test_a_read_write_mount_that_resolves_onto_the_work_root_is_refused_on_the_host(tmp_path: Path) -> None:
    """As written, /data/link lies beside the work root; on the host it is a link to /data, above it: the second look
    refuses it read-write (one line, keyed), and takes it read-only."""
    path = tmp_path / "inv.yaml"
    for mode, refused in (("rw", True), ("ro", False)):
        path.write_text(yaml.safe_dump({"hosts": [{"name": "a", "address": "h", "runtime": "docker",
                                                   "work_root": "/data/work",
                                                   "docker": {"data_mounts": [f"/data/link:{mode}"]}}]}))
        settings = container_settings(load_vendor("cpu"), load_inventory(path).hosts[0], "img:1")
        # The work root is asked of the host only where a read-write mount is checked against it
        assert ("/data/work" in settings.host_paths()) is refused
        facts = {**as_written(settings.host_paths()), "/data/link": PathFacts("/data", "folder")}
        if not refused:
            assert settings.resolved(facts).data_mounts[0].source == "/data"
            continue
        with pytest.raises(PolicyError) as info:
            settings.resolved(facts)
        assert info.value.key == "docker.data_mounts.0" and str(info.value).startswith(
            "data mount '/data' (as resolved) is refused read-write: it is a folder above the host's work root "
            "(/data/work)"), str(info.value)


def test_a_docker_host_without_read_write_mounts_is_not_asked_for_its_work_root(tmp_path: Path) -> None:
    """The work root is checked against read-write mounts only: without one, host_paths() (what describe-paths asks
    the host) does not name it."""
    path = tmp_path / "inv.yaml"
    for docker in ({}, {"data_mounts": ["/data/x"], "extra_options": "-v /data/y:/y"}):
        path.write_text(yaml.safe_dump({"hosts": [{"name": "a", "address": "h", "runtime": "docker",
                                                   "work_root": "/data/work", "docker": docker}]}))
        settings = container_settings(load_vendor("cpu"), load_inventory(path).hosts[0], "img:1")
        assert settings.work_root == "/data/work" and "/data/work" not in settings.host_paths()


def test_a_step_the_host_cannot_look_at_is_refused_not_taken_for_no_link(tmp_path: Path) -> None:
    """Where lstat fails for another reason than nothing being there (EACCES on a folder on the way; here, as root
    can read everything, a name longer than NAME_MAX), whether the way goes on by a link is unknown: refused.
    os.path.islink said False, and the walk read on as if the place were a plain folder."""
    from flagperf.hosts.local import resolved_in_container

    data = tmp_path / "data"
    data.mkdir()
    views = [(str(data), "/data")]
    assert resolved_in_container("/data/missing/x", views)  # not there: not this check's concern
    assert not resolved_in_container(f"/data/{'n' * 300}/x", views)


def test_a_loop_of_links_is_named_as_one_not_as_a_link_out_and_back(tmp_path: Path) -> None:
    """a -> b -> a leads nowhere: its resolved path is a link in the folder, which read as 'links out of its folder
    and back'. The host's facts list it among the loops (a key of its own, which an older controller ignores), and
    the message says what it is; a chain longer than the kernel's 40 opens nowhere either."""
    from flagperf.hosts.local import describe_paths

    case = tmp_path / "lab" / "base" / "x"
    case.mkdir(parents=True)
    (case / "a").symlink_to("b")
    (case / "b").symlink_to("a")
    found = describe_paths([str(case)], scan=[str(case)])[str(case)]
    assert found["loops"] == ["a", "b"] and json.loads(json.dumps(found)) == found
    facts = PathFacts.of(found)
    problem = container_policy.links_out_problem(str(case), "base/x", facts, container_policy.CASE_FOLDERS)
    assert problem == (f"FLAGPERF_CASE_PATH case 'base/x': {case}/a is a loop of links (to b; or a chain of "
                       "more than the 40 links Linux follows): it opens nowhere, here or in a container (and 1 more "
                       "such link(s)): make it lead to the file"), problem
    # An older agent's facts (no loops key) read as before.
    assert PathFacts.of({k: v for k, v in found.items() if k != "loops"}).loops == ()


def _without_dac_override() -> list[str] | None:
    """A prefix that runs a command as this root without the capabilities that let root pass file permissions
    (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH): a real EACCES, from the same interpreter (/root's pyenv stays readable
    by its owner, uid 0, where the user nobody could not run it). None where that cannot be had (not root, no
    setpriv, or a container that may not change its bounding set)."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        return None
    prefix = [setpriv, "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, check=False)
    return prefix if probe.returncode == 0 else None


def test_a_link_in_a_folder_listed_but_not_entered_is_named_not_passed(tmp_path: Path) -> None:
    """A folder of mode 644 (listed, not entered) or 000: os.path.islink of a link in it said False (EACCES on lstat)
    and the scan passed it; the 000 one was not listed and passed whole. Each is now a finding naming the path, in
    one line, from the host agent run for real without root's override of file permissions."""
    prefix = _without_dac_override()
    if prefix is None:
        pytest.skip("needs root and setpriv to drop CAP_DAC_OVERRIDE for a real EACCES")
    lab = tmp_path / "lab"
    case = lab / "base" / "x"
    (case / "listed").mkdir(parents=True)
    (case / "listed" / "out").symlink_to("/etc/passwd")
    (case / "closed").mkdir()
    (case / "closed" / "out").symlink_to("/etc/passwd")
    (case / "fine.py").write_text("")
    (case / "listed").chmod(0o644)
    (case / "closed").chmod(0o000)
    try:
        answer = subprocess.run([*prefix, sys.executable, "-m", "flagperf.hosts.agent", "describe-paths",
                                 f"--scan={case}", "--", str(case)], capture_output=True, text=True, check=False,
                                env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
        assert answer.returncode == 0, answer.stderr
        found = json.loads(answer.stdout)["paths"][str(case)]
        assert found["links_out"] == [["closed", "", "EACCES: Permission denied"],
                                      ["listed/out", "", "EACCES: Permission denied"]], found
        problem = container_policy.links_out_problem(str(lab / "base" / "x"), "base/x", PathFacts.of(found),
                                                     container_policy.CASE_FOLDERS)
        assert problem == (f"FLAGPERF_CASE_PATH case 'base/x': {case}/closed cannot be looked at on this host "
                           "(permission denied): whether it holds a link that would dangle in a container is unknown "
                           "(and 1 more such link(s)): make the folder readable and enterable (chmod a+rX) by the user "
                           "the host runs as"), problem
    finally:  # tmp_path is removed later: it must be enterable again, whatever the verdict
        (case / "listed").chmod(0o755)
        (case / "closed").chmod(0o755)


def _links_leaving_without_override(prefix: list[str], folder: Path, limit: int) -> list[list[str]]:
    """links_leaving run for real without root's override of file permissions (a real EACCES)."""
    code = ("import json, sys; from flagperf.hosts.local import links_leaving; "
            "print(json.dumps(links_leaving(sys.argv[1], limit=int(sys.argv[2]))))")
    answer = subprocess.run([*prefix, sys.executable, "-c", code, str(folder), str(limit)], capture_output=True,
                            text=True, check=False, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    assert answer.returncode == 0, answer.stderr
    return json.loads(answer.stdout)


def test_links_leaving_names_no_more_unlistable_folders_than_its_limit(tmp_path: Path) -> None:
    """15 folders of mode 000 with limit 10: the folders it could not list were added past the limit (15)."""
    prefix = _without_dac_override()
    if prefix is None:
        pytest.skip("needs root and setpriv to drop CAP_DAC_OVERRIDE for a real EACCES")
    case = tmp_path / "case"
    for i in range(15):
        (case / f"d{i:02}").mkdir(parents=True)
        (case / f"d{i:02}").chmod(0o000)
    try:
        found = _links_leaving_without_override(prefix, case, 10)
    finally:
        for i in range(15):
            (case / f"d{i:02}").chmod(0o755)
    assert [below for below, _, _ in found] == [f"d{i:02}" for i in range(10)], found


def test_an_unlistable_scanned_folder_is_named_as_itself(tmp_path: Path) -> None:
    """A scanned folder that cannot be listed was named '<folder>/.' in the run's error, and vendor check's filter
    by engine or case (folder/'.' is the folder) dropped it: what is in the folder is unknown, for every part."""
    prefix = _without_dac_override()
    if prefix is None:
        pytest.skip("needs root and setpriv to drop CAP_DAC_OVERRIDE for a real EACCES")
    case = tmp_path / "base" / "x"
    (case / "cases" / "y").mkdir(parents=True)
    case.chmod(0o000)
    try:
        found = _links_leaving_without_override(prefix, case, 10)
        code = ("import sys; from pathlib import Path; "
                "from flagperf.hosts.vendorcheck import links_out_of_vendor_folder; "
                "print('\\n'.join(str(e) for e in links_out_of_vendor_folder(Path(sys.argv[1]), 'cases/y')))")
        vendor = subprocess.run([*prefix, sys.executable, "-c", code, str(case)], capture_output=True, text=True,
                                check=False, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    finally:
        case.chmod(0o755)
    assert found == [[".", "", "EACCES: Permission denied"]], found
    problem = container_policy.links_out_problem(str(case), "base/x", PathFacts.of({
        "path": str(case), "kind": "folder", "links_out": found}), container_policy.CASE_FOLDERS)
    assert problem is not None and problem.startswith(
        f"FLAGPERF_CASE_PATH case 'base/x': {case} cannot be looked at on this host (permission denied)"), problem
    assert vendor.returncode == 0, vendor.stderr
    assert vendor.stdout.startswith(f"{case}: ") and "cannot be looked at" in vendor.stdout, vendor.stdout


@pytest.mark.parametrize(("real", "words"), [
    ("EACCES: Permission denied", "(permission denied): whether it holds a link that would dangle in a container is "
     "unknown: make the folder readable and enterable (chmod a+rX) by the user the host runs as"),
    ("EPERM: Operation not permitted", "(permission denied)"),
    ("/lab/case/closed", "(permission denied)"),  # an agent older than the error's field: it only saw EACCES
    ("EIO: Input/output error", "could not be read on this host: Input/output error: whether it holds a link that "
     "would dangle in a container is unknown: check the file system there and run again"),
    ("ESTALE: Stale file handle", "could not be read on this host: Stale file handle"),
])
def test_a_place_links_leaving_could_not_look_at_is_worded_by_its_error(real: str, words: str) -> None:
    """Every error was worded 'permission denied ... chmod a+rX', wrong advice for an EIO or a stale NFS handle."""
    line = container_policy.leaving_link_words("", real, "/lab/case", False)
    assert words in line, line
    assert ("chmod" in line) == (words.startswith("(permission denied)")), line


def test_the_error_of_a_place_not_looked_at_is_its_errno_name_and_text() -> None:
    from flagperf.hosts.local import unreadable_reason

    assert unreadable_reason(OSError(errno.EIO, "Input/output error", "/x")) == "EIO: Input/output error"
    assert unreadable_reason(PermissionError(errno.EACCES, "Permission denied")) == "EACCES: Permission denied"


@pytest.mark.parametrize("work_root", ["//data/work", "/data//work/", "/data/./work"])
@pytest.mark.parametrize("project_root", ["//opt/flagperf", "/opt/flagperf"])
def test_a_work_root_or_project_written_with_extra_slashes_still_refuses_a_mount_in_it(work_root: str,
                                                                                      project_root: str) -> None:
    """posixpath.normpath keeps a leading '//': a work root written //data/work refused no mount at /data/work/x."""
    assert container_policy.mount_target_problem("/data/work/x", project_root, work_root) is not None
    assert container_policy.mount_target_problem("/opt/flagperf/x", project_root, work_root) is not None
    assert container_policy.mount_target_problem("/data/other", project_root, work_root) is None


def test_containers_carry_the_owner_label_only_where_an_owner_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from flagperf.hosts.docker import owner_labels

    monkeypatch.delenv("FLAGPERF_CONTAINER_OWNER", raising=False)
    assert owner_labels() == {}
    monkeypatch.setenv("FLAGPERF_CONTAINER_OWNER", "")
    assert owner_labels() == {}
    monkeypatch.setenv("FLAGPERF_CONTAINER_OWNER", "flagperf-testbed-0123456789abcdef.4242")
    assert owner_labels() == {"org.flagperf.owner": "flagperf-testbed-0123456789abcdef.4242"}
    monkeypatch.setenv("FLAGPERF_CONTAINER_OWNER", "two\nlines")
    with pytest.raises(ConfigError, match=r"^FLAGPERF_CONTAINER_OWNER: 'two\\nlines' is not a container owner"):
        owner_labels()


def test_a_test_bed_path_that_is_no_file_leaves_the_session_running(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """FLAGPERF_TESTBED naming a folder: IsADirectoryError left the integration conftest's pytest_configure and the
    whole session (unit tests included) ended in an INTERNALERROR."""
    from tests.integration import conftest

    monkeypatch.setenv("FLAGPERF_TESTBED", str(tmp_path))
    monkeypatch.setenv("FLAGPERF_CONTAINER_OWNER", "before")
    conftest.pytest_configure(None)  # type: ignore[arg-type]  # it reads no option
    assert os.environ["FLAGPERF_CONTAINER_OWNER"] == "before"


def test_the_test_sessions_containers_carry_the_beds_owner_not_a_lab_value(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.integration import conftest
    from tests.testbed.bed import session_id

    bed = {"hosts": [], "known_hosts": "", "base_image": "img", "docker_host": "unix:///x", "bridge_address": "x",
           "container_owner": "flagperf-testbed-0123456789abcdef"}
    (tmp_path / "testbed.json").write_text(json.dumps(bed))
    monkeypatch.setenv("FLAGPERF_TESTBED", str(tmp_path / "testbed.json"))
    monkeypatch.setenv("FLAGPERF_CONTAINER_OWNER", "the-lab")  # a lab's own, exported in the shell
    conftest.pytest_configure(None)  # type: ignore[arg-type]
    assert os.environ["FLAGPERF_CONTAINER_OWNER"] == f"flagperf-testbed-0123456789abcdef.{session_id()}"
    assert session_id().startswith(f"{os.getpid()}.")


def test_up_removes_only_this_beds_containers_whose_session_is_gone_or_that_stopped() -> None:
    """up.sh removed every container of the bed's owner: a second session on the bed took the first one's running
    round away; then a live session's stopped ones went (one created and not yet started, or exited and not yet
    read: that round failed or was lost), and a running one with no pid stayed for ever. Now: one whose session (the
    label's pid) is gone, or with no pid (the sessions always add theirs); --all (down.sh) every one."""
    from tests.testbed.bed import session_id

    script = PROJECT_ROOT / "tests" / "testbed" / "leftovers.sh"
    owner, live, gone = "flagperf-testbed-00", os.getpid(), 2 ** 22 + 1  # above pid_max's default: no process
    lines = [f"a1 running {owner}.{live}", f"a2 running {owner}.{gone}", f"a3 exited {owner}.{live}",
             f"a4 running {owner}", f"a5 created {owner}", f"a6 running {owner}1.{gone}", "a7 exited other",
             f"a8 running {owner}.x", f"a9 exited {owner}.{gone}",
             # a live session's round between create and start, paused or restarting: still its round
             f"b1 created {owner}.{live}", f"b2 paused {owner}.{live}", f"b3 restarting {owner}.{live}",
             # going already: `docker rm -f` of it fails (409) and took up.sh/down.sh --all down (set -e)
             f"c1 removing {owner}.{live}", f"c2 removing {owner}.{gone}", f"c3 removing {owner}"]
    # A session's label as it is now: its pid and that process's start time; the pid reused by another process
    # (here: this live one's pid with another start) is a gone session, whose containers stayed for ever.
    session, start = session_id(), int(session_id().split(".")[1])
    lines += [f"d1 running {owner}.{session}", f"d2 exited {owner}.{live}.{start + 1}",
              f"d3 running {owner}.{gone}.{start}", f"d4 created {owner}.{live}.x"]
    picked = subprocess.run(["bash", str(script), owner], input="\n".join(lines) + "\n", capture_output=True,
                            text=True, check=True).stdout.split()
    assert picked == ["a2", "a4", "a5", "a8", "a9", "d2", "d3", "d4"]
    every = subprocess.run(["bash", str(script), owner, "--all"], input="\n".join(lines) + "\n",
                           capture_output=True, text=True, check=True).stdout.split()
    assert every == ["a1", "a2", "a3", "a4", "a5", "a8", "a9", "b1", "b2", "b3", "d1", "d2", "d3", "d4"]


def test_up_cancels_only_a_gone_sessions_slurm_jobs_and_resumes_only_nodes_no_live_session_drained() -> None:
    """up.sh ran `scancel --partition` (every job, a live session's too) and resumed every drained node (one a live
    session drained on purpose, mid-test). Now: a job or a drain whose session tag (sess<pid>t<start>) names a
    gone session, or a pid now another process's; a drain of Slurm's own is resumed, an untagged test drain kept."""
    from tests.testbed.bed import session_id, slurm_session

    script = PROJECT_ROOT / "tests" / "testbed" / "slurm-leftovers.sh"
    live, gone = slurm_session(), f"sess{2 ** 22 + 1}t5"
    reused = f"sess{os.getpid()}t{int(session_id().split('.')[1]) + 1}"  # this pid, another process's start

    def leftovers(mode: str, lines: list[str], *kept: str) -> list[str]:
        return subprocess.run(["bash", str(script), mode, *kept], input="\n".join(lines) + "\n", capture_output=True,
                              text=True, check=True).stdout.splitlines()

    jobs = [f"11 flagperf-pair-{live}-h1-x", f"12 flagperf-pair-{gone}-h1-x", f"13 flagperf-blocker-{reused}",
            "14 flagperf-blocker-s1a2b3c4", "15 someone-elses-job", f"16 flagperf-slurmsecrets-{gone}"]
    assert leftovers("jobs", jobs) == ["12", "13", "16"]
    nodes = [f"h1|drained|flagperf_test_drain_{live}", f"h2|drained|flagperf_test_drain_{gone}",
             f"h3|draining|flagperf_test_drain_{reused}", "h4|down|Not responding", "h5|drained|Kill task failed",
             "h6|drained|flagperf_test_drain_s1a2b3c4", "h7|idle|none", f"h8|mixed|flagperf_test_drain_{gone}"]
    said = leftovers("nodes", nodes)
    assert [line.split()[:2] for line in said] == [["keep", "h1"], ["resume", "h2"], ["resume", "h3"],
                                                   ["resume", "h4"], ["resume", "h5"], ["keep", "h6"]]
    assert "a live test session's" in said[0] and "resume it by hand" in said[5]
    # Settled once the leftovers are gone: idle nodes are checked by a step; a node a live session's job runs on,
    # or is planned for (Slurm holds it for a pending job), or that is kept drained is busy, not waited for; a
    # completing one is waited for.
    states = ["h1 idle", "h2 mixed", "h3 allocated", "h4 planned", "h5 drained", "h6 completing", "h7 down", ""]
    assert leftovers("states", states, "h5") == ["idle h1", "busy h2", "busy h3", "busy h4", "busy h5",
                                                 "wait h6 completing", "wait h7 down"]
    assert leftovers("states", states[4:5]) == ["wait h5 drained"]


def test_down_sh_dry_run_says_what_it_would_take_down_and_changes_nothing() -> None:
    """down.sh was only syntax-checked (running it takes down the bed other sessions use). --dry-run walks the same
    paths over the bed as it is, saying each change ("would: ..."), and makes none; '--all --dry-run' (a dry run
    given last, which an --all alone would not read) is refused before anything, as any word after the mode."""
    script = PROJECT_ROOT / "tests" / "testbed" / "down.sh"
    bed_up = Path("/run/netns/fp-h1").exists()
    sshd = (Path("/tmp/flagperf-testbed/hosts/h1/sshd.pid").read_text().strip()
            if Path("/tmp/flagperf-testbed/hosts/h1/sshd.pid").is_file() else None)
    for refused in (["--all", "--dry-run"], ["--beyond", "1", "--dry-run"], ["--dry-run", "--all", "x"]):
        done = subprocess.run(["bash", str(script), *refused], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and "usage: down.sh [--dry-run] [--all | --beyond K]" in done.stderr, refused
    every = subprocess.run(["bash", str(script), "--dry-run", "--all"], capture_output=True, text=True, timeout=300)
    beyond = subprocess.run(["bash", str(script), "--dry-run", "--beyond", "1"], capture_output=True, text=True,
                            timeout=300)
    for done in (every, beyond):
        assert done.returncode == 0, done.stderr
        assert all(line.startswith("would: ") for line in done.stdout.splitlines()), done.stdout
        assert all("(dry run: nothing done)" in line for line in done.stderr.splitlines()), done.stderr
    assert every.stdout.splitlines()[-1] == "would: rm -rf --one-file-system /tmp/flagperf-testbed"
    if bed_up:  # the live bed: named in full, left as it was
        # whole lines and words: on a bed of 10 hosts or more, fp-h10 (which --beyond 1 takes down) holds "fp-h1"
        h1 = {"would: ip netns delete fp-h1", "would: ip link delete fpv1"}
        assert h1 | {"would: ip link delete fpbr0"} <= set(every.stdout.splitlines()), every.stdout
        assert not (h1 | {"would: ip link delete fpbr0"}) & set(beyond.stdout.splitlines()), beyond.stdout
        assert not any("/tmp/flagperf-testbed/hosts/h1" in line.split() for line in beyond.stdout.splitlines())
        assert Path("/run/netns/fp-h1").exists() and Path("/sys/class/net/fpbr0").exists()
        # its namespace's processes, the sshd among them, would be stopped; it runs on. Only root is told a
        # namespace's processes (ip netns pids prints nothing to another user), so only root's dry run names them.
        if sshd and os.geteuid() == 0:
            def stops(done: subprocess.CompletedProcess[str]) -> list[list[str]]:
                return [line.split()[2:] for line in done.stdout.splitlines() if line.startswith("would: stop ")]
            assert any(sshd in pids for pids in stops(every)) and Path(f"/proc/{sshd}").exists(), stops(every)
            assert not any(sshd in pids for pids in stops(beyond)), stops(beyond)
