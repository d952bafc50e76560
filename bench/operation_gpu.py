"""Native torch against FlagGems on every operator of the operation family (22: the 20 that LLM training and
inference spend most time in, and log_softmax and exp), each checked against a higher-precision reference
before it is timed, through the family's own driver (flagperf.operation.driver.run_operation).

    python bench/operation_gpu.py               # GPU host: nvidia's native and flaggems, Llama-3-8B shapes at
                                                # batch 1 x seq 2048, bf16, fp16, fp32 (and fp8 for mm)
    python bench/operation_gpu.py --quick       # CPU dry run: the same plumbing at the tiny model's shapes,
                                                # fp32; flaggems is skipped there, saying why
    options: --out DIR (where the records go), --budget-s S (no new operator once S have passed),
             --dtypes bf16,fp16 (a subset), --operators mm,softmax (a subset), --with-compile (torch.compile
             as a third implementation), --cuda-graphs (time replays of a graph captured once, the case key
             cuda_graphs: each point's last replay is checked; the record's graphs line says how it went),
             --energy-intervals N --monitor-interval S (the case key energy_intervals: the vendor's monitors
             sample every S s around the run, each passed point's calls run back to back for N x S s after its
             timing, and its energy per work is taken over that loop as a run's summary takes it: 2 samples of
             the energy source inside it or no figure, the point saying why)

Each point has two latencies, both from the family's own timer (flagperf.operation.timer), the same for every
implementation: the device clock's median over calls timed alone after a cache flush, and the host latency
(FlagPerf's cputime: the host clock's wall time per call of calls back to back, one synchronisation at the
end), which includes what the device clock leaves out, a library's Python wrapper and dispatch. The record has
a geometric-mean speed-up against native of each.

Operator by operator (one run_operation call each), the records (operation_gpu[_quick].json and .md in --out)
are rewritten after every operator, so a run stopped by its time limit keeps what it measured. Each record
names the code (git revision, source digest), the machine, torch, Triton and FlagGems versions. Exit 1 when a
point failed (a wrong result or an error) on a GPU; 0 otherwise (the dry run's figures are a CPU's, recorded
but not judged).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.monitors import VendorMonitors  # noqa: E402
from bench.paired import write_record  # noqa: E402
from flagperf.config.vendors import load_vendor  # noqa: E402
from flagperf.errors import CaseUserError  # noqa: E402
from flagperf.monitoring import MAX_RATE_HZ  # noqa: E402
from flagperf.operation.config import ENERGY_MAX_INTERVALS, ENERGY_MIN_INTERVALS, OperationConfig  # noqa: E402
from flagperf.operation.driver import OperationOutcome, check_energy_loop, run_operation  # noqa: E402
from flagperf.operation.operators import OPERATORS  # noqa: E402
from flagperf.results.analysis import read_monitor, window_stats  # noqa: E402
from flagperf.results.markup import md_text  # noqa: E402
from flagperf.results.provenance import code_identity, host_info  # noqa: E402
from flagperf.results.summary import per_work  # noqa: E402


def version(name: str) -> str:
    if importlib.util.find_spec(name) is None:
        return "not installed"
    try:
        return str(getattr(__import__(name), "__version__", "?"))
    except Exception as exc:  # a library that fails to import is a finding, not a crash of the bench
        return f"fails to import: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def settings(quick: bool, dtypes: list[str], implementations: list[str], operator: str, graphs: bool = False,
             energy_intervals: int = 0) -> OperationConfig:
    shape = {"models": ["tiny"], "batch_sizes": [1], "seq_lens": [32]} if quick else \
        {"models": ["llama-3-8b"], "batch_sizes": [1], "seq_lens": [2048]}
    wanted = [d for d in dtypes if d in OPERATORS[operator].dtypes]
    return OperationConfig.model_validate({
        "operators": [operator], "dtypes": wanted, **shape, "implementations": implementations,
        "warmup_s": 0.01 if quick else 0.05, "rep_s": 0.01 if quick else 0.1,
        "min_iters": 3 if quick else 10, "max_iters": 10 if quick else 1000,
        "flush_cache": not quick, "cuda_graphs": graphs, "reference_cpu_max_elements": 1 << 20,
        "energy_intervals": energy_intervals, "timeout_s": 600.0, "max_retries": 0})


class Monitors(VendorMonitors):
    """The vendor's monitors sampling every ``interval_s`` (the energy loop is N of their intervals, so they must
    sample at that one), keeping their own long limit as a round's do: energy loops run past the bench's budget,
    and a monitor that stopped early would leave the last operators' figures uncovered."""

    def energy(self, outcome: OperationOutcome) -> dict[str, dict[str, Any]]:
        """metric name -> its energy per work over its energy_window (the energy loop), as a run's summary takes it
        (flagperf.results.summary.per_work: 2 samples of the source inside the window or none, saying why)."""
        ends = [m.energy_window[1] for m in outcome.metrics if m.energy_window]
        if ends:
            self.wait_past(max(ends))
        seen = [read_monitor(path) for path in self.paths.values() if path.exists()]
        failed = self.failed()
        found: dict[str, dict[str, Any]] = {}
        for metric in outcome.metrics:
            window = (metric.window[0], metric.window[1]) if metric.window else None
            work = per_work(window_stats(seen, window), metric, seen)
            counted = metric.energy_work if metric.energy_window is not None else metric.work
            why = work.why
            if why is None and work.value is None:
                if not counted or math.isnan(counted):  # per_work leaves it out: nothing to divide by
                    why = f"no work counted for it ({counted}): energy per work has nothing to divide by"
                elif failed:
                    why = "; ".join(failed)
                else:
                    why = "no power or energy source in the monitors' samples (" + ", ".join(self.paths) + ")"
            found[metric.name] = {"energy_per_work": work.value, "energy_per_work_unit": work.unit,
                                  "energy_per_work_samples": work.samples if work.value is not None else None,
                                  "energy_source": work.source, "energy_per_work_note": why}
        return found


