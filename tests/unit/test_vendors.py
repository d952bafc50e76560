"""flagperf.config.vendors: the real cpu vendor and malformed vendor folders on FLAGPERF_VENDOR_PATH."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flagperf.config.vendors import HostSpecSettings, available_vendors, load_vendor, load_vendor_manifest
from flagperf.errors import ConfigError
from flagperf.paths import PROJECT_ROOT
from flagperf.results.schema import SpecTable

SPEC_PY = """
def spec_table(settings):
    return {"device": "acme " + str(settings.get("model")),
            "peaks": {"fp32": {"value": settings.get("fp32"), "unit": "TFLOPS", "source": "datasheet p. 3"}}}
"""


@pytest.fixture
def vendor_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "vendors"
    root.mkdir()
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(root))
    return root


def make_vendor(root: Path, folder: str = "acme", **manifest: Any) -> Path:
    import yaml

    path = root / folder
    (path / "pytorch").mkdir(parents=True)
    (path / "pytorch" / "Dockerfile").write_text("FROM scratch\n", encoding="utf-8")
    (path / "spec.py").write_text(SPEC_PY, encoding="utf-8")
    (path / "mon.py").write_text("", encoding="utf-8")
    data: dict[str, Any] = {"name": folder, "description": "test vendor", "torch_device": "cpu",
                            "shares_host_memory": True,
                            "spec_settings": {"model": "X1", "fp32": 12.5},
                            "monitors": [{"name": "sys", "script": "mon.py"}],
                            "container": {"dockerfile": "pytorch/Dockerfile"}}
    for key, value in manifest.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    (path / "vendor.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    return path / "vendor.yaml"


# --- the real cpu vendor -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cpu_spec() -> SpecTable:
    return load_vendor("cpu").spec_table()


def test_cpu_vendor_manifest() -> None:
    vendor = load_vendor("cpu")
    assert vendor.name == "cpu"
    assert vendor.manifest.torch_device == "cpu"
    assert vendor.manifest.container.privileged is False
    assert [m.name for m in vendor.manifest.monitors] == ["system"]
    assert vendor.monitor_command(vendor.manifest.monitors[0], "python") == [
        "python", "-m", "flagperf.monitoring.system"]


def test_monitor_entry_needs_exactly_one_of_module_and_script(vendor_root: Path) -> None:
    both = make_vendor(vendor_root, monitors=[{"name": "sys", "script": "mon.py",
                                               "module": "flagperf.monitoring.system"}])
    with pytest.raises(ConfigError, match="exactly one of module and script"):
        load_vendor_manifest(both)


@pytest.mark.parametrize("module", ["os", "flagperf.monitoring.nope", "flagperf.monitoring.system; rm"])
def test_monitor_module_must_be_an_existing_core_monitor(vendor_root: Path, module: str) -> None:
    path = make_vendor(vendor_root, monitors=[{"name": "sys", "module": module}])
    with pytest.raises(ConfigError) as info:
        load_vendor_manifest(path)
    assert info.value.key.startswith("monitors.0")


def test_cpu_spec_table(cpu_spec: SpecTable) -> None:
    assert isinstance(cpu_spec, SpecTable)
    assert cpu_spec.device
    fp32, fp64 = cpu_spec.peaks["fp32"], cpu_spec.peaks["fp64"]
    assert fp32.supported and fp32.unit == "TFLOPS"
    assert fp32.source.startswith("derived:")
    if "no clock found" not in fp32.source:
        assert fp32.value is not None and fp32.value > 0
        assert fp64.value is not None
        assert fp32.value == pytest.approx(2 * fp64.value)  # twice the lanes
    tf32 = cpu_spec.peaks["tf32"]
    assert tf32.supported is False
    assert tf32.value is None
    for key in ("h2d_bandwidth", "d2h_bandwidth"):
        assert cpu_spec.peaks[key].supported is False
    capacity = cpu_spec.peaks["memory_capacity"]
    assert capacity.unit == "GiB" and capacity.value is not None and capacity.value > 0
    assert {"fp64", "fp32", "tf32", "fp16", "bf16", "int8", "memory_bandwidth", "memory_capacity"} <= set(
        cpu_spec.peaks)
    for peak in cpu_spec.peaks.values():  # every peak says where it comes from
        assert peak.source
        if not peak.supported:
            assert peak.value is None


def test_cpu_spec_settings_are_used() -> None:
    vendor = load_vendor("cpu")
    module = vendor._spec_module
    table = SpecTable.model_validate(module.spec_table({"clock_ghz": 2.0, "fma_units_per_core": 2,
                                                        "memory_channels": 8, "memory_mt_per_s": 3200}))
    fp32 = table.peaks["fp32"]
    assert "2.000 GHz (spec_settings.clock_ghz)" in fp32.source
    assert fp32.value is not None and fp32.value > 0
    doubled = SpecTable.model_validate(module.spec_table({"clock_ghz": 4.0, "fma_units_per_core": 2}))
    assert doubled.peaks["fp32"].value == pytest.approx(2 * fp32.value)
    bandwidth = table.peaks["memory_bandwidth"]
    assert bandwidth.value == pytest.approx(8 * 3200e6 * 8 / 1e9)
    assert bandwidth.unit == "GB/s"
    assert load_vendor("cpu").spec_table().peaks["memory_bandwidth"].value is None  # not set in vendor.yaml


# --- vendor folders on FLAGPERF_VENDOR_PATH --------------------------------------------------------------


def test_tmp_vendor_loads(vendor_root: Path) -> None:
    path = make_vendor(vendor_root)
    assert available_vendors()["acme"] == path.parent
    assert "cpu" in available_vendors()
    vendor = load_vendor("acme")
    table = vendor.spec_table()
    assert table.device == "acme X1"
    assert table.peaks["fp32"].value == 12.5



def test_which_folder_is_the_vendors_is_one_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder whose vendor.yaml is a dangling link, first on the search path: vendor_folders counted it (the later
    copy shadowed) while available_vendors' glob skipped it (the later copy used), so a run read the copy vendor
    check and validate called shadowed. Now every question goes by one search: the first folder is the vendor's,
    and loading it says its vendor.yaml leads nowhere, rather than silently using another copy. A folder without a
    vendor.yaml only adds engines, before the vendor's own as after it; a folder listed twice is one."""
    from flagperf.config.engines import engine_roots
    from flagperf.config.vendors import shadowed_by, vendor_folders

    broken, copy, lab = tmp_path / "broken", tmp_path / "copy", tmp_path / "lab"
    (broken / "acme").mkdir(parents=True)
    (broken / "acme" / "vendor.yaml").symlink_to("gone.yaml")
    make_vendor(copy)
    (lab / "acme" / "operation").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(copy)  # the same folder again
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", ":".join(map(str, (lab, broken, copy, tmp_path / "alias"))))
    assert available_vendors()["acme"] == broken / "acme"
    assert vendor_folders("acme") == [broken / "acme", copy / "acme"]
    assert shadowed_by(copy / "acme") == broken / "acme" and shadowed_by(broken / "acme") is None
    assert engine_roots("acme") == [lab / "acme", broken / "acme"]
    with pytest.raises(ConfigError, match=r"broken/acme/vendor\.yaml: a link to nothing"):
        load_vendor("acme")

