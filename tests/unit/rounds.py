"""One round of a case on this host through the in-host entry, as the controller would hand it over."""

from __future__ import annotations

from pathlib import Path

from flagperf.config.job import Job
from flagperf.config.plan import plan_run
from flagperf.entry import run_job


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
