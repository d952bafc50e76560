"""A generate case round through the whole harness against a bare transformers generate loop of the same work,
interleaved pair by pair.

    python bench/generate_gpu.py                    # GPU host: llama3-8b-generate (bf16, 128/128 tokens), c1 and c32
    python bench/generate_gpu.py --quick            # CPU smoke run: tiny-llama-generate, c1 and c4
    options: --out DIR (where the records go), --budget-s S (no new pair once the next would end past S)

Engine (A): one round of the case through flagperf.entry.run_job in this process (the case's config, prompts,
  engine plug-in, per-token streamer, contract checks, metrics, result.json), with the vendor's monitors
  started around it as a host round starts them (every MONITOR_INTERVAL_S, the flows' default). Its figure
  is output_tokens_per_s@c<N> from result.json: the driver's host clock over the level's timed batches.
Bare (B): the same model (flagperf.generate.models.build_model: preset, precision, seed), the same prompts and
  pad id (the case's own prompt set), the same batches in the same order, the same GenerationConfig
  (flagperf.generate.hf.generation_config), the same warm-up batches per level; model.generate and nothing
  else: no streamer, no monitors, no result. Timed with the same clock over the same region (see TIMER).
Each pair runs A then B, each after the same quiet time (memory released, device synchronised, IDLE_S of
sleep). At least MIN_PAIRS pairs, more while --budget-s allows. Per level: each side's median rate and
spread, the pair ratios, their median (the headline, see HEADLINE_RULE) and the ratio of the medians beside
it. Target: headline >= TARGET; above SUSPICIOUS it is flagged (the harness does the bare loop's work plus
its own, so it cannot be faster: such a ratio is noise or unequal work, not a win). The records
(generate_gpu[_quick].json and .md in --out) are rewritten after every pair, so a run stopped by its time
limit leaves what it measured. Exit 1 when a round fails or the two sides did different work, and on a GPU
when a level misses the target; 0 otherwise (the smoke run's verdict is recorded, not enforced).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import logging
import math
import os
import platform
import shlex
import signal
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()  # the budget counts the imports below (torch, transformers: seconds)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import transformers  # noqa: E402

from bench.monitors import VendorMonitors  # noqa: E402
from bench.paired import write_record  # noqa: E402
from flagperf.config.job import Job  # noqa: E402
from flagperf.config.plan import CasePlan, plan_run  # noqa: E402
from flagperf.config.vendors import load_vendor  # noqa: E402
from flagperf.entry import run_job  # noqa: E402
from flagperf.generate.config import GenerateConfig  # noqa: E402
from flagperf.generate.driver import load_prompts  # noqa: E402
from flagperf.generate.hf import generation_config, left_pad  # noqa: E402
from flagperf.generate.metrics import level_name  # noqa: E402
from flagperf.generate.models import build_model  # noqa: E402
from flagperf.measure.hostmemory import keep_freed_host_memory  # noqa: E402
from flagperf.results.provenance import code_identity, host_info  # noqa: E402
from flagperf.results.schema import read_result  # noqa: E402

log = logging.getLogger("bench.generate")

TARGET = 0.97
SUSPICIOUS = 1.03
MIN_PAIRS, MAX_PAIRS = 3, 9
MONITOR_INTERVAL_S = 1.0  # flows.evaluate's default monitor_interval_s
HEADLINE_RULE = ("the median of the pair ratios, at every level: the two sides of a pair run back to back "
                 "on the machine as it is at that moment (clocks, host load, temperature), so each pair's "
                 "ratio cancels what drifts between pairs, and the median drops an odd pair; the ratio of "
                 "the two sides' medians compares figures taken at different moments and is shown beside it")
TIMER = ("host clock (time.perf_counter) on both sides: the engine's figure is result.json's, which the "
         "driver times on the host from the first timed batch to the return of the last; the bare loop "
         "starts its clock after a device synchronisation and stops it after one. generate copies every "
         "step's tokens to the host, so the host clock waits for the device; on a GPU the bare loop also "
         "records CUDA events around its region, and their time over the host clock's is reported as a check")


@dataclass(frozen=True)
class Setup:
    case: str
    vendor: str
    sets: list[str]
    idle_s: float
    budget_s: float


def setup(quick: bool, budget_s: float | None) -> Setup:
    if quick:  # a 2-layer Llama, a few batches a level: the dry run proves the pairs, its figures are not judged
        return Setup("tiny-llama-generate", "cpu", ["concurrency=[1, 4]", "requests=8", "duration_s=null",
                                                    "warmup_batches=1"], 0.2, budget_s or 150.0)
    # Llama-3-8B shape, the case's 128/128 tokens. requests=1 makes one request at c1 and one batch of 32 at
    # c32 (a level serves whole batches). Eager decoding of this model is host-bound at about 35 ms a step
    # at either level (H100, 2026-11-23), so each timed region is about 4.5 s and a side about 20 s with
    # its build and warm-ups: three pairs in about 150 s.
    return Setup("llama3-8b-generate", "nvidia", ["concurrency=[1, 32]", "requests=1", "duration_s=null",
                                                  "warmup_batches=1"], 2.0, budget_s or 190.0)


@dataclass
class Side:
    """One side's timed figure at one level."""

    tokens: int
    requests: int
    seconds: float
    device_s: float | None = None  # the bare loop's CUDA-event time of the same region (GPU only)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds


