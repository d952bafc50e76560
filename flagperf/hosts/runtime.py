"""Runtimes start a case round's entry on a host. The plain-process runtime is for hosts without a
container engine (and the embedded default); a container runtime later implements the same call."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from flagperf.config.job import JOB_FILE
from flagperf.hosts.local import CommandResult, Host, LineSink
from flagperf.results.schema import CASE_LOG_FILE

PID_FILE = "case.pid"


class Runtime(ABC):
    name: str

    @abstractmethod
    def run_entry(self, host: Host, job_dir: Path, timeout_s: float, on_line: LineSink | None,
                  pid_file: Path) -> CommandResult:
        """Run ``python -m flagperf.entry --job <job_dir>/job.json``; output goes to <job_dir>/case.log,
        the case's process id to ``pid_file`` (the monitors follow it)."""


class ProcessRuntime(Runtime):
    name = "process"

    def run_entry(self, host: Host, job_dir: Path, timeout_s: float, on_line: LineSink | None,
                  pid_file: Path) -> CommandResult:
        argv = [host.python, "-m", "flagperf.entry", "--job", str(job_dir / JOB_FILE)]
        return host.run(argv, timeout=timeout_s, log_path=job_dir / CASE_LOG_FILE, on_line=on_line,
                        pid_file=pid_file)
