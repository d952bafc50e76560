"""Slurm inventory entries: validation (one line naming the key), slots per node, gres parsing, and how a node
of a job finds its rank (flagperf/hosts/slurm_spec.py, slurm.py, slurm_node.py; the real cluster is in
tests/integration/test_slurm.py)."""

from __future__ import annotations

import itertools
import os
import pwd
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from flagperf.errors import ConfigError, one_line
from flagperf.hosts import slurm
from flagperf.hosts.container_policy import Mount
from flagperf.hosts.inventory import load_inventory, spec_origin
from flagperf.hosts.slurm import SUMMARY_LINES, SlurmHost, batch_script, gres_missing, output_summary, parse_gres
from flagperf.hosts.slurm_node import my_rank
from flagperf.paths import PROJECT_ROOT


def write(tmp_path: Path, **slurm: Any) -> Path:
    path = tmp_path / "inventory.yaml"
    entry = {"name": "gpu", "slurm": {"shared_dir": str(tmp_path / "shared"), **slurm}}
    path.write_text(yaml.safe_dump({"hosts": [entry]}))
    return path


def test_a_nodelist_becomes_one_pinned_slot_per_node(tmp_path: Path) -> None:
    hosts = load_inventory(write(tmp_path, partition="batch", nodelist=["n1", "n2"], gres="gpu:8")).hosts
    assert [h.name for h in hosts] == ["gpu-n1", "gpu-n2"]
    assert [h.slurm.node for h in hosts if h.slurm] == ["n1", "n2"]
    assert {h.transport for h in hosts} == {"slurm"} and {h.slurm.group for h in hosts if h.slurm} == {"gpu"}


def test_a_node_count_becomes_numbered_slots_and_one_node_keeps_the_name(tmp_path: Path) -> None:
    hosts = load_inventory(write(tmp_path, nodes=3)).hosts
    assert [h.name for h in hosts] == ["gpu-1", "gpu-2", "gpu-3"]
    assert all(h.slurm is not None and h.slurm.node is None for h in hosts)
    (single,) = load_inventory(write(tmp_path, nodelist=["n7"])).hosts
    assert single.name == "gpu" and single.slurm is not None and single.slurm.node == "n7"


@pytest.mark.parametrize(("slurm", "key", "words"), [
    ({"partition": "a b"}, "hosts.0.slurm.partition", "not a Slurm name"),
    ({"account": "--wrap=rm"}, "hosts.0.slurm.account", "not a Slurm name"),
    ({"nodelist": ["n[1-4]"]}, "hosts.0.slurm.nodelist", "not a node name"),
    ({"nodes": 3, "nodelist": ["a", "b"]}, "hosts.0.slurm", "nodes is 3 but nodelist names 2"),
    ({"gres": "gpu:8;reboot"}, "hosts.0.slurm.gres", "not a gres request"),
    ({"shared_dir": "relative/dir"}, "hosts.0.slurm.shared_dir", "absolute path"),
    ({"container_mounts": ["/a:/b,/etc:/etc"]}, "hosts.0.slurm.container_mounts", "expected /SRC:/DST"),
    ({"pending_timeout_s": 0}, "hosts.0.slurm.pending_timeout_s", "greater than 0"),
    ({"partition": "p1\n#SBATCH --uid=0"}, "hosts.0.slurm.partition", "not a Slurm name"),
    ({"qos": "$(touch marker)"}, "hosts.0.slurm.qos", "not a Slurm name"),
    ({"container_mounts": ["/a\n#SBATCH --uid=0:/b"]}, "hosts.0.slurm.container_mounts", "expected /SRC:/DST"),
    ({"shared_dir": "/tmp/s\r#SBATCH --uid=0"}, "hosts.0.slurm.shared_dir", "control characters"),
    ({"container_mounts": ["/data://"]}, "hosts.0.slurm.container_mounts", "'/data://': a mount of or over the file "
                                                                            "system's root '/' is refused"),
    ({"container_mounts": ["/data:/x/.."]}, "hosts.0.slurm.container_mounts",
     "'/data:/x/..': its container path '/x/..' must be an absolute path without '..'"),
    ({"container_mounts": ["/data/../etc:/x:ro"]}, "hosts.0.slurm.container_mounts", "its host path '/data/../etc'"),
    ({"container_mounts": [f"/data:{PROJECT_ROOT}/cases:ro"]}, "hosts.0",  # project_root: the controller's
     f"slurm.container_mounts: '/data:{PROJECT_ROOT}/cases:ro' is refused: its container path is in the project"),
    ({"container_mounts": ["/data:/flagperf-search"]}, "hosts.0", "its container path is FlagPerf's folder of the "
                                                                  "run's vendor and case folders"),
    ({"shared_dir": "/shared", "container_mounts": ["/data:/shared/fp/run-1"]}, "hosts.0",  # the job's own folder
     "slurm.container_mounts: '/data:/shared/fp/run-1' is refused: its container path is in slurm.shared_dir "
     "(/shared), where the job's scratch folder and the adaptation cache are mounted"),
    ({"shared_dir": "/shared", "container_mounts": ["/data:/shared:ro"]}, "hosts.0", "its container path is "
                                                                                     "slurm.shared_dir (/shared)"),
    ({"time_slack_s": float("inf")}, "hosts.0.slurm.time_slack_s", "finite number"),
])
def test_a_bad_value_is_refused_in_one_line_naming_the_key(tmp_path: Path, slurm: dict[str, Any], key: str,
                                                           words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_inventory(write(tmp_path, **slurm))
    assert info.value.key == key and words in info.value.message and "\n" not in str(info.value)


@pytest.mark.parametrize(("entry", "key", "words"), [
    ({"env": {"SBATCH_PARTITION": "other"}}, "hosts.0.env.SBATCH_PARTITION", "sbatch and srun read this variable"),
    ({"env": {"SRUN_CONTAINER": "x"}}, "hosts.0.env.SRUN_CONTAINER", "sbatch and srun read this variable"),
    ({"env": {"SLURM_CONF": "/tmp/other.conf"}}, "hosts.0.env.SLURM_CONF", "sbatch and srun read this variable"),
    ({"project_root": "/opt/flagperf,/:/host"}, "hosts.0.project_root", "without '..', ',', ':'"),
    ({"project_root": "/opt/flagperf\n#SBATCH --uid=0"}, "hosts.0.project_root", "control characters"),
])
def test_an_entry_cannot_reach_sbatch_options_around_its_slurm_keys(tmp_path: Path, entry: dict[str, Any],
                                                                    key: str, words: str) -> None:
    """sbatch and srun read SBATCH_*/SRUN_*/SLURM_* variables as options, and project_root is one item of the
    container's comma-separated SRC:DST mounts: either would bypass the checks of the slurm: keys."""
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"hosts": [{"name": "gpu", **entry, "slurm": {"shared_dir": str(tmp_path)}}]}))
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert info.value.key == key and words in info.value.message and "\n" not in str(info.value)