@dataclass
class Pair:
    number: int
    engine: dict[int, Side]
    bare: dict[int, Side]
    engine_s: float  # the whole side, build and warm-ups included
    bare_s: float
    device_memory_before: dict[str, int | None]  # bytes still allocated when each side started
    monitors: dict[str, Any]
    engine_latency: dict[int, dict[str, float | None]] = field(default_factory=dict)


class BenchFailure(Exception):
    """A round failed or the two sides did different work: the comparison means nothing."""


class Stopped(BaseException):
    """SIGTERM (the session's time limit): the record says how far the bench got."""


def stop_on_sigterm(signum: int, _frame: object) -> None:
    raise Stopped(f"stopped by signal {signal.Signals(signum).name}")


class Device:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def quiesce(self) -> int | None:
        """Nothing left from the other side: Python's garbage collected, the device's cache released and
        synchronised. Returns the device memory still allocated (should be about zero)."""
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()
            self.sync()
        return torch.cuda.memory_allocated(self.device) if self.cuda else None


# --- A: the engine ------------------------------------------------------------------------------------------


class Monitors(VendorMonitors):
    """The vendor's monitors every MONITOR_INTERVAL_S (a host round's default), for at most an hour, started when
    made."""

    def __init__(self, vendor: str, folder: Path) -> None:
        super().__init__(vendor, folder, MONITOR_INTERVAL_S, max_seconds=3600)
        self.start()


def engine_round(plan: CasePlan, run_id: str, vendor: str, folder: Path, number: int, levels: list[int],
                 idle_s: float) -> tuple[dict[int, Side], dict[int, dict[str, float | None]], dict[str, Any]]:
    folder.mkdir(parents=True)
    job = Job(run_id=run_id, case=plan.name, family=plan.family, round=number, host="localhost", vendor=vendor,
              config=plan.config, config_origins=plan.origins, run_overrides=plan.run_overrides,
              command="bench/generate_gpu.py", image={"status": "none"})
    (folder / "job.json").write_text(job.model_dump_json(), encoding="utf-8")
    monitors = Monitors(vendor, folder)
    try:
        monitors.wait_sampling()
        time.sleep(idle_s)
        code = run_job(job, folder)
    finally:
        monitor_state = monitors.stop()
    result = read_result(folder / "result.json")
    if code != 0 or result.status != "success":
        message = result.failure.message if result.failure else f"exit {code}"
        raise BenchFailure(f"{plan.name} round {number} through run_job: {message.splitlines()[0]}")
    metrics = {m.name: m for m in result.metrics}
    sides: dict[int, Side] = {}
    latency: dict[int, dict[str, float | None]] = {}
    for c in levels:
        rate, per_request = metrics[level_name("output_tokens_per_s", c)], metrics[level_name("requests_per_s", c)]
        sides[c] = Side(tokens=int(rate.iterations or 0), requests=int(per_request.iterations or 0),
                        seconds=float(rate.measured_seconds or 0.0))
        if not math.isclose(sides[c].rate, rate.value, rel_tol=1e-6):
            raise BenchFailure(f"result.json's {rate.name} ({rate.value}) is not its tokens over its seconds")

        def ms(name: str, quantile: str, level: int = c) -> float | None:
            metric = metrics.get(level_name(name, level))
            value = getattr(metric, quantile) if metric else None
            return None if value is None else value * 1e3

        latency[c] = {"ttft_p50_ms": ms("ttft_s", "p50"), "tpot_p50_ms": ms("tpot_s", "p50"),
                      "itl_p99_ms": ms("itl_s", "p99"), "mfu": rate.mfu}
    return sides, latency, monitor_state


