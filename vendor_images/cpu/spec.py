"""Peaks of the host CPU, derived from what the machine reports, with the derivation recorded.

FLOP/s = cores x clock x FLOPs per cycle per core, where FLOPs per cycle =
FMA units x lanes (vector bits / element bits) x 2 (a fused multiply-add is two operations).
"""

from __future__ import annotations

import math
import os
import platform
import re
from pathlib import Path
from typing import Any

import psutil

from flagperf.errors import SpecSettingError

TFLOPS = "TFLOPS"
TOPS = "TOPS"
# The settings this module reads, each with the range a real machine's value lies in (whole numbers where
# the value counts something): a value outside is a typo (3500 for GHz, 2.1 for MT/s), refused in one line.
SETTINGS: dict[str, tuple[float, float, bool, str]] = {
    "clock_ghz": (0.1, 10.0, False, "GHz"),
    "fma_units_per_core": (1, 8, True, "FMA units"),
    "memory_channels": (1, 128, True, "channels"),
    "memory_mt_per_s": (100.0, 20000.0, False, "MT/s"),
}
BASE_CLOCK = "base clock from the model name; the cores may boost above it"
CURRENT_CLOCK = "current clock from /proc/cpuinfo, no cpufreq maximum being visible; the cores may boost above it"


def checked_settings(settings: dict[str, Any]) -> dict[str, float | int | None]:
    """The settings as numbers within their ranges, None where not given; SpecSettingError names the key."""
    checked: dict[str, float | int | None] = {}
    for key, value in settings.items():
        if key not in SETTINGS:
            raise SpecSettingError(key, f"not a setting of the cpu spec module (it reads {', '.join(SETTINGS)})")
        low, high, whole, unit = SETTINGS[key]
        if value is None:
            checked[key] = None
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or (whole and not isinstance(value, int)):
            raise SpecSettingError(key, f"{value!r} is not a {'whole ' if whole else ''}number of {unit}")
        if not math.isfinite(value) or not low <= value <= high:
            raise SpecSettingError(key, f"{value!r} is outside {low:g} to {high:g} {unit}")
        checked[key] = value
    return checked


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor block is enough
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    return info


def _clock_ghz(info: dict[str, str], override: float | None) -> tuple[float | None, str, str | None]:
    """(clock, where it was read, why it is only a lower bound of the peak clock or None when it is the peak)."""
    if override:
        return float(override), "spec_settings.clock_ghz", None
    max_freq = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    try:
        return int(max_freq.read_text()) / 1e6, str(max_freq), None
    except (OSError, ValueError):
        pass
    model = info.get("model name", "")
    match = re.search(r"@\s*([\d.]+)\s*GHz", model)
    if match:
        return float(match.group(1)), "model name", BASE_CLOCK
    if "cpu MHz" in info:
        return (float(info["cpu MHz"]) / 1000, "/proc/cpuinfo 'cpu MHz' (current clock; no cpufreq max exposed)",
                CURRENT_CLOCK)
    return None, "no clock found", None


def _cores() -> tuple[int, str]:
    logical_total = psutil.cpu_count(logical=True) or 1
    physical_total = psutil.cpu_count(logical=False) or logical_total
    usable_logical = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else logical_total
    # SMT siblings share one core's vector units: count cores, scaled to what this process may use.
    cores = max(1, round(physical_total * usable_logical / logical_total))
    return cores, f"{cores} cores ({usable_logical} of {logical_total} logical CPUs usable, {physical_total} physical)"


def _vector_bits(flags: set[str]) -> tuple[int, str]:
    for flag, bits in (("avx512f", 512), ("avx2", 256), ("avx", 256), ("sse2", 128), ("asimd", 128)):
        if flag in flags:
            return bits, flag
    return 64, "scalar"