def test_a_job_scripts_comment_cannot_end_early(tmp_path: Path) -> None:
    """Names and paths in the comment line of a job script, and quoted words of its commands, with newlines,
    #SBATCH and $(...): sbatch reads no directive from them (those come before the first command) and bash runs
    each word as the one word it is."""
    hostile = "x\n#SBATCH --uid=0\n$(touch marker)\n"
    script = batch_script(f"flagperf: {hostile} on gpu", [shlex.join(["printf", "%s", hostile])])
    header = list(itertools.takewhile(lambda line: line.startswith("#") or not line.strip(),
                                      script.splitlines()[1:]))
    assert len(header) == 1 and not any(line.startswith("#SBATCH") for line in header), script
    (tmp_path / "job.sh").write_text(script)
    done = subprocess.run(["bash", "job.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, hostile, "")
    assert not (tmp_path / "marker").exists()


def test_a_slurm_entry_runs_its_own_jobs(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"hosts": [{"name": "x", "runtime": "docker", "slurm": {
        "shared_dir": str(tmp_path)}}]}))
    with pytest.raises(ConfigError, match=r"hosts\.0: .*slurm\.container_image runs cases in a container"):
        load_inventory(path)


def test_gres_as_slurm_writes_it_against_what_is_asked() -> None:
    assert parse_gres("gpu:h100:8(S:0-1),nic:2") == {("gpu", "h100"): 8, ("nic", None): 2}
    assert parse_gres("(null)") == {}
    assert gres_missing("gpu:8", "gpu:h100:8(S:0-1)") is None
    assert gres_missing("gpu:h100:4", "gpu:h100:8(S:0-1)") is None
    assert gres_missing("gpu:a100:1", "gpu:h100:8") == "gpu:a100:1 asked, the node has 0"
    assert gres_missing("gpu:8", "gpu:4") == "gpu:8 asked, the node has 4"