# --- B: the bare loop ---------------------------------------------------------------------------------------


def batch_indices(start: int, size: int, count: int) -> list[int]:
    return [(start + i) % count for i in range(size)]


def bare_round(config: GenerateConfig, dev: Device) -> dict[int, Side]:
    """model.generate over the case's batches: per level the warm-up batches, then the timed batches, which
    start again from the first prompt (as the driver serves them); the same requests and tokens."""
    prompts, pad_id = load_prompts(config)
    ids = [p.ids for p in prompts.prompts]
    model = build_model(config.model, config.checkpoint_path, config.precision, dev.device, config.seed)
    gen = generation_config(config.max_new_tokens, pad_id, config.compile)
    assert config.requests is not None  # setup() gives a request count, not a duration
    sides: dict[int, Side] = {}
    with torch.inference_mode():
        for c in config.concurrency:
            for w in range(config.warmup_batches):
                prompt_ids, mask = left_pad([ids[i] for i in batch_indices(w * c, c, len(ids))], pad_id, dev.device)
                model.generate(input_ids=prompt_ids, attention_mask=mask, generation_config=gen)
            batches = [batch_indices(b * c, c, len(ids)) for b in range(math.ceil(config.requests / c))]
            events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if dev.cuda else []
            tokens = requests = 0
            dev.sync()
            if events:
                events[0].record()
            started = time.perf_counter()
            for batch in batches:
                prompt_ids, mask = left_pad([ids[i] for i in batch], pad_id, dev.device)
                out = model.generate(input_ids=prompt_ids, attention_mask=mask, generation_config=gen)
                tokens += (out.shape[1] - prompt_ids.shape[1]) * out.shape[0]
                requests += out.shape[0]
            if events:
                events[1].record()
            dev.sync()
            seconds = time.perf_counter() - started
            sides[c] = Side(tokens=tokens, requests=requests, seconds=seconds,
                            device_s=events[0].elapsed_time(events[1]) / 1e3 if events else None)
    del model
    return sides


# --- the comparison -----------------------------------------------------------------------------------------


def spread(values: list[float]) -> dict[str, float]:
    middle = statistics.median(values)
    return {"median": middle, "min": min(values), "max": max(values), "spread": (max(values) - min(values)) / middle}


def summarise(pairs: list[Pair], levels: list[int]) -> list[dict[str, Any]]:
    rows = []
    for c in levels:
        engine = [p.engine[c].rate for p in pairs]
        bare = [p.bare[c].rate for p in pairs]
        ratios = [e / b for e, b in zip(engine, bare, strict=True)]
        headline = statistics.median(ratios)
        checks = [p.bare[c].device_s / p.bare[c].seconds for p in pairs if p.bare[c].device_s is not None]
        rows.append({
            "concurrency": c, "requests": pairs[-1].engine[c].requests, "output_tokens": pairs[-1].engine[c].tokens,
            "engine_tokens_per_s": spread(engine), "bare_tokens_per_s": spread(bare),
            "pair_ratios": ratios, "median_pair_ratio": headline,
            "ratio_of_medians": statistics.median(engine) / statistics.median(bare),
            "headline": headline, "verdict": "pass" if headline >= TARGET else "fail",
            "suspicious": headline > SUSPICIOUS,
            "bare_device_over_host_time": spread(checks) if checks else None,
            "engine_latency_last_pair": pairs[-1].engine_latency.get(c, {}),
        })
    return rows


