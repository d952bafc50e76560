"""Each NVIDIA GPU's health at the healthcheck, read through NVML (nvidia-ml-py) by the host probe before the host's
first round (vendor.yaml ``health_module``; the form is flagperf.results.devicehealth's). What operators read before
trusting a node, as nvidia-smi and DCGM's level-1 checks read it:

- the PCIe link: the width it trained at against the most the GPU and its slot allow (a link that came up at x8 of
  x16 moves host data at half the rate, for good); the generation is recorded, never judged here, since an idle GPU
  lowers its link speed to save power and raises it under load;
- row remapping (Ampere and later): rows waiting for a reset, and whether a remapping ever failed (a GPU to
  replace); page retirement pending (GPUs older than Ampere only: on Ampere and later, retired pages do not show
  remapping, so a GPU whose remapping NVML cannot report, under MIG, reads null, not 0);
- uncorrected ECC errors since the driver loaded and over the GPU's life; whether ECC is on (recorded, not judged);
- hardware slowdown active while idle (HW slowdown, HW thermal or power-brake slowdown: nothing the workload did);
- the PCIe replay count (link-level retransmissions since the driver loaded);
- a GPU NVML counts but that does not answer: lost (fallen off the bus, XID 79), short of power, an interrupt
  problem, or needing a reset; at opening, also an unknown error or "GPU not found" (after XID 79 nvidia-smi says
  "Unable to determine the device handle for GPU ...: Unknown Error"). A GPU this process may not open
  (NO_PERMISSION: another job's, where the job's cgroup holds only its own, as Slurm's ConstrainDevices does) is
  not read, and is not called unreachable.

A figure a GPU or driver does not report (NOT_SUPPORTED) is null, never 0; a query that fails otherwise is null too,
and named in the device's ``errors`` fact. Without NVML (the package, the driver, or the GPUs missing), or when NVML
does not answer within NVML_LIMIT_S, the answer says why and reads nothing.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from flagperf.config.vendors import import_file
from flagperf.errors import missing_extra

HW_SLOWDOWN = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
NVML_LIMIT_S = 30.0  # a wedged driver can hold an NVML call for minutes: the probe must answer before its own limit
# NVML's errors that mean the GPU itself does not answer (nvml.h): a device with one of these is unreachable.
UNREACHABLE_ERRORS = ("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_INSUFFICIENT_POWER", "NVML_ERROR_IRQ_ISSUE",
                      "NVML_ERROR_RESET_REQUIRED")
# Opening the handle of a GPU NVML counts: these too. A GPU fallen off the bus (XID 79) often answers UNKNOWN there
# (nvidia-smi: "Unable to determine the device handle for GPU ...: Unknown Error"), or GPU_NOT_FOUND (newer
# drivers, absent from older bindings: then never matched). After a handle opened, an unknown error of one query
# says nothing of the GPU as a whole: named in ``errors`` only.
UNREACHABLE_AT_OPEN_ERRORS = (*UNREACHABLE_ERRORS, "NVML_ERROR_UNKNOWN", "NVML_ERROR_GPU_NOT_FOUND")
# A figure this GPU or driver does not have: null, and no error (a driver older than the query has no function).
NOT_REPORTED_ERRORS = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND")
MAX_ERRORS = 16


def _common() -> ModuleType:
    """What this folder's NVML readers share (nvml_common.py): side-effect free, so the probe may load it."""
    return import_file(Path(__file__).with_name("nvml_common.py"), "flagperf_vendor_nvidia_nvml_common")


def nvml_error_is(pynvml: Any, exc: BaseException, names: tuple[str, ...]) -> bool:
    """Whether ``exc`` is an NVMLError of one of the codes ``names`` (pynvml's NVML_ERROR_* constants)."""
    base = getattr(pynvml, "NVMLError", None)
    if base is None or not isinstance(exc, base):
        return False
    value = getattr(exc, "value", None)
    return any(value == getattr(pynvml, name, None) for name in names)


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


class Queries:
    """One GPU's NVML queries, each on its own: a figure not reported is None; any other failure is None too, named
    in ``errors``, and one saying the GPU does not answer marks it ``lost`` (a GPU whose handle opened and fell off
    the bus after must not read as reachable)."""

    def __init__(self, pynvml: Any) -> None:
        self.pynvml = pynvml
        self.errors: list[str] = []
        self.lost = False

    def __call__(self, fn: Any, *args: Any) -> Any:
        try:
            value = fn(*args)
        except Exception as exc:
            if nvml_error_is(self.pynvml, exc, NOT_REPORTED_ERRORS):
                return None
            self.lost = self.lost or nvml_error_is(self.pynvml, exc, UNREACHABLE_ERRORS)
            if len(self.errors) < MAX_ERRORS:
                self.errors.append(f"{getattr(fn, '__name__', 'query')}: {_error_text(exc)}")
            return None
        return value.decode(errors="replace") if isinstance(value, bytes) else value  # old bindings return bytes

    def get(self, name: str, *args: Any) -> Any:
        """The binding's function ``name`` called; None where the binding is too old to have it."""
        fn = getattr(self.pynvml, name, None)
        return None if fn is None else self(fn, *args)