def test_a_container_image_mounts_the_shared_folder_and_the_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    (spec,) = load_inventory(write(tmp_path, container_image="nvcr.io#nvidia/pytorch:24.05-py3",
                                   container_mounts=["/data:/data:ro"])).hosts
    host = SlurmHost(spec)
    shared = tmp_path / "shared"
    assert host.container_options() == [
        "--container-image=nvcr.io#nvidia/pytorch:24.05-py3",
        f"--container-mounts={shared}:{shared},{host.project_root}:{host.project_root}:ro,/data:/data:ro",
        f"--container-workdir={host.project_root}", "--no-container-mount-home"]
    # The controller's markers of attempts seen to end lie in its own state folder, in no mount of the container (the
    # shared folder is mounted whole; the home, where that folder is by default, never: --no-container-mount-home);
    # where that folder is in one, none is kept (no attempt counts as ended)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    marker = host.ended_marker(shared / "run" / "c" / "round1" / "h_noderank0" / "attempt1")
    assert marker is not None and marker.is_relative_to(tmp_path / "state")
    monkeypatch.setattr(slurm, "_SAID_NO_MARKERS", set())
    monkeypatch.setenv("XDG_STATE_HOME", str(shared / "state"))
    assert host.ended_marker(shared / "run" / "attempt1") is None
    assert host.ended_path(shared / "run" / "c" / "round1") is None
    # Said once for the host and run, in one warning naming the folder, the key that mounts it and what to set
    (said,) = [r.getMessage() for r in caplog.records if "keeps no record" in r.getMessage()]
    assert f"lies in what the jobs can write ({spec_origin(spec)[0]}: hosts.0.slurm.shared_dir)" in said, said
    assert str(shared / "state") in said and "set XDG_STATE_HOME" in said and "\n" not in said
    # ... and again in the next run of the same process (the team server's worker runs one flow run after another):
    # each run's log says it
    caplog.clear()
    assert host.ended_marker(shared / "run2" / "attempt1") is None and host.ended_marker(shared / "run2" / "a2") is None
    assert [r.getMessage() for r in caplog.records if "keeps no record" in r.getMessage()] == [said]
    assert host.ended_root is None
    monkeypatch.setattr(slurm, "_SAID_NO_MARKERS", set())
    caplog.clear()
    monkeypatch.setenv("XDG_STATE_HOME", "/data/state")  # in the container_mounts source /data
    assert host.ended_root is None
    assert ": hosts.0.slurm.container_mounts.0)" in caplog.text
    # A relative XDG_STATE_HOME is ignored (the XDG spec): the home's .local/state; no home to be found (no HOME, no
    # passwd entry: Path.home raises), no marker rather than an error in the round
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert host.ended_root is not None and host.ended_root.is_relative_to(tmp_path / "home" / ".local" / "state")
    with monkeypatch.context() as homeless:
        homeless.delenv("HOME")
        homeless.setattr(pwd, "getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(uid)))
        assert host.ended_root is None and host.ended_marker(shared / "run" / "attempt1") is None
    (plain,) = load_inventory(write(tmp_path)).hosts
    assert SlurmHost(plain).container_options() == []
    # A squash file enroot made is named by its absolute path, as pyxis takes it; one that climbs out is refused.
    (squash,) = load_inventory(write(tmp_path, container_image="/shared/images/pytorch+24.05.sqsh")).hosts
    assert SlurmHost(squash).container_options()[0] == "--container-image=/shared/images/pytorch+24.05.sqsh"
    for bad in ("/shared/../etc/x.sqsh", "/shared/images/x.tar", "/shared/a b.sqsh"):
        with pytest.raises(ConfigError, match=r"slurm\.container_image"):
            load_inventory(write(tmp_path, container_image=bad))


def test_a_node_finds_its_rank_by_name_when_pinned_else_by_node_id(monkeypatch: pytest.MonkeyPatch) -> None:
    pinned = {"ranks": [{"rank": 0, "node": "n2"}, {"rank": 1, "node": "n1"}]}
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    monkeypatch.setenv("SLURM_NODEID", "0")  # Slurm's own order need not be the round's
    assert my_rank(pinned)["rank"] == 1
    loose = {"ranks": [{"rank": 0, "node": None}, {"rank": 1, "node": None}]}
    monkeypatch.setenv("SLURM_NODEID", "1")
    assert my_rank(loose)["rank"] == 1
    monkeypatch.setenv("SLURMD_NODENAME", "n9")
    with pytest.raises(SystemExit, match="node 'n9' is not in the plan's nodes"):
        my_rank(pinned)


def test_the_shipped_slurm_inventory_validates() -> None:
    from typer.testing import CliRunner

    from flows.cli import app

    path = Path(__file__).resolve().parents[2] / "deployments" / "inventories" / "slurm.yaml"
    outcome = CliRunner().invoke(app, ["validate", str(path)])
    assert outcome.exit_code == 0, outcome.output
    assert "inventory, 2 host(s)" in outcome.output


def test_a_container_image_gets_the_runs_vendor_and_cases_from_outside_the_project_under_flagperfs_folder(
        tmp_path: Path) -> None:
    """A Slurm entry with a container_image whose FLAGPERF_VENDOR_PATH / FLAGPERF_CASE_PATH name folders outside the
    project: its round's job script gives srun (pyxis) the run's vendor and case folders there, read-only under
    /flagperf-search as a docker host's containers get them, and exports the variables the container must read. The
    script runs here with an `srun` that records what it got (the test bed's Slurm has no pyxis: the integration
    test cannot run a container image)."""
    from flagperf.hosts.slurm import SCRIPT_FILE, Rank, SlurmRuntime

    vendors, lab = tmp_path / "vendors", tmp_path / "lab"
    (vendors / "acme").mkdir(parents=True)
    (vendors / "other").mkdir()
    (lab / "base" / "x").mkdir(parents=True)
    (tmp_path / "shared").mkdir(mode=0o700)
    env = {"FLAGPERF_VENDOR_PATH": str(vendors), "FLAGPERF_CASE_PATH": f"tests/fixtures/cases:{lab}",
           "OTHER": "kept"}

    def entry(image: str | None, **more: str) -> SlurmHost:
        path = tmp_path / "inventory.yaml"
        slurm = {"shared_dir": str(tmp_path / "shared"), **({"container_image": image} if image else {})}
        path.write_text(yaml.safe_dump({"hosts": [{"name": "gpu", "env": {**env, **more}, "slurm": slurm}]}))
        return SlurmHost(load_inventory(path).hosts[0])

    def run_script(host: SlurmHost) -> tuple[list[str], dict[str, str]]:
        """The job script's srun arguments and the variables srun saw."""
        search = host.search_mounts("acme", ["base/x", "base/computation-FP32"])
        job_dir = tmp_path / "shared" / "job"
        job_dir.mkdir(exist_ok=True)
        SlurmRuntime(search).write_job(host, [(Rank(0, None, job_dir, job_dir, ["python3", "-m", "x"], []), host)],
                                       "r1")
        stub = tmp_path / "bin" / "srun"
        stub.parent.mkdir(exist_ok=True)
        stub.write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$OUT.args"\n'
                        'printf "%s\\n" "$FLAGPERF_VENDOR_PATH" "$FLAGPERF_CASE_PATH" "$OTHER" > "$OUT.env"\n')
        stub.chmod(0o755)
        out = tmp_path / "srun"
        done = subprocess.run(["bash", str(job_dir / SCRIPT_FILE)], capture_output=True, text=True, timeout=60,
                              env={"PATH": f"{stub.parent}:/usr/bin:/bin", "OUT": str(out)})
        assert done.returncode == 0, done.stderr
        names = ("FLAGPERF_VENDOR_PATH", "FLAGPERF_CASE_PATH", "OTHER")
        return (Path(f"{out}.args").read_text().splitlines(),
                dict(zip(names, Path(f"{out}.env").read_text().splitlines(), strict=True)))

    host = entry("nvcr.io#nvidia/pytorch:24.05-py3")
    args, seen = run_script(host)
    shared, project = tmp_path / "shared", host.project_root
    base = f"--container-mounts={shared}:{shared},{project}:{project}:ro"
    assert f"{base},{vendors}/acme:/flagperf-search/vendor/0/acme:ro,{lab}/base/x:/flagperf-search/case/1/base/x:ro" \
        in args, args
    assert seen == {"FLAGPERF_VENDOR_PATH": "/flagperf-search/vendor/0",
                    "FLAGPERF_CASE_PATH": "tests/fixtures/cases:/flagperf-search/case/1", "OTHER": "kept"}
    # The healthcheck's probe job gets the vendor alike.
    probe_host = host.with_search(host.search_mounts("acme"))
    vendor_only = f"{base},{vendors}/acme:/flagperf-search/vendor/0/acme:ro"
    assert probe_host.container_options(probe_host.search)[1] == vendor_only
    assert host.search is None  # the slot itself is left as it was
    # On the node, before srun: a mount source that is not the folder the controller resolved (a node-local folder
    # that differs there: here, replaced by a link out after the script was written) stops the job in one line.
    search = host.search_mounts("acme", ["base/x"])
    job_dir = tmp_path / "shared" / "job"
    SlurmRuntime(search).write_job(host, [(Rank(0, None, job_dir, job_dir, ["python3", "-m", "x"], []), host)], "r2")
    (vendors / "acme").rename(tmp_path / "acme-kept")
    (vendors / "acme").symlink_to(tmp_path / "acme-kept")
    done = subprocess.run(["bash", str(job_dir / SCRIPT_FILE)], capture_output=True, text=True, timeout=60,
                          env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "OUT": str(tmp_path / "never"),
                               "SLURMD_NODENAME": "n1"})
    assert done.returncode == 96 and not Path(f"{tmp_path / 'never'}.args").exists(), done
    assert done.stderr == (f"flagperf-job: FLAGPERF_VENDOR_PATH's vendor folder {vendors}/acme is missing or a link "
                           "elsewhere on node n1, unlike on the controller: not mounted, the job stops\n"), done.stderr
    (vendors / "acme").unlink()
    (tmp_path / "acme-kept").rename(vendors / "acme")
    # Where a folder resolves decides, as for docker: a link to the project's vendor_images is named there (the
    # nodes see the project), a project-relative link out of the project is mounted.
    (tmp_path / "to-project").symlink_to(host.project_root / "vendor_images")
    (tmp_path / "to-lab").symlink_to(lab)
    linked = entry("nvcr.io#nvidia/pytorch:24.05-py3", FLAGPERF_VENDOR_PATH=str(tmp_path / "to-project"),
                   FLAGPERF_CASE_PATH=os.path.relpath(tmp_path / "to-lab", host.project_root)).search_mounts(
        "cpu", ["base/x"])
    assert linked is not None and linked.all() == [Mount(f"{lab}/base/x", "/flagperf-search/case/0/base/x", True)]
    assert dict(linked.env) == {"FLAGPERF_VENDOR_PATH": str(host.project_root / "vendor_images"),
                                "FLAGPERF_CASE_PATH": "/flagperf-search/case/0"}
    # A search path folder the controller lacks (the nodes may have it): one line, never a silent omission.
    with pytest.raises(ConfigError) as info:
        entry("nvcr.io#nvidia/pytorch:24.05-py3", FLAGPERF_VENDOR_PATH="/opt/flagperf-no-such-vendors").search_mounts(
            "acme")
    assert info.value.key == "hosts.0.env.FLAGPERF_VENDOR_PATH" and "'/opt/flagperf-no-such-vendors' is not a " \
        "folder on the controller" in info.value.message, str(info.value)
    # Without a container image the nodes' own python reads the host's folders where they are.
    plain = entry(None)
    assert plain.search_mounts("acme", ["base/x"]) is None
    args, seen = run_script(plain)
    assert not any(arg.startswith("--container") for arg in args)
    assert seen == {"FLAGPERF_VENDOR_PATH": str(vendors), "FLAGPERF_CASE_PATH": f"tests/fixtures/cases:{lab}",
                    "OTHER": "kept"}
    # What pyxis cannot mount, and a link out of its folder: one line naming the inventory's key.
    (tmp_path / "a,b" / "acme").mkdir(parents=True)
    (tmp_path / "escape").mkdir()
    (tmp_path / "escape" / "acme").symlink_to(vendors / "acme")
    for folder, words in ((tmp_path / "a,b", "cannot be mounted by pyxis"), (tmp_path / "escape", "outside its")):
        with pytest.raises(ConfigError) as info:
            entry("nvcr.io#nvidia/pytorch:24.05-py3", FLAGPERF_VENDOR_PATH=str(folder)).search_mounts("acme")
        assert info.value.key == "hosts.0.env.FLAGPERF_VENDOR_PATH" and words in info.value.message, str(info.value)
        assert "on host gpu" in info.value.message and "\n" not in str(info.value)



