"""The generate family's `hf` engine through the harness against a bare transformers generate loop of the same
model, batches and settings (greedy, static KV cache, same GenerationConfig), interleaved pair by pair.

    python bench/generate_gpu.py             # GPU host: Llama-3-8B shape, bf16, 128/128 tokens, concurrency 1 and 32
    python bench/generate_gpu.py --quick     # CPU smoke run: the tiny preset

Harness = flagperf.generate.driver.run_level (prompt batches, the engine's streamer stamping every token,
the contract's checks) timed over the level; bare = model.generate on the same batches with no streamer,
timed with a device synchronisation at both ends. Ratio = harness output tokens/s / bare output tokens/s,
median over the pairs; the goal is >= 0.95 (the harness must not be what is measured). On a GPU a ratio
below it exits 1. vLLM is run too (its own level figures, no ratio) when the package is importable.
Writes bench/results/generate_gpu[_quick].json and .md.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import logging
import platform
import shlex
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import transformers  # noqa: E402

from flagperf.config.vendors import load_vendor  # noqa: E402
from flagperf.generate.config import GenerateConfig  # noqa: E402
from flagperf.generate.driver import run_level  # noqa: E402
from flagperf.generate.engines import EngineEnv, GenerateEngine, load_engine  # noqa: E402
from flagperf.generate.hf import Engine, generation_config, left_pad  # noqa: E402
from flagperf.generate.metrics import level_stats  # noqa: E402
from flagperf.generate.prompts import synthetic_prompts  # noqa: E402
from flagperf.results.metrics import model_flops_utilisation  # noqa: E402

GOAL = 0.95
log = logging.getLogger("bench.generate")


def settings(quick: bool, compile: bool) -> tuple[dict[str, Any], dict[int, int], int]:
    """(config, requests per level, pairs)."""
    if quick:
        base = {"model": "tiny", "precision": "fp32", "input_len": 16, "max_new_tokens": 16, "concurrency": [1, 4]}
        return base, {1: 2, 4: 4}, 3
    base = {"model": "llama-3-8b", "precision": "bf16", "input_len": 128, "max_new_tokens": 128,
            "concurrency": [1, 32]}
    # About 30 ms a step for an eager 8B decode: 2 requests at c1 and one batch at c32 keep the run short.
    return base, {1: 2, 32: 32}, 3


def bare_level(model: Any, batches: list[list[list[int]]], cfg: GenerateConfig, sync: Any) -> tuple[int, float]:
    """The reference: model.generate on the same batches with the same GenerationConfig, nothing else."""
    gen = generation_config(cfg.max_new_tokens, 0, cfg.compile)
    inputs = [left_pad(b, 0, model.device) for b in batches]
    with torch.inference_mode():
        model.generate(input_ids=inputs[0][0], attention_mask=inputs[0][1], generation_config=gen)  # warm-up
        sync()
        start = time.perf_counter()
        tokens = 0
        for ids, mask in inputs:
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)
            tokens += (out.shape[1] - ids.shape[1]) * out.shape[0]
        sync()
    return tokens, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny preset on the CPU (a smoke run)")
    parser.add_argument("--compile", action="store_true", help="let generate torch.compile the decode step")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    began = time.perf_counter()
    cuda = torch.cuda.is_available() and not args.quick
    if not args.quick and not cuda:
        print("generate_gpu: no CUDA device visible to torch; run with --quick for the CPU smoke run", file=sys.stderr)
        return 2
    device = torch.device("cuda" if cuda else "cpu")
    vendor = "nvidia" if cuda else "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    base, requests, pairs = settings(args.quick, args.compile)
    spec = load_vendor(vendor).spec_table()
    peak = spec.peaks.get(base["precision"])

    built = time.perf_counter()
    cfg0 = GenerateConfig.model_validate({**base, "engine": "hf", "compile": args.compile, "requests": 1,
                                          "timeout_s": 3600, "max_retries": 0})
    engine = Engine(cfg0, EngineEnv(device, Path(tempfile.mkdtemp()), log))
    sync()
    build_s = time.perf_counter() - built
    parameters = engine.parameters
    log.info("built %s (%.3g parameters) on %s in %.1f s", base["model"], engine.parameters, spec.device, build_s)
    prompts = synthetic_prompts(max(requests.values()), base["input_len"], engine.vocab_size, seed=0)

    levels: list[dict[str, Any]] = []
    for concurrency in base["concurrency"]:
        cfg = cfg0.model_copy(update={"requests": requests[concurrency]})
        batches = [[p.ids for p in prompts.prompts[i:i + concurrency]]
                   for i in range(0, requests[concurrency], concurrency)]
        ratios, harness_rates, bare_rates = [], [], []
        stats = None
        for pair in range(pairs):
            traces, _, seconds, _ = run_level(engine, cfg, prompts, 0, concurrency)
            stats = level_stats(concurrency, traces, seconds)
            tokens, bare_s = bare_level(engine.model, batches, cfg, sync)
            if tokens != stats.output_tokens:
                print(f"generate_gpu: bare loop made {tokens} tokens, harness {stats.output_tokens}: not the same "
                      "work", file=sys.stderr)
                return 1
            harness_rates.append(stats.tokens_per_s)
            bare_rates.append(tokens / bare_s)
            ratios.append(harness_rates[-1] / bare_rates[-1])
            log.info("c%d pair %d: harness %.1f tokens/s, bare %.1f tokens/s, ratio %.3f", concurrency, pair + 1,
                     harness_rates[-1], bare_rates[-1], ratios[-1])
        assert stats is not None and stats.tpot is not None
        mfu = model_flops_utilisation(statistics.median(harness_rates), 2.0 * engine.parameters,
                                      peak.value if peak else None, peak.unit if peak else "")
        levels.append({
            "engine": "hf", "concurrency": concurrency, "requests": stats.requests,
            "harness_tokens_per_s": statistics.median(harness_rates),
            "bare_tokens_per_s": statistics.median(bare_rates),
            "ratio_median": statistics.median(ratios), "ratios": ratios,
            "tokens_per_s_per_user": stats.per_user.mean, "ttft_p50_ms": stats.ttft.p50 * 1e3,
            "ttft_p99_ms": stats.ttft.p99 * 1e3, "tpot_p50_ms": stats.tpot.p50 * 1e3,
            "itl_p99_ms": stats.itl.p99 * 1e3 if stats.itl else None, "mfu": mfu})

    if cuda and importlib.util.find_spec("vllm") is not None:
        del engine
        gc.collect()
        torch.cuda.empty_cache()
        levels += vllm_levels(cfg0, requests, prompts, device)

    failed = [lv for lv in levels if lv["engine"] == "hf" and lv["ratio_median"] < GOAL]
    record = {
        "bench": "generate_gpu", "quick": args.quick, "command": " ".join(shlex.quote(a) for a in sys.argv),
        "when": datetime.now(UTC).isoformat(timespec="seconds"), "device": spec.device,
        "host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "model": base["model"], "precision": base["precision"],
        "input_len": base["input_len"], "max_new_tokens": base["max_new_tokens"], "compile": args.compile,
        "parameters": parameters, "build_s": build_s, "pairs": pairs,
        "goal": GOAL, "levels": levels, "total_s": time.perf_counter() - began,
        "verdict": "not checked (CPU smoke run)" if not cuda else ("fail" if failed else "pass"),
    }
    write(args.out, record)
    if cuda and failed:
        print(f"generate_gpu: harness/bare below {GOAL} at concurrency "
              f"{', '.join(str(lv['concurrency']) for lv in failed)}", file=sys.stderr)
        return 1
    return 0


def vllm_levels(cfg0: GenerateConfig, requests: dict[int, int], prompts: Any, device: torch.device
                ) -> list[dict[str, Any]]:
    """vLLM through the same harness levels (its own figures; the bare reference is vLLM itself)."""
    out: list[dict[str, Any]] = []
    try:
        cls = load_engine("nvidia", "vllm").engine_class()
        engine: GenerateEngine = cls(cfg0.model_copy(update={"engine": "vllm"}),
                                     EngineEnv(device, Path(tempfile.mkdtemp()), log))
        for concurrency, count in requests.items():
            cfg = cfg0.model_copy(update={"engine": "vllm", "requests": count})
            traces, _, seconds, _ = run_level(engine, cfg, prompts, 0, concurrency)
            stats = level_stats(concurrency, traces, seconds)
            out.append({"engine": "vllm", "concurrency": concurrency, "requests": stats.requests,
                        "harness_tokens_per_s": stats.tokens_per_s, "tokens_per_s_per_user": stats.per_user.mean,
                        "ttft_p50_ms": stats.ttft.p50 * 1e3,
                        "tpot_p50_ms": stats.tpot.p50 * 1e3 if stats.tpot else None})
    except Exception as exc:  # recorded, not fatal: the hf comparison is the bench's verdict
        out.append({"engine": "vllm", "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"})
    return out


def write(folder: Path, record: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    stem = "generate_gpu_quick" if record["quick"] else "generate_gpu"
    (folder / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    lines = ["# generate: `hf` engine through the harness vs a bare transformers generate loop", "",
             f"- command: `{record['command']}`", f"- when: {record['when']}; device: {record['device']}",
             f"- python {record['python']}, torch {record['torch']}, transformers {record['transformers']}",
             f"- model {record['model']} ({record['parameters']} parameters, random weights), {record['precision']}, "
             f"{record['input_len']}/{record['max_new_tokens']} prompt/output tokens, greedy, static KV cache, "
             f"compile {record['compile']}; {record['pairs']} interleaved pairs per level, medians",
             f"- verdict: **{record['verdict']}** (goal harness/bare >= {record['goal']}); "
             f"total {record['total_s']:.0f} s", "",
             "| engine | concurrency | requests | harness tokens/s | bare tokens/s | ratio (median) "
             "| tokens/s per user | TTFT p50 ms | TPOT p50 ms | MFU |", "|---|---|---|---|---|---|---|---|---|---|"]
    for lv in record["levels"]:
        if "error" in lv:
            lines.append(f"| {lv['engine']} | - | - | {lv['error']} | | | | | | |")
            continue

        def f(key: str, digits: int = 4, level: dict[str, Any] = lv) -> str:
            value = level.get(key)
            return "-" if value is None else f"{value:.{digits}g}"

        mfu = lv.get("mfu")
        lines.append(f"| {lv['engine']} | {lv['concurrency']} | {lv['requests']} | {f('harness_tokens_per_s')} | "
                     f"{f('bare_tokens_per_s')} | {f('ratio_median', 3)} | {f('tokens_per_s_per_user')} | "
                     f"{f('ttft_p50_ms')} | {f('tpot_p50_ms')} | {'-' if mfu is None else f'{100 * mfu:.2f}%'} |")
    (folder / f"{stem}.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
