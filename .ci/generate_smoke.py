"""The generate family with whatever transformers the running interpreter has (.ci/newest-in-range runs it in a
fresh venv with the generate extra, so the newest transformers in range): one round each of tiny-llama-generate
(the `hf` engine: transformers' generate) and tiny-llama-serve (`transformers serve` started from the cpu
vendor's engine folder, measured by our client), through the case entry as a round's process runs it, a few
tokens each. Exits 1 naming the case and its failure if a round fails, measures nothing, or (where the server
sends usage) counts tokens otherwise than the client.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

SIZES = ["input_len=8", "max_new_tokens=4", "concurrency=[2]", "requests=2"]
ROUNDS = {
    "tiny-llama-generate": SIZES,
    "tiny-llama-serve": [*SIZES, "request_rates=[]", "warmup_requests=1"],
}


def run_round(case: str, sets: list[str], folder: Path) -> str:
    """One round of ``case`` through run_job; its metrics in one line, or SystemExit naming what went wrong."""
    from flagperf.config.job import Job
    from flagperf.config.plan import plan_run
    from flagperf.entry import run_job
    from flagperf.generate.loadgen import REQUESTS_FILE, read_records
    from flagperf.results.schema import read_result

    plan = plan_run(cases=[case], sets=sets, results_dir=folder / "results")
    cp = plan.cases[0]
    job = Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, host="localhost", vendor="cpu",
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})
    out = folder / case
    out.mkdir()
    code = run_job(job, out)
    result = read_result(out / "result.json")
    if code != 0 or result.status != "success":
        raise SystemExit(f"generate smoke: {case}: exit {code}, status {result.status}: {result.failure}")
    by_name = {m.name: m.value for m in result.metrics}
    tokens = by_name.get("output_tokens_per_s@c2", 0.0)
    mismatches = by_name.get("token_count_mismatches@c2", 0.0)
    if not tokens > 0 or mismatches:
        raise SystemExit(f"generate smoke: {case}: output_tokens_per_s@c2 {tokens}, "
                         f"token_count_mismatches@c2 {mismatches}")
    line = f"{case}: output_tokens_per_s@c2 {tokens:.4g}"
    if (out / REQUESTS_FILE).is_file():  # a serving round: did the server send usage to check the counts with?
        records = read_records(out / REQUESTS_FILE)
        usage = sum(r.output_tokens_usage is not None for r in records)
        line += f", token_count_mismatches@c2 {mismatches:g}, the server's usage in {usage} of {len(records)} requests"
    return line


def main() -> int:
    import transformers

    with tempfile.TemporaryDirectory(prefix="flagperf-generate-smoke-") as folder:
        # Its own work root: the served random-weight model is saved there by this transformers, not reused
        # from one an older transformers saved in the default work root.
        os.environ["FLAGPERF_WORK_ROOT"] = str(Path(folder) / "work")
        for case, sets in ROUNDS.items():
            print(f"  {run_round(case, sets, Path(folder))} (transformers {transformers.__version__})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
