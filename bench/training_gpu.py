"""Training on one GPU through the harness against a bare loop of the same model and settings, in interleaved pairs.

    python bench/training_gpu.py [--budget-s 200] [--pairs 3] [--eager] [--out bench/results]   # GPU host
    (three pairs of both models: about 190 s on an H200, most of it the harness's process start per round)
    python bench/training_gpu.py --quick                                                        # CPU smoke run

1. Llama-3.2-1B's shape (llama-pretrain, model=llama-3.2-1b), bf16 autocast over fp32 weights, fused AdamW,
   SDPA attention, each decoder layer torch.compiled (--eager for none), synthetic tokens.
2. ResNet-50 at batch 256, channels-last, bf16 autocast, fused SGD, synthetic images on the GPU (eager).
Each pair: one round through the harness (flagperf.entry.run_job: the launcher, the worker process and the
driver, a fresh process as a round runs it), then one timed segment of the bare loop (transformers' model, the
batches resident on the device, nothing else). The bare loops run in one process per model, started (and
compiled) before the first pair, which also fills Inductor's cache for the harness's compiles; each segment
empties the allocator's cache first, as a fresh process starts without one. Both sides are measured alike: the
same warm-up steps, the same timed steps between two device synchronisations read by the host clock (the
driver's timer: flagperf.training.driver), the loss read back at the same steps (the driver's STEP_END), and the
same idle sleep before each side (the harness's process start-up adds its own idle before its warm-up).
Reported per side: the median over the pairs and the spread (min-max); per model: the median of the pair ratios.
MFU = (6 x N + 12 x layers x hidden x seq) FLOPs per token x tokens/s / the datasheet bf16 peak.

Targets (issue 25): harness / bare >= 0.97 for both models, Llama MFU through the harness >= 40 %; a median
ratio above 1.03 is flagged as suspicious. The records (training_gpu.json and .md, training_gpu_quick.* with
--quick) are rewritten after every pair; a pair starts only if the time the model's previous pair took still
fits in --budget-s. Exits 1 when a run fails, 2 with --strict when a target is missed, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.paired import (  # noqa: E402
    PARITY,
    SUSPICIOUS,
    Budget,
    bench_identity,
    budget_phrase,
    command_line,
    compare,
    machine,
    outcome_lines,
    rate_cell,
    ratio_cell,
    spread,
    too_few,
    verdict,
    write_record,
)

PAIRS = 3
MFU_MIN = 0.40
LOG_FREQ = 10
IDLE_S = {"gpu": 0.5, "cpu": 0.2}  # the sleep before each side, the device synchronised
MARK = "BENCH-BARE "  # the bare process's answers on its stdout (anything else there is a library's chatter)


# -- the bare loops (one process per model: `--bare-server KIND SETTINGS_JSON`, segments asked on stdin) --------
class Setup:
    """A model, its optimizer and resident batches; ``step(i)`` runs training step i and returns its loss."""

    device: Any
    items_per_step: int
    extra: dict[str, Any]

    def step(self, i: int) -> Any:
        raise NotImplementedError


BARE_SETUP_LIMIT_S = 900.0  # imports, model, compile of a bare loop's process


class LlamaSetup(Setup):
    def __init__(self, s: dict[str, Any]) -> None:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        from flagperf.training.shapes import LLAMA_PRESETS, llama_config_kwargs, matmul_parameters

        self.device = device = torch.device(s["device"])
        shape = LLAMA_PRESETS[s["model"]]
        torch.manual_seed(0)
        with device:
            self.model = LlamaForCausalLM(LlamaConfig(**llama_config_kwargs(shape, s["seq"])))
        self.model.train()
        parameters = matmul_parameters(self.model)
        fused = {"fused": True} if device.type == "cuda" else {}
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-4, **fused)
        if s["compile"]:  # each decoder layer, as the harness's driver does (regional compilation)
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            for layer in self.model.model.layers:
                layer.compile()
        self.dtype = torch.bfloat16 if s["precision"] == "bf16" else torch.float32
        g = torch.Generator(device=device).manual_seed(0)
        self.batches = [torch.randint(0, shape.vocab_size, (s["batch"], s["seq"]), device=device, generator=g)
                        for _ in range(4)]
        self.items_per_step = s["batch"] * s["seq"]  # tokens
        self.extra = {"parameters": parameters,
                      "flops_per_token": 6.0 * parameters + 12.0 * shape.num_layers * shape.hidden_size * s["seq"]}

    def step(self, i: int) -> Any:
        import torch

        batch = self.batches[i % len(self.batches)]
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            loss = self.model(input_ids=batch, labels=batch, use_cache=False).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss


class ResNetSetup(Setup):
    def __init__(self, s: dict[str, Any]) -> None:
        import torch
        from transformers import ResNetConfig, ResNetForImageClassification

        from flagperf.training.shapes import RESNET_PRESETS

        self.device = device = torch.device(s["device"])
        shape = RESNET_PRESETS[s["model"]]
        torch.manual_seed(0)
        with device:
            model = ResNetForImageClassification(ResNetConfig(
                embedding_size=shape.embedding_size, depths=list(shape.depths),
                hidden_sizes=list(shape.hidden_sizes), layer_type=shape.layer_type, num_labels=1000))
        self.model = model.to(memory_format=torch.channels_last).train()
        fused = {"fused": True} if device.type == "cuda" else {}
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, **fused)
        self.dtype = torch.bfloat16 if s["precision"] == "bf16" else torch.float32
        g = torch.Generator(device=device).manual_seed(0)
        self.images = [torch.randn(s["batch"], 3, s["crop"], s["crop"], device=device, generator=g
                                   ).contiguous(memory_format=torch.channels_last) for _ in range(2)]
        self.labels = [torch.randint(0, 1000, (s["batch"],), device=device, generator=g) for _ in range(2)]
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.items_per_step = s["batch"]  # images
        self.extra = {}

    def step(self, i: int) -> Any:
        import torch

        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            loss = self.loss_fn(self.model(pixel_values=self.images[i % 2]).logits, self.labels[i % 2])
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss


def segment(setup: Setup, warmup: int, steps: int, idle_s: float) -> dict[str, Any]:
    """An idle sleep, ``warmup`` steps, a device synchronisation, ``steps`` steps (the loss read back where the
    driver's STEP_END reads it: step 1 and every LOG_FREQ), a synchronisation: the rate between the two."""
    import torch

    cuda = setup.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    if cuda:  # a fresh process's allocator: its warm-up steps fill the cache again
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    time.sleep(idle_s)
    for i in range(warmup + steps):
        if i == warmup:
            sync()
            started = time.perf_counter()
        loss = setup.step(i)
        if i == 0 or (i + 1) % LOG_FREQ == 0:
            float(loss.detach())
    sync()
    seconds = time.perf_counter() - started
    return {"rate": setup.items_per_step * steps / seconds, "seconds": seconds,
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}


def bare_server(kind: str, settings: dict[str, Any]) -> int:
    """Build the model once, warm it (compiles), say READY, then answer one segment per line of stdin."""
    import torch

    from flagperf.entry import watch_parent
    from flagperf.measure.hostmemory import keep_freed_host_memory

    watch_parent()  # a bench stopped midway (its time limit) leaves no bare loop running on the device
    keep_freed_host_memory()  # as the harness's training processes do
    if settings["device"] == "cpu":
        torch.set_num_threads(1)  # as the harness's cpu_threads=1 in --quick
    started = time.perf_counter()
    setup: Setup = LlamaSetup(settings) if kind == "llama" else ResNetSetup(settings)
    segment(setup, settings["warmup"], 1, 0.0)  # compiles, the optimizer's state, the allocator
    answer({"ready": True, "setup_s": time.perf_counter() - started, "machine": machine(settings["device"]),
            **setup.extra})
    for line in sys.stdin:
        ask = json.loads(line)
        answer(segment(setup, ask["warmup"], ask["steps"], ask["idle_s"]))
    return 0


def answer(value: dict[str, Any]) -> None:
    sys.stdout.write(MARK + json.dumps(value) + "\n")
    sys.stdout.flush()


class RunFailed(Exception):
    pass


class BareProcess:
    """The main side of a bare server: start it, wait for READY, ask for segments (each with a deadline)."""

    def __init__(self, kind: str, settings: dict[str, Any], log_path: Path) -> None:
        self.kind, self.log_path = kind, log_path
        self._log = log_path.open("w")
        self.proc = subprocess.Popen([sys.executable, __file__, "--bare-server", kind, json.dumps(settings)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     cwd=ROOT)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()
        self.ready: dict[str, Any] | None = None

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            if line.startswith(MARK):
                self.lines.put(line[len(MARK):])
        self.lines.put(None)  # the process closed its output: it ended

    def receive(self, timeout_s: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=max(1.0, timeout_s))
        except queue.Empty:
            self.close()
            raise RunFailed(f"the bare {self.kind} loop gave no answer within {timeout_s:.0f} s") from None
        if line is None:
            code = self.proc.wait()
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RunFailed(f"the bare {self.kind} loop exited {code}:\n{tail}")
        return json.loads(line)

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        self.ready = self.receive(timeout_s)
        return self.ready

    def segment(self, warmup: int, steps: int, idle_s: float, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"warmup": warmup, "steps": steps, "idle_s": idle_s}) + "\n")
        self.proc.stdin.flush()
        return self.receive(timeout_s)

    def close(self) -> None:
        if self.proc.poll() is None:
            if self.proc.stdin:
                self.proc.stdin.close()  # end of its requests: it exits
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