def test_a_search_path_from_the_controllers_environment_is_named_as_such(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry that sets no FLAGPERF_VENDOR_PATH: its jobs get the controller's, and a bad folder there is named as
    the controller's variable, not as an inventory key that does not exist."""
    (tmp_path / "escape").mkdir()
    (tmp_path / "vendors" / "acme").mkdir(parents=True)
    (tmp_path / "escape" / "acme").symlink_to(tmp_path / "vendors" / "acme")
    (tmp_path / "shared").mkdir(mode=0o700)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"hosts": [{"name": "gpu", "slurm": {
        "shared_dir": str(tmp_path / "shared"), "container_image": "nvcr.io#nvidia/pytorch:24.05-py3"}}]}))
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(tmp_path / "escape"))
    with pytest.raises(ConfigError) as info:
        SlurmHost(load_inventory(path).hosts[0]).search_mounts("acme")
    assert str(info.value).startswith("the controller's environment: FLAGPERF_VENDOR_PATH: on host gpu (its "
                                      "inventory entry sets no env.FLAGPERF_VENDOR_PATH): "), str(info.value)
    assert "hosts.0" not in str(info.value) and "outside its" in str(info.value)
    # A link in the mounted folder that leaves it: the controller lists it as it resolves the folder (the jobs'
    # container would find it dangling), before a job is written.
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(tmp_path / "vendors"))
    (tmp_path / "monitor.py").write_text("# the lab's\n")
    (tmp_path / "vendors" / "acme" / "monitor.py").symlink_to(tmp_path / "monitor.py")
    with pytest.raises(ConfigError) as info:
        SlurmHost(load_inventory(path).hosts[0]).search_mounts("acme")
    assert str(info.value).startswith("the controller's environment: FLAGPERF_VENDOR_PATH: on host gpu "), info.value
    assert (f"FLAGPERF_VENDOR_PATH vendor 'acme': {tmp_path / 'vendors' / 'acme' / 'monitor.py'} links outside its "
            f"folder (to {tmp_path / 'monitor.py'}); in a container it would dangle" in str(info.value)), info.value
    # The project's own vendor folder (the container has the project whole): a link in it out of the project is
    # the deployment's, named by the entry's project_root, never as a variable of the controller's.
    monkeypatch.delenv("FLAGPERF_VENDOR_PATH")
    project = tmp_path / "deploy"
    (project / "vendor_images" / "acme").mkdir(parents=True)
    (project / "vendor_images" / "acme" / "monitor.py").symlink_to(tmp_path / "monitor.py")
    entry = yaml.safe_load(path.read_text())
    entry["hosts"][0]["project_root"] = str(project)
    path.write_text(yaml.safe_dump(entry))
    with pytest.raises(ConfigError) as info:
        SlurmHost(load_inventory(path).hosts[0]).search_mounts("acme")
    # As every error shows it (one line of at most MAX_LINE): a long temporary folder shortens a path's middle.
    assert str(info.value) == one_line(
        f"on host gpu: the project's vendor 'acme': {project}/vendor_images/acme/monitor.py links outside the project "
        f"(to {tmp_path / 'monitor.py'}); in a container it would dangle: copy the file into the project, or make the "
        "link relative and inside it", lead=f"{path}: hosts.0.project_root:"), str(info.value)
    # Links to places the container has mounted, at the same place: the shared folder and a container_mounts target.
    (project / "vendor_images" / "acme" / "monitor.py").unlink()
    (project / "vendor_images" / "acme" / "shared.bin").symlink_to(tmp_path / "shared" / "weights.bin")
    (project / "vendor_images" / "acme" / "weights").symlink_to("/weights/llama")
    with pytest.raises(ConfigError) as info:  # /weights is no mount of this entry's container yet
        SlurmHost(load_inventory(path).hosts[0]).search_mounts("acme")
    assert "acme/weights links outside the project (to /weights/llama)" in info.value.message, str(info.value)
    entry["hosts"][0]["slurm"]["container_mounts"] = [f"{tmp_path / 'vendors'}:/weights:ro"]
    path.write_text(yaml.safe_dump(entry))
    search = SlurmHost(load_inventory(path).hosts[0]).search_mounts("acme")
    assert search is not None and search.all() == [] and search.mounted == (str(tmp_path / "shared"),
                                                                        f"{tmp_path / 'vendors'}:/weights")