def test_spec_table_output_is_validated(vendor_root: Path) -> None:
    make_vendor(vendor_root, spec_settings={"model": "X", "fp32": "fast"})
    # One line naming the vendor's spec module and the figure, as every user error is (no pydantic dump).
    with pytest.raises(ConfigError, match=r"acme/spec\.py spec_table\(\): peaks\.fp32\.value: "):
        load_vendor("acme").spec_table()


def test_privileged_needs_a_reason(vendor_root: Path) -> None:
    path = make_vendor(vendor_root, container={"dockerfile": "pytorch/Dockerfile", "privileged": True})
    with pytest.raises(ConfigError) as info:
        load_vendor("acme")
    assert info.value.source == str(path)
    assert info.value.key == "container"
    assert "privileged_reason" in info.value.message
    assert "\n" not in str(info.value)


def test_privileged_blank_reason_is_rejected(vendor_root: Path) -> None:
    make_vendor(vendor_root, container={"dockerfile": "pytorch/Dockerfile", "privileged": True,
                                        "privileged_reason": "  "})
    with pytest.raises(ConfigError, match="privileged_reason"):
        load_vendor("acme")


def test_privileged_with_reason_is_accepted(vendor_root: Path) -> None:
    make_vendor(vendor_root, container={"dockerfile": "pytorch/Dockerfile", "privileged": True,
                                        "privileged_reason": "the driver needs /dev/mem"})
    assert load_vendor("acme").manifest.container.privileged is True