# -- the harness -------------------------------------------------------------------------------------------
def harness(case: str, vendor: str, sets: list[str], work: Path) -> dict[str, Any]:
    from flagperf.config.job import Job
    from flagperf.config.plan import plan_run
    from flagperf.entry import run_job
    from flagperf.measure.perflog import parse_file
    from flagperf.results.schema import read_result

    started = time.perf_counter()
    plan = plan_run(cases=[case], vendor=vendor, results_dir=work / "plans", sets=sets)
    cp = plan.cases[0]
    job = Job(run_id="bench", case=cp.name, family=cp.family, round=1, host="localhost", vendor=vendor,
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})
    out = work / case
    out.mkdir(parents=True)
    (out / "job.json").write_text(job.model_dump_json())
    code = run_job(job, out)
    result = read_result(out / "result.json")
    if code != 0:
        log = (out / "rank0.out.log").read_text(errors="replace")[-3000:] if (out / "rank0.out.log").is_file() else ""
        raise RunFailed(f"the harness run of {case} exited {code}: {result.failure}\n{log}")
    finished = parse_file(out / "rank0.out.log").finished()[0]
    metrics = {m.name: m for m in result.metrics}
    return {"metrics": {k: m.value for k, m in metrics.items()}, "mfu": next(
        (m.mfu for m in result.metrics if m.mfu is not None), None), "extra": finished["extra"],
            "steps": finished["steps"], "seconds": time.perf_counter() - started}