def test_a_multi_node_jobs_mount_check_runs_on_every_node_outside_the_container(tmp_path: Path) -> None:
    """A two-node round with a container image: its job script checks the folders pyxis will mount on every node,
    in a step of its own before the round's step and without the container options (inside the container the
    mounts are made already), not only where the batch script runs. The script runs here with a stand-in `srun`
    that records each step and runs a check step's command once per node (n1, n2), where node n2 sees the vendor
    folder as a link elsewhere: the job stops with exit 96 in one line naming n2 and the folder, and the round's
    step never starts. The folder's name holds quotes and $(...): the check runs it as the one word it is."""
    import json
    import sys

    from flagperf.hosts.slurm import SCRIPT_FILE, Rank, SlurmRuntime

    vendors, lab = tmp_path / "ven'dors$(touch${IFS}marker)", tmp_path / "lab"
    (vendors / "acme").mkdir(parents=True)
    (lab / "base" / "x").mkdir(parents=True)
    (tmp_path / "shared").mkdir(mode=0o700)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"hosts": [{"name": "gpu", "env": {
        "FLAGPERF_VENDOR_PATH": str(vendors), "FLAGPERF_CASE_PATH": str(lab)}, "slurm": {
        "shared_dir": str(tmp_path / "shared"), "nodelist": ["n1", "n2"],
        "container_image": "nvcr.io#nvidia/pytorch:24.05-py3"}}]}))
    hosts = [SlurmHost(spec) for spec in load_inventory(path).hosts]
    search = hosts[0].search_mounts("acme", ["base/x"])
    assert search is not None and len(search.mounts) == 2
    members = []
    for rank, host in enumerate(hosts):
        job_dir = tmp_path / "shared" / f"job{rank}"
        job_dir.mkdir()
        members.append((Rank(rank, host.slurm.node, job_dir, job_dir, ["python3", "-m", "x"], []), host))
    script = tmp_path / "shared" / "job0" / SCRIPT_FILE

    stub = tmp_path / "bin" / "srun"
    stub.parent.mkdir()
    stub.write_text(f"""#!{sys.executable}
import json, os, subprocess, sys
args = sys.argv[1:]
with open(os.environ["OUT"], "a") as steps:
    steps.write(json.dumps(args) + "\\n")
nodes = int(next(a for a in args if a.startswith("--nodes=")).split("=")[1])
command = [a for a in args if not a.startswith("--")]
if command[0] != "/bin/bash":
    sys.exit(0)  # the round's step: recorded only
worst = 0
for node in range(1, nodes + 1):
    folder, away = os.environ.get(f"ELSEWHERE_ON_N{{node}}", ""), os.environ["AWAY"]
    shared = os.environ.get(f"OTHER_SHARED_ON_N{{node}}", "")
    if folder:  # this node's node-local folder differs: a link elsewhere, as long as its task runs
        os.rename(folder, away)
        os.symlink(away, folder)
    if shared:  # this node has another folder at the shared folder's path (an empty node-local one)
        os.rename(shared, shared + ".kept")
        os.mkdir(shared)
    try:
        code = subprocess.run(command, env={{**os.environ, "SLURMD_NODENAME": f"n{{node}}"}}).returncode
    finally:
        if folder:
            os.unlink(folder)
            os.rename(away, folder)
        if shared:
            os.rmdir(shared)
            os.rename(shared + ".kept", shared)
    worst = max(worst, code)
sys.exit(worst)
""")
    stub.chmod(0o755)

    def run(**more: str) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
        """The round's job script, written afresh (it removes its env file), run; what srun got, step by step."""
        SlurmRuntime(search).write_job(hosts[0], members, "r1")
        steps = tmp_path / "steps.jsonl"
        steps.unlink(missing_ok=True)
        done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                              env={"PATH": f"{stub.parent}:/usr/bin:/bin", "OUT": str(steps),
                                   "AWAY": str(tmp_path / "acme-elsewhere"), **more})
        return done, [json.loads(line) for line in steps.read_text().splitlines()] if steps.exists() else []

    done, steps = run()
    assert done.returncode == 0 and done.stderr == "", done
    (check, main) = steps
    # Every node's check runs to its end, where the cluster's KillOnBadExit=1 would kill the others at the first 96
    assert check[:7] == ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=0", "/bin/bash", "-c",
                         check[6]], check
    assert not any(a.startswith("--container") for a in check), check
    assert main[:3] == ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1"] and "--container-image=nvcr.io#nvidia/" \
        "pytorch:24.05-py3" in main and main[-3:] == ["-m", "flagperf.hosts.slurm_node", str(script.parent /
                                                                                                "slurm-job.json")]
    # Node n2 alone sees another vendor folder: the first node, where the batch script runs, would pass.
    done, steps = run(ELSEWHERE_ON_N2=str(vendors / "acme"))
    assert done.returncode == 96 and len(steps) == 1, (done, steps)
    assert done.stderr == (f"flagperf-job: FLAGPERF_VENDOR_PATH's vendor folder {vendors}/acme is missing or a link "
                           "elsewhere on node n2, unlike on the controller: not mounted, the job stops\n"), done.stderr
    assert not (tmp_path / "marker").exists() and not list(tmp_path.glob("*/marker"))
    # Node n2 has another folder at shared_dir's path (a node-local one): its records would never reach the
    # controller. The first step says so, naming the node and shared_dir, before the round's step starts; a node
    # with both problems names both.
    shared, plan = tmp_path / "shared", tmp_path / "shared" / "job0" / "slurm-job.json"
    shared_note = (f"flagperf-job: node n2 does not see slurm.shared_dir {shared} as the controller does (the job's "
                   f"plan {plan}, which the controller wrote there, is missing or another file): its records would be "
                   "lost, the job stops\n")
    done, steps = run(OTHER_SHARED_ON_N2=str(shared))
    assert done.returncode == 96 and len(steps) == 1, (done, steps)
    assert done.stderr == shared_note, done.stderr
    done, steps = run(OTHER_SHARED_ON_N2=str(shared), ELSEWHERE_ON_N2=str(vendors / "acme"))
    assert done.returncode == 96 and len(steps) == 1, (done, steps)
    assert done.stderr == shared_note + (f"flagperf-job: FLAGPERF_VENDOR_PATH's vendor folder {vendors}/acme is "
                                         "missing or a link elsewhere on node n2, unlike on the controller: not "
                                         "mounted, the job stops\n"), done.stderr
    # Without a container image a two-node job checks the shared folder alike (nothing to mount, the same records).
    plain_runtime = SlurmRuntime(None)
    plain_runtime.write_job(hosts[0], members, "r3")
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={"PATH": f"{stub.parent}:/usr/bin:/bin", "OUT": str(tmp_path / "plain.jsonl"),
                               "AWAY": str(tmp_path / "unused"), "OTHER_SHARED_ON_N2": str(shared)})
    assert done.returncode == 96 and done.stderr == shared_note, done
    assert len((tmp_path / "plain.jsonl").read_text().splitlines()) == 1
    # Where shared_dir is reached through a link on the controller, the note says where it leads there.
    (tmp_path / "mnt").symlink_to(tmp_path)
    (linked,) = [SlurmHost(spec.model_copy(update={"slurm": spec.slurm.model_copy(update={
        "shared_dir": tmp_path / "mnt" / "shared"})})) for spec in load_inventory(path).hosts[:1] if spec.slurm]
    assert (f"does not see slurm.shared_dir {tmp_path}/mnt/shared (on the controller: {shared}) as the controller "
            "does") in linked.shared_check_line(plan, "t", "exit 96")
    # A one-node round keeps the check in the batch script itself (it runs on the job's one node): no extra step.
    SlurmRuntime(search).write_job(hosts[0], members[:1], "r2")
    assert script.read_text().count("srun ") == 1 and "exit 96" in script.read_text()


