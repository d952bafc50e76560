"""What the harness itself costs, measured in one run on this machine.

(a) Evaluation wall time against the sum of the time the cases spent measuring, at two measuring
    windows: if the harness costs a fixed few seconds per round, the overhead per round is the same
    at both windows (it is not a share of the case).
(b) The FP32 GEMM figure through the whole harness (flow, tasks, monitors, case process) against a
    bare torch loop of the same size and duration, interleaved so that drift hits both alike.

    python bench/harness_cost.py [--windows 2,8] [--pairs 3] [--out bench/results]

Runs against PREFECT_API_URL if set, else a temporary server (its start-up is reported separately).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

from flagperf.results.schema import read_result  # noqa: E402

CASES_A = ["computation-FP32", "computation-FP64", "main_memory-bandwidth"]


def evaluate_once(results: Path, cases: list[str], window: float, tag: str) -> dict[str, Any]:
    from flows.evaluate import evaluate

    run_id = f"bench-{tag}-{time.time_ns()}"
    start = time.perf_counter()
    state = evaluate(cases=cases, overrides=[f"min_duration_s={window}", "min_iters=1"], results_dir=str(results),
                     run_id=run_id, return_state=True, command="bench/harness_cost.py")
    wall = time.perf_counter() - start
    if not state.is_completed():
        raise SystemExit(f"evaluation failed: {state.message}")
    rounds = [read_result(p) for p in sorted((results / run_id).glob("*/round*/*/result.json"))]
    return {"run_id": run_id, "wall_s": wall, "rounds": len(rounds),
            "measured_s": sum(r.measured_seconds for r in rounds),
            "case_process_s": sum(r.duration_s for r in rounds),
            "startup_s": sum(r.startup_s or 0.0 for r in rounds),
            "metrics": {r.case: r.metrics[0].value for r in rounds}}


def bare_gemm(size: int, seconds: float) -> float:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bare_gemm.py"), "--size", str(size),
                          "--seconds", str(seconds)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["tflops"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", default="2,8", help="measuring windows (min_duration_s) for part (a)")
    parser.add_argument("--pairs", type=int, default=3, help="interleaved harness/bare pairs for part (b)")
    parser.add_argument("--gemm-seconds", type=float, default=8.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--results", type=Path, default=Path("/tmp/flagperf-bench-results"))
    args = parser.parse_args()
    windows = [float(w) for w in args.windows.split(",")]

    from flagperf.config.plan import plan_run

    size = plan_run(cases=["computation-FP32"], results_dir=args.results).cases[0].config["m"]

    # Warm-up evaluation: starts the temporary server (if any) and fills the OS caches for torch.
    first = evaluate_once(args.results, ["computation-FP32"], 0.5, "warmup")

    part_a = []
    for window in windows:
        run = evaluate_once(args.results, CASES_A, window, f"a{window:g}")
        overhead = run["wall_s"] - run["measured_s"]
        part_a.append({**run, "window_s": window, "overhead_s": overhead,
                       "overhead_per_round_s": overhead / run["rounds"],
                       "startup_per_round_s": run["startup_s"] / run["rounds"],
                       "in_case_unmeasured_per_round_s": (run["case_process_s"] - run["measured_s"]) / run["rounds"],
                       "orchestration_per_round_s": (overhead - run["startup_s"] - run["case_process_s"]
                                                     + run["measured_s"]) / run["rounds"]})

    part_b = []
    for _ in range(args.pairs):
        harness = evaluate_once(args.results, ["computation-FP32"], args.gemm_seconds, "b")
        bare = bare_gemm(size, args.gemm_seconds)
        part_b.append({"harness_tflops": harness["metrics"]["computation-FP32"], "bare_tflops": bare})
    ratios = [p["harness_tflops"] / p["bare_tflops"] for p in part_b]

    report = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "python": platform.python_version()},
        "api": os.environ.get("PREFECT_API_URL") or "temporary server",
        "first_evaluation_wall_s": first["wall_s"],
        "a_overhead": part_a,
        "b_gemm": {"size": size, "seconds": args.gemm_seconds, "pairs": part_b,
                   "ratio_median": statistics.median(ratios), "ratios": ratios},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "harness_cost.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# Harness cost", "",
        f"Recorded {report['date']} with `{report['command']}` on {report['machine']['cores']} cores "
        f"({report['machine']['cpu']}), Prefect API: {report['api']}.", "",
        f"First evaluation (includes the temporary server's start-up): {first['wall_s']:.1f} s.", "",
        "## (a) wall time against time spent measuring", "",
        "| measuring window | rounds | wall s | measured s | overhead s | per round s | of which: interpreter + "
        "imports s | in case, not timed (warm-up, calibration, setup) s | flow, tasks, monitors, collection s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {a['window_s']:g} s | {a['rounds']} | {a['wall_s']:.1f} | {a['measured_s']:.1f} | "
              f"{a['overhead_s']:.1f} | {a['overhead_per_round_s']:.2f} | {a['startup_per_round_s']:.2f} | "
              f"{a['in_case_unmeasured_per_round_s']:.2f} | {a['orchestration_per_round_s']:.2f} |"
              for a in part_a]
    lines += ["", "## (b) FP32 GEMM through the harness against a bare torch loop", "",
              f"{size}^3 FP32, {args.gemm_seconds:g} s each, interleaved.", "",
              "| pair | harness TFLOPS | bare TFLOPS | ratio |", "|---|---|---|---|"]
    lines += [f"| {i + 1} | {p['harness_tflops']:.4f} | {p['bare_tflops']:.4f} | {r:.3f} |"
              for i, (p, r) in enumerate(zip(part_b, ratios, strict=True))]
    harness_all = [p["harness_tflops"] for p in part_b]
    bare_all = [p["bare_tflops"] for p in part_b]
    lines += ["", f"Median ratio: **{report['b_gemm']['ratio_median']:.3f}** (goal: at least 0.97); ratio of the "
              f"medians {statistics.median(harness_all) / statistics.median(bare_all):.3f}. Run-to-run spread on "
              f"this machine (CV): harness {statistics.stdev(harness_all) / statistics.fmean(harness_all):.1%}, "
              f"bare loop {statistics.stdev(bare_all) / statistics.fmean(bare_all):.1%}: a difference smaller "
              "than that spread cannot be told from noise.", ""]
    (args.out / "harness_cost.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