# -- pairs ----------------------------------------------------------------------------------------------------
@dataclass
class Model:
    """One comparison series: a training case through the harness against its bare loop."""

    name: str
    case: str
    kind: str  # the bare loop: llama or resnet
    sets: list[str]
    settings: dict[str, Any]  # the bare loop's
    rate_key: str  # the harness's metric
    unit: str
    warmup: int
    steps: int
    bare: BareProcess | None = None
    pairs: list[dict[str, Any]] = field(default_factory=list)
    stopped: str | None = None
    failed: str | None = None
    compile_failure: str | None = None

    def estimate_s(self) -> float:
        return self.pairs[-1]["seconds"] if self.pairs else 0.0


def run_pair(model: Model, number: int, vendor: str, work: Path, idle_s: float) -> dict[str, Any]:
    assert model.bare is not None
    started = time.perf_counter()
    time.sleep(idle_s)  # the device is idle here (this process does not use it): the same sleep as the bare's
    h = harness(model.case, vendor, model.sets, work / f"{model.name}-pair{number}")
    timeout = max(60.0, 3 * (model.pairs[-1]["bare"]["segment_s"] if model.pairs else 60.0))
    asked = time.perf_counter()
    b = model.bare.segment(model.warmup, model.steps, idle_s, timeout)
    b["segment_s"] = time.perf_counter() - asked
    pair = {"pair": number, "harness": {"rate": h["metrics"][model.rate_key], "mfu": h["mfu"],
                                        "peak_memory_gib": h["metrics"].get("peak_memory"),
                                        "steps": h["steps"], "round_s": h["seconds"], "metrics": h["metrics"]},
            "bare": b, "harness_extra": h["extra"], "seconds": time.perf_counter() - started}
    print(f"{model.name} pair {number}: harness {pair['harness']['rate']:.6g}, bare {b['rate']:.6g} {model.unit} "
          f"({pair['seconds']:.1f} s)", flush=True)
    return pair