def test_monitor_script_escaping_folder(vendor_root: Path) -> None:
    (vendor_root / "x.py").write_text("", encoding="utf-8")  # it exists: only the location is wrong
    path = make_vendor(vendor_root, monitors=[{"name": "sys", "script": "../x.py"}])
    with pytest.raises(ConfigError) as info:
        load_vendor_manifest(path)
    assert info.value.source == str(path)
    assert info.value.key == "monitors.0.script"
    assert "must stay inside the vendor folder" in info.value.message


def test_monitor_script_missing(vendor_root: Path) -> None:
    path = make_vendor(vendor_root, monitors=[{"name": "sys", "script": "nope.py"}])
    with pytest.raises(ConfigError) as info:
        load_vendor_manifest(path)
    assert info.value.key == "monitors.0.script"
    assert "does not exist" in info.value.message


@pytest.mark.parametrize(("key", "value", "error_key"), [
    ("spec_module", "/etc/passwd", "spec_module"),
    ("container", {"dockerfile": "../../Dockerfile"}, "container.dockerfile"),
])
def test_other_paths_must_stay_inside(vendor_root: Path, key: str, value: Any, error_key: str) -> None:
    path = make_vendor(vendor_root, **{key: value})
    with pytest.raises(ConfigError) as info:
        load_vendor_manifest(path)
    assert info.value.key == error_key


def test_name_must_match_folder(vendor_root: Path) -> None:
    path = make_vendor(vendor_root, name="other")
    with pytest.raises(ConfigError) as info:
        load_vendor("acme")
    assert info.value.source == str(path)
    assert info.value.key == "name"
    assert "folder name ('acme')" in info.value.message


@pytest.mark.parametrize(("key", "value", "error_key", "message"), [
    ("torch_device", None, "torch_device", "required key is missing"),
    ("colour", "red", "colour", "unknown key"),
    ("monitors", [{"name": "bad name", "script": "mon.py"}], "monitors.0.name", "monitor name"),
])
def test_manifest_schema_errors(vendor_root: Path, key: str, value: Any, error_key: str, message: str) -> None:
    path = make_vendor(vendor_root, **{key: value})
    with pytest.raises(ConfigError) as info:
        load_vendor_manifest(path)
    assert info.value.source == str(path)
    assert info.value.key == error_key
    assert message in info.value.message


def test_unknown_vendor_lists_known(vendor_root: Path) -> None:
    make_vendor(vendor_root)
    with pytest.raises(ConfigError) as info:
        load_vendor("nope")
    assert info.value.source == "--vendor"
    assert "(known: acme, " in info.value.message and ", cpu" in info.value.message