def test_a_failure_quotes_every_failing_nodes_note_before_srun_noise(tmp_path: Path) -> None:
    """A multi-node job's failure names every node whose mount check stopped it: the job script's notes are
    quoted, not the last lines, where srun's own "task N: Exited" lines would crowd them out."""
    output = tmp_path / "slurm-7.out"
    nodes = [f"n{i}" for i in range(1, 11)]
    output.write_text("".join(f"flagperf-job: FLAGPERF_VENDOR_PATH's vendor folder /v/cpu is missing or a link "
                              f"elsewhere on node {node}, unlike on the controller: not mounted, the job stops\n"
                              f"srun: error: {node}: task {i}: Exited with exit code 96\n"
                              for i, node in enumerate(nodes)))
    summary = output_summary(output)
    assert summary.startswith("its notes in slurm-7.out: flagperf-job: FLAGPERF_VENDOR_PATH's vendor folder /v/cpu")
    assert [node for node in nodes if f"on node {node}," in summary] == nodes[:SUMMARY_LINES]
    assert summary.endswith(f"(and {len(nodes) - SUMMARY_LINES} more)")
    assert "srun: error" not in summary

    output.write_text("".join(f"line {i}\n" for i in range(20)))  # no notes: the last lines, as before
    assert output_summary(output) == "last lines of slurm-7.out: " + " | ".join(
        f"line {i}" for i in range(20 - SUMMARY_LINES, 20))
    # A job's command prints "flagperf: " lines of its own (the training worker's ranks, SlurmHost.run's command):
    # they are output, not the job script's notes, and the failure quotes the output's end, where its error is.
    output.write_text("flagperf: rank 1 joined the process group at 10.0.0.2:29501\n"
                      "Traceback (most recent call last):\nRuntimeError: CUDA out of memory\n"
                      "srun: error: n1: task 0: Exited with exit code 1\n")
    assert output_summary(output) == ("last lines of slurm-7.out: flagperf: rank 1 joined the process group at "
                                      "10.0.0.2:29501 | Traceback (most recent call last): | RuntimeError: CUDA out "
                                      "of memory | srun: error: n1: task 0: Exited with exit code 1")
    output.write_text("")
    assert output_summary(output) == "last lines of slurm-7.out: (empty)"


