"""amd-smi monitor for the amd vendor: per GPU the GFX activity, VRAM used and total, socket power,
temperature (hotspot, else edge), the GFX clock against its maximum and the throttle status.

Reads AMD's own tool, ``amd-smi metric --json`` (one call per sample) and ``amd-smi static --json`` (once, for
names and power caps), never a human table. amd-smi's JSON has changed shape across ROCm releases: a list of
GPUs or {"gpu_data": [...]}, values as {"value": V, "unit": U} or bare numbers, "N/A" where a field is not
supported. Every form is read; a value it cannot read is null (unavailable), never 0. Where amd-smi is missing
or fails, the header says why and the monitor exits at once (no samples).

The sample fields are the ones the analysis reads for every vendor (flagperf.monitoring): the GFX clock goes
in ``sm_clock_mhz`` (the compute clock column) and the throttle status in ``clock_event_bits`` with its names
in the header's ``throttle_bits``. UNTESTED ON AMD HARDWARE: the parser is tested on published amd-smi output
(tests/fixtures/amdsmi/README.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project root, for flagperf.monitoring

from flagperf.monitoring import monitor_arguments, run_sampler, write_unavailable

AMD_SMI = "amd-smi"
CALL_TIMEOUT_S = 20.0
THROTTLE_BITS = {1: "throttled"}  # amd-smi reports THROTTLED / UNTHROTTLED (no reason on MI300-class parts)
BYTES = {"B": 1, "KB": 2**10, "MB": 2**20, "GB": 2**30, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def number(value: Any) -> float | None:
    """A value of amd-smi's JSON as a number: {"value": V, ...}, a bare number, or a numeric string; "N/A",
    null and anything else are None."""
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip().split()[0])
        except (ValueError, IndexError):
            return None
    return None


def nbytes(value: Any) -> float | None:
    """A memory figure in bytes; amd-smi's "MB" are MiB (a 16 GiB card reports 16368 MB)."""
    amount = number(value)
    if amount is None:
        return None
    unit = str(value.get("unit", "MB")).upper() if isinstance(value, dict) else "MB"
    return amount * BYTES.get(unit, 2**20)


def gpu_entries(document: Any) -> list[dict[str, Any]]:
    """The per-GPU objects of an amd-smi JSON document, whichever form it has."""
    if isinstance(document, dict):
        document = document.get("gpu_data", [document] if "gpu" in document else [])
    return [entry for entry in document if isinstance(entry, dict)] if isinstance(document, list) else []


def _section(entry: dict[str, Any], name: str) -> dict[str, Any]:
    section = entry.get(name)
    return section if isinstance(section, dict) else {}


def throttle_bits(status: Any) -> int | None:
    if not isinstance(status, str) or status.strip().upper() in ("", "N/A"):
        return None
    return 0 if status.strip().upper() == "UNTHROTTLED" else 1


def parse_metric(document: Any) -> list[dict[str, Any]]:
    """``amd-smi metric --json`` -> one sample per GPU, in the fields every vendor's monitor writes."""
    samples = []
    for entry in gpu_entries(document):
        index = number(entry.get("gpu"))
        usage, mem = _section(entry, "usage"), _section(entry, "mem_usage")
        power, temp, clock = _section(entry, "power"), _section(entry, "temperature"), _section(entry, "clock")
        gfx = _section(clock, "gfx_0") or _section(clock, "gfx")
        memclk = _section(clock, "mem_0") or _section(clock, "mem")
        watts = next((w for w in (number(power.get(k)) for k in ("socket_power", "current_socket_power",
                                                                  "average_socket_power")) if w is not None), None)
        hot = number(temp.get("hotspot"))
        bits = throttle_bits(power.get("throttle_status"))
        samples.append({
            "index": int(index) if index is not None else None,
            "util_percent": number(usage.get("gfx_activity")),
            "mem_util_percent": number(usage.get("umc_activity")),
            "mem_used_bytes": nbytes(mem.get("used_vram")),
            "mem_total_bytes": nbytes(mem.get("total_vram")),
            "power_w": watts,
            "temp_c": hot if hot is not None else number(temp.get("edge")),
            "temp_mem_c": number(temp.get("mem")),
            "sm_clock_mhz": number(gfx.get("clk")),
            "max_sm_clock_mhz": number(gfx.get("max_clk")),
            "mem_clock_mhz": number(memclk.get("clk")),
            "throttle": None if bits is None else [name for bit, name in THROTTLE_BITS.items() if bits & bit],
            "clock_event_bits": bits,
        })
    return samples


