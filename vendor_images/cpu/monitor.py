"""System monitor for the cpu vendor: CPU (overall and per core), memory, the case process and its
children, and package energy from RAPL where the kernel exposes it (recorded as unavailable otherwise)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project root, for flagperf.monitoring

from flagperf.monitoring import monitor_arguments, read_pid, run_sampler

RAPL_ROOT = Path("/sys/class/powercap")


def rapl_domains() -> tuple[list[tuple[str, Path]], str | None]:
    """Top-level RAPL package domains with a readable energy counter, or the reason there are none."""
    if not RAPL_ROOT.is_dir():
        return [], f"{RAPL_ROOT} does not exist (no RAPL driver, or a VM)"
    domains = []
    for zone in sorted(RAPL_ROOT.glob("intel-rapl:*")):
        if zone.name.count(":") != 1:
            continue  # sub-domains (core, uncore, dram) are inside the package figure
        try:
            name = (zone / "name").read_text().strip()
            int((zone / "energy_uj").read_text())
        except (OSError, ValueError) as exc:
            return [], f"{zone / 'energy_uj'} is not readable ({exc.__class__.__name__}; root may be needed)"
        domains.append((name, zone / "energy_uj"))
    if not domains:
        return [], f"no RAPL package domains under {RAPL_ROOT}"
    return domains, None


def process_tree_rss(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


def main() -> int:
    args = monitor_arguments(__doc__ or "").parse_args()
    domains, rapl_reason = rapl_domains()
    header: dict[str, Any] = {
        "cpu_count": psutil.cpu_count(),
        "mem_total_bytes": psutil.virtual_memory().total,
        "rapl": {"available": not rapl_reason, "domains": [n for n, _ in domains], "reason": rapl_reason},
        "fields": {"cpu_percent": "%", "cpu_percent_per_core": "%", "mem_used_bytes": "B", "mem_percent": "%",
                   "swap_used_bytes": "B", "case_rss_bytes": "B", "energy_uj": "uJ per RAPL domain"},
    }
    psutil.cpu_percent(percpu=True)  # prime the counters: the first call has no interval to measure

    def sample() -> dict[str, Any]:
        per_core = psutil.cpu_percent(percpu=True)
        vm = psutil.virtual_memory()
        energy: dict[str, int | None] | None = None
        if domains:
            energy = {}
            for name, path in domains:
                try:
                    energy[name] = int(path.read_text())
                except (OSError, ValueError):
                    energy[name] = None
        return {
            "cpu_percent": sum(per_core) / len(per_core) if per_core else None,
            "cpu_percent_per_core": per_core,
            "mem_used_bytes": vm.total - vm.available,
            "mem_percent": vm.percent,
            "swap_used_bytes": psutil.swap_memory().used,
            "case_rss_bytes": process_tree_rss(read_pid(args.pid_file)),
            "energy_uj": energy,
        }

    return run_sampler("system", args, header, sample)


if __name__ == "__main__":
    raise SystemExit(main())
