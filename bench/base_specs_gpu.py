"""Every base spec through the engine against a bare loop of the same operation, in one command.

    python bench/base_specs_gpu.py                 # a GPU host: vendor nvidia, the base suite (about 4 minutes)
    python bench/base_specs_gpu.py --quick         # a CPU smoke run of the same code (vendor cpu, tiny sizes)

1. The engine: the base suite (GEMMs incl. INT8, FP8 and BF16 max-achievable, memory copy and capacity, H2D,
   D2H, the cuBLASLt vendor toolkit), one round each with a short measuring window, through the Prefect flow
   (a temporary server unless PREFECT_API_URL is set); `--engine entry` runs each round as the engine's
   in-host entry process with the vendor's monitors instead (no Prefect), for a host where the server
   will not start.
2. Bare loops of the same operations at the same sizes in this process (plain torch, none of the engine's
   code), with the vendor's NVML monitor sampling them too; the toolkit's bare figure is its program run
   directly.
3. One table: engine figure, bare figure, ratio, peak, and how the chip ran (SM clock mean/min/max, power
   mean/limit, limiter in words) beside each, written to bench/results/base_specs_gpu.{json,md}
   (`--quick`: base_specs_cpu_quick.*). On a GPU the issue's targets are checked and printed; the exit
   status is 1 if one is missed or the engine failed, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

import torch  # noqa: E402

from flagperf.config.job import Job  # noqa: E402
from flagperf.config.plan import plan_run  # noqa: E402
from flagperf.config.vendors import load_vendor  # noqa: E402
from flagperf.results.analysis import read_monitor  # noqa: E402
from flagperf.results.chipstate import ChipState, chip_state  # noqa: E402
from flagperf.results.schema import RoundResult, read_result, round_dir  # noqa: E402
from flagperf.results.summary import summarize, write_summary  # noqa: E402

CASES = ["computation-FP64", "computation-FP32", "computation-TF32", "computation-FP16", "computation-BF16",
         "computation-INT8", "computation-FP8", "main_memory-bandwidth", "main_memory-capacity", "interconnect-h2d",
         "interconnect-d2h", "toolkit-gemm"]
TARGETS = {  # issue 12, on an H100
    ("computation-INT8", "gemm_int8"): 850.0,
    ("computation-FP8", "gemm_fp8"): 1200.0,
    ("computation-BF16", "gemm_bf16_max"): 750.0,
}
MIN_RATIO = 0.97


def engine_sets(quick: bool, seconds: float, sweep_s: float) -> list[str]:
    sets = [f"min_duration_s={seconds}", "min_iters=5", f"computation-BF16.sweep_budget_s={sweep_s}"]
    if quick:  # a CPU: shapes it multiplies in milliseconds, a bounded capacity check
        sets += ["m=256", "n=256", "k=256", "warmup_iters=2", "size_mib=64", "main_memory-capacity.max_gib=0.25",
                 "computation-BF16.sweep_m=[128, 512]", "computation-BF16.sweep_n=[128, 512]",
                 "computation-BF16.sweep_k=[128, 512]", "computation-BF16.sweep_step=128",
                 "computation-BF16.sweep_shape_s=0.02"]
    else:
        sets += ["computation-BF16.sweep_shape_s=0.05", "toolkit-gemm.warmup_iters=20"]
    return sets


# --- 1. the engine ---------------------------------------------------------------------------------------


def engine_prefect(results: Path, run_id: str, vendor: str, sets: list[str], interval: float) -> Path:
    from flows.evaluate import evaluate

    evaluate(cases=CASES, vendor=vendor, rounds=1, overrides=sets, results_dir=str(results), run_id=run_id,
             monitor_interval_s=interval, command="bench/base_specs_gpu.py", return_state=True)
    return results / run_id


def engine_entry(results: Path, run_id: str, vendor: str, sets: list[str], interval: float) -> Path:
    """Each round as the engine runs it on a host: the vendor's monitors around `python -m flagperf.entry`."""
    plan = plan_run(cases=CASES, vendor=vendor, rounds=1, sets=sets, results_dir=results, run_id=run_id)
    loaded = load_vendor(vendor)
    for case in plan.cases:
        folder = round_dir(plan.run_dir, case.name, 1, "localhost")
        folder.mkdir(parents=True, exist_ok=True)
        job = Job(run_id=run_id, case=case.name, family=case.family, round=1, host="localhost", vendor=vendor,
                  config=case.config, config_origins=case.origins, run_overrides=case.run_overrides,
                  command="bench/base_specs_gpu.py --engine entry", image={"status": "none"})
        (folder / "job.json").write_text(job.model_dump_json(), encoding="utf-8")
        monitors = [subprocess.Popen([*loaded.monitor_command(m, sys.executable), "--out",
                                      str(folder / f"monitor_{m.name}.jsonl"), "--interval", str(interval),
                                      "--parent-pid", str(os.getpid())],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    for m in loaded.manifest.monitors]
        try:
            time.sleep(2 * interval)
            with (folder / "case.log").open("w") as log:
                subprocess.run([sys.executable, "-m", "flagperf.entry", "--job", str(folder / "job.json")],
                               stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, check=False,
                               timeout=float(case.config.get("timeout_s", 900)))
        finally:
            for proc in monitors:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=10)
    write_summary(plan.run_dir, summarize(plan.run_dir))
    return plan.run_dir