def summary(model: Model, peak_flops: float | None, judged: bool) -> dict[str, Any]:
    h_rates = [p["harness"]["rate"] for p in model.pairs]
    b_rates = [p["bare"]["rate"] for p in model.pairs]
    out: dict[str, Any] = {"rate": compare(h_rates, b_rates, PARITY, judged)}
    h_mfu = [p["harness"]["mfu"] for p in model.pairs if p["harness"]["mfu"] is not None]
    out["harness_mfu"] = spread(h_mfu)
    ready = model.bare.ready if model.bare else None
    flops = ready.get("flops_per_token") if ready else None
    out["bare_mfu"] = spread([r * flops / peak_flops for r in b_rates]) if flops and peak_flops else spread([])
    out["harness_peak_memory_gib"] = spread([p["harness"]["peak_memory_gib"] for p in model.pairs
                                             if p["harness"]["peak_memory_gib"] is not None])
    out["bare_peak_memory_gib"] = spread([p["bare"]["peak_memory_gib"] for p in model.pairs
                                          if p["bare"]["peak_memory_gib"] is not None])
    return out


def problems(models: list[Model], peak_flops: float | None, quick: bool) -> tuple[list[str], list[str]]:
    """(targets missed, suspicious ratios). A few steps on a shared CPU say nothing about the harness's cost:
    --quick judges nothing but whether both sides ran the same model."""
    missed: list[str] = []
    suspicious: list[str] = []
    for m in models:
        if not m.pairs:
            continue
        s = summary(m, peak_flops, not quick)
        extra = m.pairs[0]["harness_extra"]
        flops = m.bare.ready.get("flops_per_token") if m.bare and m.bare.ready else None
        if flops is not None and extra.get("flops_per_token") != flops:
            missed.append(f"{m.name}: the harness counts {extra.get('flops_per_token')} FLOPs per token, the bare "
                          f"loop {flops}: not the same model")
        if quick:
            continue
        r = s["rate"]
        if r["passed"] is False:
            missed.append(f"{m.name}: harness / bare {r['ratio_median']:.3f} < {PARITY}")
        if r["suspicious"]:
            suspicious.append(f"{m.name}: harness / bare {r['ratio_median']:.3f} > {SUSPICIOUS}")
        if m.kind == "llama" and (s["harness_mfu"]["median"] or 0) < MFU_MIN:
            missed.append(f"{m.name}: MFU through the harness {100 * (s['harness_mfu']['median'] or 0):.1f} % "
                          f"< {100 * MFU_MIN:.0f} %")
    return missed, suspicious


def pct(x: float | None) -> str:
    return f"{100 * x:.1f} %" if x is not None else "-"


def gib(x: float | None) -> str:
    return f"{x:.1f}" if x is not None else "-"


