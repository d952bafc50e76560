"""Each device's health at the healthcheck (the vendor's health probe, vendor.yaml health_module) and the fleet
diagnosis's health_field rules on it. NVML cannot run here: the NVIDIA probe reads a stand-in ``pynvml`` (StandInNvml:
nvidia-ml-py's functions as the probe calls them, raising its own exception classes, the real package's where it is
installed), and the path without NVML (no nvidia-ml-py, no driver) runs for real, through the probe and the
healthcheck; tests/gpu reads real GPUs."""

from __future__ import annotations

import json
import os
import shutil
import string
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, ClassVar

import pytest

from flagperf.config.diagnose import load_rules
from flagperf.config.vendors import Vendor, import_file, load_vendor, load_vendor_manifest
from flagperf.errors import ConfigError
from flagperf.hosts.fleet import open_host
from flagperf.hosts.health import check_host, device_health_check
from flagperf.hosts.inventory import load_inventory
from flagperf.hosts.probe import probe
from flagperf.paths import PROJECT_ROOT
from flagperf.results.devicehealth import HealthReading, checked_reading, recorded_reading, summary_line, unavailable
from flagperf.results.diagnosis import Rules, diagnose, health_findings, match_readings, render_markdown
from flagperf.results.summary import summarize
from tests.unit.test_diagnosis import FLEET, GEMM_RULE, put_round

NVIDIA_HEALTH = import_file(PROJECT_ROOT / "vendor_images" / "nvidia" / "health.py", "test_nvidia_health")
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vendor_adaptation"


def _nvml_errors() -> ModuleType:
    """nvidia-ml-py's error codes and exception classes: the real package's where it is installed, else the same
    API (pynvml.py: NVMLError(code) is the code's subclass, NVMLError_<CapWords>, with .value and nvml.h's text)."""
    try:
        import pynvml

        return pynvml
    except ImportError:
        pass
    codes = {"UNINITIALIZED": (1, "Uninitialized"), "INVALID_ARGUMENT": (2, "Invalid Argument"),
             "NOT_SUPPORTED": (3, "Not Supported"),
             "NO_PERMISSION": (4, "Insufficient Permissions"), "NOT_FOUND": (6, "Not Found"),
             "INSUFFICIENT_POWER": (8, "Insufficient External Power"), "DRIVER_NOT_LOADED": (9, "Driver Not Loaded"),
             "TIMEOUT": (10, "Timeout"), "IRQ_ISSUE": (11, "Interrupt Request Issue"),
             "FUNCTION_NOT_FOUND": (13, "Function Not Found"), "GPU_IS_LOST": (15, "GPU is lost"),
             "RESET_REQUIRED": (16, "GPU requires restart"), "GPU_NOT_FOUND": (28, "GPU Not Found"),
             "UNKNOWN": (999, "Unknown Error")}
    module = ModuleType("nvml_errors")

    class NVMLError(Exception):
        _valClassMapping: ClassVar[dict[int, type]] = {}
        value: int

        def __new__(cls, value: int) -> NVMLError:
            if cls is NVMLError:
                cls = NVMLError._valClassMapping.get(value, cls)
            obj = Exception.__new__(cls)
            obj.value = value
            return obj

        def __str__(self) -> str:
            return next((text for code, text in codes.values() if code == self.value),
                        f"NVML Error with code {self.value}")

    module.NVMLError = NVMLError
    for name, (code, _) in codes.items():
        setattr(module, f"NVML_ERROR_{name}", code)
        cls = type("NVMLError_" + string.capwords(name, "_").replace("_", ""), (NVMLError,),
                   {"__new__": lambda typ, *args, _code=code: NVMLError.__new__(typ, _code)})
        setattr(module, cls.__name__, cls)
        NVMLError._valClassMapping[code] = cls
    return module


NVML = _nvml_errors()
E = NVML.NVMLError


