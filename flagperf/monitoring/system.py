"""System monitor, shared by every vendor: CPU (overall and per core), memory, the case process tree's memory
(PSS and USS: shared pages counted once, not once per forked worker as summed RSS would),
disk and network I/O, and host power: RAPL package energy and/or ipmitool's DCMI power reading where
the machine has them (recorded as unavailable, with the reason, otherwise; never as 0).

    python -m flagperf.monitoring.system --out FILE --interval 1 [--pid-file F] [--max-seconds N]

Counters (energy_j, disk_*_bytes, net_*_bytes) are cumulative since the monitor started; RAPL's
wrap-around is undone here, so a reader only ever sees a growing counter.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import psutil

from flagperf.monitoring import monitor_arguments, read_pid, run_sampler

RAPL_ROOT = Path("/sys/class/powercap")
IPMITOOL_TIMEOUT_S = 2.0


class RaplEnergy:
    """Package energy from RAPL, summed over packages, unwrapped, in joules since start."""

    def __init__(self, root: Path = RAPL_ROOT) -> None:
        self.zones: list[tuple[Path, int]] = []
        self.reason: str | None = None
        if not root.is_dir():
            self.reason = f"{root} does not exist (no RAPL driver, or a VM)"
            return
        for zone in sorted(root.glob("intel-rapl:*")):
            if zone.name.count(":") != 1:
                continue  # sub-domains (core, uncore, dram) are inside the package figure
            try:
                if not (zone / "name").read_text().strip().startswith("package"):
                    continue  # 'psys' (whole platform) would count the packages twice
                int((zone / "energy_uj").read_text())
                max_range = int((zone / "max_energy_range_uj").read_text())
            except (OSError, ValueError) as exc:
                self.reason = f"{zone / 'energy_uj'} is not readable ({exc.__class__.__name__}; root may be needed)"
                self.zones = []
                return
            self.zones.append((zone / "energy_uj", max_range))
        if not self.zones:
            self.reason = f"no RAPL package domains under {root}"
            return
        self.last = [self._read(path) for path, _ in self.zones]
        self.total_uj = 0

    @staticmethod
    def _read(path: Path) -> int:
        return int(path.read_text())

    @property
    def available(self) -> bool:
        return not self.reason

    def joules(self) -> float | None:
        if not self.available:
            return None
        for i, (path, max_range) in enumerate(self.zones):
            try:
                now = self._read(path)
            except (OSError, ValueError):
                return None
            delta = now - self.last[i]
            if delta < 0:  # the counter wrapped
                delta += max_range
            self.total_uj += delta
            self.last[i] = now
        return self.total_uj / 1e6


class IpmiPower:
    """Whole-system power from the BMC (`ipmitool dcmi power reading`), where there is one."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.binary = shutil.which("ipmitool")
        if not self.binary:
            self.reason = "ipmitool is not installed"
        elif self._read() is None:
            self.reason = "ipmitool dcmi power reading gave no reading (no BMC, or no permission)"

    @property
    def available(self) -> bool:
        return not self.reason

    def watts(self) -> float | None:
        return self._read() if self.available else None

    def _read(self) -> float | None:
        assert self.binary is not None
        try:
            out = subprocess.run([self.binary, "dcmi", "power", "reading"], capture_output=True, text=True,
                                 timeout=IPMITOOL_TIMEOUT_S, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        for line in out.splitlines():
            if "Instantaneous power reading" in line:
                try:
                    return float(line.split(":", 1)[1].split()[0])
                except (IndexError, ValueError):
                    return None
        return None


def _tree(pid: int | None) -> list[psutil.Process]:
    if pid is None:
        return []
    try:
        proc = psutil.Process(pid)
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return []


def process_tree_rss(pid: int | None) -> int | None:
    """Summed RSS of the tree: a page shared by N processes (a forked DataLoader worker's copy of the
    parent's memory) counts N times. Kept for comparison; case_pss_bytes is the figure to read."""
    procs = _tree(pid)
    if not procs:
        return None
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


def process_tree_memory(pid: int | None) -> dict[str, int | None]:
    """The tree's proportional set size (each shared page split between its sharers, so the sum is the
    memory the tree really holds) and unique set size (pages no other process maps), from psutil's
    memory_full_info (Linux: /proc/<pid>/smaps_rollup). PSS is None where the OS does not give it."""
    procs = _tree(pid)
    if not procs:
        return {"case_pss_bytes": None, "case_uss_bytes": None}
    pss: int | None = 0
    uss: int | None = 0
    for p in procs:
        try:
            full = p.memory_full_info()
        except psutil.AccessDenied:
            return {"case_pss_bytes": None, "case_uss_bytes": None}
        except psutil.Error:
            continue  # exited between listing and reading
        pss = pss + full.pss if pss is not None and hasattr(full, "pss") else None
        uss = uss + full.uss if uss is not None and hasattr(full, "uss") else None
    return {"case_pss_bytes": pss, "case_uss_bytes": uss}


class IoCounters:
    """Disk and network byte counters relative to the first reading (None where the OS has none)."""

    def __init__(self) -> None:
        self.disk0 = psutil.disk_io_counters()
        self.net0 = psutil.net_io_counters()

    def sample(self) -> dict[str, int | None]:
        disk, net = psutil.disk_io_counters(), psutil.net_io_counters()
        return {
            "disk_read_bytes": disk.read_bytes - self.disk0.read_bytes if disk and self.disk0 else None,
            "disk_write_bytes": disk.write_bytes - self.disk0.write_bytes if disk and self.disk0 else None,
            "net_sent_bytes": net.bytes_sent - self.net0.bytes_sent if net and self.net0 else None,
            "net_recv_bytes": net.bytes_recv - self.net0.bytes_recv if net and self.net0 else None,
        }


FIELDS = {
    "cpu_percent": "%", "cpu_percent_per_core": "%", "mem_used_bytes": "B", "mem_percent": "%",
    "swap_used_bytes": "B", "case_rss_bytes": "B (summed RSS: shared pages counted per process)",
    "case_pss_bytes": "B (proportional set size of the case's process tree, psutil memory_full_info)",
    "case_uss_bytes": "B (unique set size of the case's process tree, psutil memory_full_info)",
    "disk_read_bytes": "B (cumulative)",
    "disk_write_bytes": "B (cumulative)", "net_sent_bytes": "B (cumulative)", "net_recv_bytes": "B (cumulative)",
    "power_w": "W (whole system, BMC)", "energy_j": "J (CPU packages, RAPL, cumulative)",
}


def main() -> int:
    args = monitor_arguments(__doc__ or "").parse_args()
    rapl, ipmi, io = RaplEnergy(), IpmiPower(), IoCounters()
    header: dict[str, Any] = {
        "cpu_count": psutil.cpu_count(),
        "mem_total_bytes": psutil.virtual_memory().total,
        "sources": {
            "energy_j": {"available": rapl.available, "reason": rapl.reason, "what": "RAPL package energy"},
            "power_w": {"available": ipmi.available, "reason": ipmi.reason, "what": "ipmitool dcmi power reading"},
        },
        "fields": FIELDS,
    }
    psutil.cpu_percent(percpu=True)  # prime the counters: the first call has no interval to measure

    def sample() -> dict[str, Any]:
        per_core = psutil.cpu_percent(percpu=True)
        vm = psutil.virtual_memory()
        pid = read_pid(args.pid_file)
        return {
            "cpu_percent": sum(per_core) / len(per_core) if per_core else None,
            "cpu_percent_per_core": per_core,
            "mem_used_bytes": vm.total - vm.available,
            "mem_percent": vm.percent,
            "swap_used_bytes": psutil.swap_memory().used,
            "case_rss_bytes": process_tree_rss(pid),
            **process_tree_memory(pid),
            **io.sample(),
            "power_w": ipmi.watts() if ipmi.available else None,
            "energy_j": rapl.joules(),
        }

    return run_sampler("system", args, header, sample)


if __name__ == "__main__":
    raise SystemExit(main())