def _lanes_missing(width: int | None, width_max: int | None) -> int | None:
    if width is None or width_max is None or width_max <= 0:
        return None
    return max(0, width_max - width)


def _flag(value: Any) -> int | None:
    return None if value is None else int(bool(value))


def _ecc_mode(mode: Any, which: int) -> int | None:
    return _flag(mode[which]) if isinstance(mode, list | tuple) and len(mode) == 2 else None


def device_reading(raw: dict[str, Any]) -> dict[str, Any]:
    """One GPU's recorded NVML figures (read_raw) as the health reading's device: the figures the diagnosis
    compares under ``fields``, names and lists under ``facts``."""
    rows = raw.get("remapped_rows")  # (correctable, uncorrectable, pending, failed), or None before Ampere
    correctable, uncorrectable, rows_pending, rows_failed = rows if rows is not None else (None, None, None, None)
    pending_parts = [v for v in (_flag(rows_pending), _flag(raw.get("retired_pages_pending"))) if v is not None]
    reasons = raw.get("clock_event_reasons")
    ecc_mode = raw.get("ecc_mode")
    fields: dict[str, float | None] = {
        "pcie_link_width": raw.get("pcie_link_width"),
        "pcie_link_width_max": raw.get("pcie_link_width_max"),
        "pcie_width_lanes_missing": _lanes_missing(raw.get("pcie_link_width"), raw.get("pcie_link_width_max")),
        "pcie_link_gen": raw.get("pcie_link_gen"),
        "pcie_link_gen_max": raw.get("pcie_link_gen_max"),
        "pcie_link_gen_gpu_max": raw.get("pcie_link_gen_gpu_max"),
        "pcie_replay_count": raw.get("pcie_replay_count"),
        "remapped_rows_correctable": correctable,
        "remapped_rows_uncorrectable": uncorrectable,
        "row_remap_failed": _flag(rows_failed),
        # Rows or pages waiting for a reset, and nothing else: a failed remapping is row_remap_failed's (a GPU to
        # replace, which a reset does not mend). The monitor's field of the same name counts a failure too.
        "retirement_pending": max(pending_parts) if pending_parts else None,
        "ecc_uncorrected": raw.get("ecc_uncorrected_volatile"),
        "ecc_uncorrected_aggregate": raw.get("ecc_uncorrected_aggregate"),
        "ecc_enabled": _ecc_mode(ecc_mode, 0),
        "ecc_enabled_pending": _ecc_mode(ecc_mode, 1),
        "hw_slowdown_idle": None if reasons is None else int(any(r in HW_SLOWDOWN for r in reasons)),
        "unreachable": int(bool(raw.get("lost"))),
    }
    facts: dict[str, Any] = {key: raw[key] for key in ("name", "pci_bus_id", "serial", "architecture")
                             if raw.get(key) is not None}
    if reasons is not None:
        facts["clock_event_reasons"] = list(reasons)
    if raw.get("errors"):
        facts["errors"] = list(raw["errors"])
    return {"index": int(raw["index"]), "uuid": raw.get("uuid"), "fields": fields, "facts": facts}


def _unopened(index: int, unreachable: int | None, fact: str, error: str) -> dict[str, Any]:
    fields = {name: None for name in device_reading({"index": index})["fields"]} | {"unreachable": unreachable}
    return {"index": index, "uuid": None, "fields": fields, "facts": {fact: error[:300]}}


def unreachable_reading(index: int, error: str) -> dict[str, Any]:
    """A GPU NVML counts but that does not answer (lost, short of power, ...): every figure unknown, unreachable 1."""
    return _unopened(index, 1, "error", error)


def not_opened_reading(index: int, error: str) -> dict[str, Any]:
    """A GPU NVML counts but this process may not open (another job's: NO_PERMISSION), or one NVML cannot open for
    a reason that says nothing of the GPU: not read, every figure unknown, ``unreachable`` too."""
    return _unopened(index, None, "not_read", error)


