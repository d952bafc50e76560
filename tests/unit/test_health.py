"""Healthcheck verdicts that do not need remote hosts (the SSH ones are in tests/integration/test_hosts.py)."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import pytest

from flagperf.config.vendors import load_vendor
from flagperf.hosts.fleet import open_host
from flagperf.hosts.health import (
    MAX_CLOCK_SKEW_S,
    Check,
    HealthReport,
    check_clock,
    check_host,
    device_count_check,
    log_check,
)
from flagperf.hosts.inventory import load_inventory
from flagperf.hosts.local import LocalHost
from flagperf.paths import display_path


class _SkewedHost(LocalHost):
    """This machine with its clock moved: skew is a property of the reading, whatever the transport."""

    def __init__(self, offset_s: float) -> None:
        super().__init__("skewed")
        self.offset_s = offset_s

    def clock(self) -> float:
        return time.time() + self.offset_s


def test_clock_skew_is_judged_on_a_cheap_read() -> None:
    assert check_clock(LocalHost()).ok
    for offset in (-(MAX_CLOCK_SKEW_S + 1.0), MAX_CLOCK_SKEW_S + 1.0):  # behind and ahead both count
        check = check_clock(_SkewedHost(offset))
        assert not check.ok and check.detail.startswith(f"{abs(offset):.2f} s against the controller")
    assert check_clock(_SkewedHost(MAX_CLOCK_SKEW_S / 2)).ok


def test_an_unreadable_clock_is_a_failed_check_not_a_crash() -> None:
    class _Broken(LocalHost):
        def clock(self) -> float:
            raise OSError("connection reset")

    check = check_clock(_Broken())
    assert not check.ok and check.detail == "cannot read the host's clock: connection reset"


def test_the_healthcheck_probe_builds_the_peaks_with_the_host_s_spec_settings(tmp_path: Path) -> None:
    """The probe runs with the inventory's spec_settings for the host: its peaks use them, and a value the spec
    module refuses fails the healthcheck in one line naming the inventory and key, before any round runs."""
    good = tmp_path / "good.yaml"
    good.write_text("hosts: [{name: here, address: localhost, spec_settings: {clock_ghz: 3.0}, expected_devices: 1}]")
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts: [{name: here, address: localhost, spec_settings: {memory_channels: 0}}]")
    vendor = load_vendor("cpu")
    for inventory in (good, bad):
        spec = load_inventory(inventory).hosts[0]
        report = check_host(open_host(spec), spec, vendor, tmp_path / f"{inventory.stem}.log")
        if inventory is good:
            assert all(c.ok for c in report.checks), report.checks
            assert report.probe is not None and "3.000 GHz (spec_settings.clock_ghz)" in \
                report.probe["peaks"]["fp32"]["source"]
            _the_host_s_device_count_is_checked_and_recorded(tmp_path, good, report)
        else:
            python = next(c for c in report.checks if c.name == "python")
            assert not python.ok and python.detail == (
                f"flagperf.hosts.probe exited 2: error: {display_path(bad)}: hosts.0.spec_settings.memory_channels: "
                "0 is outside 1 to 128 channels"), python.detail


def _the_host_s_device_count_is_checked_and_recorded(tmp_path: Path, inventory: Path, report: HealthReport) -> None:
    """expected_devices against the devices the probe found on the host (the cpu vendor: one): the same count is
    an ok check; another, on the same probe, fails in one line naming the file and key (where the defaults give
    it: defaults.expected_devices), both counts and what to look at; the record keeps both counts."""
    assert report.probe is not None
    counted = next(c for c in report.checks if c.name == "device count")
    assert counted.ok and counted.detail.startswith("1 x ") and counted.detail.endswith(
        f"on the host, as expected_devices: 1 ({display_path(inventory)}: hosts.0.expected_devices) says")
    assert report.as_dict()["device_count"] == {"expected": 1, "found": 1}
    two = tmp_path / "two.yaml"
    two.write_text("defaults: {expected_devices: 2}\nhosts: [{name: here, address: localhost}]")
    mismatch = device_count_check(load_inventory(two).hosts[0], load_vendor("cpu"), report.probe, "on the host")
    assert not mismatch.ok and mismatch.detail == (
        f"expected_devices: 2 ({display_path(two)}: defaults.expected_devices), found 1 x {report.probe['device']} "
        "on the host: fewer than expected: look at the host's devices with the vendor's tool (one off the bus, a "
        "driver that did not load)"), mismatch.detail
    assert HealthReport(host="here", checks=[mismatch], probe=report.probe, device_count={
        "expected": 2, "found": 1}).as_dict()["device_count"] == {"expected": 2, "found": 1}
    assert "device_count" not in HealthReport(host="here", checks=[], probe=None).as_dict()  # no expected_devices


def test_the_probe_names_the_visible_devices_variable_its_count_went_through(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe reports the vendor's visible-devices variable as it got it: a count other than expected_devices
    says it (escaped: one line), and names it as what to look at or narrow the devices with; a docker host's
    --gpus and a Slurm entry's gres are named as what narrowed theirs."""
    from flagperf.hosts.probe import probe
    from flagperf.hosts.vendorscaffold import write_vendor_folder

    manifest = write_vendor_folder(tmp_path / "vendors", "acme") / "vendor.yaml"
    manifest.write_text(manifest.read_text().replace("# visible_devices_env:", "visible_devices_env:"))
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(tmp_path / "vendors"))
    monkeypatch.setenv("ACME_VISIBLE_DEVICES", "0,1")
    monkeypatch.setitem(sys.modules, "torch", None)  # its answer before torch is all this reads: no torch import
    answer = probe("acme")
    assert answer["visible_devices"] == {"ACME_VISIBLE_DEVICES": "0,1"}, answer
    inventory = tmp_path / "inv.yaml"
    inventory.write_text("hosts: [{name: h1, address: localhost, expected_devices: 4}]")
    spec, vendor = load_inventory(inventory).hosts[0], load_vendor("acme")
    given = f"expected_devices: 4 ({display_path(inventory)}: hosts.0.expected_devices)"
    fewer = device_count_check(spec, vendor, {**answer, "device_count": 2, "device": "Acme X1"}, "on the host")
    assert fewer.detail == (f"{given}, found 2 x Acme X1 on the host with ACME_VISIBLE_DEVICES=0,1: fewer than "
                            "expected: look at the host's devices with the vendor's tool (one off the bus, a driver "
                            "that did not load) and at ACME_VISIBLE_DEVICES"), fewer.detail
    more = device_count_check(spec, vendor, {**answer, "device_count": 8, "device": "Acme X1",
                                             "visible_devices": {"ACME_VISIBLE_DEVICES": "0\n1"}}, "on the host")
    assert more.detail == (f"{given}, found 8 x Acme X1 on the host with ACME_VISIBLE_DEVICES=0\\n1: more than "
                           "expected: correct expected_devices, or narrow the devices with ACME_VISIBLE_DEVICES")
    # What narrowed a docker host's and a Slurm node's count: their own keys (the probe's variable unset)
    inventory.write_text(f"hosts: [{{name: d, address: localhost, runtime: docker, expected_devices: 4, docker: "
                         f"{{extra_options: '--gpus 2'}}}}, {{name: s, project_root: /srv/fp, expected_devices: 4, "
                         f"slurm: {{gres: 'gpu:4', shared_dir: {tmp_path}}}}}]")
    unset = {**answer, "device_count": 2, "device": "Acme X1", "visible_devices": {"ACME_VISIBLE_DEVICES": None}}
    docker, slurm = (device_count_check(spec, vendor, unset, "there").detail.partition("fewer than expected: ")[2]
                     for spec in load_inventory(inventory).hosts)
    assert docker.endswith(" and at ACME_VISIBLE_DEVICES, docker.extra_options (--gpus 2)"), docker
    assert slurm.endswith(" and at slurm.gres (gpu:4)"), slurm


