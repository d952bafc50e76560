"""digits-mlp through the harness against a bare loop of the same training, on this CPU, at 1 and 2 torch threads,
as the host is and with busy processes beside it: where a factor of 30 between two digits-mlp figures went.

    python bench/training_cpu_harness.py [--rounds 3] [--contend 2] [--out bench/results]

Harness: the in-host entry (flagperf.entry.run_job: the launcher starts a worker process with torchrun's
environment, the driver times the training steps), exactly what a round runs. Bare loop: a fresh Python
process running the same training (the same split, model, SGD, DataLoader, batch and seed; epochs until the
95 % target) timed the same way (training steps only), with nothing else. Both start as new processes with the
same torch thread count; rounds interleave so a change in the machine's load hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET = 0.95
MAX_EPOCHS = 30


def bare(threads: int) -> dict[str, float]:
    """The training, written plainly (the case's settings from its case.yaml)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from flagperf.training.data import digits_split

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    (x_train, y_train), (x_test, y_test) = digits_split(0, 0.2)
    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=32, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    samples, seconds, epochs, accuracy = 0, 0.0, 0, 0.0
    for epochs in range(1, MAX_EPOCHS + 1):  # noqa: B007 (the count is the result)
        started = time.perf_counter()
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
            samples += len(x)
        seconds += time.perf_counter() - started
        with torch.no_grad():
            accuracy = float((model(x_test).argmax(1) == y_test).float().mean())
        if accuracy >= TARGET:
            break
    return {"samples_per_s": samples / seconds, "epochs": epochs, "accuracy": accuracy}


def run_bare(threads: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--bare", str(threads)], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_harness(threads: int, work: Path) -> dict[str, float]:
    from flagperf.config.job import Job
    from flagperf.config.plan import plan_run
    from flagperf.entry import run_job
    from flagperf.measure.perflog import parse_file
    from flagperf.results.schema import read_result

    sets = [] if threads == 1 else [f"cpu_threads={threads}"]  # the case's default is 1
    plan = plan_run(cases=["digits-mlp"], results_dir=work / "plans", sets=sets)
    cp = plan.cases[0]
    job = Job(run_id="bench", case=cp.name, family=cp.family, round=1, host="localhost", vendor="cpu",
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})
    work.mkdir(parents=True)
    (work / "job.json").write_text(job.model_dump_json())
    if run_job(job, work) != 0:
        raise SystemExit(f"the harness run failed: see {work}")
    result = read_result(work / "result.json")
    extra = parse_file(work / "rank0.out.log").finished()[0]["extra"]
    throughput = next(m.value for m in result.metrics if m.name == "training_throughput")
    assert extra["torch_threads"] == threads, extra
    return {"samples_per_s": throughput, "epochs": result.convergence.epochs, "accuracy": result.convergence.reached,
            "load_average_1m": extra["load_average_1m"]}


def spin() -> None:
    while True:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--contend", type=int, default=2, help="busy processes started for the 'contended' phase")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--bare", type=int, help=argparse.SUPPRESS)  # internal: one bare run at this many threads
    args = parser.parse_args()
    if args.bare is not None:
        print(json.dumps(bare(args.bare)))
        return 0
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for phase in ("as found", "contended"):
            spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                        for _ in range(args.contend if phase == "contended" else 0)]
            try:
                for rnd in range(1, args.rounds + 1):
                    for threads in (1, 2):
                        load = os.getloadavg()[0]
                        b = run_bare(threads)
                        h = run_harness(threads, Path(tmp) / f"{phase.replace(' ', '-')}-{rnd}-{threads}")
                        rows.append({"phase": phase, "round": rnd, "threads": threads, "load_average_1m": load,
                                     "bare": b["samples_per_s"], "harness": h["samples_per_s"],
                                     "ratio": h["samples_per_s"] / b["samples_per_s"], "bare_epochs": b["epochs"],
                                     "harness_epochs": h["epochs"]})
                        print(json.dumps(rows[-1]), flush=True)
            finally:
                for p in spinners:
                    p.kill()
                    p.wait()
    summary = []
    for phase in ("as found", "contended"):
        for threads in (1, 2):
            sel = [r for r in rows if r["phase"] == phase and r["threads"] == threads]
            summary.append({"phase": phase, "threads": threads,
                            "bare_median": statistics.median(float(r["bare"]) for r in sel),
                            "harness_median": statistics.median(float(r["harness"]) for r in sel),
                            "ratio_median": statistics.median(float(r["ratio"]) for r in sel)})
    report = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "command": shlex.join(["python", *sys.argv]),
              "cores": len(os.sched_getaffinity(0)), "contend": args.contend, "rows": rows, "summary": summary}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "training_cpu_harness.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = ["# digits-mlp: harness against a bare loop on this CPU", "",
             f"Recorded {report['date']} with `{report['command']}` on {report['cores']} usable cores, a machine "
             f"shared with other work. 'contended' adds {args.contend} busy-looping processes. Harness: "
             "flagperf.entry.run_job (launcher, worker process, driver), as a round runs it; bare: the same training "
             "in a fresh process with nothing else. samples/s over training steps only, epochs to 95 % test "
             "accuracy.", "",
             "| phase | torch threads | bare samples/s (median) | harness samples/s (median) | harness / bare |",
             "|---|---|---|---|---|"]
    lines += [f"| {s['phase']} | {s['threads']} | {s['bare_median']:.0f} | {s['harness_median']:.0f} | "
              f"{s['ratio_median']:.2f} |" for s in summary]
    lines += ["", "Every run:", "", "| phase | round | threads | load avg (1 min) | bare | harness | ratio | epochs "
              "(bare / harness) |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['phase']} | {r['round']} | {r['threads']} | {float(r['load_average_1m']):.1f} | "
              f"{float(r['bare']):.0f} | {float(r['harness']):.0f} | {float(r['ratio']):.2f} | "
              f"{r['bare_epochs']} / {r['harness_epochs']} |" for r in rows]
    lines += [""]
    (args.out / "training_cpu_harness.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
