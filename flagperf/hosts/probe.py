"""What a host reports about itself at healthcheck: versions, the vendor's device and its peaks.

    python -m flagperf.hosts.probe --vendor cpu [--spec-settings JSON]     (prints one JSON object)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

import psutil
from pydantic import ValidationError

from flagperf import __version__
from flagperf.config.vendors import HostSpecSettings, load_vendor
from flagperf.errors import FlagperfError, validation_message
from flagperf.results.devicehealth import HEALTH_KEY
from flagperf.results.provenance import host_info, library_versions

# cgroup v2, then v1 ("max" or a huge number when there is no limit)
CGROUP_MEMORY_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def probe_command(python: str, vendor: str, settings: HostSpecSettings | None) -> list[str]:
    """The probe's command line for one host: with the inventory's spec_settings for that host, so every probe
    of it (the healthcheck's, the one before the run, the one in its image) builds the peaks a round will."""
    return [python, "-m", "flagperf.hosts.probe", "--vendor", vendor,
            *(["--spec-settings", settings.model_dump_json()] if settings is not None else [])]


def probe(vendor_name: str, settings: HostSpecSettings | None = None) -> dict[str, object]:
    """settings: the inventory's spec_settings for this host, over the vendor's (as a round's job gives them)."""
    vendor = load_vendor(vendor_name).with_host_settings(settings)
    device_type = vendor.manifest.torch_device
    visible_env = vendor.manifest.container.visible_devices_env
    answer: dict[str, object] = {
        "engine_version": __version__,
        "python": sys.version.split()[0],
        "python_executable": sys.executable,  # which interpreter, in an image: the one a failure names
        "libraries": library_versions(),
        "host": host_info(),
        "limits": process_limits(),
        "torch_device": device_type,
        "device_visible": None,
        "device_count": None,
        "device_memory_bytes": None,
        "device": None,
        "peaks": {},
        # The vendor's visible-devices variable as this process got it (unset: None): what narrowed device_count.
        "visible_devices": {visible_env: os.environ.get(visible_env)} if visible_env else {},
    }
    # Before torch: a container host without torch reads its devices' health all the same (vendor's NVML etc.). A
    # vendor without a health module reads none: the key is left out (no reading, not an unknown one).
    health = vendor.device_health()
    if health is not None:
        answer[HEALTH_KEY] = health
    try:
        import torch
    except ImportError as exc:  # a container host may keep torch in its images only
        return answer | {"torch_missing": f"{type(exc).__name__}: {exc}", "time": time.time()}
    module = torch.get_device_module(device_type)
    visible = bool(module.is_available())
    spec = vendor.spec_table() if visible else None
    count = int(module.device_count()) if visible else 0
    return answer | {
        "device_visible": visible,
        "device_count": count,
        "device_memory_bytes": (host_memory_bytes() if vendor.manifest.shares_host_memory
                                else device_memory_bytes(module, count)),
        "device": spec.device if spec else None,
        "peaks": {key: peak.model_dump() for key, peak in spec.peaks.items()} if spec else {},
        "time": time.time(),
    }


def process_limits() -> dict[str, object]:
    """What this process got of what a container's options set: /dev/shm's size (--shm-size) and the resource
    limits (--ulimit) as [soft, hard], -1 for unlimited. In the image it shows the vendor's options took effect."""
    import resource

    try:
        shm: int | None = shutil.disk_usage("/dev/shm").total
    except OSError:
        shm = None
    limits: dict[str, object] = {"shm_bytes": shm}
    for name in ("memlock", "nofile", "stack", "core", "nproc"):
        soft, hard = resource.getrlimit(getattr(resource, f"RLIMIT_{name.upper()}"))
        limits[name] = [-1 if value == resource.RLIM_INFINITY else value for value in (soft, hard)]
    return limits


def host_memory_bytes() -> int:
    """The host's memory, or less where this process's control group is limited to less (a container)."""
    total = int(psutil.virtual_memory().total)
    for limit_file in CGROUP_MEMORY_LIMITS:
        try:
            text = limit_file.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def device_memory_bytes(module: Any, count: int) -> int | None:
    """The smallest device's memory (a rank may land on any of them), or None where torch cannot tell."""
    try:
        sizes = [int(module.get_device_properties(index).total_memory) for index in range(count)]
    except (AttributeError, RuntimeError, AssertionError):  # a device module without properties
        return None
    return min(sizes) if sizes else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flagperf.hosts.probe")
    parser.add_argument("--vendor", required=True)
    parser.add_argument("--spec-settings", help="this host's spec_settings from the inventory (HostSpecSettings JSON)")
    args = parser.parse_args(argv)
    try:
        settings = HostSpecSettings.model_validate_json(args.spec_settings) if args.spec_settings else None
        print(json.dumps(probe(args.vendor, settings)))
    except FlagperfError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        print(f"error: --spec-settings: {validation_message(exc.errors()[0])}", file=sys.stderr)
        return 2
    return 0


def exit_process(code: int) -> NoReturn:
    """The probe's exit. A thread still alive here is one left behind (a vendor's health reading that did not
    answer in its limit: a driver that hangs): it may sit in a C call holding the driver library's locks, on which
    the library's destructors wait at the interpreter's exit, so the process would never end and its printed
    answer would be lost to the caller's timeout. Then: the answer flushed, and out without the destructors."""
    if any(t.is_alive() for t in threading.enumerate() if t is not threading.current_thread()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)


if __name__ == "__main__":
    try:
        code = main()
    except Exception:  # a bug of its own, said as a traceback: still out past a health thread left behind
        traceback.print_exc()
        code = 1
    exit_process(code)
