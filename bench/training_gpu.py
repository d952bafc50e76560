"""Training on one GPU through the harness against a bare loop of the same model and settings.

    python bench/training_gpu.py [--eager] [--batch 4] [--seq 2048] [--steps 30] [--out bench/results]
    python bench/training_gpu.py --quick          # CPU smoke run: the tiny preset, seconds

1. Llama-3.2-1B's shape (llama-pretrain, model=llama-3.2-1b), bf16 autocast over fp32 weights, fused AdamW,
   SDPA attention (flash on an H100), each decoder layer torch.compiled (RMSNorm, rotary and SwiGLU fused;
   --eager for none), synthetic tokens: the harness (flagperf.entry.run_job, the launcher's
   worker process and the driver, as a round runs it) and a bare loop (a fresh process: transformers'
   LlamaForCausalLM, the batch resident on the GPU, nothing else). Both skip the same warm-up steps, time the
   same number of steps between two device synchronisations and read the loss every log_freq steps.
   MFU = (6 x N + 12 x layers x hidden x seq) FLOPs per token x tokens/s / the datasheet bf16 peak, N the
   parameters in matrix products (the tied embedding table once, as the output head).
2. ResNet-50 at batch 256, channels-last, bf16 autocast, fused SGD, synthetic images on the GPU: images/s,
   harness and bare loop the same way.

Pass criteria (exit 1 with the reason otherwise): harness / bare >= 0.95 for both models, Llama MFU >= 40 %.
Writes bench/results/training_gpu.json and .md (training_gpu_quick.* with --quick).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RATIO_MIN = 0.95
MFU_MIN = 0.40
LOG_FREQ = 10


# -- the bare loops (run in a fresh process each: `--bare llama|resnet SETTINGS_JSON`) ----------------------
def bare_llama(s: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from flagperf.training.shapes import LLAMA_PRESETS, llama_config_kwargs, matmul_parameters

    device = torch.device(s["device"])
    if device.type == "cpu":
        torch.set_num_threads(1)  # as the harness's cpu_threads=1 in --quick
    shape = LLAMA_PRESETS[s["model"]]
    torch.manual_seed(0)
    with device:
        model = LlamaForCausalLM(LlamaConfig(**llama_config_kwargs(shape, s["seq"])))
    model.train()
    parameters = matmul_parameters(model)
    fused = {"fused": True} if device.type == "cuda" else {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, **fused)
    if s["compile"]:  # each decoder layer, as the harness's driver does (regional compilation)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        for layer in model.model.layers:
            layer.compile()
    step_fn = model
    dtype = torch.bfloat16 if s["precision"] == "bf16" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    batches = [torch.randint(0, shape.vocab_size, (s["batch"], s["seq"]), device=device, generator=g)
               for _ in range(4)]
    seconds = _timed_loop(s, device, lambda i: _lm_step(step_fn, optimizer, batches[i % 4], device, dtype))
    tokens = s["batch"] * s["seq"] * s["steps"]
    return {"tokens_per_s": tokens / seconds, "seconds": seconds, "parameters": parameters,
            "flops_per_token": 6.0 * parameters + 12.0 * shape.num_layers * shape.hidden_size * s["seq"],
            "peak_memory_gib": _peak_gib(device)}


def _lm_step(model: Any, optimizer: Any, batch: Any, device: Any, dtype: Any) -> Any:
    import torch

    with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def bare_resnet(s: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    from flagperf.training.shapes import RESNET_PRESETS

    device = torch.device(s["device"])
    if device.type == "cpu":
        torch.set_num_threads(1)  # as the harness's cpu_threads=1 in --quick
    shape = RESNET_PRESETS[s["model"]]
    torch.manual_seed(0)
    with device:
        model = ResNetForImageClassification(ResNetConfig(
            embedding_size=shape.embedding_size, depths=list(shape.depths), hidden_sizes=list(shape.hidden_sizes),
            layer_type=shape.layer_type, num_labels=1000))
    model = model.to(memory_format=torch.channels_last).train()
    fused = {"fused": True} if device.type == "cuda" else {}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, **fused)
    step_fn = model
    dtype = torch.bfloat16 if s["precision"] == "bf16" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    images = [torch.randn(s["batch"], 3, s["crop"], s["crop"], device=device, generator=g
                          ).contiguous(memory_format=torch.channels_last) for _ in range(2)]
    labels = [torch.randint(0, 1000, (s["batch"],), device=device, generator=g) for _ in range(2)]
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(i: int) -> Any:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = loss_fn(step_fn(pixel_values=images[i % 2]).logits, labels[i % 2])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    seconds = _timed_loop(s, device, step)
    return {"images_per_s": s["batch"] * s["steps"] / seconds, "seconds": seconds,
            "peak_memory_gib": _peak_gib(device)}


def _timed_loop(s: dict[str, Any], device: Any, step: Any) -> float:
    """warmup steps, a device synchronisation, `steps` steps (the loss read every LOG_FREQ, as the driver's
    STEP_END does), a synchronisation: the seconds between the two."""
    import torch

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for i in range(s["warmup"]):
        step(i)
    sync()
    started = time.perf_counter()
    for i in range(s["steps"]):
        loss = step(s["warmup"] + i)
        if (s["warmup"] + i + 1) % LOG_FREQ == 0:
            float(loss.detach())
    sync()
    return time.perf_counter() - started


def _peak_gib(device: Any) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


# -- the harness -------------------------------------------------------------------------------------------
class RunFailed(Exception):
    pass


def harness(case: str, vendor: str, sets: list[str], work: Path) -> dict[str, Any]:
    from flagperf.config.job import Job
    from flagperf.config.plan import plan_run
    from flagperf.entry import run_job
    from flagperf.measure.perflog import parse_file
    from flagperf.results.schema import read_result

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
            "steps": finished["steps"], "config": cp.config}


def run_bare(kind: str, settings: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--bare", kind, json.dumps(settings)], capture_output=True,
                         text=True, cwd=ROOT)
    if out.returncode != 0:
        raise RunFailed(f"the bare {kind} loop exited {out.returncode}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU smoke run: tiny presets, a few steps")
    parser.add_argument("--eager", action="store_true", help="no torch.compile (by default each Llama decoder "
                        "layer is compiled, harness and bare alike; a compile failure falls back to eager)")
    parser.add_argument("--batch", type=int, default=6, help="Llama sequences per step (8 comes near 80 GB with "
                        "fp32 master weights: the loss's fp32 logits take 1 GiB per sequence of 2048, several times)")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--resnet-batch", type=int, default=256)
    parser.add_argument("--resnet-steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--bare", nargs=2, help=argparse.SUPPRESS)  # internal: KIND SETTINGS_JSON
    args = parser.parse_args()
    if args.bare:
        from flagperf.measure.hostmemory import keep_freed_host_memory

        keep_freed_host_memory()  # as the harness's training processes do
        kind, settings = args.bare[0], json.loads(args.bare[1])
        print(json.dumps(bare_llama(settings) if kind == "llama" else bare_resnet(settings)))
        return 0

    started = time.perf_counter()
    if args.quick:
        vendor, device, model, resnet_model, precision = "cpu", "cpu", "tiny", "tiny", "bf16"
        batch, seq, steps, warmup, r_batch, r_steps = 4, 64, 6, 2, 8, 4
    else:
        vendor, device, model, resnet_model, precision = "nvidia", "cuda", "llama-3.2-1b", "resnet50", "bf16"
        batch, seq, steps, warmup = args.batch, args.seq, args.steps, args.warmup
        r_batch, r_steps = args.resnet_batch, args.resnet_steps
    from flagperf.config.vendors import load_vendor
    from flagperf.results.provenance import code_identity

    spec = load_vendor(vendor).spec_table()
    peak = spec.peaks.get(precision)
    peak_flops = peak.value * 1e12 if peak is not None and peak.value else None
    common = [f"precision={precision}", f"warmup_steps={warmup}", f"max_steps={warmup + steps}", "max_epochs=1",
              f"log_freq={LOG_FREQ}"] + (["cpu_threads=1"] if args.quick else [])
    # Enough sequences that one epoch (after the 10 % held out for evaluation) has every step.
    sequences = int((warmup + steps + 2) * batch / 0.9) + batch
    llama_sets = [f"model={model}", f"seq_len={seq}", f"batch_size={batch}", f"synthetic_sequences={sequences}",
                  *common]
    resnet_sets = [f"model={resnet_model}", f"batch_size={r_batch}", "channels_last=true",
                   f"synthetic_images={(r_steps + warmup + 1) * r_batch}", *common, f"max_steps={warmup + r_steps}"]
    compiled = not args.eager
    settings = {"device": device, "model": model, "seq": seq, "batch": batch, "steps": steps, "warmup": warmup,
                "precision": precision, "compile": compiled}
    compile_failure = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                h_llama = harness("llama-pretrain", vendor, [*llama_sets, *(["compile=true"] if compiled else [])],
                                  Path(tmp) / "llama")
                b_llama = run_bare("llama", settings)
            except RunFailed as exc:
                if not compiled:
                    raise
                compile_failure, compiled = str(exc)[-2000:], False  # say so, and measure eager instead
                print(f"compiled run failed, measuring eager instead:\n{compile_failure}", file=sys.stderr)
                settings["compile"] = False
                h_llama = harness("llama-pretrain", vendor, llama_sets, Path(tmp) / "llama-eager")
                b_llama = run_bare("llama", settings)
            # ResNet-50: eager (cuDNN's channels-last bf16 convolutions), harness and bare alike.
            h_resnet = harness("resnet50", vendor, resnet_sets, Path(tmp) / "resnet")
            b_resnet = run_bare("resnet", {**settings, "model": resnet_model, "batch": r_batch, "steps": r_steps,
                                           "crop": 224, "compile": False})
    except RunFailed as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return 1
    h_tokens = h_llama["metrics"]["tokens_per_s"]
    b_tokens = b_llama["tokens_per_s"]
    b_mfu = b_llama["flops_per_token"] * b_tokens / peak_flops if peak_flops else None
    h_images = h_resnet["metrics"]["training_throughput"]
    b_images = b_resnet["images_per_s"]
    llama_ratio, resnet_ratio = h_tokens / b_tokens, h_images / b_images
    problems = []
    if h_llama["extra"]["flops_per_token"] != b_llama["flops_per_token"]:
        problems.append(f"the harness counts {h_llama['extra']['flops_per_token']:.4g} FLOPs per token, the bare "
                        f"loop {b_llama['flops_per_token']:.4g}: not the same model")
    # A few steps on a shared CPU say nothing about the harness's cost: --quick checks that both paths run.
    if llama_ratio < RATIO_MIN and not args.quick:
        problems.append(f"Llama harness / bare = {llama_ratio:.3f} < {RATIO_MIN}")
    if resnet_ratio < RATIO_MIN and not args.quick:
        problems.append(f"ResNet-50 harness / bare = {resnet_ratio:.3f} < {RATIO_MIN}")
    if not args.quick and (h_llama["mfu"] or 0) < MFU_MIN:
        problems.append(f"Llama MFU through the harness = {100 * (h_llama['mfu'] or 0):.1f} % < {100 * MFU_MIN:.0f} %")
    elapsed = time.perf_counter() - started
    report = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "command": shlex.join(["python", *sys.argv]),
              "code": code_identity(),
              "device": spec.device, "peak": {"key": precision, "tflops": peak.value if peak else None,
                                              "source": peak.source if peak else None},
              "settings": {**settings, "resnet_model": resnet_model, "resnet_batch": r_batch,
                           "resnet_steps": r_steps},
              "llama": {"harness": h_llama, "bare": {**b_llama, "mfu": b_mfu}, "ratio": llama_ratio},
              "resnet50": {"harness": h_resnet, "bare": b_resnet, "ratio": resnet_ratio},
              "compile_failure": compile_failure, "elapsed_s": elapsed, "problems": problems,
              "passed": not problems}
    name = "training_gpu_quick" if args.quick else "training_gpu"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")

    def pct(x: float | None) -> str:
        return f"{100 * x:.1f} %" if x is not None else "-"

    def gib(x: float | None) -> str:
        return f"{x:.1f}" if x is not None else "-"

    h_mem = h_llama["metrics"].get("peak_memory")
    lines = [f"# Training on one device: harness against a bare loop{' (CPU smoke run)' if args.quick else ''}", "",
             f"Recorded {report['date']} with `{report['command']}` on {spec.device} ({report['code']}), "
             f"{elapsed:.0f} s in all. "
             f"Peak {precision}: {peak.value if peak else '-'} TFLOPS ({peak.source if peak else 'none'}).", "",
             f"Llama ({model} shape), sequence {seq}, batch {batch}, {precision} autocast over fp32 weights, "
             f"{h_llama['extra'].get('optimizer')}, SDPA attention, "
             f"torch.compile {'of each decoder layer' if compiled else 'off'}"
             f"{' (the compiled run failed: see compile_failure in the JSON)' if compile_failure else ''}; "
             f"{warmup} warm-up steps, then "
             f"{steps} timed. FLOPs per token: {h_llama['extra'].get('flops_convention')} = "
             f"{h_llama['extra']['flops_per_token']:.4g} ({h_llama['extra']['parameters']:,} parameters).", "",
             "| | tokens/s | MFU | peak memory (GiB) |", "|---|---|---|---|",
             f"| harness | {h_tokens:,.0f} | {pct(h_llama['mfu'])} | {gib(h_mem)} |",
             f"| bare loop | {b_tokens:,.0f} | {pct(b_mfu)} | {gib(b_llama['peak_memory_gib'])} |",
             f"| harness / bare | {llama_ratio:.3f} | | |", "",
             f"ResNet-50 ({resnet_model} shape), batch {r_batch}, channels-last, {precision} autocast, "
             f"{h_resnet['extra'].get('optimizer')}, "
             f"synthetic images on the device; {warmup} warm-up steps, then {r_steps} timed.", "",
             "| | images/s | MFU | peak memory (GiB) |", "|---|---|---|---|",
             f"| harness | {h_images:,.0f} | {pct(h_resnet['mfu'])} | "
             f"{gib(h_resnet['metrics'].get('peak_memory'))} |",
             f"| bare loop | {b_images:,.0f} | | {gib(b_resnet['peak_memory_gib'])} |",
             f"| harness / bare | {resnet_ratio:.3f} | | |", "",
             f"Verdict: {'PASS' if not problems else 'FAIL: ' + '; '.join(problems)}"
             f"{' (smoke run: both paths ran; ratios and MFU are not judged on a CPU)' if args.quick else ''}", ""]
    (args.out / f"{name}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    if problems:
        print("FAIL: " + "; ".join(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