def test_a_docker_host_s_count_is_checked_in_its_image_recorded_and_raised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """probe_image, the probe itself answered by a stand-in: another count than expected_devices is a failed
    check, logged, recorded in the host's report beside the image's count, and raised naming the host and the
    runtime's own variable (the host's visible_devices_env); after a failed "accelerators in image" no count is
    checked; the same count passes and the probe is returned."""
    import tasks.image as image_task
    from flagperf.errors import InfrastructureFailure
    from flagperf.hosts.docker import DockerRuntime
    from flagperf.hosts.local import CommandResult

    inventory = tmp_path / "inv.yaml"
    inventory.write_text(f"defaults: {{expected_devices: 4, runtime: docker, work_root: {tmp_path / 'work'}}}\n"
                         "hosts: [{name: h1, address: localhost, visible_devices: '0,1', "
                         "visible_devices_env: ACME_VISIBLE_DEVICES}]")
    spec, vendor = load_inventory(inventory).hosts[0], load_vendor("cpu")
    answers: list[dict[str, object]] = []
    monkeypatch.setattr(DockerRuntime, "run_probe", lambda *_, **__: (
        CommandResult(argv=[], exit_code=0, timed_out=False, seconds=0.1), [json.dumps(answers.pop())]))
    monkeypatch.setattr(image_task, "get_run_logger", lambda: logging.getLogger("test"))  # no task run around it
    health = tmp_path / "hosts" / "h1.health.json"
    health.parent.mkdir()
    health.write_text(json.dumps(HealthReport(host="h1", checks=[], probe=None,
                                              device_count={"expected": 4, "found": None}).as_dict()))
    seen = {"device_visible": True, "device": "Acme X1", "torch_device": "cuda", "libraries": {"torch": "2.9"},
            "visible_devices": {}}

    def probe_image(framework: str, count: int, visible: bool = True) -> dict[str, object]:
        answers.append({**seen, "device_count": count, "device_visible": visible})
        image = {"framework": framework, "tag": f"flagperf/cpu-{framework}:1", "dockerfile": "d/Dockerfile"}
        return image_task.probe_image.fn(open_host(spec), spec, vendor, "run1", image, tmp_path)

    with pytest.raises(InfrastructureFailure) as failed:
        probe_image("pytorch", 2)
    assert str(failed.value) == (
        f"host h1: device count: expected_devices: 4 ({display_path(inventory)}: defaults.expected_devices), found 2 "
        "x Acme X1 in flagperf/cpu-pytorch:1 with ACME_VISIBLE_DEVICES=0,1: fewer than expected: look at the host's "
        "devices with the vendor's tool (one off the bus, a driver that did not load) and at visible_devices (0,1, "
        "as ACME_VISIBLE_DEVICES)")
    with pytest.raises(InfrastructureFailure, match=r"^host h1: accelerators in image: no cuda device visible"):
        probe_image("invisible", 0, visible=False)
    assert probe_image("serving", 4)["device_count"] == 4
    report = json.loads(health.read_text())
    assert [(c["name"], c["ok"]) for c in report["checks"]] == [
        ("accelerators in image", True), ("device count", False), ("accelerators in image", False),
        ("accelerators in image", True), ("device count", True)] and not report["ok"], report["checks"]
    assert report["device_count"] == {"expected": 4, "found": None, "images": {"pytorch": 2, "serving": 4}}