# --- 2. bare loops -----------------------------------------------------------------------------------------


class Sampler:
    """The vendor's monitors, sampling the bare loops as they sample the engine's rounds."""

    def __init__(self, vendor: str, folder: Path, interval: float) -> None:
        loaded = load_vendor(vendor)
        folder.mkdir(parents=True, exist_ok=True)
        self.paths = [folder / f"monitor_{m.name}.jsonl" for m in loaded.manifest.monitors]
        self.procs = [subprocess.Popen([*loaded.monitor_command(m, sys.executable), "--out", str(path), "--interval",
                                        str(interval), "--parent-pid", str(os.getpid())],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                      for m, path in zip(loaded.manifest.monitors, self.paths, strict=True)]
        time.sleep(max(1.0, 3 * interval))  # the first samples before the first loop

    def stop(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)

    def state(self, window: tuple[float, float]) -> ChipState | None:
        return chip_state([read_monitor(p) for p in self.paths if p.is_file()], window)


Window = tuple[float, float]


def timed(step: Callable[[], object], sync: Callable[[], None], seconds: float, warmup: int
          ) -> tuple[int, float, Window]:
    for _ in range(warmup):
        step()
    sync()
    start, epoch = time.perf_counter(), time.time()
    iterations = 0
    batch = 1
    while time.perf_counter() - start < seconds:
        for _ in range(batch):
            step()
        iterations += batch
        sync()
        batch = min(batch * 2, 64)
    sync()
    elapsed = time.perf_counter() - start
    return iterations, elapsed, (epoch, epoch + elapsed)


def bare_gemm(config: dict[str, Any], shape: dict[str, int] | None, device: str, seconds: float
              ) -> tuple[float, tuple[float, float]]:
    """torch.mm / _int_mm / _scaled_mm written out again here, at the engine's size and operand layout."""
    precision = config["precision"]
    m, n, k = (shape["m"], shape["n"], shape["k"]) if shape else (config["m"], config["n"], config["k"])
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    pattern = config.get("data_pattern", "normal")

    def values(rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
        if pattern == "zeros":
            return torch.zeros(rows, cols, dtype=dtype, device=device)
        if dtype == torch.int8:
            if pattern == "uniform":
                return torch.randint(-128, 128, (rows, cols), dtype=torch.int8, device=device)
            return (torch.randn(rows, cols, device=device) * 16).round().clamp(-128, 127).to(torch.int8)
        make = torch.float32 if dtype.itemsize == 1 else dtype
        x = torch.rand(rows, cols, dtype=make, device=device) * 2 - 1 if pattern == "uniform" else \
            torch.randn(rows, cols, dtype=make, device=device)
        return x.to(dtype)

    if precision == "int8":
        a, b = values(m, k, torch.int8), values(n, k, torch.int8).t()
        out = torch.empty(m, n, dtype=torch.int32, device=device)
        def step() -> object:
            return torch._int_mm(a, b, out=out)
    elif precision == "fp8":
        a_type = torch.float8_e5m2 if config.get("fp8_format") == "e5m2" else torch.float8_e4m3fn
        a, b = values(m, k, a_type), values(n, k, torch.float8_e4m3fn).t()
        one = torch.tensor(1.0, device=device)
        out = torch.empty(m, n, dtype=torch.bfloat16, device=device)
        fast = bool(config.get("fp8_fast_accum", False))
        def step() -> object:
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=fast,
                                    out=out)
    else:
        dtype = {"fp64": torch.float64, "fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
                 "bf16": torch.bfloat16}[precision]
        a, b = values(m, k, dtype), values(k, n, dtype)
        out = torch.empty(m, n, dtype=dtype, device=device)
        def step() -> object:
            return torch.mm(a, b, out=out)
    iterations, elapsed, window = timed(step, sync_for(device), seconds, warmup=int(config.get("warmup_iters", 10)))
    return 2 * m * n * k * iterations / elapsed / 1e12, window


def bare_copy(config: dict[str, Any], device: str, seconds: float) -> tuple[float, tuple[float, float]]:
    nbytes = config["size_mib"] * 2**20
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    iterations, elapsed, window = timed(lambda: dst.copy_(src), sync_for(device), seconds, warmup=10)
    return 2 * nbytes * iterations / elapsed / 1e9, window


def bare_transfer(config: dict[str, Any], device: str, seconds: float) -> tuple[float, tuple[float, float]]:
    nbytes = config["size_mib"] * 2**20
    host = torch.ones(nbytes, dtype=torch.uint8, pin_memory=config["pinned"])
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    if config["direction"] == "h2d":
        def step() -> object:
            return dev.copy_(host, non_blocking=config["pinned"])
    else:
        def step() -> object:
            return host.copy_(dev, non_blocking=config["pinned"])
    iterations, elapsed, window = timed(step, sync_for(device), seconds, warmup=10)
    return nbytes * iterations / elapsed / 1e9, window


def bare_capacity(config: dict[str, Any], device: str) -> tuple[float, tuple[float, float]]:
    """Allocate and touch chunk_mib blocks (halving on refusal) until the device refuses or max_gib is held."""
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # the bare loops' cached blocks back to the device first
    limit = int(config["max_gib"] * 2**30) if config.get("max_gib") else None
    chunk, held, total, epoch = config["chunk_mib"] * 2**20, [], 0, time.time()
    while chunk >= 2**20 and (limit is None or total + chunk <= limit):
        try:
            block = torch.empty(chunk, dtype=torch.uint8, device=device)
            block.fill_(1)
        except torch.OutOfMemoryError:
            chunk //= 2
            continue
        held.append(block)
        total += chunk
    sync_for(device)()
    window = (epoch, time.time())
    del held
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return total / 2**30, window


def bare_toolkit(result: RoundResult) -> dict[str, tuple[float, tuple[float, float]]]:
    """The vendor program run directly (no engine): the same binary the case built, the same arguments."""
    from flagperf.basespec import toolkit

    config = toolkit.Config.model_validate(result.config)
    vendor = load_vendor(result.vendor)
    folder, manifest = toolkit.find_toolkit(vendor.folder, config.provides)
    binary = toolkit.build(folder, manifest)  # cached by the engine's round: no second build
    figures: dict[str, tuple[float, tuple[float, float]]] = {}
    for metric in result.metrics:
        precision = metric.name.removeprefix("toolkit_gemm_")
        done = subprocess.run([str(binary), *toolkit.program_arguments(config, manifest, precision)],
                              capture_output=True, text=True, timeout=config.timeout_s, check=True)
        data = toolkit.parse_output(done.stdout, manifest.name)
        iterations = sum(c[0] for c in data["chunks"])
        seconds = sum(c[1] for c in data["chunks"])
        figures[metric.name] = (2 * config.m * config.n * config.k * iterations / seconds / 1e12,
                                (data["window"][0], data["window"][1]))
    return figures


def sync_for(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


# --- 3. the table ------------------------------------------------------------------------------------------


def chip_cells(state: dict[str, Any] | None) -> str:
    if not state:
        return "-"
    def num(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"
    flag = "**" if state.get("flagged") else ""
    return (f"{num(state['sm_clock_mean_mhz'])}/{num(state['sm_clock_min_mhz'])}/{num(state['sm_clock_max_mhz'])} "
            f"MHz, {num(state['power_mean_w'])}/{num(state['power_limit_w'])} W, {flag}{state['limiter']}{flag}")


def render(report: dict[str, Any]) -> str:
    lines = [f"# Base specs: engine against bare loops ({report['device']})", "",
             f"- command: `{report['command']}`", f"- when: {report['when']}, host {report['host']}, "
             f"torch {report['torch']}, engine path: {report['engine_path']}, measuring window "
             f"{report['seconds']} s per figure, BF16 shape search {report['sweep_s']} s",
             f"- engine run folder: {report['run_dir']}; wall time {report['wall_s']:.0f} s "
             f"(engine {report['engine_s']:.0f} s, bare loops {report['bare_s']:.0f} s)", "",
             "| case | metric | engine | bare | engine/bare | peak | engine/peak | chip in the engine's region "
             "(SM clock mean/min/max, power mean/limit, limiter) | chip in the bare loop's region | note |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        def fig(value: float | None, unit: str = row["unit"]) -> str:
            return "-" if value is None else f"{value:.4g} {unit}"
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
        of_peak = "-" if row["of_peak"] is None else f"{row['of_peak']:.1%}"
        lines.append(f"| {row['case']} | {row['metric']} | {fig(row['engine'])} | {fig(row['bare'])} | {ratio} | "
                     f"{fig(row['peak'], row['peak_unit'] or '')} | {of_peak} | {chip_cells(row['engine_chip'])} | "
                     f"{chip_cells(row['bare_chip'])} | {row['note'] or ''} |")
    if report["not_measured"]:
        lines += ["", "Not measured:", ""] + [f"- {c}: {s}" for c, s in report["not_measured"].items()]
    if report["checks"]:
        lines += ["", "Checks (issue 12)" + (" (informational in a --quick CPU run)" if report["quick"] else "") + ":",
                  ""] + [f"- {'PASS' if ok else 'FAIL'}: {text}"
                                                   for text, ok in report["checks"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU smoke run: vendor cpu, tiny sizes")
    parser.add_argument("--vendor", default=None, help="default: nvidia (cpu with --quick)")
    parser.add_argument("--seconds", type=float, default=None, help="measuring window per figure (default 3; 0.3 "
                        "with --quick)")
    parser.add_argument("--sweep-seconds", type=float, default=None, help="BF16 shape search budget (default 30)")
    parser.add_argument("--engine", choices=["prefect", "entry"], default="prefect")
    parser.add_argument("--interval", type=float, default=0.2, help="monitor sampling interval, seconds")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--results", type=Path, default=ROOT / "results", help="the engine's run folders")
    args = parser.parse_args()
    vendor = args.vendor or ("cpu" if args.quick else "nvidia")
    seconds = args.seconds or (0.3 if args.quick else 3.0)
    sweep_s = args.sweep_seconds or (2.0 if args.quick else 30.0)
    device = load_vendor(vendor).manifest.torch_device
    if device == "cuda" and not torch.cuda.is_available():
        print("base_specs_gpu: FAILED: vendor nvidia but torch sees no CUDA device", file=sys.stderr)
        return 1
    began = time.perf_counter()
    run_id = f"base-specs-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}"
    sets = engine_sets(args.quick, seconds, sweep_s)
    engine_path = args.engine
    print(f"engine ({args.engine}): {len(CASES)} cases, vendor {vendor}, window {seconds} s ...", flush=True)
    try:
        run_dir = (engine_prefect if args.engine == "prefect" else engine_entry)(args.results, run_id, vendor, sets,
                                                                                 args.interval)
    except Exception as exc:  # the Prefect server did not start, the API is unreachable ...
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if args.engine != "prefect":
            print(f"base_specs_gpu: FAILED: the engine did not run ({why})", file=sys.stderr)
            return 1
        print(f"the Prefect path failed ({why}); running each round through the in-host entry instead", flush=True)
        engine_path = f"entry (the Prefect path failed: {why})"
        run_id += "-entry"
        run_dir = engine_entry(args.results, run_id, vendor, sets, args.interval)
    engine_s = time.perf_counter() - began
    summary = summarize(run_dir)
    chips = {(e["case"], e["metric"]): e.get("chip") for e in summary.headline}
    results = {r.case: r for r in (read_result(p) for p in sorted(run_dir.glob("*/round1/*/result.json")))}
    not_measured = {case: f"{r.status}: {r.failure.message if r.failure else ''}"
                    for case, r in results.items() if r.status != "success"}
    missing = [c for c in CASES if c not in results]
    not_measured.update({c: "no result (see the run folder)" for c in missing})

    # The engine's figures first, so that a bench stopped during its bare loops still leaves them in its log.
    for case, result in results.items():
        for metric in result.metrics:
            print(f"engine {case}: {metric.name} {metric.value:.6g} {metric.unit}", flush=True)
    print("bare loops ...", flush=True)
    bare_began = time.perf_counter()
    sampler = Sampler(vendor, args.results / run_id / "bare", args.interval)
    rows: list[dict[str, Any]] = []
    try:
        for case in CASES:
            result = results.get(case)
            if result is None or result.status != "success":
                continue
            bare: dict[str, tuple[float, tuple[float, float]]] = {}
            if case.startswith("computation-"):
                for metric in result.metrics:
                    shape = metric.search.shape if metric.search else None
                    bare[metric.name] = bare_gemm(result.config, shape, device, seconds)
            elif case == "main_memory-bandwidth":
                bare["memory_copy_bandwidth"] = bare_copy(result.config, device, seconds)
            elif case == "main_memory-capacity":
                bare["memory_capacity"] = bare_capacity(result.config, device)
            elif case.startswith("interconnect-"):
                bare[f"{result.config['direction']}_bandwidth"] = bare_transfer(result.config, device, seconds)
            elif case == "toolkit-gemm":
                bare = bare_toolkit(result)
            for metric in result.metrics:
                value, window = bare.get(metric.name, (None, None))
                state = sampler.state(window) if window and device != "cpu" else None
                rows.append({
                    "case": case, "metric": metric.name, "unit": metric.unit, "engine": metric.value, "bare": value,
                    "ratio": metric.value / value if value else None,
                    "peak": metric.peak.value if metric.peak else None,
                    "peak_unit": metric.peak.unit if metric.peak else None, "of_peak": metric.ratio,
                    "engine_chip": chips.get((case, metric.name)), "bare_chip": state.as_dict() if state else None,
                    "note": metric.note, "search": metric.search.model_dump() if metric.search else None})
    finally:
        sampler.stop()
    bare_s = time.perf_counter() - bare_began

    checks: list[tuple[str, bool]] = []
    for row in rows:
        if row["ratio"] is not None and row["metric"] != "memory_capacity":
            checks.append((f"{row['case']} {row['metric']} engine/bare {row['ratio']:.3f} >= {MIN_RATIO}",
                           row["ratio"] >= MIN_RATIO))
    if not args.quick:
        for (case, metric), target in TARGETS.items():
            got = next((r["engine"] for r in rows if (r["case"], r["metric"]) == (case, metric)), None)
            checks.append((f"{case} {metric} {got if got is None else round(got, 1)} >= {target:g}",
                           got is not None and got >= target))
    report = {
        "device": summary.context.get("device") or platform.processor(), "host": platform.node(),
        "torch": torch.__version__, "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "bench/base_specs_gpu.py", *sys.argv[1:]]), "engine_path": engine_path,
        "seconds": seconds, "sweep_s": sweep_s, "run_dir": str(run_dir), "wall_s": time.perf_counter() - began,
        "engine_s": engine_s, "bare_s": bare_s, "rows": rows, "not_measured": not_measured,
        "checks": checks, "engine_sets": sets, "quick": args.quick,
    }
    name = "base_specs_cpu_quick" if args.quick else "base_specs_gpu"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    text = render(report)
    (args.out / f"{name}.md").write_text(text, encoding="utf-8")
    print(text)
    # A CPU smoke run checks that the code runs end to end; its figures are a loaded 2-core VM's, not a chip's.
    failed = [t for t, ok in checks if not ok] if not args.quick else []
    engine_failed = [c for c, s in not_measured.items() if not s.startswith("unsupported")]
    if engine_failed or failed:
        print(f"base_specs_gpu: FAILED: {len(engine_failed)} case(s) not measured ({', '.join(engine_failed)}), "
              f"{len(failed)} check(s) missed: {'; '.join(failed)}", file=sys.stderr)
        return 1
    print(f"base_specs_gpu: ok in {report['wall_s']:.0f} s; {args.out / name}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