def parse_static(document: Any) -> dict[int, dict[str, Any]]:
    """``amd-smi static --json`` -> index -> name and power cap (the header's device facts)."""
    facts: dict[int, dict[str, Any]] = {}
    for entry in gpu_entries(document):
        index = number(entry.get("gpu"))
        if index is None:
            continue
        asic, limit = _section(entry, "asic"), _section(entry, "limit")
        cap = number(limit.get("socket_power"))
        facts[int(index)] = {"name": asic.get("market_name") if isinstance(asic.get("market_name"), str) else None,
                             "power_limit_w": cap if cap is not None else number(limit.get("max_power"))}
    return facts


def visible_indices(hip: str | None, rocr: str | None) -> list[int] | None:
    """The GPUs the case can use: HIP_VISIBLE_DEVICES, else ROCR_VISIBLE_DEVICES, as amd-smi indices (both
    number GPUs by PCI bus on a plain host); None = all. UUIDs are not mapped: everything is sampled then."""
    for value in (hip, rocr):
        if value is not None and value.strip():
            try:
                return [int(part) for part in value.split(",") if part.strip()]
            except ValueError:
                return None
    return None


def amd_smi(*args: str) -> Any:
    completed = subprocess.run([AMD_SMI, *args, "--json"], capture_output=True, text=True, timeout=CALL_TIMEOUT_S,
                               check=False)
    if completed.returncode != 0:
        last = (completed.stderr or completed.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"amd-smi {' '.join(args)} exited {completed.returncode}: {last[0]}")
    text = completed.stdout
    start = min((i for i in (text.find("["), text.find("{")) if i >= 0), default=-1)  # warnings before the JSON
    return json.loads(text[start:] if start >= 0 else text)


def unavailable(args: Any, reason: str) -> int:
    return write_unavailable("amdsmi", args, reason)


def main() -> int:
    parser = monitor_arguments(__doc__ or "")
    parser.add_argument("--devices", default=None, help="comma-separated amd-smi indices (default: "
                                                        "HIP_VISIBLE_DEVICES, else ROCR_VISIBLE_DEVICES, else all)")
    args = parser.parse_args()
    if shutil.which(AMD_SMI) is None:
        return unavailable(args, "amd-smi unavailable: not on PATH (ROCm's amd-smi package)")
    try:
        first = parse_metric(amd_smi("metric"))
        facts = parse_static(amd_smi("static"))
    except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        return unavailable(args, f"amd-smi unavailable: {type(exc).__name__}: {exc}")
    wanted = visible_indices(args.devices, None) if args.devices else visible_indices(
        os.environ.get("HIP_VISIBLE_DEVICES"), os.environ.get("ROCR_VISIBLE_DEVICES"))

    def chosen(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [s for s in samples if wanted is None or s["index"] in wanted]

    header = {
        "tool": AMD_SMI,
        "devices": [{"index": s["index"], **facts.get(s["index"], {}), "max_sm_clock_mhz": s["max_sm_clock_mhz"]}
                    for s in chosen(first)],
        "fields": {"util_percent": "% (GFX activity)", "mem_util_percent": "% (UMC activity)", "mem_used_bytes": "B",
                   "mem_total_bytes": "B", "power_w": "W (socket power)", "temp_c": "C (hotspot, else edge)",
                   "temp_mem_c": "C (HBM)", "sm_clock_mhz": "MHz (GFX clock)", "mem_clock_mhz": "MHz",
                   "throttle": "amd-smi throttle status", "clock_event_bits": "the same as bits (names in "
                                                                                 "throttle_bits)"},
        "throttle_bits": {str(bit): name for bit, name in THROTTLE_BITS.items()},
    }

    def sample() -> dict[str, Any]:
        try:
            return {"devices": chosen(parse_metric(amd_smi("metric")))}
        except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
            return {"devices": [], "error": f"{type(exc).__name__}: {str(exc)[:200]}"}

    return run_sampler("amdsmi", args, header, sample)


if __name__ == "__main__":
    raise SystemExit(main())
