"""Our serving client (flagperf.generate.loadgen) against GuideLLM, a maintained one, on the same server.

One `transformers serve` (the engine folder of --vendor) serves a random-weight preset saved to a local
folder; both clients send the same prompts (--requests of --input-len word tokens, exactly --output-len
tokens out through the engine's exact-output fields), closed loop at --concurrency, one warm-up request
first. Rounds are interleaved (ours, GuideLLM, ours, ...) so a drifting machine moves both alike; the
headline is the median over rounds of each figure and the ratio ours / GuideLLM (goal: within 3 %).

Figures, defined alike on both sides:
  TTFT mean         first content token - send (GuideLLM: time_to_first_token_ms)
  TPOT mean         (E2EL - TTFT) / (output tokens - 1) (GuideLLM calls it inter_token_latency_ms; its
                    time_per_output_token_ms divides the whole latency, first token included)
  output tokens/s   all output tokens / the benchmark's duration (GuideLLM: output_token_count total /
                    duration)

GuideLLM is installed in its own venv, never into the project's (it needs transformers 5):
    python -m venv --system-site-packages /tmp/venv-guidellm
    /tmp/venv-guidellm/bin/pip install guidellm "torch==$(python -c 'import torch; print(torch.__version__)')"
Run:  python bench/serving_client_check.py [--vendor nvidia --preset llama-3.2-1b --precision bf16 ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flagperf.generate.engines import load_engine  # noqa: E402
from flagperf.generate.loadgen import Load, ServingPrompt, Target, first_answer, run_phase  # noqa: E402
from flagperf.generate.models import random_checkpoint  # noqa: E402
from flagperf.generate.points import tpot  # noqa: E402
from flagperf.generate.serve import Tokens  # noqa: E402
from flagperf.generate.server import start_server  # noqa: E402


def ours(target: Target, prompts: list[ServingPrompt], concurrency: int, tokens: Tokens) -> dict[str, float]:
    run = asyncio.run(run_phase(target, Load("check", concurrency=concurrency), prompts, "timed",
                                requests=len(prompts), duration_s=None, writer=None, count_tokens=tokens.counter()))
    done = [r for r in run.records if r.ok]
    if len(done) != len(prompts):
        raise SystemExit(f"our client: {len(prompts) - len(done)} request(s) failed: {run.records[0].error}")
    return {"ttft_ms": 1e3 * statistics.fmean(r.ttft_s or 0.0 for r in done),
            "tpot_ms": 1e3 * statistics.fmean(t for t in (tpot(r) for r in done) if t is not None),
            "output_tokens_per_s": sum(r.output_tokens for r in done) / run.seconds,
            "output_tokens": float(sum(r.output_tokens for r in done))}


def guidellm(binary: str, target: Target, model: str, prompts: list[ServingPrompt], concurrency: int,
             exact: dict[str, Any], work: Path, round_no: int) -> dict[str, float]:
    data = work / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p.text}) + "\n" for p in prompts), encoding="utf-8")
    scenario = {"metadata": {"name": "flagperf-client-check"}, "spec": {
        "backend": {"kind": "openai_http", "target": target.base_url, "model": model,
                    "request_format": "/v1/chat/completions", "max_tokens": prompts[0].output_len,
                    "validate_backend": False, "extras": {"body": exact}},
        "profile": {"kind": "concurrent", "streams": concurrency},
        "data": [{"kind": "json_file", "path": str(data)}],
        "constraints": [{"kind": "max_requests", "count": len(prompts)}]}}
    (work / "scenario.json").write_text(json.dumps(scenario), encoding="utf-8")
    report = work / f"guidellm{round_no}.json"
    done = subprocess.run([binary, "run", "-c", str(work / "scenario.json"), "--output",
                           f"kind=json,path={report}", "--disable-console-interactive"],
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"guidellm exited {done.returncode}: {done.stderr[-2000:] or done.stdout[-2000:]}")
    bench = json.loads(report.read_text(encoding="utf-8"))["benchmarks"][0]
    metrics = bench["metrics"]
    count = metrics["output_token_count"]["successful"]
    if metrics["request_totals"]["successful"] != len(prompts):
        raise SystemExit(f"guidellm: {metrics['request_totals']} requests, {len(prompts)} sent")
    return {"ttft_ms": metrics["time_to_first_token_ms"]["successful"]["mean"],
            "tpot_ms": metrics["inter_token_latency_ms"]["successful"]["mean"],
            "output_tokens_per_s": count["total_sum"] / bench["duration"],
            "output_tokens": float(count["total_sum"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vendor", default="cpu")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--input-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--guidellm", default="/tmp/venv-guidellm/bin/guidellm")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "serving_client_check.json")
    args = parser.parse_args()

    spec = load_engine(args.vendor, "transformers-serve").server
    assert spec is not None
    device = torch.device("cuda" if args.vendor == "nvidia" else "cpu")
    with tempfile.TemporaryDirectory(prefix="serving-check-") as tmp:
        work = Path(tmp)
        model = random_checkpoint(args.preset, args.precision, 0, work / "models", device)
        tokens = Tokens(model)
        generator = torch.Generator().manual_seed(0)
        vocab = int(tokens.tokenizer.vocab_size)
        prompts = [ServingPrompt(i, tokens.text(torch.randint(0, vocab, (args.input_len,), generator=generator)
                                                .tolist()), args.input_len, args.output_len)
                   for i in range(args.requests)]
        server = start_server(spec, {"model_dir": str(model), "dtype": spec.dtypes[args.precision],
                                     "tensor_parallel": 1}, [], {}, work / "server.log", ready_timeout_s=900.0)
        try:
            target = Target(server.base_url, str(model), "chat", exact_fields=spec.exact_output_fields)
            if first_answer(target, prompts[0], 900.0) is not None:
                raise SystemExit("the server answered no request")
            exact = spec.exact_output_fields(args.output_len)
            rounds: list[dict[str, dict[str, float]]] = []
            for round_no in range(1, args.rounds + 1):
                mine = ours(target, prompts, args.concurrency, tokens)
                theirs = guidellm(args.guidellm, target, str(model), prompts, args.concurrency, exact, work,
                                  round_no)
                rounds.append({"ours": mine, "guidellm": theirs})
                print(f"round {round_no}: ours {mine}, guidellm {theirs}", flush=True)
        finally:
            server.stop()
    figures = ("ttft_ms", "tpot_ms", "output_tokens_per_s")
    median = {side: {f: statistics.median(r[side][f] for r in rounds) for f in figures}
              for side in ("ours", "guidellm")}
    ratio = {f: median["ours"][f] / median["guidellm"][f] for f in figures}
    guidellm_version = subprocess.run([args.guidellm, "--version"], capture_output=True, text=True).stdout.strip()
    record = {"command": " ".join(["python", "bench/serving_client_check.py", *sys.argv[1:]]),
              "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "guidellm": guidellm_version,
              "server": f"transformers serve ({args.vendor})", "preset": args.preset, "precision": args.precision,
              "concurrency": args.concurrency, "requests": args.requests, "input_len": args.input_len,
              "output_len": args.output_len, "rounds": rounds, "median": median, "ratio_ours_to_guidellm": ratio,
              "within_3_percent": {f: abs(r - 1.0) <= 0.03 for f, r in ratio.items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({"median": median, "ratio": ratio}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
