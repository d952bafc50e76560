"""Runtimes start a case round's entry on a host. The plain-process runtime is for hosts without a
container engine (and the embedded default); a container runtime later implements the same call."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

from flagperf.config.job import JOB_FILE
from flagperf.hosts.local import CommandResult, Host, LineSink
from flagperf.results.schema import CASE_LOG_FILE

if TYPE_CHECKING:
    from flagperf.hosts.inventory import HostSpec

PID_FILE = "case.pid"


class Runtime(ABC):
    name: str

    @abstractmethod
    def run_entry(self, host: Host, job_dir: Path, timeout_s: float, on_line: LineSink | None,
                  pid_file: Path) -> CommandResult:
        """Run ``python -m flagperf.entry --job <job_dir>/job.json``; output goes to <job_dir>/case.log,
        the case's process id to ``pid_file`` (the monitors follow it)."""

    @classmethod
    def stop_run(cls, host: Host, spec: HostSpec, run_id: str) -> str | None:
        """After an interrupt, before the run's folder on ``host`` is removed: end what the run still has running
        there that its rounds' threads may have lost (their connection closed). None when nothing is left; else
        why it may still run (the folder must then stay). A process ends with its SSH session; a Slurm job is
        cancelled by cancel_jobs: nothing to do here."""
        return None


class ProcessRuntime(Runtime):
    name = "process"

    def run_entry(self, host: Host, job_dir: Path, timeout_s: float, on_line: LineSink | None,
                  pid_file: Path) -> CommandResult:
        argv = [host.python, "-m", "flagperf.entry", "--job", str(job_dir / JOB_FILE)]
        return host.run(argv, timeout=timeout_s, log_path=job_dir / CASE_LOG_FILE, on_line=on_line,
                        pid_file=pid_file)