def healthy_h100(index: int) -> dict[str, Any]:
    """An idle H100 SXM as NVML answers: the link at Gen1 (power saving) of Gen5, x16 of x16, nothing pending."""
    return {"nvmlDeviceGetUUID": f"GPU-{index}", "nvmlDeviceGetName": "NVIDIA H100 80GB HBM3",
            "nvmlDeviceGetSerial": "1650", "nvmlDeviceGetArchitecture": 9,
            "nvmlDeviceGetPciInfo": SimpleNamespace(busId=f"00000000:{index + 0x18:02X}:00.0".encode()),
            "nvmlDeviceGetCurrPcieLinkWidth": 16, "nvmlDeviceGetMaxPcieLinkWidth": 16,
            "nvmlDeviceGetCurrPcieLinkGeneration": 1, "nvmlDeviceGetMaxPcieLinkGeneration": 5,
            "nvmlDeviceGetGpuMaxPcieLinkGeneration": 5, "nvmlDeviceGetPcieReplayCounter": 0,
            "nvmlDeviceGetRemappedRows": (0, 0, 0, 0), "nvmlDeviceGetRetiredPagesPendingStatus": 0,
            "nvmlDeviceGetEccMode": [1, 1], "nvmlDeviceGetTotalEccErrors": 0,
            "nvmlDeviceGetCurrentClocksEventReasons": 0x1}


