"""Each device's health at the healthcheck (the vendor's health probe, vendor.yaml health_module) and the fleet
diagnosis's health_field rules on it. NVML cannot run here: the NVIDIA probe's decisions are tested on recorded
NVML readings, and the path without NVML (no nvidia-ml-py, no driver) for real, through the probe and the
healthcheck; tests/gpu reads real GPUs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from flagperf.config.diagnose import load_rules
from flagperf.config.vendors import import_file, load_vendor
from flagperf.errors import ConfigError
from flagperf.hosts.fleet import open_host
from flagperf.hosts.health import check_host, device_health_check
from flagperf.hosts.inventory import load_inventory
from flagperf.hosts.probe import probe
from flagperf.paths import PROJECT_ROOT
from flagperf.results.devicehealth import checked_reading
from flagperf.results.diagnosis import Rules, diagnose, health_findings, render_markdown
from flagperf.results.summary import summarize
from tests.unit.test_diagnosis import FLEET, GEMM_RULE, put_round

NVIDIA_HEALTH = import_file(PROJECT_ROOT / "vendor_images" / "nvidia" / "health.py", "test_nvidia_health")


def raw(index: int, **changes: Any) -> dict[str, Any]:
    """An idle H100 SXM as NVML reads it: the link at Gen1 (power saving) of Gen5, x16 of x16, nothing pending."""
    return {"index": index, "uuid": f"GPU-{index}", "name": "NVIDIA H100 80GB HBM3", "serial": "1650", "pci_bus_id":
            f"00000000:{index + 0x18:02X}:00.0", "pcie_link_width": 16, "pcie_link_width_max": 16, "pcie_link_gen": 1,
            "pcie_link_gen_max": 5, "pcie_replay_count": 0, "remapped_rows": [0, 0, 0, 0],
            "retired_pages_pending": None, "ecc_uncorrected_volatile": 0, "ecc_uncorrected_aggregate": 0,
            "clock_event_reasons": ["gpu_idle"]} | changes


def reading(*devices: dict[str, Any]) -> dict[str, Any]:
    return {"available": True, "source": "NVML, driver 550.54.15", "devices": list(devices)}


def test_nvidia_readings_become_the_fields_the_rules_read() -> None:
    healthy = NVIDIA_HEALTH.device_reading(raw(0))
    assert healthy["fields"]["pcie_width_lanes_missing"] == 0  # Gen1 of Gen5 at idle is power saving: not judged
    assert (healthy["fields"]["pcie_link_gen"], healthy["fields"]["pcie_link_gen_max"]) == (1, 5)
    assert healthy["fields"]["retirement_pending"] == 0 and healthy["fields"]["hw_slowdown_idle"] == 0
    narrow = NVIDIA_HEALTH.device_reading(raw(3, pcie_link_width=8, remapped_rows=[2, 1, 1, 0],
                                              clock_event_reasons=["hw_slowdown", "gpu_idle"]))
    expected = {"pcie_width_lanes_missing": 8, "remapped_rows_correctable": 2, "remapped_rows_uncorrectable": 1,
                "retirement_pending": 1, "row_remap_failed": 0, "hw_slowdown_idle": 1}
    assert {k: narrow["fields"][k] for k in expected} == expected
    # A V100: no row remapper, pages pending instead; a field the GPU does not report stays null, never 0.
    older = NVIDIA_HEALTH.device_reading(raw(1, remapped_rows=None, retired_pages_pending=1, pcie_replay_count=None))
    assert older["fields"]["retirement_pending"] == 1 and older["fields"]["row_remap_failed"] is None
    assert older["fields"]["pcie_replay_count"] is None
    lost = NVIDIA_HEALTH.unreachable_reading(5, "NVMLError_GpuIsLost: GPU is lost")
    assert lost["fields"]["unreachable"] == 1 and lost["fields"]["pcie_width_lanes_missing"] is None
    for device in (healthy, narrow, older, lost):
        checked_reading(reading(device), "test")  # each is of the form the core reads


def test_without_nvml_the_reading_says_why_through_the_probe() -> None:
    answer = load_vendor("nvidia").device_health()
    if answer["available"]:
        pytest.skip("NVML works on this machine: tests/gpu checks the reading")
    assert answer["devices"] == [] and answer["reason"].startswith("NVML unavailable: ")
    assert probe("nvidia")["device_health"] == answer  # read before torch, whether or not torch sees a device
    assert probe("cpu")["device_health"]["reason"] == \
        "vendor cpu has no health probe (health_module in its vendor.yaml)"


def test_the_healthcheck_records_the_reading_and_names_what_the_rules_will_fail(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"hosts: [{{name: here, address: localhost, python: {sys.executable}}}]")
    spec = load_inventory(inventory).hosts[0]
    report = check_host(open_host(spec), spec, load_vendor("nvidia"), tmp_path / "probe.log")
    assert report.probe is not None
    check = next(c for c in report.checks if c.name == "device health")
    if report.probe["device_health"]["available"]:
        pytest.skip("NVML works on this machine: tests/gpu checks the reading")
    assert check.ok and not check.warn and check.detail.startswith("not read: NVML unavailable: ")

    recorded = reading(NVIDIA_HEALTH.device_reading(raw(0)),
                       NVIDIA_HEALTH.device_reading(raw(1, pcie_link_width=8, remapped_rows=[0, 0, 1, 1])))
    check = device_health_check({"device_health": recorded})
    assert check.ok and check.warn  # the run goes on; the diagnosis names the device beside its figures
    assert check.detail.startswith("2 device(s) read through NVML, driver 550.54.15; device 1 (GPU-1): "
                                   "pcie-link-width: health pcie_width_lanes_missing 8, needs <= 0 at the healthcheck: "
                                   "fail; device 1 (GPU-1): no-remapping-failure"), check.detail
    assert device_health_check({"device_health": reading(NVIDIA_HEALTH.device_reading(raw(0)))}).detail.endswith(
        "no default health rule fails")
    bad = device_health_check({"device_health": {"available": True, "devices": [{"index": -1}]}})
    assert bad.ok and bad.detail.startswith("not read: the probe's device_health: devices.0.index: ")


def put_health(run: Path, host: str, answer: dict[str, Any], image: dict[str, Any] | None = None) -> None:
    path = run / "hosts" / f"{host}.health.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    report = {"host": host, "ok": True, "checks": [], "probe": {"device_health": answer}}
    if image is not None:
        report["image_probes"] = {"pytorch": {"device_health": image}}
    path.write_text(json.dumps(report))


def health_rules(*names: str) -> Rules:
    default = {r.name: r.model_dump(exclude_none=True) for r in load_rules().rules}
    return Rules.model_validate({"min_fleet": 3, "rules": [GEMM_RULE, *[default[n] for n in names]]})


def test_the_diagnosis_fails_the_device_its_health_reading_shows(tmp_path: Path) -> None:
    """h2's device 1 trained at x8; h3 has a GPU its rounds never measured whose remapping failed; h4's reading was
    made in its image only (none on the host); h5 could not be read, and h1 has no health report at all."""
    run = tmp_path / "run1"
    for host in ("h1", "h2", "h3", "h4", "h5"):
        put_round(run, host, FLEET.get(host, [100.0, 100.0]))
    device = NVIDIA_HEALTH.device_reading
    put_health(run, "h2", reading(device(raw(0)), device(raw(1, pcie_link_width=8))))
    put_health(run, "h3", reading(device(raw(0)), device(raw(1)), device(raw(2, remapped_rows=[0, 0, 0, 1]))))
    put_health(run, "h4", {"available": False, "reason": "NVML unavailable: no nvidia-ml-py"},
               image=reading(device(raw(0)), device(raw(1))))
    put_health(run, "h5", {"available": False, "reason": "NVML unavailable: NVMLError_DriverNotLoaded"})
    found = diagnose(run, summarize(run).rows, health_rules("pcie-link-width", "no-remapping-failure"))
    by_key = {(v.host, v.device): v for v in found.devices}
    (width,) = by_key[("h2", 1)].failed
    assert width.line() == "pcie-link-width: health pcie_width_lanes_missing 8, needs <= 0 at the healthcheck: fail"
    assert by_key[("h2", 0)].status == "pass" and by_key[("h4", 1)].status == "pass"
    hosts = {v.host: v for v in found.hosts}
    assert [h.host for h in found.failed_hosts] == ["h2", "h3"]  # h3's device 1 (90 % of the fleet) fails gemm too
    assert [c.what for c in hosts["h3"].failed if c.rule == "no-remapping-failure"] == [
        "device 2 (GPU-2) (not measured): health row_remap_failed"]
    assert {c.what for c in hosts["h5"].checks if c.status == "unknown"} == {
        "health pcie_width_lanes_missing (not read: NVML unavailable: NVMLError_DriverNotLoaded)",
        "health row_remap_failed (not read: NVML unavailable: NVMLError_DriverNotLoaded)"}
    assert not [c for c in hosts["h1"].checks + by_key[("h1", 0)].checks if c.rule != "gemm"]
    assert "| h2 | **fail** | pcie-link-width: h2 device 1: health pcie_width_lanes_missing 8, needs <= 0 at the " \
           "healthcheck: fail |" in render_markdown(found).replace("\\_", "_")


def test_devices_are_matched_by_uuid_where_the_rounds_name_them(tmp_path: Path) -> None:
    """The rounds measured the host's GPUs 4 and 5 (visible devices narrowed) as their devices 0 and 1: the
    reading's GPU 5, x8, is the rounds' device 1 by its UUID, not the rounds' device 5."""
    run = tmp_path / "run1"
    header = {"type": "header", "monitor": "nvml", "interval_s": 1.0, "started_at": 99.0,
              "devices": [{"index": 0, "uuid": "GPU-4"}, {"index": 1, "uuid": "GPU-5"}]}
    sample = {"type": "sample", "t": 105.0, "devices": [{"index": 0}, {"index": 1}]}
    for host in ("h1", "h2", "h4"):
        put_round(run, host, FLEET[host], monitor=[header, sample])
    put_health(run, "h2", reading(*[NVIDIA_HEALTH.device_reading(raw(i, pcie_link_width=8 if i == 5 else 16))
                                    for i in range(8)]))
    found = diagnose(run, summarize(run).rows, health_rules("pcie-link-width"))
    failed = [(v.host, v.device, v.uuid) for v in found.devices if v.status == "fail"]
    assert failed == [("h2", 1, "GPU-5")]
    assert not [c for c in next(h for h in found.hosts if h.host == "h2").checks if "not measured" in c.what]


@pytest.mark.parametrize(("rule", "message"), [
    ({"name": "x", "health_field": "unreachable"}, "max goes with monitor_field or health_field"),
    ({"name": "x", "health_field": "unreachable", "monitor_field": "xid_events", "max": 0},
     "give exactly one of metric, throttle, monitor_field and health_field"),
])
def test_a_health_rule_needs_its_limit_and_no_other_kind(tmp_path: Path, rule: dict, message: str) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(json.dumps({"rules": [rule]}))
    with pytest.raises(ConfigError, match=message):
        load_rules(path)


def test_the_default_health_rules_read_fields_the_nvidia_probe_gives() -> None:
    fields = set(NVIDIA_HEALTH.device_reading(raw(0))["fields"])
    health = [r.health_field for r in load_rules().rules if r.health_field]
    assert health and set(health) <= fields
    assert health_findings(checked_reading(reading(NVIDIA_HEALTH.device_reading(raw(0))), "t"), load_rules()) == []