def test_each_check_s_line_names_its_host(caplog: pytest.LogCaptureFixture) -> None:
    """The default Prefect UI shows a flow run's log without the task of each line: the healthchecks of several
    hosts read alike there unless each line names its host (as a failure's message does)."""
    log = logging.getLogger("flagperf.test.health")
    with caplog.at_level(logging.INFO, logger=log.name):
        log_check(log, "h1", Check("disk", True, "74.1 GiB free at /work (need 1.0)"))
        log_check(log, "h2", Check("disk", False, "0.2 GiB free at /work (need 1.0)"))
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "ok   host h1: disk: 74.1 GiB free at /work (need 1.0)"),
        (logging.ERROR, "FAIL host h2: disk: 0.2 GiB free at /work (need 1.0)")]


def test_a_slurm_container_images_bad_case_folder_fails_the_healthcheck_once_before_any_round(tmp_path: Path) -> None:
    """A Slurm entry with a container_image mounts the run's case folders from FLAGPERF_CASE_PATH: one that pyxis
    cannot mount (a link out of its folder here) fails the healthcheck, naming hosts.0.env.FLAGPERF_CASE_PATH,
    before the cluster is asked anything, so no round runs (each would fail as an infrastructure failure)."""
    import yaml

    lab, elsewhere = tmp_path / "lab", tmp_path / "elsewhere"
    (elsewhere / "x").mkdir(parents=True)
    (lab / "base").mkdir(parents=True)
    (lab / "base" / "x").symlink_to(elsewhere / "x")
    (tmp_path / "shared").mkdir(mode=0o700)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": [{
        "name": "gpu", "env": {"FLAGPERF_CASE_PATH": str(lab)},
        "slurm": {"shared_dir": str(tmp_path / "shared"), "container_image": "nvcr.io#nvidia/pytorch:24.05-py3"}}]}))
    spec = load_inventory(inventory).hosts[0]
    report = check_host(open_host(spec), spec, load_vendor("cpu"), tmp_path / "h.log", cases=["base/x"])
    assert [(c.name, c.ok) for c in report.checks] == [("container mounts", False)], report.checks
    detail = report.checks[0].detail
    assert "hosts.0.env.FLAGPERF_CASE_PATH" in detail and "outside its" in detail and "\n" not in detail, detail
    assert report.probe is None


