"""Base specs through the engine against bare loops of the same operation, interleaved, in one command.

    python bench/base_specs_gpu.py                 # a GPU host: vendor nvidia (about 6 minutes)
    python bench/base_specs_gpu.py --quick         # a CPU smoke run of the same code (vendor cpu, tiny sizes)

For each case, --pairs times (default 3): an engine round, then a bare loop of the same work (A B A B ...;
pair 1 of every case first, so that a run cut short by --budget-s still has every case).
Both sides are a fresh process started the same way after the same idle (--idle-s), so neither side gets a
cooler chip or a warmer cache than the other:
  engine  `python -m flagperf.entry` for one round of the case, with the vendor's monitors around it (what a
          host runs for every round of `flagperf run`; the Prefect flow around it times nothing);
  bare    this file's own loop of the same operation at the same size and operand layout, the same warm-up
          and the same number of timed iterations as that engine round, timed the same way (host clock
          between device synchronisations), with none of the engine's code; the toolkit's bare figure is
          its program run directly with the same arguments.
The headline of a figure is the median of its pair ratios (each pair adjacent in time, so drift in clock and
power cancels); each side's median rate and spread are beside it. A ratio above 1.03 is flagged as
suspicious: the bare loop does less than the engine claims to, or the comparison is unfair.

A max-achievable reference (MAMF-style, after ml-engineering's mamf-finder): BF16 and FP8 GEMM shapes
scanned, each shape timed matmul by matmul with device events and the L2 cache flushed between them; the
best and the median over shapes, and the best shape once more back to back for an engine window (the clock
the chip holds, not a burst). The engine's max-achievable figures are reported as ratios of both.

Everything goes to --out as it is made (base_specs_gpu.{json,md}; --quick: base_specs_cpu_quick.*): a run
stopped at its time limit keeps every finished pair. Exit 1 when the engine failed or a target is missed
on a GPU, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flagperf.config.job import Job  # noqa: E402
from flagperf.config.plan import plan_run  # noqa: E402
from flagperf.config.vendors import load_vendor  # noqa: E402
from flagperf.results.analysis import read_monitor  # noqa: E402
from flagperf.results.chipstate import chip_state  # noqa: E402
from flagperf.results.provenance import code_identity  # noqa: E402
from flagperf.results.schema import RoundResult, read_result, round_dir  # noqa: E402

ALL_CASES = ["computation-FP64", "computation-FP32", "computation-TF32", "computation-FP16", "computation-BF16",
             "computation-INT8", "computation-FP8", "main_memory-bandwidth", "main_memory-capacity",
             "interconnect-h2d", "interconnect-d2h", "toolkit-gemm"]
# The figures still pending on a GPU (issue 25); the four plain GEMMs are in `flagperf run --suite base`.
PENDING = ["computation-BF16", "computation-INT8", "computation-FP8", "toolkit-gemm", "main_memory-bandwidth",
           "main_memory-capacity", "interconnect-h2d", "interconnect-d2h"]
MIN_RATIO = 0.97
SUSPICIOUS = 1.03
MAMF_MIN_SHARE = 0.95  # the engine's BF16 max-achievable against the MAMF-style best
# Engine targets by device (TFLOPS / TOPS), issue 25.
TARGETS = {"H100": {"gemm_int8": 850.0, "gemm_fp8": 1300.0}, "H200": {"gemm_int8": 850.0, "gemm_fp8": 1400.0}}


def engine_sets(quick: bool, seconds: float, sweep_s: float, cases: list[str]) -> list[str]:
    """The engine's --set list; a case-scoped setting only for a case that is run (the plan refuses others)."""
    # The max-achievable search on every tensor-core precision the targets name: on the H200 the MAMF-style
    # scan found FP8 at 1,420 TFLOPS on 4096x16384x16384 where the fixed 8192^3 shape gave 1,232.
    sets = [f"min_duration_s={seconds}", "min_iters=5",
            *(f"computation-{p}.sweep_budget_s={sweep_s}" for p in ("BF16", "FP8", "INT8"))]
    if quick:  # a CPU: shapes it multiplies in milliseconds, small buffers, a bounded capacity check
        for case in cases:
            if case.startswith("computation-"):
                sets += [f"{case}.{key}" for key in ("m=256", "n=256", "k=256", "warmup_iters=2")]
            elif case.startswith(("main_memory-bandwidth", "interconnect-")):
                sets.append(f"{case}.size_mib=64")
        sets += ["main_memory-capacity.max_gib=0.25", "computation-BF16.sweep_m=[128, 512]",
                 "computation-BF16.sweep_n=[128, 512]", "computation-BF16.sweep_k=[128, 512]",
                 "computation-BF16.sweep_step=128", "computation-BF16.sweep_shape_s=0.02"]
    else:
        sets += ["computation-BF16.sweep_shape_s=0.05", "toolkit-gemm.warmup_iters=20"]
    return [s for s in sets if "." not in s.split("=", 1)[0] or s.split(".", 1)[0] in cases]