def _geomean(values: list[float]) -> float | None:
    return math.exp(statistics.fmean(math.log(x) for x in values)) if values else None


def geomeans(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per dtype and implementation, over the points both it and native passed: the geometric mean of native's
    latency / its latency, of the device clock's medians and of the host latencies."""
    native = {(p["operator"], p["dtype"], json.dumps(p["shape"])): p for p in points
              if p["implementation"] == "native" and p["status"] == "passed"}
    groups: dict[tuple[str, str], list[float]] = {}
    hosts: dict[tuple[str, str], list[float]] = {}
    for p in points:
        base = native.get((p["operator"], p["dtype"], json.dumps(p["shape"])))
        if p["implementation"] != "native" and p["status"] == "passed" and base:
            key = (p["dtype"], p["implementation"])
            groups.setdefault(key, []).append(base["latency_s"] / p["latency_s"])
            if base.get("host_latency_s") and p.get("host_latency_s"):
                hosts.setdefault(key, []).append(base["host_latency_s"] / p["host_latency_s"])
    return [{"dtype": d, "implementation": i, "points": len(v), "geomean": _geomean(v),
             "host_points": len(hosts.get((d, i), [])), "host_geomean": _geomean(hosts.get((d, i), []))}
            for (d, i), v in sorted(groups.items())]


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.4g}"