def optional_packages(cuda: bool) -> dict[str, str]:
    """What the bench would use if present; a missing one is a reason here, never a crash."""
    found = {name: importlib.util.find_spec(name) is not None for name in ("vllm", "rouge_score")}
    return {
        "vllm": ("not run: this bench compares the hf engine (vLLM has no bare loop of the same work here)"
                 if found["vllm"] else "skipped: package vllm is not installed") if cuda
        else "skipped: vLLM needs a GPU",
        "rouge_score": ("installed; not used: synthetic prompts have no references" if found["rouge_score"]
                        else "skipped: package rouge-score is not installed (synthetic prompts need no ROUGE)"),
    }


def write(folder: Path, record: dict[str, Any]) -> None:
    write_record(folder, "generate_gpu_quick" if record["quick"] else "generate_gpu", record, markdown(record))


def markdown(record: dict[str, Any]) -> str:
    m = record["machine"]
    lines = [f"# generate: {record['case']} through the whole harness vs a bare transformers generate loop", "",
             f"- state: **{record['state']}**; verdict: **{record['verdict']}** (target median pair ratio >= "
             f"{record['target']}, above {record['suspicious_above']} flagged as suspicious)",
             f"- command: `{record['command']}`; recorded {record['recorded']}; {record['total_s']:.0f} s "
             f"(budget {record['budget_s']:.0f} s)",
             f"- code: {record['code']}",
             f"- machine: {m['device']} on {m['host']['hostname']} ({m['host']['cpu_model']}, "
             f"{m['host']['usable_cpus']} usable CPUs); python {m['python']}, torch {m['torch']}, transformers "
             f"{m['transformers']}; host allocator: {m['host_allocator']}; load average (1, 5, 15 min) "
             f"{' / '.join(f'{x:.1f}' for x in m['load_average_at_start'])} at the start"
             + (f", {' / '.join(f'{x:.1f}' for x in m['load_average_at_end'])} at the end"
                if "load_average_at_end" in m else ""),
             f"- work: {record['work']}",
             f"- engine (A): {record['engine_side']}", f"- bare (B): {record['bare_side']}",
             f"- order: {record['order']}", f"- timer: {record['timer']}",
             f"- headline: {record['headline_rule']}",
             "- optional packages: " + "; ".join(f"{k}: {v}" for k, v in record["optional_packages"].items()), ""]
    if record.get("error"):
        lines += [f"**Stopped**: {record['error']}", ""]
    if record["levels"]:
        lines += ["| concurrency | requests | output tokens | engine tokens/s median [min-max] (spread) "
                  "| bare tokens/s median [min-max] (spread) | pair ratios | **median pair ratio** "
                  "| ratio of medians | verdict |", "|---|---|---|---|---|---|---|---|---|"]
        for lv in record["levels"]:
            def rate(s: dict[str, float]) -> str:
                return f"{s['median']:.4g} [{s['min']:.4g}-{s['max']:.4g}] ({100 * s['spread']:.1f} %)"

            flag = f", **suspicious** (> {SUSPICIOUS:.2f})" if lv["suspicious"] else ""
            lines.append(f"| {lv['concurrency']} | {lv['requests']} | {lv['output_tokens']} | "
                         f"{rate(lv['engine_tokens_per_s'])} | {rate(lv['bare_tokens_per_s'])} | "
                         f"{', '.join(f'{r:.3f}' for r in lv['pair_ratios'])} | **{lv['median_pair_ratio']:.3f}** | "
                         f"{lv['ratio_of_medians']:.3f} | {lv['verdict']}{flag} |")
        lines += ["", "| pair | concurrency | engine tokens/s | bare tokens/s | ratio | engine side s | bare side s "
                  "| bare device/host time | device memory at start (engine, bare) | monitors |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for p in record["pairs"]:
            mem = {side: "-" if v is None else f"{v / 2**20:.0f} MiB" for side, v in p["device_memory_before"].items()}
            mons = ", ".join(f"{k} {v['samples']} samples" if v["samples"]
                             else f"{k} failed ({v.get('error', '')})" for k, v in p["monitors"].items())
            for c, e in p["engine"].items():
                b = p["bare"][c]
                er, br = e["tokens"] / e["seconds"], b["tokens"] / b["seconds"]
                check = "-" if b["device_s"] is None else f"{b['device_s'] / b['seconds']:.4f}"
                lines.append(f"| {p['number']} | {c} | {er:.4g} | {br:.4g} | {er / br:.3f} | {p['engine_s']:.1f} | "
                             f"{p['bare_s']:.1f} | {check} | {mem['engine']}, {mem['bare']} | {mons} |")
        lat = [f"c{lv['concurrency']}: " + ", ".join(f"{k} {v:.4g}" for k, v in lv["engine_latency_last_pair"].items()
                                                     if v is not None) for lv in record["levels"]]
        lines += ["", "Engine latencies (last pair, from result.json): " + "; ".join(lat)]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU smoke run: the tiny preset, vendor cpu")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="folder for the records")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no pair past MIN_PAIRS that would end after this many seconds "
                             "(default 190 on a GPU, 150 for --quick)")
    args = parser.parse_args()
    if args.budget_s is not None and args.budget_s <= 0:
        print(f"generate_gpu: --budget-s must be positive, got {args.budget_s:g}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if not args.quick and not torch.cuda.is_available():
        print("generate_gpu: no CUDA device visible to torch; run with --quick for the CPU smoke run", file=sys.stderr)
        return 2
    plan_setup = setup(args.quick, args.budget_s)
    dev = Device(torch.device("cpu" if args.quick else "cuda"))
    if args.quick:
        # One intra-op thread on both sides: on a shared small VM a second thread is descheduled at random and
        # every step waits for it.
        torch.set_num_threads(1)
    # The case process keeps freed host memory for reuse (flagperf.measure.hostmemory); here both sides run
    # in this process, so both get that setting, made before either runs.
    allocator = keep_freed_host_memory()
    work = Path(tempfile.mkdtemp(prefix="bench-generate-"))
    plan = plan_run(cases=[plan_setup.case], vendor=plan_setup.vendor, sets=plan_setup.sets,
                    results_dir=work / "results")
    case_plan = plan.cases[0]
    config = GenerateConfig.model_validate(case_plan.config)
    levels = list(config.concurrency)
    vendor = load_vendor(plan_setup.vendor)
    spec = vendor.spec_table()
    monitor_names = [m.name for m in vendor.manifest.monitors]
    record: dict[str, Any] = {
        "bench": "generate_gpu", "quick": args.quick, "state": "starting", "verdict": "none yet",
        "command": shlex.join(["python", "bench/generate_gpu.py", *sys.argv[1:]]),
        "recorded": datetime.now(timezone.utc).isoformat(timespec="seconds"), "code": code_identity(),
        "machine": {"device": spec.device, "host": host_info(), "python": platform.python_version(),
                    "torch": torch.__version__, "transformers": transformers.__version__,
                    "host_allocator": allocator, "load_average_at_start": os.getloadavg()},
        "case": plan_setup.case, "vendor": plan_setup.vendor, "sets": plan_setup.sets, "config": case_plan.config,
        "work": (f"{config.model} preset, random weights, {config.precision}, {config.input_len} prompt / "
                 f"{config.max_new_tokens} output tokens, greedy, static KV cache, compile {config.compile}; levels "
                 f"{levels}, {config.requests} request(s) a level in whole batches, {config.warmup_batches} "
                 "warm-up batch(es) a level on both sides"),
        "engine_side": ("flagperf.entry.run_job of one case round in this process (model build, prompts, every "
                        "level's warm-up and timed batches through the engine plug-in with its per-token streamer, "
                        f"metrics, result.json), the vendor's monitors ({', '.join(monitor_names)}) sampling every "
                        f"{MONITOR_INTERVAL_S:g} s around it"),
        "bare_side": ("build_model of the same preset/precision/seed, the case's prompts and pad id, the same "
                      "batches, GenerationConfig and warm-up; model.generate only"),
        "order": (f"A then B in every pair, each after the same quiet start (memory released, device synchronised, "
                  f"{plan_setup.idle_s:g} s idle); at least {MIN_PAIRS} pairs, more while the budget allows"),
        "timer": TIMER, "headline_rule": HEADLINE_RULE, "target": TARGET, "suspicious_above": SUSPICIOUS,
        "budget_s": plan_setup.budget_s, "optional_packages": optional_packages(dev.cuda),
        "levels": [], "pairs": [], "total_s": 0.0,
    }
    pairs: list[Pair] = []
    code = 0
    write(args.out, record)
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        while len(pairs) < MAX_PAIRS:
            elapsed = time.perf_counter() - STARTED
            longest = max((p.engine_s + p.bare_s + 2 * plan_setup.idle_s for p in pairs), default=0.0)
            if len(pairs) >= MIN_PAIRS and elapsed + longest > plan_setup.budget_s:
                break
            number = len(pairs) + 1
            # The same quiet start for both sides; the engine's monitors start (and take their first sample)
            # before its idle time, as a host starts them before the case process.
            memory: dict[str, int | None] = {"engine": dev.quiesce()}
            started = time.perf_counter()
            engine, latency, monitors = engine_round(case_plan, plan.run_id, plan_setup.vendor,
                                                     work / f"pair{number}", number, levels, plan_setup.idle_s)
            engine_s = time.perf_counter() - started
            memory["bare"] = dev.quiesce()
            started = time.perf_counter()
            time.sleep(plan_setup.idle_s)
            bare = bare_round(config, dev)
            bare_s = time.perf_counter() - started
            for c in levels:
                if (engine[c].tokens, engine[c].requests) != (bare[c].tokens, bare[c].requests):
                    raise BenchFailure(f"concurrency {c}: the engine served {engine[c].requests} requests, "
                                       f"{engine[c].tokens} tokens; the bare loop {bare[c].requests}, "
                                       f"{bare[c].tokens}: not the same work")
            pairs.append(Pair(number, engine, bare, engine_s, bare_s, memory, monitors, latency))
            for c in levels:
                log.info("pair %d c%d: engine %.2f tokens/s, bare %.2f tokens/s, ratio %.3f", number, c,
                         engine[c].rate, bare[c].rate, engine[c].rate / bare[c].rate)
            record.update(state=f"partial: {len(pairs)} pair(s) so far", levels=summarise(pairs, levels),
                          pairs=[asdict(p) for p in pairs], total_s=time.perf_counter() - STARTED)
            write(args.out, record)
    except BenchFailure as exc:
        record["error"] = str(exc)
        print(f"generate_gpu: {exc}", file=sys.stderr)
        code = 1
    except Stopped as exc:
        record["error"] = f"{exc} after {len(pairs)} pair(s)"
        print(f"generate_gpu: {record['error']}", file=sys.stderr)
        code = 1
    except Exception as exc:  # a crash of either side: recorded with what was measured before it, then shown
        first = str(exc).splitlines()[0] if str(exc) else ""
        record["error"] = f"{type(exc).__name__}: {first} (after {len(pairs)} pair(s))"
        traceback.print_exc()
        code = 1
    levels_out = summarise(pairs, levels) if pairs else []
    failed = [lv["concurrency"] for lv in levels_out if lv["verdict"] == "fail"]
    verdict = "none (stopped)" if code else ("fail" if failed else "pass")
    if levels_out and any(lv["suspicious"] for lv in levels_out):
        verdict += "; suspicious ratio at c" + ", c".join(str(lv["concurrency"]) for lv in levels_out
                                                           if lv["suspicious"])
    if args.quick and not code:
        verdict += " (CPU smoke run: recorded, not enforced)"
    record["machine"]["load_average_at_end"] = os.getloadavg()
    record.update(state=f"stopped: {record['error']}" if code else f"complete: {len(pairs)} pairs", verdict=verdict,
                  levels=levels_out, pairs=[asdict(p) for p in pairs], total_s=time.perf_counter() - STARTED)
    write(args.out, record)
    print(markdown(record))
    if not code and failed and not args.quick:
        print(f"generate_gpu: median pair ratio below {TARGET} at concurrency {', '.join(map(str, failed))}",
              file=sys.stderr)
        code = 1
    return code


if __name__ == "__main__":
    raise SystemExit(main())