# --- the two sides, each a fresh process -------------------------------------------------------------------


def start_monitors(vendor: str, folder: Path, interval: float) -> list[subprocess.Popen[bytes]]:
    loaded = load_vendor(vendor)
    folder.mkdir(parents=True, exist_ok=True)
    return [subprocess.Popen([*loaded.monitor_command(m, sys.executable), "--out",
                              str(folder / f"monitor_{m.name}.jsonl"), "--interval", str(interval),
                              "--parent-pid", str(os.getpid())], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for m in loaded.manifest.monitors]


def stop_monitors(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def engine_round(plan: Any, case: Any, pair: int, vendor: str, interval: float) -> tuple[RoundResult | None, Path]:
    """One round as the engine runs it on a host: the vendor's monitors around `python -m flagperf.entry`."""
    folder = round_dir(plan.run_dir, case.name, pair, "localhost")
    folder.mkdir(parents=True, exist_ok=True)
    job = Job(run_id=plan.run_id, case=case.name, family=case.family, round=pair, host="localhost", vendor=vendor,
              config=case.config, config_origins=case.origins, run_overrides=case.run_overrides,
              command="bench/base_specs_gpu.py", image={"status": "none"})
    (folder / "job.json").write_text(job.model_dump_json(), encoding="utf-8")
    monitors = start_monitors(vendor, folder, interval)
    try:
        with (folder / "case.log").open("w") as log:
            subprocess.run([sys.executable, "-m", "flagperf.entry", "--job", str(folder / "job.json")],
                           stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, check=False,
                           timeout=float(case.config.get("timeout_s", 900)))
    except subprocess.TimeoutExpired:
        pass
    finally:
        stop_monitors(monitors)
    try:
        return read_result(folder / "result.json"), folder
    except (OSError, ValueError):
        return None, folder


def bare_round(work: dict[str, Any], timeout: float) -> dict[str, Any]:
    """The bare loop in a fresh process (this file with --bare), started as the engine's round is."""
    done = subprocess.run([sys.executable, __file__, "--bare", json.dumps(work)], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {done.returncode}: {' | '.join(tail)}"}
    return json.loads(lines[-1])


def bare_work(result: RoundResult, device: str) -> dict[str, Any]:
    """What the bare process must do to repeat the engine round: per metric, the shape, the warm-up and the
    number of timed iterations the engine timed (in as many chunks)."""
    metrics = [{"name": m.name, "shape": m.search.shape if m.search else None, "iterations": m.iterations,
                "chunks": max(m.chunks, 1)} for m in result.metrics]
    return {"case": result.case, "config": result.config, "device": device, "metrics": metrics}


# --- inside the bare process (plain torch, none of the engine's code) ---------------------------------------


def run_bare(work: dict[str, Any]) -> dict[str, Any]:
    import torch

    device, config, case = work["device"], work["config"], work["case"]

    def sync() -> None:
        if device != "cpu":
            torch.cuda.synchronize()

    def timed(step: Any, warmup: int, iterations: int, chunks: int) -> tuple[float, list[float]]:
        """Warm-up, one untimed calibration step (the engine's timing loop makes one), then `iterations` steps
        in `chunks` chunks, the host clock read between device synchronisations."""
        for _ in range(warmup + 1):
            step()
        sync()
        per_chunk = [iterations // chunks + (1 if i < iterations % chunks else 0) for i in range(chunks)]
        seconds, epoch = 0.0, time.time()
        for count in per_chunk:
            start = time.perf_counter()
            for _ in range(count):
                step()
            sync()
            seconds += time.perf_counter() - start
        return seconds, [epoch, time.time()]

    figures: dict[str, Any] = {}
    warmup = int(config.get("warmup_iters", 10))
    for metric in work["metrics"]:
        name, n_iter, n_chunks = metric["name"], int(metric["iterations"]), int(metric["chunks"])
        if case.startswith("computation-"):
            step, work_per_iter = gemm_step(torch, config, metric["shape"], device)
            seconds, window = timed(step, warmup, n_iter, n_chunks)
            figures[name] = [work_per_iter * n_iter / seconds / 1e12, window]
        elif case == "main_memory-bandwidth":
            nbytes = config["size_mib"] * 2**20
            src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
            dst = torch.empty_like(src)
            seconds, window = timed(lambda dst=dst, src=src: dst.copy_(src), warmup, n_iter, n_chunks)
            figures[name] = [2 * nbytes * n_iter / seconds / 1e9, window]  # read + write, as the engine counts
        elif case.startswith("interconnect-"):
            nbytes = config["size_mib"] * 2**20
            host = torch.ones(nbytes, dtype=torch.uint8, pin_memory=config["pinned"])
            dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
            dst, src = (dev, host) if config["direction"] == "h2d" else (host, dev)
            seconds, window = timed(lambda dst=dst, src=src, pinned=bool(config["pinned"]): dst.copy_(
                src, non_blocking=pinned), warmup, n_iter, n_chunks)
            figures[name] = [nbytes * n_iter / seconds / 1e9, window]
        elif case == "main_memory-capacity":
            figures[name] = list(bare_capacity(torch, config, device))
        elif case == "toolkit-gemm":
            figures.update(bare_toolkit(config, work.get("vendor", "nvidia"), [name]))
    return {"figures": figures}


def gemm_step(torch: Any, config: dict[str, Any], shape: dict[str, int] | None, device: str) -> tuple[Any, float]:
    """torch.mm / _int_mm / _scaled_mm written out again, at the engine's size and operand layout."""
    precision = config["precision"]
    m, n, k = (shape["m"], shape["n"], shape["k"]) if shape else (config["m"], config["n"], config["k"])
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    pattern = config.get("data_pattern", "normal")

    def values(rows: int, cols: int, dtype: Any) -> Any:
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
        return (lambda: torch._int_mm(a, b, out=out)), 2.0 * m * n * k
    if precision == "fp8":
        a_type = torch.float8_e5m2 if config.get("fp8_format") == "e5m2" else torch.float8_e4m3fn
        a, b = values(m, k, a_type), values(n, k, torch.float8_e4m3fn).t()
        one = torch.tensor(1.0, device=device)
        out = torch.empty(m, n, dtype=torch.bfloat16, device=device)
        fast = bool(config.get("fp8_fast_accum", False))
        return (lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                         use_fast_accum=fast, out=out)), 2.0 * m * n * k
    dtype = {"fp64": torch.float64, "fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
             "bf16": torch.bfloat16}[precision]
    a, b = values(m, k, dtype), values(k, n, dtype)
    out = torch.empty(m, n, dtype=dtype, device=device)
    return (lambda: torch.mm(a, b, out=out)), 2.0 * m * n * k


def bare_capacity(torch: Any, config: dict[str, Any], device: str) -> tuple[float, list[float]]:
    """Allocate and touch chunk_mib blocks (halving on refusal) until the device refuses or max_gib is held."""
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
    if device != "cpu":
        torch.cuda.synchronize()
    return total / 2**30, [epoch, time.time()]


def bare_toolkit(config: dict[str, Any], vendor: str, names: list[str]) -> dict[str, list[Any]]:
    """The vendor program run directly (no engine): the binary the case built, the same arguments."""
    from flagperf.basespec import toolkit  # finds and builds the program only; no timing code of the engine's

    cfg = toolkit.Config.model_validate(config)
    folder, manifest = toolkit.find_toolkit(load_vendor(vendor).folder, cfg.provides)
    binary = toolkit.build(folder, manifest)  # cached by the engine's round: no second build
    figures: dict[str, list[Any]] = {}
    for name in names:
        precision = name.removeprefix("toolkit_gemm_")
        done = subprocess.run([str(binary), *toolkit.program_arguments(cfg, manifest, precision)],
                              capture_output=True, text=True, timeout=cfg.timeout_s, check=True)
        data = toolkit.parse_output(done.stdout, manifest.name)
        iterations = sum(c[0] for c in data["chunks"])
        seconds = sum(c[1] for c in data["chunks"])
        figures[name] = [2 * cfg.m * cfg.n * cfg.k * iterations / seconds / 1e12, list(data["window"][:2])]
    return figures


def run_mamf(work: dict[str, Any]) -> dict[str, Any]:
    """MAMF-style maximum achievable matmul FLOPS: shapes scanned (large first) within a time budget; per shape
    a warm-up, then matmul by matmul, each between two device events, with the L2 cache flushed (a buffer
    larger than it rewritten) before each; a shape's figure is from its median matmul time."""
    import torch

    device, dtype_name, budget = work["device"], work["dtype"], float(work["seconds"])
    sizes, ks, per_shape = work["sizes"], work["ks"], int(work["iterations"])
    on_gpu = device != "cpu"
    flush = torch.empty(int(work.get("flush_mib", 256)) * 2**20, dtype=torch.uint8, device=device)
    shapes = sorted(((m, n, k) for m in sizes for n in sizes for k in ks), key=lambda s: -s[0] * s[1] * s[2])
    began, tried = time.perf_counter(), []
    for m, n, k in shapes:
        if time.perf_counter() - began > budget:
            break
        step = mamf_step(torch, dtype_name, m, n, k, device)
        for _ in range(3):
            step()
        times = []
        for _ in range(per_shape):
            flush.zero_()
            if on_gpu:
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                step()
                stop.record()
                stop.synchronize()
                times.append(start.elapsed_time(stop) / 1e3)
            else:
                t0 = time.perf_counter()
                step()
                times.append(time.perf_counter() - t0)
        tried.append({"m": m, "n": n, "k": k, "tflops": 2 * m * n * k / statistics.median(times) / 1e12})
        del step
    rates = [t["tflops"] for t in tried]
    best = max(tried, key=lambda t: t["tflops"]) if tried else None
    outcome = {"dtype": dtype_name, "shapes": len(tried), "best": best, "median_tflops": statistics.median(rates)
               if rates else None, "spent_s": time.perf_counter() - began, "per_shape_matmuls": per_shape,
               "method": "MAMF-style: per matmul device events (host clock on a CPU), L2 flushed before each, "
                         "median matmul time per shape, best and median over shapes"}
    if best is not None and float(work.get("sustain_s", 0)) > 0:
        # The best shape once more, back to back for as long as an engine window, as the engine times it: a
        # short scan reads a cool chip's bursts, this reads the clock the chip holds (so a gap between the
        # engine's figure and the best splits into shape choice and power state).
        del flush
        step = mamf_step(torch, dtype_name, best["m"], best["n"], best["k"], device)
        sync = torch.cuda.synchronize if on_gpu else (lambda: None)
        for _ in range(3):
            step()
        sync()
        count, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < float(work["sustain_s"]):
            for _ in range(10):
                step()
            sync()
            count += 10
        seconds = time.perf_counter() - t0
        outcome["best_sustained"] = {"tflops": 2 * best["m"] * best["n"] * best["k"] * count / seconds / 1e12,
                                     "seconds": seconds, "matmuls": count,
                                     "method": "the best shape back to back, no flush, host clock between device "
                                               "synchronisations every 10 matmuls (the engine's timer)"}
    return outcome


def mamf_step(torch: Any, dtype_name: str, m: int, n: int, k: int, device: str) -> Any:
    if dtype_name == "fp8":
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
        one = torch.tensor(1.0, device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    dtype = torch.bfloat16 if device != "cpu" else torch.float32  # a CPU smoke run: bf16 matmul is emulated there
    a = torch.randn(m, k, dtype=dtype, device=device)
    b = torch.randn(k, n, dtype=dtype, device=device)
    return lambda: torch.mm(a, b)


# --- the record ---------------------------------------------------------------------------------------------


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{min(values):.4g}-{max(values):.4g}"


def chip_cells(state: dict[str, Any] | None) -> str:
    if not state:
        return "-"
    def num(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"
    return (f"{num(state['sm_clock_mean_mhz'])} MHz, {num(state['power_mean_w'])}/{num(state['power_limit_w'])} W, "
            f"{state['limiter']}")


def summarise(record: dict[str, Any]) -> None:
    """Rows from the pairs: each side's median and spread, the pair ratios and their median (the headline)."""
    rows = []
    for key, pairs in record["pairs"].items():
        case, metric = key.split(" / ")
        done = [p for p in pairs if p.get("engine") is not None and p.get("bare") is not None]
        engine = [p["engine"] for p in pairs if p.get("engine") is not None]
        bare = [p["bare"] for p in pairs if p.get("bare") is not None]
        ratios = [p["engine"] / p["bare"] for p in done if p["bare"]]
        ratio = statistics.median(ratios) if ratios else None
        last = pairs[-1]
        rows.append({
            "case": case, "metric": metric, "unit": last.get("unit"), "pairs": len(done),
            "engine_median": statistics.median(engine) if engine else None, "engine_spread": spread(engine),
            "bare_median": statistics.median(bare) if bare else None, "bare_spread": spread(bare),
            "pair_ratios": ratios, "ratio": ratio, "suspicious": ratio is not None and ratio > SUSPICIOUS,
            "peak": last.get("peak"), "engine_chip": last.get("engine_chip"), "bare_chip": last.get("bare_chip"),
            "note": last.get("note")})
    record["rows"] = rows
    checks: list[tuple[str, bool]] = []
    for row in rows:
        if row["ratio"] is not None and row["metric"] != "memory_capacity":
            checks.append((f"{row['case']} {row['metric']}: engine/bare {row['ratio']:.3f} >= {MIN_RATIO}",
                           row["ratio"] >= MIN_RATIO))
        if row["suspicious"]:
            checks.append((f"{row['case']} {row['metric']}: engine/bare {row['ratio']:.3f} > {SUSPICIOUS} is "
                           "suspicious (the comparison, not the engine)", False))
    targets = next((t for chip, t in TARGETS.items() if chip in record["device"]), {})
    for metric, target in targets.items():  # the better of the fixed shape and the searched one
        got = max((r["engine_median"] for r in rows if r["metric"] in (metric, f"{metric}_max")
                   and r["engine_median"] is not None), default=None)
        checks.append((f"{metric} {got if got is None else round(got, 1)} >= {target:g} on {record['device']}",
                       got is not None and got >= target))
    for dtype in ("bf16", "fp8"):
        mamf = record["mamf"].get(dtype) or {}
        best_max = next((r["engine_median"] for r in rows if r["metric"] == f"gemm_{dtype}_max"), None)
        if mamf.get("best") and best_max is not None:
            share = best_max / mamf["best"]["tflops"]
            record[f"{dtype}_max_of_mamf"] = share
            checks.append((f"gemm_{dtype}_max {best_max:.1f} is {share:.3f} of the MAMF-style best "
                           f"{mamf['best']['tflops']:.1f} TFLOPS (>= {MAMF_MIN_SHARE})", share >= MAMF_MIN_SHARE))
            if mamf.get("best_sustained"):
                held = mamf["best_sustained"]["tflops"]
                record[f"{dtype}_max_of_mamf_sustained"] = best_max / held
                record.setdefault("notes", {})[f"{dtype}_mamf_split"] = (
                    f"gemm_{dtype}_max {best_max:.1f} is {best_max / held:.3f} of the MAMF-style best shape run back "
                    f"to back for {mamf['best_sustained']['seconds']:.0f} s ({held:.1f} TFLOPS), which is "
                    f"{held / mamf['best']['tflops']:.3f} of its flushed-burst figure: the first ratio is the "
                    "engine's shape choice and harness, the second the chip's power state")
    record["checks"] = checks


def render(record: dict[str, Any]) -> str:
    def fig(value: float | None, unit: str | None) -> str:
        return "-" if value is None else f"{value:.4g} {unit or ''}".strip()
    lines = [f"# Base specs: engine against bare loops, interleaved ({record['device']})", "",
             f"- command: `{record['command']}`", f"- code: {record['code']}",
             f"- when: {record['when']}, host {record['host']}, torch {record['torch']}; "
             f"{record['state']}, wall time {record['wall_s']:.0f} s",
             f"- method: per case {record['pairs_asked']} pairs (engine round, then bare loop), each side a fresh "
             f"process after {record['idle_s']} s idle; the bare loop repeats the engine round's warm-up and timed "
             f"iterations, same timer (host clock between device synchronisations); measuring window "
             f"{record['seconds']} s; headline = median of the pair ratios; > {SUSPICIOUS} flagged", "",
             "| case | metric | pairs | engine median (spread) | bare median (spread) | engine/bare (pairs) | "
             "peak | chip, last engine round | chip, last bare loop | note |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in record["rows"]:
        ratio = "-" if row["ratio"] is None else f"**{row['ratio']:.3f}**" + (" SUSPICIOUS" if row["suspicious"]
                                                                               else "")
        pairs = ", ".join(f"{r:.3f}" for r in row["pair_ratios"])
        lines.append(f"| {row['case']} | {row['metric']} | {row['pairs']} | {fig(row['engine_median'], row['unit'])} "
                     f"({row['engine_spread']}) | {fig(row['bare_median'], row['unit'])} ({row['bare_spread']}) | "
                     f"{ratio} ({pairs}) | {row['peak'] or '-'} | {chip_cells(row['engine_chip'])} | "
                     f"{chip_cells(row['bare_chip'])} | {row['note'] or ''} |")
    if record["mamf"]:
        lines += ["", "Max-achievable reference (MAMF-style):", ""]
        for name, m in record["mamf"].items():
            if m.get("best"):
                b = m["best"]
                lines.append(f"- {name}: best {b['tflops']:.1f} TFLOPS at {b['m']}x{b['k']} @ {b['k']}x{b['n']}, "
                             f"median {m['median_tflops']:.1f} over {m['shapes']} shapes ({m['spent_s']:.0f} s; "
                             f"{m['method']})")
                if m.get("best_sustained"):
                    held = m["best_sustained"]
                    lines.append(f"  - the best shape sustained: {held['tflops']:.1f} TFLOPS over "
                                 f"{held['seconds']:.1f} s ({held['matmuls']} matmuls; {held['method']})")
            else:
                lines.append(f"- {name}: {m.get('error') or m.get('skipped') or 'no shape measured'}")
        lines += [f"- {text}" for text in record.get("notes", {}).values()]
    if record["not_measured"]:
        lines += ["", "Not measured:", ""] + [f"- {c}: {s}" for c, s in record["not_measured"].items()]
    if record["checks"]:
        lines += ["", "Checks" + (" (informational in a --quick CPU run)" if record["quick"] else "") + ":", ""]
        lines += [f"- {'PASS' if ok else 'FAIL'}: {text}" for text, ok in record["checks"]]
    return "\n".join(lines) + "\n"


def write(record: dict[str, Any], out: Path, name: str, began: float) -> None:
    record["wall_s"] = time.perf_counter() - began
    summarise(record)
    out.mkdir(parents=True, exist_ok=True)
    for suffix, text in (("json", json.dumps(record, indent=2, default=str) + "\n"), ("md", render(record))):
        tmp = out / f".{name}.{suffix}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out / f"{name}.{suffix}")


def device_name(device: str) -> str:
    if device == "cpu":
        return platform.processor() or "cpu"
    done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else device


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU smoke run: vendor cpu, tiny sizes")
    parser.add_argument("--vendor", default=None, help="default: nvidia (cpu with --quick)")
    parser.add_argument("--cases", default=None, help=f"comma-separated (default: {','.join(PENDING)}; 'all': "
                        "every base spec)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=None, help="measuring window per figure (default 2; "
                        "0.3 with --quick)")
    parser.add_argument("--sweep-seconds", type=float, default=None, help="BF16 shape search budget (default 10)")
    parser.add_argument("--idle-s", type=float, default=None, help="idle before each side (default 2; 0 --quick)")
    parser.add_argument("--mamf-seconds", type=float, default=None, help="MAMF-style scan per dtype (default 25)")
    parser.add_argument("--budget-s", type=float, default=420, help="stop starting pairs after this many seconds")
    parser.add_argument("--interval", type=float, default=0.2, help="monitor sampling interval, seconds")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--results", type=Path, default=ROOT / "results", help="the engine's run folders")
    parser.add_argument("--bare", help=argparse.SUPPRESS)  # inside the bare process: the work, as JSON
    args = parser.parse_args()
    if args.bare:
        work = json.loads(args.bare)
        print(json.dumps(run_mamf(work) if work.get("mamf") else run_bare(work)))
        return 0

    began = time.perf_counter()
    vendor = args.vendor or ("cpu" if args.quick else "nvidia")
    seconds = args.seconds or (0.3 if args.quick else 2.0)
    sweep_s = args.sweep_seconds or (2.0 if args.quick else 10.0)
    idle_s = args.idle_s if args.idle_s is not None else (0.0 if args.quick else 2.0)
    mamf_s = args.mamf_seconds if args.mamf_seconds is not None else (1.0 if args.quick else 25.0)
    cases = ALL_CASES if args.cases == "all" else (args.cases.split(",") if args.cases else PENDING)
    device = load_vendor(vendor).manifest.torch_device
    name = "base_specs_cpu_quick" if args.quick else "base_specs_gpu"
    run_id = f"base-specs-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}"
    sets = engine_sets(args.quick, seconds, sweep_s, cases)
    plan = plan_run(cases=cases, vendor=vendor, rounds=args.pairs, sets=sets, results_dir=args.results,
                    run_id=run_id)
    import torch  # the version only: this process never touches the device (the capacity rounds need it all)

    record: dict[str, Any] = {
        "device": device_name(device), "host": platform.node(), "torch": torch.__version__, "code": code_identity(),
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "quick": args.quick,
        "command": shlex.join(["python", "bench/base_specs_gpu.py", *sys.argv[1:]]), "seconds": seconds,
        "sweep_s": sweep_s, "idle_s": idle_s, "pairs_asked": args.pairs, "engine_sets": sets,
        "run_dir": str(plan.run_dir), "state": "running", "pairs": {}, "mamf": {}, "not_measured": {},
        "rows": [], "checks": []}
    write(record, args.out, name, began)

    # The max-achievable reference first: its figure must not depend on how long the pairs ran.
    mamf_shapes = {"sizes": [128, 256], "ks": [128, 256], "iterations": 3} if args.quick else \
        {"sizes": [4096, 6144, 8192, 12288, 16384], "ks": [4096, 8192, 16384], "iterations": 20}
    for dtype in ("bf16", "fp8"):
        if dtype == "fp8" and device == "cpu":
            record["mamf"][dtype] = {"skipped": "no FP8 matmul on a CPU"}
            continue
        time.sleep(idle_s)
        sustain_s = max(seconds, 0.5 if args.quick else 5.0)  # an engine window, and long enough to settle
        outcome = bare_round({"mamf": True, "device": device, "dtype": dtype, "seconds": mamf_s,
                              "sustain_s": sustain_s, **mamf_shapes}, timeout=mamf_s + sustain_s + 120)
        record["mamf"][dtype] = outcome
        print(f"MAMF-style {dtype}: {outcome.get('best') or outcome.get('error')}", flush=True)
        write(record, args.out, name, began)

    bare_monitors = start_monitors(vendor, plan.run_dir / "bare", args.interval)
    bare_samples = [plan.run_dir / "bare" / f"monitor_{m.name}.jsonl" for m in load_vendor(vendor).manifest.monitors]
    failed_cases: set[str] = set()
    try:
        # Pair-major (pair 1 of every case, then pair 2 ...): a run cut short by its budget still has every case.
        for pair in range(1, args.pairs + 1):
            for case in plan.cases:
                if case.name in failed_cases:
                    continue
                if time.perf_counter() - began > args.budget_s:
                    record["not_measured"][f"{case.name} pair {pair}"] = f"time budget {args.budget_s:g} s spent"
                    continue
                time.sleep(idle_s)
                result, folder = engine_round(plan, case, pair, vendor, args.interval)
                if result is None or result.status != "success":
                    why = "no result" if result is None else f"{result.status}: " \
                        f"{result.failure.message if result.failure else ''}"
                    record["not_measured"][case.name] = f"{why} (see {folder})"
                    failed_cases.add(case.name)
                    write(record, args.out, name, began)
                    continue
                engine_chip = {m.name: chip_state([read_monitor(p) for p in folder.glob("monitor_*.jsonl")],
                                                  tuple(m.window)) for m in result.metrics if m.window}
                time.sleep(idle_s)
                work = bare_work(result, device) | {"vendor": vendor}
                bare = bare_round(work, timeout=float(case.config.get("timeout_s", 900)))
                for metric in result.metrics:
                    value, window = (bare.get("figures", {}).get(metric.name) or [None, None])
                    bare_chip = chip_state([read_monitor(p) for p in bare_samples if p.is_file()], tuple(window)) \
                        if window and device != "cpu" else None
                    state = engine_chip.get(metric.name) if device != "cpu" else None
                    record["pairs"].setdefault(f"{case.name} / {metric.name}", []).append({
                        "pair": pair, "engine": metric.value, "bare": value, "unit": metric.unit,
                        "iterations": metric.iterations, "error": bare.get("error"),
                        "peak": f"{metric.peak.value:g} {metric.peak.unit}" if metric.peak and metric.peak.value
                        else None,
                        "engine_chip": state.as_dict() if state else None,
                        "bare_chip": bare_chip.as_dict() if bare_chip else None, "note": metric.note})
                    print(f"{case.name} {metric.name} pair {pair}: engine {metric.value:.5g}, bare "
                          f"{value if value is None else f'{value:.5g}'} {metric.unit}"
                          f"{' (' + bare['error'] + ')' if bare.get('error') else ''}", flush=True)
                write(record, args.out, name, began)
    finally:
        stop_monitors(bare_monitors)
    record["state"] = "finished"
    write(record, args.out, name, began)
    print(render(record))
    failed = [text for text, ok in record["checks"] if not ok] if not args.quick else []
    engine_failed = [c for c, s in record["not_measured"].items() if not s.startswith(("unsupported", "time budget"))]
    if engine_failed or failed:
        print(f"base_specs_gpu: FAILED: {len(engine_failed)} case(s) not measured ({', '.join(engine_failed)}), "
              f"{len(failed)} check(s) missed: {'; '.join(failed)}", file=sys.stderr)
        return 1
    print(f"base_specs_gpu: ok in {record['wall_s']:.0f} s; {args.out / name}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