def markdown(record: dict[str, Any]) -> str:
    m = record["machine"]
    lines = [f"# operation: native torch against {', '.join(record['implementations'][1:])} on every operator", "",
             f"- state: **{record['state']}**; {record['total_s']:.0f} s (budget {record['budget_s']:.0f} s); "
             f"recorded {record['recorded']}",
             f"- code: {record['code']}",
             f"- machine: {m['device']} on {m['host'].get('hostname')}; python {m['python']}, torch {m['torch']}, "
             f"triton {m['triton']}, flag_gems {m['flag_gems']}",
             f"- shapes: {record['shapes']}; dtypes {', '.join(record['dtypes'])}",
             f"- timing: {record.get('timing', '-')}", f"- cache: {record.get('flush', '-')}",
             f"- graphs: {record.get('graphs', '-')}", f"- energy loop: {record.get('energy', '-')}"
             + (f"; monitors: {record['monitors']}" if record.get("monitors") else ""),
             "- implementations: " + "; ".join(f"{k}: {v}" for k, v in record.get("described", {}).items()), ""]
    if record["geomeans"]:
        lines += ["| dtype | implementation | geomean speed-up against native (device clock) | points | "
                  "geomean host speed-up (cputime) | host points |", "|---|---|---|---|---|---|"]
        lines += [f"| {g['dtype']} | {g['implementation']} | {g['geomean']:.3f} | {g['points']} | "
                  f"{'-' if g.get('host_geomean') is None else format(g['host_geomean'], '.3f')} | "
                  f"{g.get('host_points', 0)} |" for g in record["geomeans"]]
        lines.append("")
    lines += ["| operator | dtype | shape | implementation | status | latency ms | host ms | figure | % of peak | "
              "% of roofline | energy per work | error |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in record["points"]:
        latency, host = _ms(p["latency_s"]), _ms(p.get("host_latency_s"))
        figure = "-" if p["value"] is None else f"{p['value']:.4g} {p['unit']}"
        ratio = "-" if p.get("ratio") is None else f"{100 * p['ratio']:.1f}%"
        roof = "-" if p["roofline"] is None else f"{100 * p['roofline']:.1f}%"
        shape = "x".join(f"{k}{v}" for k, v in p["shape"].items())
        lines.append(f"| {md_text(p['operator'])} | {p['dtype']} | {md_text(shape)} | {md_text(p['implementation'])} | "
                     f"{p['status']} | {latency} | {host} | {md_text(figure)} | {ratio} | {roof} | {_energy(p)} | "
                     f"{md_text(p['error'] or '')} |")
    if record.get("error"):
        lines += ["", f"**Stopped**: {record['error']}"]
    return "\n".join(lines) + "\n"


def _energy(point: dict[str, Any]) -> str:
    """A point's energy per work with its samples, or why it has none ("-": no energy loop asked)."""
    if point.get("energy_per_work") is not None:
        return (f"{point['energy_per_work']:.4g} {point['energy_per_work_unit']} "
                f"({point['energy_per_work_samples']} samples of {point['energy_source']})")
    return md_text(point.get("energy_per_work_note") or "-")


def write(folder: Path, record: dict[str, Any]) -> None:
    write_record(folder, "operation_gpu_quick" if record["quick"] else "operation_gpu", record, markdown(record))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--dtypes", default=None)
    parser.add_argument("--operators", default=None, help="a comma-separated subset (default: every operator)")
    parser.add_argument("--with-compile", action="store_true")
    parser.add_argument("--cuda-graphs", action="store_true", help="time replays of a graph captured once")
    parser.add_argument("--energy-intervals", type=int, default=0,
                        help=f"0 (default): no energy loop; {ENERGY_MIN_INTERVALS} to {ENERGY_MAX_INTERVALS}: each "
                             "passed point's calls back to back for this many monitor intervals, energy per work over "
                             "them (the vendor's monitors run around the bench)")
    parser.add_argument("--monitor-interval", type=float, default=None,
                        help=f"the monitors' sampling interval in seconds with --energy-intervals, {1 / MAX_RATE_HZ:g} "
                             f"to 60 (default {1 / MAX_RATE_HZ:g})")
    args = parser.parse_args()
    operators = args.operators.split(",") if args.operators else list(OPERATORS)
    unknown = [name for name in operators if name not in OPERATORS]
    if unknown:
        parser.error(f"--operators: unknown {', '.join(unknown)} (known: {', '.join(OPERATORS)})")
    if args.energy_intervals and not ENERGY_MIN_INTERVALS <= args.energy_intervals <= ENERGY_MAX_INTERVALS:
        parser.error(f"--energy-intervals: 0 or {ENERGY_MIN_INTERVALS} to {ENERGY_MAX_INTERVALS} (got "
                     f"{args.energy_intervals}): a shorter loop may hold fewer than 2 monitor samples")
    if args.monitor_interval is not None and not args.energy_intervals:
        parser.error("--monitor-interval: the monitors run only with --energy-intervals (their interval is its unit)")
    if args.monitor_interval is None:
        args.monitor_interval = 1 / MAX_RATE_HZ
    if not 1 / MAX_RATE_HZ <= args.monitor_interval <= 60:  # as the monitors themselves and `flagperf run` take it
        parser.error(f"--monitor-interval: {1 / MAX_RATE_HZ:g} to 60 seconds (got {args.monitor_interval:g})")
    if args.energy_intervals:
        try:  # the loop with a point's warm-up and timing must stay well inside the case's timeout
            check_energy_loop(settings(args.quick, ["fp32"], ["native"], "add", False, args.energy_intervals),
                              args.monitor_interval, "--energy-intervals")
        except CaseUserError as exc:
            parser.error(str(exc))
    cuda = torch.cuda.is_available() and not args.quick
    vendor = "nvidia"  # its operation folder holds native, compile and flaggems
    device = torch.device("cuda" if cuda else "cpu")
    spec = load_vendor("nvidia" if cuda else "cpu").spec_table()
    dtypes = args.dtypes.split(",") if args.dtypes else (["fp32"] if args.quick else ["bf16", "fp16", "fp32", "fp8"])
    implementations = ["native", "flaggems", *(["compile"] if args.with_compile else [])]
    record: dict[str, Any] = {
        "quick": args.quick, "state": "running", "budget_s": args.budget_s, "total_s": 0.0,
        "recorded": datetime.now(timezone.utc).isoformat(timespec="seconds"), "code": code_identity(),
        "command": " ".join(sys.argv),
        "machine": {"device": spec.device, "host": host_info(), "python": platform.python_version(),
                    "torch": torch.__version__, "triton": version("triton"), "flag_gems": version("flag_gems")},
        "shapes": "tiny b1 s32 (CPU dry run)" if args.quick else "llama-3-8b b1 s2048",
        "dtypes": dtypes, "implementations": implementations, "cuda_graphs": args.cuda_graphs,
        "energy_intervals": args.energy_intervals,
        "monitor_interval_s": args.monitor_interval if args.energy_intervals else None, "points": [],
        "geomeans": []}
    write(args.out, record)
    with tempfile.TemporaryDirectory(prefix="operation-gpu-monitors-") as folder:
        monitors = None
        if args.energy_intervals:  # monitors sampling before the first point, as around a host's round
            monitors = Monitors("nvidia" if cuda else "cpu", Path(folder), args.monitor_interval)
        try:
            if monitors is not None:  # inside the try: a monitor that fails to start stops the ones started
                monitors.start()
                monitors.wait_sampling()
            failed = measure(args, operators, dtypes, implementations, vendor, spec, device, record, monitors)
        finally:
            if monitors is not None:
                record["monitors"] = monitors.stop()
    record["state"] = "finished" if "error" not in record else "stopped"
    record["total_s"] = time.perf_counter() - STARTED
    write(args.out, record)
    for g in record["geomeans"]:
        host = (f"; host {g['host_geomean']:.3f} over {g['host_points']}" if g["host_geomean"] is not None else "")
        print(f"geomean speed-up {g['implementation']} {g['dtype']}: {g['geomean']:.3f} over {g['points']} points"
              + host)
    print(f"{failed} failed point(s); records in {args.out}")
    return 1 if (failed and cuda) else 0


def measure(args: argparse.Namespace, operators: list[str], dtypes: list[str], implementations: list[str],
            vendor: str, spec: Any, device: torch.device, record: dict[str, Any], monitors: Monitors | None) -> int:
    """Operator by operator into ``record`` (written after each); the failed points' count."""
    failed = 0
    for operator in operators:
        if time.perf_counter() - STARTED > args.budget_s:
            record["error"] = f"budget of {args.budget_s:.0f} s spent before {operator}"
            break
        config = settings(args.quick, dtypes, implementations, operator, args.cuda_graphs, args.energy_intervals)
        if not config.dtypes:
            continue
        try:
            outcome = run_operation(config, vendor, spec, device,
                                    monitor_interval_s=args.monitor_interval if monitors is not None else None)
        except Exception as exc:  # one operator's crash is recorded; the others still run
            record["points"].append({"operator": operator, "dtype": ",".join(config.dtypes), "shape": {},
                                     "implementation": "-", "status": "failed", "latency_s": None,
                                     "host_latency_s": None, "value": None,
                                     "unit": None, "roofline": None, "error": f"{type(exc).__name__}: {exc}"})
            failed += 1
            continue
        ratios = {m.name: m.ratio for m in outcome.metrics}
        energy = monitors.energy(outcome) if monitors is not None else {}
        for p in outcome.report.points:
            record["points"].append({**p.model_dump(mode="json"), "ratio": ratios.get(p.metric or ""),
                                     **energy.get(p.metric or "", {})})
            failed += p.status == "failed"
        record.update(timing=outcome.report.timing, flush=outcome.report.flush, graphs=outcome.report.graphs,
                      energy=outcome.report.energy, described=outcome.report.implementations)
        record["geomeans"] = geomeans(record["points"])
        record["total_s"] = time.perf_counter() - STARTED
        write(args.out, record)
        print(f"{operator}: " + ", ".join(f"{p.implementation} {p.dtype} {p.status}"
                                          + (f" {p.latency_s * 1e3:.3g} ms" if p.latency_s else "")
                                          + (f" (host {p.host_latency_s * 1e3:.3g} ms)" if p.host_latency_s else "")
                                          for p in outcome.report.points), flush=True)
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
