"""What a host reports about itself at healthcheck: versions, the vendor's device and its peaks.

    python -m flagperf.hosts.probe --vendor cpu      (prints one JSON object)
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from flagperf import __version__
from flagperf.config.vendors import load_vendor
from flagperf.errors import FlagperfError
from flagperf.results.provenance import host_info, library_versions


def probe(vendor_name: str) -> dict[str, object]:
    vendor = load_vendor(vendor_name)
    device_type = vendor.manifest.torch_device
    answer: dict[str, object] = {
        "engine_version": __version__,
        "python": sys.version.split()[0],
        "libraries": library_versions(),
        "host": host_info(),
        "torch_device": device_type,
        "device_visible": None,
        "device_count": None,
        "device": None,
        "peaks": {},
    }
    try:
        import torch
    except ImportError as exc:  # a container host may keep torch in its images only
        return answer | {"torch_missing": f"{type(exc).__name__}: {exc}", "time": time.time()}
    module = torch.get_device_module(device_type)
    visible = bool(module.is_available())
    spec = vendor.spec_table() if visible else None
    return answer | {
        "device_visible": visible,
        "device_count": int(module.device_count()) if visible else 0,
        "device": spec.device if spec else None,
        "peaks": {key: peak.model_dump() for key, peak in spec.peaks.items()} if spec else {},
        "time": time.time(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flagperf.hosts.probe")
    parser.add_argument("--vendor", required=True)
    args = parser.parse_args(argv)
    try:
        print(json.dumps(probe(args.vendor)))
    except FlagperfError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