def markdown(rec: dict[str, Any]) -> str:
    m = rec["machine"]
    s = rec["settings"]
    state = "finished" if rec["finished"] else "**partial** (still running, or stopped)"
    lines = [f"# Training on one device: harness against a bare loop{' (CPU smoke run)' if rec['quick'] else ''}",
             "",
             f"Recorded {rec['recorded']} ({state}, {rec['elapsed_s']:.0f} s from the process's start, budget "
             f"{budget_phrase(s['budget_s'])}) with `{rec['command']}`; code "
             f"{rec['code']}, bench {', '.join(f'{k} {v}' for k, v in rec['bench'].items())}; machine "
             f"{m.get('device', '-')}, driver {m.get('driver', '-')}, torch {m.get('torch', '-')} "
             f"(CUDA {m.get('cuda', '-')}), host {m.get('host', '-')}. Peak {s['precision']}: "
             f"{rec['peak']['tflops'] or '-'} TFLOPS ({rec['peak']['source'] or 'none'}).", "",
             f"Method: {s['pairs']} interleaved pairs per model (a harness round through flagperf.entry.run_job, "
             f"then a segment of the bare loop's process), the models taking turns; the same warm-up and timed "
             f"steps on both sides, timed by the host clock between two device synchronisations (the driver's "
             f"timer), the loss read back at step 1 and every {LOG_FREQ}; {s['idle_s']:g} s idle before each side. "
             "Rates: median (min-max) over the pairs; ratio: median (min-max) of the pair ratios; a median ratio "
             f"above {SUSPICIOUS} is flagged as suspicious.", ""]
    for name, entry in rec["models"].items():
        lines += [f"## {name}", "", entry["description"], ""]
        lines.append(f"{entry['pairs_done']} of {s['pairs']} pairs, {entry['warmup']} warm-up and {entry['steps']} "
                     "timed steps each" + (f"; stopped: {entry['stopped']}" if entry["stopped"] else "")
                     + (f"; **FAILED**: {entry['failed']}" if entry["failed"] else "")
                     + ("; the compiled run failed, measured eager (compile_failure in the JSON)"
                        if entry["compile_failure"] else ""))
        lines.append("")
        if "summary" not in entry:
            continue
        su = entry["summary"]
        r = su["rate"]
        lines += [f"| | {entry['unit']}, median (min-max) | MFU, median | peak memory (GiB), median |",
                  "|---|---|---|---|",
                  f"| harness | {rate_cell(r['engine'])} | {pct(su['harness_mfu']['median'])} | "
                  f"{gib(su['harness_peak_memory_gib']['median'])} |",
                  f"| bare loop | {rate_cell(r['bare'])} | {pct(su['bare_mfu']['median'])} | "
                  f"{gib(su['bare_peak_memory_gib']['median'])} |",
                  f"| harness / bare | {ratio_cell(r)} | | |", "",
                  f"Verdict (harness / bare >= {PARITY}): {verdict(r)}", ""]
    if rec["quick"] and not rec["missed"]:
        lines.append("Smoke run: both paths ran the same model; ratios and MFU are not judged on a shared CPU.")
    else:
        lines += outcome_lines(rec)
    lines += [""] + [f"**Suspicious** (harness above its bare loop): {x}" for x in rec["suspicious"]]
    lines += [f"**Failed**: {x}" for x in rec["failed"]]
    lines += [f"**Too few pairs**: {x}" for x in rec.get("too_few_pairs", [])]
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU smoke run: tiny presets, a few steps")
    parser.add_argument("--strict", action="store_true", help="exit 2 when a target is missed")
    parser.add_argument("--eager", action="store_true", help="no torch.compile (by default each Llama decoder "
                        "layer is compiled, harness and bare alike; a compile failure falls back to eager)")
    parser.add_argument("--batch", type=int, default=6, help="Llama sequences per step (8 comes near 80 GB with "
                        "fp32 master weights: the loss's fp32 logits take 1 GiB per sequence of 2048, several times)")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=12, help="timed Llama steps per pair")
    parser.add_argument("--warmup", type=int, default=5, help="warm-up steps per pair, both models")
    parser.add_argument("--resnet-batch", type=int, default=256)
    parser.add_argument("--resnet-steps", type=int, default=20, help="timed ResNet-50 steps per pair")
    parser.add_argument("--pairs", type=int, default=PAIRS, help="interleaved pairs per model (at least 3 to judge)")
    parser.add_argument("--budget-s", type=float, default=None, help="stop pairing when the next pair would not "
                        "end within this many seconds of the start (default: no limit)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="folder for the records")
    parser.add_argument("--bare-server", nargs=2, help=argparse.SUPPRESS)  # internal: KIND SETTINGS_JSON
    args = parser.parse_args()
    if args.bare_server:
        return bare_server(args.bare_server[0], json.loads(args.bare_server[1]))

    budget = Budget(args.budget_s)
    if args.quick:
        vendor, device, llama_model, resnet_model, precision = "cpu", "cpu", "tiny", "tiny", "bf16"
        batch, seq, steps, warmup, r_batch, r_steps = 4, 64, 6, 2, 8, 4
    else:
        vendor, device, llama_model, resnet_model, precision = "nvidia", "cuda", "llama-3.2-1b", "resnet50", "bf16"
        batch, seq, steps, warmup = args.batch, args.seq, args.steps, args.warmup
        r_batch, r_steps = args.resnet_batch, args.resnet_steps
    idle_s = IDLE_S["cpu" if args.quick else "gpu"]
    from flagperf.config.vendors import load_vendor
    from flagperf.results.provenance import code_identity

    spec = load_vendor(vendor).spec_table()
    peak = spec.peaks.get(precision)
    peak_flops = peak.value * 1e12 if peak is not None and peak.value else None
    common = [f"precision={precision}", f"warmup_steps={warmup}", "max_epochs=1", f"log_freq={LOG_FREQ}",
              *(["cpu_threads=1"] if args.quick else [])]
    # Enough sequences that one epoch (after the 10 % held out for evaluation) has every step.
    sequences = int((warmup + steps + 2) * batch / 0.9) + batch
    compiled = not args.eager
    llama_settings = {"device": device, "model": llama_model, "seq": seq, "batch": batch, "warmup": warmup,
                      "precision": precision, "compile": compiled}
    llama = Model(
        "llama", "llama-pretrain", "llama",
        [f"model={llama_model}", f"seq_len={seq}", f"batch_size={batch}", f"synthetic_sequences={sequences}",
         *common, f"max_steps={warmup + steps}", *(["compile=true"] if compiled else [])],
        llama_settings, "tokens_per_s", "tokens/s", warmup, steps)
    resnet = Model(
        "resnet50", "resnet50", "resnet",
        [f"model={resnet_model}", f"batch_size={r_batch}", "channels_last=true",
         f"synthetic_images={(r_steps + warmup + 1) * r_batch}", *common, f"max_steps={warmup + r_steps}"],
        {"device": device, "model": resnet_model, "batch": r_batch, "crop": 224, "warmup": warmup,
         "precision": precision, "compile": False}, "training_throughput", "images/s", warmup, r_steps)
    models = [llama, resnet]
    descriptions = {
        "llama": f"Llama ({llama_model} shape), sequence {seq}, batch {batch}, {precision} autocast over fp32 "
                 "weights, AdamW fused, SDPA attention, torch.compile {compile}.",
        "resnet50": f"ResNet-50 ({resnet_model} shape), batch {r_batch}, channels-last, {precision} autocast, SGD "
                    "fused, synthetic images on the device, eager.",
    }
    name = "training_gpu_quick" if args.quick else "training_gpu"
    header = {"command": command_line(), "code": code_identity(),
              "bench": bench_identity(Path(__file__), ROOT / "bench" / "paired.py"), "quick": args.quick,
              "peak": {"key": precision, "tflops": peak.value if peak else None,
                       "source": peak.source if peak else None},
              "settings": {"pairs": args.pairs, "budget_s": args.budget_s, "idle_s": idle_s, "precision": precision,
                           "log_freq": LOG_FREQ, "timer": "host clock (time.perf_counter) between two device "
                           "synchronisations, both sides"},
              "targets": {"parity": PARITY, "suspicious_above": SUSPICIOUS, "llama_mfu": MFU_MIN}}
    machine_info: dict[str, Any] = {"device": spec.device}

    def save(finished: bool = False) -> dict[str, Any]:
        missed, suspicious = problems(models, peak_flops, args.quick)
        entries = {}
        for m in models:
            entry: dict[str, Any] = {
                "case": m.case, "sets": m.sets, "unit": m.unit, "warmup": m.warmup, "steps": m.steps,
                "description": descriptions[m.name].format(
                    compile="of each decoder layer" if m.settings.get("compile") else "off"),
                "bare_settings": m.settings, "bare_ready": m.bare.ready if m.bare else None,
                "pairs_done": len(m.pairs), "stopped": m.stopped, "failed": m.failed,
                "compile_failure": m.compile_failure, "pairs": m.pairs}
            if m.pairs:
                entry["summary"] = summary(m, peak_flops, not args.quick)
            entries[m.name] = entry
        rec = {**header, "machine": machine_info, "recorded": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "finished": finished, "elapsed_s": budget.elapsed(), "models": entries, "missed": missed,
               "suspicious": suspicious, "failed": [f"{m.name}: {m.failed}" for m in models if m.failed],
               "too_few_pairs": [x for m in models if finished and (x := too_few(m.name, len(m.pairs), args.pairs))]}
        write_record(args.out, name, rec, markdown(rec))
        return rec

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)

        def start(m: Model) -> None:
            m.bare = BareProcess(m.kind, m.settings, work / f"bare-{m.name}.log")

        def ready(m: Model) -> None:
            assert m.bare is not None
            # A hang guard, not the budget: the budget decides which pairs start, never whether setup may end
            # (a budget shorter than one compile used to fail the run with a negative wait).
            info = m.bare.wait_ready(BARE_SETUP_LIMIT_S)
            machine_info.update(info.get("machine", {}))
            print(f"{m.name}: bare loop ready ({info['setup_s']:.1f} s, compile included)", flush=True)

        # The bare processes start together (imports, model, compile: untimed, and before any harness round).
        for m in models:
            start(m)
        for m in models:
            try:
                ready(m)
            except RunFailed as exc:
                if m.kind != "llama" or not m.settings["compile"]:
                    m.failed = str(exc)
                    continue
                fall_back_to_eager(m, str(exc))
                try:
                    start(m)
                    ready(m)
                except RunFailed as again:
                    m.failed = str(again)
        save()
        try:
            for number in range(1, args.pairs + 1):
                for m in models:
                    if m.failed or m.stopped:
                        continue
                    if not budget.fits(m.estimate_s()):
                        m.stopped = (f"budget: pair {number} (about {m.estimate_s():.0f} s) would end after "
                                     f"{args.budget_s:g} s")
                        print(f"{m.name}: {m.stopped}", flush=True)
                        continue
                    try:
                        m.pairs.append(run_pair(m, number, vendor, work, idle_s))
                    except RunFailed as exc:
                        if number == 1 and m.kind == "llama" and m.settings["compile"]:
                            # Say so, and measure eager instead (harness and bare alike).
                            fall_back_to_eager(m, str(exc))
                            try:
                                start(m)
                                ready(m)
                                m.pairs.append(run_pair(m, number, vendor, work, idle_s))
                            except RunFailed as again:
                                m.failed = str(again)
                        else:
                            m.failed = str(exc)
                    if m.failed:
                        print(f"FAILED: {m.name}: {m.failed}", file=sys.stderr)
                    save()
        finally:
            for m in models:
                if m.bare:
                    m.bare.close()
        rec = save(finished=True)
    print(markdown(rec))
    if rec["failed"]:
        return 1
    if rec["missed"]:
        print("TARGETS MISSED: " + "; ".join(rec["missed"]), file=sys.stderr)
        return 2 if args.strict else 0
    return 0


def fall_back_to_eager(m: Model, failure: str) -> None:
    """A compiled Llama that fails (harness or bare) is measured eager on both sides, and the failure kept."""
    print(f"compiled Llama failed, measuring eager instead:\n{failure[-2000:]}", file=sys.stderr)
    m.compile_failure = failure[-2000:]
    if m.bare:
        m.bare.close()
        m.bare = None
    m.settings = {**m.settings, "compile": False}
    m.sets = [s for s in m.sets if s != "compile=true"]


if __name__ == "__main__":
    sys.exit(main())