def _report(run_dir: Path, host: str, text: str) -> Path:
    from flagperf.hosts.health import health_file

    path = health_file(run_dir, host)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(("text", "why"), [
    ("{not json", "not valid JSON"),
    ('["a list"]', "not an object"),
    ('{"probe": "a string"}', "probe: not an object"),
    ('{"probe": {"libraries": ["torch"]}}', "probe.libraries: not an object"),
    ('{"probe": {"device": 3}}', "probe.device: not a string"),
    ('{"probe": {}, "image_probes": []}', "image_probes: not an object"),
    ('{"probe": {}, "image_probes": {"pytorch": {"host": "x"}}}', "image_probes.pytorch.host: not an object"),
    (None, "is at most 67108864 bytes"),
], ids=["not-json", "a-list", "probe-string", "libraries-list", "device-number", "image-probes-list",
        "image-host-string", "too-large"])
def test_an_unreadable_health_report_is_a_warning_and_no_probe(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                                text: str | None, why: str) -> None:
    """round_probe is read as a round starts, outside the round's own catch-all, and again by the evaluation for a
    round that left no result: a report it cannot read raised there, and ended the evaluation. Now it warns,
    naming the host and why, and the round records no probe (only a failed round records one)."""
    import os

    from flagperf.hosts.health import round_probe
    from flagperf.results.bounded import MAX_RECORD_BYTES

    path = _report(tmp_path, "h1", text or "{}")
    if text is None:  # too large: sparse, a byte past the limit
        os.truncate(path, MAX_RECORD_BYTES + 1)
    with caplog.at_level(logging.WARNING, logger="flagperf.hosts.health"):
        assert round_probe(tmp_path, "h1", "pytorch") is None
    (record,) = [r for r in caplog.records if r.name == "flagperf.hosts.health"]
    assert record.levelno == logging.WARNING and record.getMessage().startswith(
        "host h1: its health report is unreadable (") and why in record.getMessage(), record.getMessage()


def test_each_framework_s_rounds_read_the_probe_in_their_own_image(tmp_path: Path) -> None:
    """A host's images (one per framework its cases use) are probed at once, each adding its check and probe to
    the host's health report: they were read, changed and written by each at once (the last writer's alone was
    kept) under one key (a round of one framework read another's image). Now one at a time, by framework."""
    from concurrent.futures import ThreadPoolExecutor

    from flagperf.hosts.health import record_image_probe, round_probe

    _report(tmp_path, "h1", '{"host": "h1", "ok": true, "checks": [{"name": "ssh", "ok": true, "detail": ""}], '
                            '"probe": {"host": {"cpu": "x86"}, "device": "cpu", "python": "3.11"}}')
    frameworks = [f"framework{n}" for n in range(12)]
    with ThreadPoolExecutor(max_workers=len(frameworks)) as pool:
        list(pool.map(lambda f: record_image_probe(tmp_path, "h1", f, Check("accelerators in image", True, f),
                                                   {"device": f"device-of-{f}", "host": {"ignored": True}}),
                      frameworks))
    for framework in frameworks:
        probe = round_probe(tmp_path, "h1", framework)
        assert probe == {"host": {"cpu": "x86"}, "device": f"device-of-{framework}", "python": "3.11"}
    report = json.loads((tmp_path / "hosts" / "h1.health.json").read_text())
    assert sorted(c["detail"] for c in report["checks"][1:]) == sorted(frameworks) and report["ok"]
    assert round_probe(tmp_path, "h1", None) == report["probe"]  # a round of no image: the host's own


def test_an_ssh_host_nothing_answers_on_is_one_plain_line(tmp_path: Path) -> None:
    """A host whose port nothing listens on (sshd down, a wrong port) fails its ssh check in one line saying why, as
    the system says it: paramiko's own text for it begins with "[Errno None]". The port is held bound, never
    listened on, so the refusal does not depend on which ports are free."""
    import socket

    from flagperf.hosts.ssh import SshHost

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        (tmp_path / "known_hosts").write_text("")
        (tmp_path / "key").write_text("")  # never read: nothing answers
        (tmp_path / "key").chmod(0o600)
        (tmp_path / "inv.yaml").write_text(
            f"hosts: [{{name: a, address: 127.0.0.1, port: {port}, user: lab, known_hosts: {tmp_path}/known_hosts, "
            f"key_file: {tmp_path}/key}}]\n")
        spec = load_inventory(tmp_path / "inv.yaml").hosts[0]
        report = check_host(SshHost(spec), spec, load_vendor("cpu"), tmp_path / "health.log")
    assert [(c.name, c.ok, c.detail) for c in report.checks] == [
        ("ssh", False, f"cannot connect to lab@127.0.0.1:{port}: Connection refused")], report.checks