def test_a_pending_job_is_cancelled_naming_squeues_reason_once_slurm_gives_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job past slurm.pending_timeout_s whose squeue reason is still None (slurmctld's scheduler has not looked at
    it yet: just submitted, or a loaded controller) is not cancelled with "reason: none": the controller waits for a
    real reason (up to REASON_WAIT_S more) and names it. Stand-in squeue/scancel/scontrol on PATH answer by call
    count, so the verdict does not depend on how fast anything runs. And a job that ended without writing its output
    where the controller reads it, though a node ran its batch script, is named with that node and shared_dir."""
    from flagperf.hosts import slurm
    from flagperf.hosts.slurm import Rank, SlurmJob
    from flagperf.hosts.slurm_node import EXIT_FILE
    from flagperf.hosts.slurm_spec import SlurmSpec

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # squeue's answer RUNNING also writes the node's exit record, as a node whose case ended would.
    for name, body in (("squeue", 'n=$(($(cat "$T/calls" 2>/dev/null || echo 0) + 1)); echo "$n" > "$T/calls"\n'
                                  'a=$(sed -n "$(( n < $(wc -l < "$T/answers") ? n : $(wc -l < "$T/answers") ))p" '
                                  '"$T/answers")\necho "$a"\n'
                                  f'case "$a" in RUNNING*) echo \'{{"exit_code": 0}}\' > "$T/shared/job/{EXIT_FILE}";; '
                                  'esac\n'),
                       ("scancel", 'echo "$@" >> "$T/cancelled"\n'),
                       ("scontrol", 'cat "$T/job"\n')):
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("T", str(tmp_path))
    shared = tmp_path / "shared"
    (shared / "job").mkdir(parents=True)
    spec = SlurmSpec(shared_dir=shared, pending_timeout_s=0.2, poll_s=0.1, state_poll_s=0.5)

    def watched(answers: list[str], job_id: str, spec: SlurmSpec = spec) -> SlurmJob:
        (tmp_path / "answers").write_text("".join(f"{a}\n" for a in answers))
        (tmp_path / "calls").unlink(missing_ok=True)
        (tmp_path / "cancelled").unlink(missing_ok=True)
        (shared / "job" / EXIT_FILE).unlink(missing_ok=True)
        rank = Rank(0, "n1", shared / "job", shared / "job", ["true"], [])
        job = SlurmJob(spec, "flagperf-test", [rank], shared / "job" / f"slurm-{job_id}.out", 60, job_id=job_id,
                       submitted=time.monotonic())
        job.watch(rank, None, {})
        return job

    job = watched(["PENDING|None", "PENDING|None", "PENDING|None", "PENDING|Priority"], "42")
    assert job.never_started and job.end == ("Slurm job 42 still PENDING after 0 s (slurm.pending_timeout_s; squeue "
                                             "reason: Priority); cancelled"), job.end
    assert (tmp_path / "cancelled").read_text() == "42\n"
    # No reason ever: cancelled once the wait for one is over, saying so.
    monkeypatch.setattr(slurm, "REASON_WAIT_S", 0.5)
    job = watched(["PENDING|None"], "43")
    assert job.never_started and job.end == ("Slurm job 43 still PENDING after 0 s (slurm.pending_timeout_s; squeue "
                                             "reason: none, also 0 s later: slurmctld's scheduler has not looked at "
                                             "the job); cancelled"), job.end
    # While it waits for a reason, squeue is asked every state_poll_s (0.5 s), not every poll_s (0.1 s): at most once
    # at the start, once when the pending timeout passes, once per state_poll_s of the wait, and at its end.
    monkeypatch.setattr(slurm, "REASON_WAIT_S", 1.5)
    job = watched(["PENDING|None"], "45")
    assert job.never_started and "squeue reason: none, also 2 s later" in str(job.end), job.end
    assert int((tmp_path / "calls").read_text()) <= 3 + 1.5 / spec.state_poll_s, (tmp_path / "calls").read_text()
    # A CONFIGURING job has its nodes (they boot, on a power-saving cluster for minutes): its time configuring is
    # no pending time, so it is not cancelled at the pending timeout (0.2 s here) but runs once they are up (the
    # stand-in squeue's RUNNING writes the node's exit record; then the job has left the queue).
    job = watched(["CONFIGURING|None", "CONFIGURING|None", "CONFIGURING|None", "RUNNING|None", ""], "47")
    assert not job.never_started and job.end is None and not (tmp_path / "cancelled").exists(), job.end
    # Past slurm.configuring_timeout_s, a clock of its own from when squeue first said CONFIGURING, it is cancelled
    # saying so: no reason is waited for (squeue gives none, nor will it), nor is it said to be unseen by the
    # scheduler.
    job = watched(["CONFIGURING|None"], "46", spec.model_copy(update={"configuring_timeout_s": 0.2}))
    assert job.never_started and job.end == (
        "Slurm job 46 still CONFIGURING after 0 s (slurm.configuring_timeout_s; its nodes are allocated and still "
        "configuring: booting (a power-saving cluster powers them up for the job) or running a prolog; squeue "
        "reason: none; where nodes boot on demand, give slurm.configuring_timeout_s more than their boot takes); "
        "cancelled"), job.end
    assert int((tmp_path / "calls").read_text()) <= 2 and (tmp_path / "cancelled").read_text() == "46\n"
    # The clocks: pending time stops while the job configures and goes on where Slurm requeues it (a boot failed).
    clocked = SlurmJob(spec.model_copy(update={"pending_timeout_s": 100.0, "configuring_timeout_s": 50.0}),
                       "flagperf-test", [], shared / "x.out", 60, job_id="48", submitted=0.0)
    clocked.count_configuring(True, 90.0)
    assert not clocked.waited_too_long(139.0) and clocked.waited_too_long(141.0)  # 50 s configuring
    clocked.count_configuring(False, 130.0)  # requeued: PENDING again, 90 s of pending so far
    assert not clocked.waited_too_long(139.0) and clocked.waited_too_long(141.0)  # 100 s pending, 40 s configuring
    # Configuring again after a requeue: its clock goes on from the earlier episodes', never starts again (a boot
    # that fails each time would otherwise be retried for ever).
    clocked = SlurmJob(spec.model_copy(update={"pending_timeout_s": 1000.0, "configuring_timeout_s": 50.0}),
                       "flagperf-test", [], shared / "x.out", 60, job_id="49", submitted=0.0)
    clocked.count_configuring(True, 10.0)
    clocked.count_configuring(False, 40.0)  # 30 s configuring, requeued
    clocked.count_configuring(True, 100.0)
    assert not clocked.waited_too_long(119.0) and clocked.waited_too_long(121.0)  # 30 + 21 s configuring
    # Ended, no output where the controller reads it, though node n1 ran the batch script (Slurm: a launch failure).
    (tmp_path / "job").write_text("JobId=44 JobState=FAILED Reason=JobLaunchFailure Dependency=(null) ExitCode=0:53 "
                                  "BatchHost=n1 NodeList=n1\n")
    job = watched([""], "44")
    assert not job.never_started and job.end == (
        "Slurm job 44 ended (JobState FAILED, Reason JobLaunchFailure, ExitCode 0:53) before node(s) 0 wrote their "
        f"exit record; no slurm-44.out in {shared}/job, where node n1 (which ran the job's batch script) was to write "
        f"it: does n1 see slurm.shared_dir {shared} as the controller does?"), job.end
    # With its output there, the output is quoted as before.
    (shared / "job" / "slurm-44.out").write_text("oops\n")
    assert watched([""], "44").end.endswith("exit record; last lines of slurm-44.out: oops")


def test_a_job_is_submitted_never_to_be_requeued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm requeues a batch job whose node failed, by default: it would run the case again from the same job.json
    (resending its prompts to an endpoint) while the controller retries the attempt itself. sbatch is told not to."""
    from flagperf.hosts import slurm
    from flagperf.hosts.slurm import Rank, SlurmJob
    from flagperf.hosts.slurm_spec import SlurmSpec

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$T/argv"\necho "7;cluster"\n')
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("T", str(tmp_path))
    shared = tmp_path / "shared"
    (shared / "job").mkdir(parents=True)
    rank = Rank(0, "n1", shared / "job", shared / "job", ["true"], [])
    job = SlurmJob(SlurmSpec(shared_dir=shared), "flagperf-test", [rank], shared / "job" / "slurm-%j.out", 60)
    try:
        job.submit(shared / "job" / "batch.sh", {}, shared / "job", None)
    finally:
        slurm._live_jobs.discard(job)  # never a real job: nothing to cancel at exit
    assert job.job_id == "7" and "--no-requeue" in (tmp_path / "argv").read_text().splitlines()