def test_nvml_monitor_samples_only_the_cases_gpus() -> None:
    import importlib.util

    from flagperf.paths import PROJECT_ROOT

    spec = importlib.util.spec_from_file_location("monitor_nvml", PROJECT_ROOT / "vendor_images/nvidia/monitor_nvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.visible_indices(None, 4) == [0, 1, 2, 3]
    assert module.visible_indices("2,0", 4) == [2, 0]
    assert module.visible_indices("1,7", 4) == [1]  # an index the host does not have is dropped
    assert module.visible_indices("GPU-8f2c", 4) == [0, 1, 2, 3]  # UUIDs: all, rather than a guess


# --- how exact a peak is, and a host's own spec_settings ------------------------------------------------------


def test_cpu_peaks_from_a_clock_the_cores_may_exceed_are_lower_bounds(cpu_spec: SpecTable) -> None:
    """cpufreq's maximum (or a clock the lab gives) is the peak clock; the model name's base clock or the
    current clock of /proc/cpuinfo (a VM) is not: peaks derived from those say they are lower bounds."""
    fp32 = cpu_spec.peaks["fp32"]
    read_from_base_or_current = "(model name)" in fp32.source or "'cpu MHz'" in fp32.source
    assert fp32.bound == ("lower" if read_from_base_or_current else "exact"), fp32.source
    assert (fp32.bound_reason is not None) == read_from_base_or_current
    assert cpu_spec.peaks["memory_capacity"].bound == "exact"
    given = SpecTable.model_validate(load_vendor("cpu")._spec_module.spec_table({"clock_ghz": 3.0}))
    assert all(p.bound == "exact" for p in given.peaks.values())  # the lab's clock is the peak clock


def test_a_host_s_spec_settings_lie_over_the_vendor_s() -> None:
    settings = HostSpecSettings(values={"clock_ghz": 3.0, "memory_channels": 2, "memory_mt_per_s": 3200},
                                source="lab.yaml", key="hosts.1.spec_settings")
    vendor = load_vendor("cpu").with_host_settings(settings)
    table = vendor.spec_table()
    assert "3.000 GHz (spec_settings.clock_ghz)" in table.peaks["fp32"].source
    assert table.peaks["memory_bandwidth"].value == pytest.approx(2 * 3200e6 * 8 / 1e9)
    values, origins = vendor.spec_settings()
    assert values == {"fma_units_per_core": 2, "clock_ghz": 3.0, "memory_channels": 2, "memory_mt_per_s": 3200}
    assert origins == {"fma_units_per_core": "vendor_images/cpu/vendor.yaml",
                       "clock_ghz": "lab.yaml: hosts.1.spec_settings.clock_ghz",
                       "memory_channels": "lab.yaml: hosts.1.spec_settings.memory_channels",
                       "memory_mt_per_s": "lab.yaml: hosts.1.spec_settings.memory_mt_per_s"}
    assert load_vendor("cpu").spec_settings()[0]["clock_ghz"] is None  # the vendor folder itself is untouched


@pytest.mark.parametrize(("key", "value", "message"), [
    ("clock_ghz", 3500, "3500 is outside 0.1 to 10 GHz"),
    ("clock_ghz", -2.0, "-2.0 is outside 0.1 to 10 GHz"),
    ("clock_ghz", "fast", "'fast' is not a number of GHz"),
    ("memory_channels", 2.5, "2.5 is not a whole number of channels"),
    ("memory_channels", 0, "0 is outside 1 to 128 channels"),
    ("memory_mt_per_s", 3.2, "3.2 is outside 100 to 20000 MT/s"),
    ("fma_units_per_core", True, "True is not a whole number of FMA units"),
    ("fma_unit_per_core", 2, "not a setting of the cpu spec module (it reads clock_ghz"),
])
def test_cpu_spec_settings_are_checked_in_one_line_naming_file_and_key(key: str, value: Any, message: str) -> None:
    settings = HostSpecSettings(values={key: value}, source="lab.yaml", key="hosts.0.spec_settings")
    with pytest.raises(ConfigError) as info:
        load_vendor("cpu").with_host_settings(settings).spec_table()
    assert str(info.value).startswith(f"lab.yaml: hosts.0.spec_settings.{key}: {message}"), str(info.value)
    assert "\n" not in str(info.value)


def test_a_bad_setting_in_vendor_yaml_names_vendor_yaml(vendor_root: Path) -> None:
    make_vendor(vendor_root, "lab", spec_settings={"clock_ghz": 0})
    spec = vendor_root / "lab" / "spec.py"
    spec.write_text((PROJECT_ROOT / "vendor_images" / "cpu" / "spec.py").read_text(encoding="utf-8"))
    with pytest.raises(ConfigError, match=r"lab/vendor.yaml: spec_settings.clock_ghz: 0 is outside 0.1 to 10 GHz$"):
        load_vendor("lab").spec_table()