def read_raw(pynvml: Any, index: int, handle: Any, common: ModuleType) -> dict[str, Any]:
    """What NVML tells of one GPU, each query on its own (Queries: one the GPU does not support is None)."""
    query = Queries(pynvml)
    bits = common.clock_event_reasons(pynvml, handle, query)
    architecture = query.get("nvmlDeviceGetArchitecture", handle)
    rows = query.get("nvmlDeviceGetRemappedRows", handle)
    # Retired pages tell of memory retired on GPUs older than Ampere only; on later ones (rows unreported under
    # MIG) they stay 0 whatever rows wait, so they would be a confident "nothing pending": null instead.
    # An architecture NVML does not tell (a driver or binding without the query) leaves the pages unread too: on an
    # Ampere or later GPU they would be that confident 0, while null is an unknown the diagnosis says so; a GPU older
    # than Ampere on such a driver loses this one figure only (its uncorrected ECC errors are still read).
    older = architecture is not None and architecture < getattr(pynvml, "NVML_DEVICE_ARCH_AMPERE", 7)
    pages = query.get("nvmlDeviceGetRetiredPagesPendingStatus", handle) if rows is None and older else None
    pci = query.get("nvmlDeviceGetPciInfo", handle)
    bus = getattr(pci, "busId", None) if pci is not None else None
    found = {
        "index": index,
        "uuid": query.get("nvmlDeviceGetUUID", handle),
        "name": query.get("nvmlDeviceGetName", handle),
        "serial": query.get("nvmlDeviceGetSerial", handle),
        "architecture": architecture,
        "pci_bus_id": bus.decode(errors="replace") if isinstance(bus, bytes) else bus,
        "pcie_link_width": query.get("nvmlDeviceGetCurrPcieLinkWidth", handle),
        "pcie_link_width_max": query.get("nvmlDeviceGetMaxPcieLinkWidth", handle),
        "pcie_link_gen": query.get("nvmlDeviceGetCurrPcieLinkGeneration", handle),
        "pcie_link_gen_max": query.get("nvmlDeviceGetMaxPcieLinkGeneration", handle),
        "pcie_link_gen_gpu_max": query.get("nvmlDeviceGetGpuMaxPcieLinkGeneration", handle),
        "pcie_replay_count": query.get("nvmlDeviceGetPcieReplayCounter", handle),
        "remapped_rows": None if rows is None else [int(v) for v in rows],
        "retired_pages_pending": pages,
        "ecc_mode": query.get("nvmlDeviceGetEccMode", handle),
        "ecc_uncorrected_volatile": query.get("nvmlDeviceGetTotalEccErrors", handle,
                                              pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
        "ecc_uncorrected_aggregate": query.get("nvmlDeviceGetTotalEccErrors", handle,
                                               pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
        "clock_event_reasons": None if bits is None else [name for bit, name in common.THROTTLE_REASONS.items()
                                                          if bits & bit],
    }
    return found | {"errors": query.errors, "lost": query.lost}


def _unavailable(reason: str) -> dict[str, Any]:
    return {"available": False, "source": "NVML", "reason": reason, "devices": []}


def _device(pynvml: Any, index: int, common: ModuleType) -> dict[str, Any]:
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as exc:
        if nvml_error_is(pynvml, exc, UNREACHABLE_AT_OPEN_ERRORS):  # e.g. GPU_IS_LOST, UNKNOWN: XID 79
            return unreachable_reading(index, _error_text(exc))
        return not_opened_reading(index, _error_text(exc))  # NO_PERMISSION: not this job's GPU; others: unknown
    return device_reading(read_raw(pynvml, index, handle, common))


def read_devices() -> dict[str, Any]:
    """Every GPU of the host (NVML's indices: all of them, whatever a round's visible-devices variable narrows)."""
    common = _common()
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # the package, the driver, or the GPUs are missing
        missing = missing_extra(exc) if isinstance(exc, ImportError) else None
        return _unavailable(f"NVML unavailable: {missing}" if missing is not None else
                            f"NVML unavailable: {_error_text(exc)}")
    try:
        driver = common.call(pynvml.nvmlSystemGetDriverVersion)
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except Exception as exc:
            return _unavailable(f"NVML cannot count the GPUs: {_error_text(exc)}")
        if count <= 0:
            return _unavailable("NVML counts no GPU on this host")
        devices = [_device(pynvml, index, common) for index in range(count)]
    finally:
        common.call(pynvml.nvmlShutdown)
    return {"available": True, "source": f"NVML, driver {driver}" if driver else "NVML", "devices": devices}


def device_health(settings: dict[str, Any], limit_s: float = NVML_LIMIT_S) -> dict[str, Any]:
    """read_devices in a thread of its own, waited for ``limit_s`` at most: a driver that does not answer leaves
    the thread behind and the answer says so. The thread is a daemon, but it may sit in a C call holding NVML's
    locks, on which libnvidia-ml's destructors would wait at the interpreter's exit: the probe, seeing a thread
    still alive, flushes its answer and leaves without them (flagperf.hosts.probe.exit_process). Where torch is
    installed the probe asks torch for the device next, and torch waits on such a driver all the same: the limit
    keeps the answer of a host without torch (a container host), and the healthcheck's own limit the others'."""
    answer: list[dict[str, Any] | BaseException] = []

    def read() -> None:
        try:
            answer.append(read_devices())
        except BaseException as exc:  # given to the caller: the vendor loader turns it into a reading saying why
            answer.append(exc)

    thread = threading.Thread(target=read, name="nvml-device-health", daemon=True)
    thread.start()
    thread.join(limit_s)
    if not answer:
        return _unavailable(f"NVML did not answer within {limit_s:g} s")
    if isinstance(answer[0], BaseException):
        raise answer[0]
    return answer[0]