def spec_table(settings: dict[str, Any]) -> dict[str, Any]:
    settings = checked_settings(settings)
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    model = info.get("model name") or platform.processor() or platform.machine()
    cores, cores_src = _cores()
    clock, clock_src, lower_because = _clock_ghz(info, settings.get("clock_ghz"))
    bits, bits_src = _vector_bits(flags)
    fma_units = int(settings.get("fma_units_per_core") or 2) if "fma" in flags or "asimd" in flags else 1
    fp64_per_cycle = fma_units * (bits // 64) * 2
    base = (f"{cores_src} x {clock:.3f} GHz ({clock_src}) x " if clock else f"{cores_src} x ? GHz ({clock_src}) x ")
    # A peak from a clock the cores may exceed is a lower bound of the real one: said, so that a figure above it
    # reads as the estimate being low, not as a wrong measurement.
    bound = {"bound": "lower", "bound_reason": lower_because} if clock and lower_because else {}

    def compute(per_cycle: float, how: str, unit: str = TFLOPS) -> dict[str, Any]:
        value = cores * clock * 1e9 * per_cycle / 1e12 if clock else None
        return {"value": value, "unit": unit, "source": f"derived: {base}{per_cycle:g} per cycle per core ({how})",
                **bound}

    def unsupported(unit: str, why: str) -> dict[str, Any]:
        return {"value": None, "unit": unit, "supported": False, "source": why}

    fp64 = compute(fp64_per_cycle, f"{fma_units} FMA units x {bits // 64} FP64 lanes ({bits_src}) x 2")
    fp32 = compute(fp64_per_cycle * 2, f"{fma_units} FMA units x {bits // 32} FP32 lanes ({bits_src}) x 2")
    peaks: dict[str, Any] = {
        "fp64": fp64,
        "fp32": fp32,
        "tf32": unsupported(TFLOPS, "CPUs have no TF32 arithmetic (a GPU tensor-core format)"),
    }
    if "amx_bf16" in flags:
        peaks["bf16"] = compute(1024, "AMX-BF16 tile unit: 1024 FLOPs per cycle")
    elif "avx512_bf16" in flags:
        peaks["bf16"] = compute(fp64_per_cycle * 4, "AVX512-BF16 dot products: twice the FP32 rate")
    else:
        peaks["bf16"] = unsupported(TFLOPS, "no native BF16 arithmetic (needs avx512_bf16 or amx_bf16); "
                                            "torch would emulate it at a small fraction of the FP32 rate")
    if "amx_fp16" in flags:
        peaks["fp16"] = compute(1024, "AMX-FP16 tile unit: 1024 FLOPs per cycle")
    elif "avx512_fp16" in flags:
        peaks["fp16"] = compute(fp64_per_cycle * 4, "AVX512-FP16 FMA: twice the FP32 lanes")
    else:
        peaks["fp16"] = unsupported(TFLOPS, "no native FP16 arithmetic (needs avx512_fp16 or amx_fp16); "
                                            "f16c only converts")
    if "amx_int8" in flags:
        peaks["int8"] = compute(2048, "AMX-INT8 tile unit: 2048 ops per cycle", TOPS)
    elif "avx512_vnni" in flags or "avx_vnni" in flags:
        peaks["int8"] = compute(fp64_per_cycle * 8, "VNNI dot products: four times the FP32 rate", TOPS)
    else:
        peaks["int8"] = unsupported(TOPS, "no INT8 dot-product instructions (needs avx512_vnni, avx_vnni or "
                                          "amx_int8)")

    # AMX-FP8 is announced for future Xeons only; torch's CPU _scaled_mm upcasts, which measures nothing of FP8.
    peaks["fp8"] = unsupported(TFLOPS, "no native FP8 arithmetic on this CPU (torch would emulate it in FP32)")

    channels, rate = settings.get("memory_channels"), settings.get("memory_mt_per_s")
    if channels and rate:
        peaks["memory_bandwidth"] = {
            "value": channels * rate * 1e6 * 8 / 1e9, "unit": "GB/s",
            "source": f"derived: {channels} channels x {rate} MT/s x 8 bytes (spec_settings)",
        }
    else:
        peaks["memory_bandwidth"] = {
            "value": None, "unit": "GB/s",
            "source": "unknown: set spec_settings memory_channels and memory_mt_per_s for this host in the "
                      "inventory (the DIMMs are not visible here)",
        }
    total = psutil.virtual_memory().total
    peaks["memory_capacity"] = {"value": total / 2**30, "unit": "GiB", "source": "psutil.virtual_memory().total"}
    no_device = "the CPU is the host: there is no separate device memory to transfer to"
    peaks["h2d_bandwidth"] = unsupported("GB/s", no_device)
    peaks["d2h_bandwidth"] = unsupported("GB/s", no_device)
    return {"device": f"{model} ({cores} cores, {platform.machine()}, {bits_src})", "peaks": peaks}