class StandInNvml(ModuleType):
    """``pynvml`` as health.py calls it, over a list of GPUs: each a dict of query name -> answer, an exception
    (raised), or absent (NVML_ERROR_NOT_SUPPORTED); ``open_error``: what nvmlDeviceGetHandleByIndex raises per index.
    Counts every call by name, nvmlShutdown's too; ``reached`` is set once nvmlInit is called."""

    def __init__(self, gpus: list[dict[str, Any]], open_error: dict[int, BaseException] | None = None,
                 init: BaseException | threading.Event | None = None, count: BaseException | None = None) -> None:
        super().__init__("pynvml")
        self.gpus, self.open_error, self.init, self.count_error = gpus, open_error or {}, init, count
        self.calls: dict[str, int] = {}
        self.reached = threading.Event()
        for name in dir(NVML):
            if name.startswith(("NVML_ERROR_", "NVMLError")):
                setattr(self, name, getattr(NVML, name))
        self.NVML_DEVICE_ARCH_AMPERE = 7
        self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, self.NVML_VOLATILE_ECC, self.NVML_AGGREGATE_ECC = 1, 0, 1
        for query in {q for gpu in gpus for q in gpu} | set(healthy_h100(0)):
            setattr(self, query, self._query(query))

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def _query(self, name: str) -> Any:
        def query(handle: int, *args: Any) -> Any:
            self._count(name)
            answer = self.gpus[handle].get(name, E(NVML.NVML_ERROR_NOT_SUPPORTED))
            if isinstance(answer, BaseException):
                raise answer
            return answer

        query.__name__ = name
        return query

    def nvmlInit(self) -> None:
        self._count("nvmlInit")
        self.reached.set()
        if isinstance(self.init, threading.Event):
            self.init.wait()  # a driver that does not answer, until the test lets it go
        elif self.init is not None:
            raise self.init

    def nvmlShutdown(self) -> None:
        self._count("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        if self.count_error is not None:
            raise self.count_error
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index in self.open_error:
            raise self.open_error[index]
        return index


def nvml_reading(monkeypatch: pytest.MonkeyPatch, nvml: StandInNvml) -> dict[str, Any]:
    """The NVIDIA vendor's answer as the probe gets it (Vendor.device_health), reading the stand-in."""
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    answer = load_vendor("nvidia").device_health()
    assert answer is not None
    json.dumps(answer, allow_nan=False)  # what the probe prints
    return answer


def raw(index: int, **changes: Any) -> dict[str, Any]:
    """An idle H100 SXM as read_raw records it (healthy_h100)."""
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
    # A failed remapping is a GPU to replace, not one waiting for a reset: row_remap_failed alone says it.
    failed = NVIDIA_HEALTH.device_reading(raw(2, remapped_rows=[0, 0, 0, 1]))
    assert (failed["fields"]["row_remap_failed"], failed["fields"]["retirement_pending"]) == (1, 0)
    assert [line.split(":")[1].strip() for line in health_findings(
        checked_reading(reading(failed), "t"), load_rules())] == ["no-remapping-failure"]
    # A V100: no row remapper, pages pending instead; a field the GPU does not report stays null, never 0.
    older = NVIDIA_HEALTH.device_reading(raw(1, remapped_rows=None, retired_pages_pending=1, pcie_replay_count=None))
    assert older["fields"]["retirement_pending"] == 1 and older["fields"]["row_remap_failed"] is None
    assert older["fields"]["pcie_replay_count"] is None
    lost = NVIDIA_HEALTH.unreachable_reading(5, "NVMLError_GpuIsLost: GPU is lost")
    assert lost["fields"]["unreachable"] == 1 and lost["fields"]["pcie_width_lanes_missing"] is None
    for device in (healthy, narrow, failed, older, lost):
        checked_reading(reading(device), "test")  # each is of the form the core reads


def test_the_probe_reads_every_gpu_through_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [healthy_h100(0), healthy_h100(1) | {"nvmlDeviceGetCurrPcieLinkWidth": 8, "nvmlDeviceGetEccMode": [1, 0]}]
    nvml = StandInNvml(gpus)
    answer = nvml_reading(monkeypatch, nvml)
    assert answer["available"] and answer["source"] == "NVML, driver 550.54.15"
    first, second = answer["devices"]
    assert (first["uuid"], first["facts"]["pci_bus_id"], first["facts"]["architecture"]) == (
        "GPU-0", "00000000:18:00.0", 9)
    assert first["facts"]["clock_event_reasons"] == ["gpu_idle"] and "errors" not in first["facts"]
    # Recorded, not judged: ECC on now and after the next reset, the GPU's own top PCIe generation.
    assert {k: second["fields"][k] for k in ("pcie_width_lanes_missing", "ecc_enabled", "ecc_enabled_pending",
                                             "pcie_link_gen_gpu_max", "unreachable")} == {
        "pcie_width_lanes_missing": 8, "ecc_enabled": 1, "ecc_enabled_pending": 0, "pcie_link_gen_gpu_max": 5,
        "unreachable": 0}
    assert nvml.calls["nvmlShutdown"] == 1


def test_a_gpu_of_another_job_is_not_read_nor_called_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under Slurm's ConstrainDevices a job that asked for two of eight GPUs may not open the other six: NVML counts
    them and answers NO_PERMISSION. That is no fault of the node: not read, unreachable unknown, no finding."""
    nvml = StandInNvml([healthy_h100(i) for i in range(8)],
                       open_error={i: E(NVML.NVML_ERROR_NO_PERMISSION) for i in range(6)})
    answer = nvml_reading(monkeypatch, nvml)
    assert [d["fields"]["unreachable"] for d in answer["devices"]] == [None] * 6 + [0, 0]
    assert answer["devices"][0]["facts"] == {"not_read": "NVMLError_NoPermission: Insufficient Permissions"}
    found = checked_reading(answer, "t")
    assert health_findings(found, load_rules()) == []
    assert summary_line(found) == "2 device(s) read through NVML, driver 550.54.15 (6 more counted, not read)"


@pytest.mark.parametrize("code", ["GPU_IS_LOST", "INSUFFICIENT_POWER", "IRQ_ISSUE", "RESET_REQUIRED", "UNKNOWN",
                                  "GPU_NOT_FOUND"])
def test_a_gpu_that_does_not_answer_is_unreachable(monkeypatch: pytest.MonkeyPatch, code: str) -> None:
    """UNKNOWN at opening: how a GPU fallen off the bus (XID 79) often answers ("Unable to determine the device
    handle for GPU ...: Unknown Error", as nvidia-smi says)."""
    if not hasattr(NVML, f"NVML_ERROR_{code}"):
        pytest.skip(f"the installed nvidia-ml-py has no NVML_ERROR_{code}")
    nvml = StandInNvml([healthy_h100(0), healthy_h100(1)], open_error={1: E(getattr(NVML, f"NVML_ERROR_{code}"))})
    lost = nvml_reading(monkeypatch, nvml)["devices"][1]
    assert lost["fields"]["unreachable"] == 1 and lost["facts"]["error"].startswith("NVMLError_")
    assert health_findings(checked_reading(reading(lost), "t"), load_rules()) == [
        "device 1: device-reachable: health unreachable 1, needs <= 0 at the healthcheck: fail"]


def test_each_query_is_told_apart_by_its_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not supported: null, no error. Any other error: null and named. GPU lost after its handle opened: unreachable
    (every error read as null made such a GPU reachable); an unknown error of one query after: named, no more. An
    error opening a GPU that says nothing of it (an invalid argument): not read, not unreachable."""
    quiet = healthy_h100(0) | {"nvmlDeviceGetPcieReplayCounter": E(NVML.NVML_ERROR_NOT_SUPPORTED),
                               "nvmlDeviceGetSerial": E(NVML.NVML_ERROR_NO_PERMISSION)}
    lost = healthy_h100(1) | {"nvmlDeviceGetCurrPcieLinkWidth": E(NVML.NVML_ERROR_GPU_IS_LOST),
                              "nvmlDeviceGetPcieReplayCounter": E(NVML.NVML_ERROR_UNKNOWN)}
    nvml = StandInNvml([quiet, lost, healthy_h100(2)], open_error={2: E(NVML.NVML_ERROR_INVALID_ARGUMENT)})
    first, second, third = nvml_reading(monkeypatch, nvml)["devices"]
    assert first["fields"]["pcie_replay_count"] is None and first["fields"]["unreachable"] == 0
    assert first["facts"]["errors"] == ["nvmlDeviceGetSerial: NVMLError_NoPermission: Insufficient Permissions"]
    assert second["fields"]["unreachable"] == 1 and second["fields"]["pcie_width_lanes_missing"] is None
    assert second["facts"]["errors"] == ["nvmlDeviceGetCurrPcieLinkWidth: NVMLError_GpuIsLost: GPU is lost",
                                         "nvmlDeviceGetPcieReplayCounter: NVMLError_Unknown: Unknown Error"]
    assert third["fields"]["unreachable"] is None
    assert third["facts"]["not_read"] == "NVMLError_InvalidArgument: Invalid Argument"


def test_retired_pages_stand_for_remapping_only_before_ampere(monkeypatch: pytest.MonkeyPatch) -> None:
    """An H100 under MIG: remapped rows not supported, and its retired pages never show remapping: null, not a
    confident 0. A V100 (Volta) has no row remapper: its pages pending are the figure."""
    mig = healthy_h100(0) | {"nvmlDeviceGetRemappedRows": E(NVML.NVML_ERROR_NOT_SUPPORTED)}
    volta = healthy_h100(1) | {"nvmlDeviceGetArchitecture": 5, "nvmlDeviceGetRetiredPagesPendingStatus": 1,
                               "nvmlDeviceGetRemappedRows": E(NVML.NVML_ERROR_NOT_SUPPORTED)}
    nvml = StandInNvml([mig, volta])
    hopper, old = (d["fields"] for d in nvml_reading(monkeypatch, nvml)["devices"])
    assert (hopper["retirement_pending"], hopper["row_remap_failed"]) == (None, None)
    assert (old["retirement_pending"], old["row_remap_failed"]) == (1, None)
    assert nvml.calls["nvmlDeviceGetRetiredPagesPendingStatus"] == 1  # the V100's alone


@pytest.mark.parametrize(("nvml", "reason", "shutdowns"), [
    (StandInNvml([healthy_h100(0)], init=E(NVML.NVML_ERROR_DRIVER_NOT_LOADED)),
     "NVML unavailable: NVMLError_DriverNotLoaded: Driver Not Loaded", 0),
    (StandInNvml([healthy_h100(0)], count=E(NVML.NVML_ERROR_UNKNOWN)),
     "NVML cannot count the GPUs: NVMLError_Unknown: Unknown Error", 1),
    (StandInNvml([]), "NVML counts no GPU on this host", 1),
    # The module's own bug (rows of the wrong form): NVML shut down all the same, the probe answers why.
    (StandInNvml([healthy_h100(0) | {"nvmlDeviceGetRemappedRows": (0, 1)}]),
     "vendor_images/nvidia/health.py device_health() raised ValueError: not enough values to unpack", 1),
], ids=["init", "count", "none", "bug"])
def test_a_reading_nvml_cannot_make_says_why(monkeypatch: pytest.MonkeyPatch, nvml: StandInNvml, reason: str,
                                             shutdowns: int) -> None:
    answer = nvml_reading(monkeypatch, nvml)
    assert not answer["available"] and answer["devices"] == [] and answer["reason"].startswith(reason), answer
    assert nvml.calls.get("nvmlShutdown", 0) == shutdowns


def test_nvml_that_does_not_answer_is_left_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    hold = threading.Event()
    nvml = StandInNvml([healthy_h100(0)], init=hold)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    try:
        answer = NVIDIA_HEALTH.device_health({}, limit_s=0.01)  # NVML never answers until released below
    finally:
        # Released only once the thread holds the stand-in: one that imported pynvml after monkeypatch restored
        # sys.modules would start the real NVML behind the later tests.
        assert nvml.reached.wait(60)
        hold.set()
    assert answer == {"available": False, "source": "NVML", "reason": "NVML did not answer within 0.01 s",
                      "devices": []}


# A driver that hangs, as the probe's process meets it: nvmlInit never returns, holding the library's lock, and the
# library's destructor waits for that lock at the interpreter's exit (libnvidia-ml's, in C; atexit's here).
HANGING_PYNVML = """import atexit, threading
_lock = threading.Lock()
atexit.register(lambda: _lock.acquire())
def nvmlInit():
    _lock.acquire()
    threading.Event().wait()
"""
# The probe as `python -m flagperf.hosts.probe --vendor nvidia` runs it, with the NVIDIA module's limit made short.
PROBE_WITH_SHORT_LIMIT = """import functools
import flagperf.config.vendors as vendors
from flagperf.hosts import probe
load = vendors.import_file
def short_limit(path, name, family=None):
    module = load(path, name, family)
    if name.endswith("_health"):
        module.device_health = functools.partial(module.device_health, limit_s=0.05)
    return module
vendors.import_file = short_limit
probe.exit_process(probe.main(["--vendor", "nvidia"]))
"""


def test_a_probe_whose_driver_hangs_exits_with_its_answer(tmp_path: Path) -> None:
    """A host without torch (a container host): the reading thread left behind must not hold the probe's exit, or
    its printed answer is lost at the healthcheck's limit."""
    (tmp_path / "pynvml.py").write_text(HANGING_PYNVML)
    (tmp_path / "torch.py").write_text("raise ImportError('no torch on this host')\n")
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(PROJECT_ROOT)])}
    done = subprocess.run([sys.executable, "-c", PROBE_WITH_SHORT_LIMIT], env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # the timeout only ends a hang: without the fix it never exits
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["device_health"]["reason"] == "NVML did not answer within 0.05 s" and "torch_missing" in answer


def health_vendor(tmp_path: Path, body: str) -> Vendor:
    """A vendor folder (the test vendor's) whose health module is ``body``."""
    folder = tmp_path / "testvendor"
    shutil.copytree(FIXTURE / "vendors" / "testvendor", folder)
    (folder / "vendor.yaml").write_text((folder / "vendor.yaml").read_text() + "health_module: health.py\n")
    (folder / "health.py").write_text(body)
    return Vendor(manifest=load_vendor_manifest(folder / "vendor.yaml"), location=str(folder))


@pytest.mark.parametrize(("body", "reason"), [
    ("def device_health(settings):\n    return {'available': True, 'devices': [{'index': 0, 'facts': "
     "{'serial': b'\\xff'}}]}\n", "device_health(): devices.0.facts.serial."),
    ("import sys\n\ndef device_health(settings):\n    sys.exit(3)\n", "device_health() raised SystemExit: 3"),
    ("def device_health(settings):\n    return {'available': True, 'devices': [{'index': 0, 'fields': "
     "{'unreachable': '1'}}]}\n", "device_health(): devices.0.fields.unreachable: Input should be a valid number"),
], ids=["bytes", "exit", "text-for-number"])
def test_a_vendor_module_cannot_stop_the_probe(tmp_path: Path, body: str, reason: str) -> None:
    answer = health_vendor(tmp_path, body).device_health()
    assert answer is not None and not answer["available"] and reason in answer["reason"], answer
    json.dumps(answer, allow_nan=False)


def test_readings_are_strict_and_whole() -> None:
    device = NVIDIA_HEALTH.device_reading(raw(0))
    for bad, message in [({"available": "yes", "reason": "x"}, "available: Input should be a valid boolean"),
                         ({"available": True, "devices": []}, "lists at least one device"),
                         ({"available": False}, "says why"),
                         (reading(device, device), "two devices with index 0"),
                         (reading(device, device | {"index": 1}), "two devices with uuid 'GPU-0'"),
                         (reading(device | {"fields": {"pcie_link_width": "16"}}), "valid number"),
                         (reading(device | {"facts": {"n": float("nan")}}), "facts.n")]:
        with pytest.raises(ConfigError, match=message):
            checked_reading(bad, "t")
    assert checked_reading(reading(device | {"fields": {"x": 16}}), "t").devices[0].fields["x"] == 16.0
    assert len(unavailable("x" * 5000)["reason"]) == 2000


def test_without_nvml_the_reading_says_why_through_the_probe() -> None:
    answer = load_vendor("nvidia").device_health()
    if answer is not None and answer["available"]:
        pytest.skip("NVML works on this machine: tests/gpu checks the reading")
    assert answer is not None and answer["devices"] == [] and answer["reason"].startswith("NVML unavailable: ")
    assert probe("nvidia")["device_health"] == answer  # read before torch, whether or not torch sees a device
    assert "device_health" not in probe("cpu")  # a vendor without a health module: no reading, not an unknown one


def test_the_healthcheck_records_the_reading(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"hosts: [{{name: here, address: localhost, python: {sys.executable}}}]")
    spec = load_inventory(inventory).hosts[0]
    report = check_host(open_host(spec), spec, load_vendor("nvidia"), tmp_path / "probe.log")
    assert report.probe is not None
    check = next(c for c in report.checks if c.name == "device health")
    if report.probe["device_health"]["available"]:
        pytest.skip("NVML works on this machine: tests/gpu checks the reading")
    assert check.ok and not check.warn and check.detail.startswith("not read: NVML unavailable: ")


def test_the_healthcheck_line_names_what_the_rules_will_fail() -> None:
    nvidia, cpu = load_vendor("nvidia"), load_vendor("cpu")
    recorded = reading(NVIDIA_HEALTH.device_reading(raw(0)),
                       NVIDIA_HEALTH.device_reading(raw(1, pcie_link_width=8, remapped_rows=[0, 0, 1, 1])))
    check = device_health_check({"device_health": recorded}, nvidia)
    assert check.ok and check.warn  # the run goes on; the diagnosis names the device beside its figures
    assert check.detail.startswith("2 device(s) read through NVML, driver 550.54.15; device 1 (GPU-1): "
                                   "pcie-link-width: health pcie_width_lanes_missing 8, needs <= 0 at the healthcheck: "
                                   "fail; device 1 (GPU-1): no-remapping-failure"), check.detail
    assert device_health_check({"device_health": reading(NVIDIA_HEALTH.device_reading(raw(0)))}, nvidia
                               ).detail.endswith("no default health rule fails")
    bad = device_health_check({"device_health": {"available": True, "devices": [{"index": -1}]}}, nvidia)
    assert bad.ok and bad.detail.startswith("not read: the probe's device_health: devices.0.index: ")
    image = device_health_check({}, cpu, "device health in the pytorch image")
    assert (image.name, image.detail) == ("device health in the pytorch image",
                                          "none: vendor cpu has no health probe (health_module in its vendor.yaml)")
    assert device_health_check({}, nvidia).detail == "not read: the flagperf probe there reads no device health"


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
    # The rounds named no UUID (no monitor): matched by index, and said so.
    assert width.line() == ("pcie-link-width: health pcie_width_lanes_missing (matched by index) 8, needs <= 0 at the "
                            "healthcheck: fail")
    assert by_key[("h2", 0)].status == "pass" and by_key[("h4", 1)].status == "pass"
    hosts = {v.host: v for v in found.hosts}
    assert [h.host for h in found.failed_hosts] == ["h2", "h3"]  # h3's device 1 (90 % of the fleet) fails gemm too
    assert [c.what for c in hosts["h3"].failed if c.rule == "no-remapping-failure"] == [
        "device 2 (GPU-2) (not measured): health row_remap_failed"]
    assert {c.what for c in hosts["h5"].checks if c.status == "unknown"} == {
        "health pcie_width_lanes_missing (not read: NVML unavailable: NVMLError_DriverNotLoaded)",
        "health row_remap_failed (not read: NVML unavailable: NVMLError_DriverNotLoaded)"}
    assert not [c for c in hosts["h1"].checks + by_key[("h1", 0)].checks if c.rule != "gemm"]
    markdown = render_markdown(found).replace("\\_", "_")
    assert "| h2 | **fail** | pcie-link-width: h2 device 1: health pcie_width_lanes_missing (matched by index) 8, " \
           "needs <= 0 at the healthcheck: fail |" in markdown
    # h5's figures pass, its health could not be read: said beside the pass, with the reason, never hidden by it.
    assert hosts["h5"].status == "pass"
    assert "| h5 | pass | every rule passed; unknown: pcie-link-width, no-remapping-failure (device health not read: " \
           "NVML unavailable: NVMLError_DriverNotLoaded) |" in markdown, markdown


def measured_rounds(run: Path, devices: list[dict[str, Any]]) -> None:
    """Hosts h1, h2 and h4 each measured the two devices ``devices`` names (their NVML monitor's header)."""
    header = {"type": "header", "monitor": "nvml", "interval_s": 1.0, "started_at": 99.0, "devices": devices}
    sample = {"type": "sample", "t": 105.0, "devices": [{"index": d["index"]} for d in devices]}
    for host in ("h1", "h2", "h4"):
        put_round(run, host, FLEET[host], monitor=[header, sample])


def test_devices_are_matched_by_uuid_where_the_rounds_name_them(tmp_path: Path) -> None:
    """The rounds measured the host's GPUs 4 and 5 (visible devices narrowed) as their devices 0 and 1: the
    reading's GPU 5, x8, is the rounds' device 1 by its UUID, not the rounds' device 5."""
    run = tmp_path / "run1"
    measured_rounds(run, [{"index": 0, "uuid": "GPU-4"}, {"index": 1, "uuid": "GPU-5"}])
    put_health(run, "h2", reading(*[NVIDIA_HEALTH.device_reading(raw(i, pcie_link_width=8 if i == 5 else 16))
                                    for i in range(8)]))
    found = diagnose(run, summarize(run).rows, health_rules("pcie-link-width"))
    failed = [(v.host, v.device, v.uuid) for v in found.devices if v.status == "fail"]
    assert failed == [("h2", 1, "GPU-5")]
    assert not [c for c in next(h for h in found.hosts if h.host == "h2").checks if "not measured" in c.what]


def test_a_serial_number_is_no_uuid_to_match_by(tmp_path: Path) -> None:
    """The monitor read the GPUs' serial numbers but not their UUIDs: a serial in device_uuid matched no reading and
    left every device "not measured". No UUID: matched by index, and said so."""
    run = tmp_path / "run1"
    measured_rounds(run, [{"index": 0, "serial": "1650"}, {"index": 1, "serial": "1651"}])
    put_health(run, "h2", reading(*[NVIDIA_HEALTH.device_reading(raw(i, pcie_link_width=8 if i == 1 else 16))
                                    for i in range(2)]))
    summary = summarize(run)
    assert summary.rows["device_uuid"].isna().all()
    found = diagnose(run, summary.rows, health_rules("pcie-link-width"))
    (width,) = next(v for v in found.devices if (v.host, v.device) == ("h2", 1)).failed
    assert width.what == "health pcie_width_lanes_missing (matched by index)"


def test_a_reading_without_a_uuid_is_never_matched_by_index_where_the_rounds_name_uuids(tmp_path: Path) -> None:
    """The rounds measured GPU-4 and GPU-5 as their devices 0 and 1; NVML's GPU 1 fell off the bus (no UUID read)
    and GPU 3 is another job's (not read). Matching GPU 1 by index blamed the healthy GPU-5: it goes on the host,
    not measured, and the not-read GPU 3 adds no unknown there."""
    run = tmp_path / "run1"
    measured_rounds(run, [{"index": 0, "uuid": "GPU-4"}, {"index": 1, "uuid": "GPU-5"}])
    devices = [NVIDIA_HEALTH.device_reading(raw(i)) for i in range(8)]
    devices[1] = NVIDIA_HEALTH.unreachable_reading(1, "NVMLError_GpuIsLost: GPU is lost")
    devices[3] = NVIDIA_HEALTH.not_opened_reading(3, "NVMLError_NoPermission: Insufficient Permissions")
    put_health(run, "h2", reading(*devices))
    found = diagnose(run, summarize(run).rows, health_rules("device-reachable"))
    assert [(v.host, v.device) for v in found.devices if v.status == "fail"] == []
    h2 = next(h for h in found.hosts if h.host == "h2")
    assert [(c.what, c.status) for c in h2.checks if c.rule == "device-reachable"] == [
        ("device 1 (not measured): health unreachable", "fail")]
    gpu5 = next(v for v in found.devices if (v.host, v.device) == ("h2", 1))
    assert [(c.what, c.value) for c in gpu5.checks if c.rule == "device-reachable"] == [("health unreachable", 0)]


def test_two_readings_on_one_measured_device_match_neither() -> None:
    from flagperf.results.diagnosis import Verdict

    device = checked_reading(reading(NVIDIA_HEALTH.device_reading(raw(0))), "t").devices[0]
    twins = HealthReading.model_construct(available=True, devices=[device, device.model_copy(update={"index": 1})])
    matched = match_readings(twins, {0: Verdict("h", 0, uuid="GPU-0"), 1: Verdict("h", 1, uuid="GPU-9")})
    assert matched == {0: (None, " (one of 2 readings of the same measured device: matched to none)"),
                       1: (None, " (one of 2 readings of the same measured device: matched to none)")}


def test_a_vendor_without_a_health_module_records_no_reading(tmp_path: Path) -> None:
    """No health module: no key in the probe, so no five unknown checks per host and run."""
    run = tmp_path / "run1"
    put_round(run, "h1", [100.0])
    path = run / "hosts" / "h1.health.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"host": "h1", "ok": True, "checks": [], "probe": probe("cpu")}))
    assert recorded_reading(run, "h1") is None


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
