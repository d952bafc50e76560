"""Inference through the engine against bare loops of the same model, on one GPU, in one command.

    python bench/inference_gpu.py            # on the GPU host (H100: about 4 minutes, compile time included)
    python bench/inference_gpu.py --quick    # a CPU smoke run of the same code paths, tiny models

For resnet50-infer (fp16, batch 256, synthetic images) and bert-large-infer (fp16, batch 32, sequence 512):
  engine    one round of the case through the real pipeline (flagperf.entry.run_job, vendor nvidia,
            compiler inductor): validation_compute (eager), inference_core and inference_compute (Inductor)
  bare      the same model built by the case's own create_model, inputs made once on the GPU, 5 warm-up
            forwards, 40 timed, synchronised once at each end: eager, and torch.compile with the engine's
            options (mode default; channels-last inputs for the convolutional model)
and the ratios the issue sets targets for: inference_compute / bare compiled >= 0.95, inference_core / bare
compiled >= 0.8, validation_compute / bare eager >= 0.95, GPU utilisation >= 90 % over the compute region
(sampled with torch.cuda.utilization, NVML, at 20 Hz). Writes bench/results/inference_gpu.json and .md.
Exits 1 with one line when a round fails; targets missed are reported (exit 0), or exit 2 with --strict.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import shlex
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from flagperf.config.cases import load_case  # noqa: E402
from flagperf.config.job import Job  # noqa: E402
from flagperf.config.plan import plan_run  # noqa: E402
from flagperf.entry import run_job  # noqa: E402
from flagperf.inference.data import in_main_process  # noqa: E402
from flagperf.inference.inductor import ChannelsLast, has_conv2d  # noqa: E402
from flagperf.measure.hostmemory import keep_freed_host_memory  # noqa: E402
from flagperf.results.provenance import code_identity  # noqa: E402
from flagperf.results.schema import Metric, read_result  # noqa: E402

log = logging.getLogger("bench.inference_gpu")

WARMUP, TIMED = 5, 40  # --quick: 1 and 4
COMPUTE_ITERATIONS = 120  # the engine's compute region: long enough for NVML's utilisation to see it
TARGETS = {"inference_compute / bare compiled": 0.95, "inference_core / bare compiled": 0.8,
           "validation_compute / bare eager": 0.95,
           # Synthetic data: loading must not bound whole (whole differs from core by the host's per-batch work).
           "inference_whole / inference_core": 0.9}
UTIL_TARGET = 90.0

FULL = {
    "resnet50-infer": ["fp16=true", "batch_size=256", "synthetic_images=8192", "repeat=2", "num_workers=8"],
    "bert-large-infer": ["fp16=true", "batch_size=32", "seq_len=512", "synthetic_sequences=256", "repeat=2",
                         "num_workers=4"],
}
QUICK = {
    "resnet50-infer": ["fp16=false", "batch_size=4", "synthetic_images=64", "repeat=1", "num_workers=0",
                       "depths=[1, 1]", "hidden_sizes=[8, 16]", "flops=1.0e6"],
    "bert-large-infer": ["fp16=false", "batch_size=2", "seq_len=16", "synthetic_sequences=200", "repeat=1",
                         "num_workers=0", "vocab_size=200", "hidden_size=32", "num_hidden_layers=1",
                         "num_attention_heads=2", "intermediate_size=64", "flops=1.0e6"],
}


@dataclass
class UtilSampler:
    """GPU utilisation (NVML through torch) with host timestamps, sampled in a thread."""

    device: torch.device
    period_s: float = 0.05
    samples: list[tuple[float, float]] = field(default_factory=list)
    reason: str | None = None

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.device.type != "cuda":
            self.reason = "no CUDA device"
            return
        try:
            torch.cuda.utilization(self.device)
        except Exception as exc:  # pynvml missing or NVML refused: recorded, not fatal
            self.reason = f"torch.cuda.utilization unavailable ({type(exc).__name__}: {exc})"

    def __enter__(self) -> UtilSampler:
        if self.reason is None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.samples.append((time.time(), float(torch.cuda.utilization(self.device))))

    def mean(self, window: tuple[float, float]) -> tuple[float | None, int]:
        inside = [u for t, u in self.samples if window[0] <= t <= window[1]]
        return (sum(inside) / len(inside) if inside else None), len(inside)


def engine_round(case: str, vendor: str, sets: list[str], work: Path) -> dict[str, Metric]:
    plan = plan_run(cases=[case], vendor=vendor, sets=sets, results_dir=work / "results")
    cp = plan.cases[0]
    job = Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, host="bench", vendor=vendor,
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})
    out = work / case
    out.mkdir(parents=True)
    code = run_job(job, out)
    result = read_result(out / "result.json")
    if code != 0 or result.status != "success":
        message = result.failure.message if result.failure else f"exit {code}"
        print(f"FAILED: {case} through the engine: {message.splitlines()[0]}", file=sys.stderr)
        raise SystemExit(1)
    return {m.name: m for m in result.metrics}


# The smoke run's tiny BERT takes 0.2 ms per forward: at 100 timed forwards (20 ms) one descheduling moved its
# ratios by a tenth either way, so it times 1,000. The tiny ResNet (40 ms per eager forward on one thread) times
# 100, which keeps it within a minute.
QUICK_WARMUP = 10
QUICK_TIMED = {"resnet50-infer": 100, "bert-large-infer": 1000}


def timed_forwards(case: str, device: torch.device) -> tuple[int, int]:
    """Warm-up and timed forwards, of the bare loops and of the engine's compute pass alike: the issue's 5 and
    40 on a GPU (the engine's compute pass runs COMPUTE_ITERATIONS), more for the smoke run's tiny models."""
    return (WARMUP, TIMED) if device.type != "cpu" else (QUICK_WARMUP, QUICK_TIMED[case])


def engine_compute_iterations(case: str, device: torch.device) -> int:
    """The engine's compute pass: COMPUTE_ITERATIONS on a GPU, the bare loops' count in the smoke run."""
    return COMPUTE_ITERATIONS if device.type != "cpu" else QUICK_TIMED[case]


def bare_rates(case: str, vendor: str, sets: list[str], device: torch.device) -> dict[str, float]:
    """items/s of the case's model, eager and compiled, on inputs made once on the device."""
    module = load_case(case).module
    config = module.Config.model_validate(plan_run(cases=[case], vendor=vendor, sets=sets,
                                                   results_dir="unused").cases[0].config)
    # One batch, made in this process: a worker loader's workers would go on making batches beside the loops.
    inputs, _ = next(iter(in_main_process(module.build_dataloader(config))))
    batch = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
    dtype = torch.float16 if config.fp16 else torch.float32
    x = [t.to(device, dtype if t.is_floating_point() else t.dtype) for t in batch]
    model = module.create_model(config).to(device, dtype).eval()

    warmup, timed = timed_forwards(case, device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def rate(fn: Any) -> float:
        with torch.inference_mode():
            for _ in range(warmup):
                fn(*x)
            sync()
            started = time.perf_counter()
            for _ in range(timed):
                fn(*x)
            sync()
            return timed * config.batch_size / (time.perf_counter() - started)

    eager = rate(model)
    # The engine's options: channels-last for a convolutional model on an accelerator, its layout change
    # inside the compiled graph (the same graph the engine compiles, so Inductor's cache serves it).
    target = model
    if device.type != "cpu" and has_conv2d(model):
        target = ChannelsLast(model.to(memory_format=torch.channels_last))
    compiled = torch.compile(target, backend="inductor", mode="default", dynamic=False)
    started = time.perf_counter()
    with torch.inference_mode():
        compiled(*x)
    compile_s = time.perf_counter() - started
    return {"bare_eager": eager, "bare_compiled": rate(compiled), "bare_compile_s": compile_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU smoke run: tiny models, vendor cpu")
    parser.add_argument("--strict", action="store_true", help="exit 2 when a target is missed")
    parser.add_argument("--cases", nargs="+", default=list(FULL), choices=list(FULL))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    vendor = "cpu" if args.quick else "nvidia"
    device = torch.device("cpu" if args.quick else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("FAILED: no CUDA device visible to torch (use --quick for the CPU smoke run)", file=sys.stderr)
        return 1
    shapes = QUICK if args.quick else FULL
    if args.quick:
        # One intra-op thread on both sides: on a shared 2-core VM a second thread is descheduled at random
        # and every forward waits for it, which makes any ratio noise.
        torch.set_num_threads(1)
    # A case process keeps freed host memory for reuse (flagperf.measure.hostmemory): this process runs the
    # engine's round (run_job) and the bare loops, both under that setting, made here before either runs.
    allocator = keep_freed_host_memory()
    started = time.perf_counter()
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp, UtilSampler(device) as util:
        for case in args.cases:
            iterations = engine_compute_iterations(case, device)
            sets = [*shapes[case], "compiler=inductor", f"compute_iterations={iterations}"]
            case_started = time.perf_counter()
            m = engine_round(case, vendor, sets, Path(tmp) / case)
            bare = bare_rates(case, vendor, shapes[case], device)
            compute_util, util_samples = util.mean(tuple(m["inference_compute"].window or (0.0, 0.0)))
            row: dict[str, Any] = {
                "unit": m["inference_core"].unit,
                "validation_core": m["validation_core"].value, "validation_compute": m["validation_compute"].value,
                "inference_whole": m["inference_whole"].value, "inference_core": m["inference_core"].value,
                "inference_compute": m["inference_compute"].value,
                "inference_compute_latency_p50_ms": m["inference_compute_latency"].p50,
                "inference_compute_latency_p99_ms": m["inference_compute_latency"].p99,
                "inference_compute_mfu": m["inference_compute"].mfu,
                "engine_build_s": m["engine_build_time"].value if "engine_build_time" in m else None,
                **bare,
                "gpu_util_compute_percent": compute_util, "gpu_util_samples": util_samples,
                "seconds": time.perf_counter() - case_started,
            }
            row["ratios"] = {
                "inference_compute / bare compiled": row["inference_compute"] / bare["bare_compiled"],
                "inference_core / bare compiled": row["inference_core"] / bare["bare_compiled"],
                "validation_compute / bare eager": row["validation_compute"] / bare["bare_eager"],
                "inference_whole / inference_core": row["inference_whole"] / row["inference_core"],
            }
            row["warnings"] = {name: x.warning for name, x in m.items() if x.warning}
            # How each figure was made, as the engine wrote it (data path, clocks, the host's issue time).
            row["notes"] = {name: m[name].note for name in ("inference_core", "inference_compute",
                                                            "validation_compute") if name in m}
            rows[case] = row
            log.info("%s: %s", case, {k: round(v, 3) for k, v in row["ratios"].items()})
    total = time.perf_counter() - started
    missed = [f"{case}: {name} {ratio:.2f} < {TARGETS[name]}" for case, row in rows.items()
              for name, ratio in row["ratios"].items() if ratio < TARGETS[name]]
    missed += [f"{case}: GPU utilisation over compute {row['gpu_util_compute_percent']:.0f} % < {UTIL_TARGET:.0f} %"
               for case, row in rows.items() if row["gpu_util_compute_percent"] is not None
               and row["gpu_util_compute_percent"] < UTIL_TARGET]
    command = shlex.join(["python", "bench/inference_gpu.py", *sys.argv[1:]])
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    record = {"recorded": datetime.now(UTC).isoformat(timespec="seconds"), "command": command, "code": code_identity(),
              "device": device_name, "torch": torch.__version__, "host_allocator": allocator, "quick": args.quick,
              "total_s": total,
              "warmup": QUICK_WARMUP if args.quick else WARMUP,
              "timed": {case: timed_forwards(case, device)[1] for case in rows},
              "engine_compute_iterations": {case: engine_compute_iterations(case, device) for case in rows},
              "gpu_util": util.reason or "torch.cuda.utilization (NVML), 20 Hz", "cases": rows,
              "targets": TARGETS, "util_target_percent": UTIL_TARGET, "missed": missed}
    args.out.mkdir(parents=True, exist_ok=True)
    name = "inference_gpu_quick" if args.quick else "inference_gpu"
    (args.out / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
    lines = [f"# Inference through the engine vs bare loops ({'CPU smoke run' if args.quick else device_name})", "",
             f"Recorded {record['recorded']} with `{command}` on {device_name} ({record['code']}), torch "
             f"{torch.__version__}, "
             f"{total:.0f} s in all (compiles included). Bare loops: the case's model, inputs made once on the "
             f"device, {record['warmup']} warm-up and "
             f"{', '.join(f'{n} timed ({c})' for c, n in record['timed'].items())} forwards (the engine's compute "
             f"pass: {', '.join(str(n) for n in record['engine_compute_iterations'].values())}), synchronised "
             "at each end; compiled with the "
             "engine's Inductor options. Engine: one round through flagperf.entry.run_job, compiler inductor. "
             f"Host allocator, both sides: {allocator}.", "",
             "| case | unit | validation_compute | bare eager | inference_core | inference_compute | bare compiled "
             "| compute / bare | core / bare | val. compute / bare eager | whole / core | GPU util over compute |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for case, row in rows.items():
        r = row["ratios"]
        util_cell = (f"{row['gpu_util_compute_percent']:.0f} % ({row['gpu_util_samples']} samples)"
                     if row["gpu_util_compute_percent"] is not None else util.reason or "-")
        lines.append(f"| {case} | {row['unit']} | {row['validation_compute']:.5g} | {row['bare_eager']:.5g} | "
                     f"{row['inference_core']:.5g} | {row['inference_compute']:.5g} | {row['bare_compiled']:.5g} | "
                     f"{r['inference_compute / bare compiled']:.2f} | {r['inference_core / bare compiled']:.2f} | "
                     f"{r['validation_compute / bare eager']:.2f} | {r['inference_whole / inference_core']:.2f} | "
                     f"{util_cell} |")
    lines += ["", "Targets: " + ", ".join(f"{k} >= {v}" for k, v in TARGETS.items())
              + f", GPU utilisation >= {UTIL_TARGET:.0f} %.", ""]
    lines += ([f"**Missed**: {m}" for m in missed] if missed else ["All targets met."]) + [""]
    for case, row in rows.items():
        for metric, warning in row["warnings"].items():
            lines.append(f"- {case} / {metric}: {warning}")
    (args.out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if missed:
        print("TARGETS MISSED: " + "; ".join(missed), file=sys.stderr)
        return 2 if args.strict else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
