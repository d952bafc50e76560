"""One round of a case on this host through the in-host entry, as the controller would hand it over."""

from __future__ import annotations

from pathlib import Path

from flagperf.config.job import Job
from flagperf.config.plan import plan_run
from flagperf.entry import run_job
from flagperf.hosts.inventory import HostSpec
from flagperf.hosts.local import LocalHost
from flagperf.hosts.ssh import SshError
from flagperf.hosts.threads import HostThreads


def run_local_round(tmp_path: Path, case: str, *sets: str) -> tuple[int, Path]:
    """The entry's exit code and the round folder (``tmp_path/out``, with its job.json)."""
    plan = plan_run(cases=[case], sets=list(sets), results_dir=tmp_path / "results")
    cp = plan.cases[0]
    job = Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, host="localhost", vendor="cpu",
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})
    out = tmp_path / "out"
    out.mkdir()
    (out / "job.json").write_text(job.model_dump_json())
    return run_job(job, out), out


def closed_by_interrupt(tmp_path: Path, threads: HostThreads, calls: list[list[str]]) -> tuple[HostSpec, LocalHost]:
    """Host ``a``, local, whose case command meets what an SSH host's does at Ctrl-C: the stop is set and
    close_hosts() closes the channel under the command, which fails with an SshError (each call in ``calls``)."""

    class ClosedByInterrupt(LocalHost):
        def run(self, argv, *, timeout, log_path=None, on_line=None, pid_file=None):  # type: ignore[no-untyped-def]
            if pid_file is None:  # not the case's command
                return super().run(argv, timeout=timeout, log_path=log_path, on_line=on_line)
            calls.append(argv)
            threads.stop()
            raise SshError("fp-h1: the SSH connection was closed")

    spec = HostSpec.model_validate({"name": "a", "transport": "local", "runtime": "process",
                                    "work_root": str(tmp_path / "a")})
    return spec, ClosedByInterrupt(name="a", work_root=tmp_path / "a")
