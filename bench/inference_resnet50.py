"""ResNet-50 inference on this CPU: eager PyTorch vs ONNX Runtime vs TorchInductor, same batches, one run.

    python bench/inference_resnet50.py [--batch-size 16] [--images 128] [--out bench/results]

Uses the resnet50-infer case's own functions and the engines from vendor_images/cpu/engines/, timed by the
shared inference loop (flagperf.inference.measure), so the figures are FlagPerf's whole and core with the
same definitions a round reports. Synthetic images and random weights: throughput only. Each engine is
built (ONNX Runtime) or compiled (Inductor) before its pass, untimed; the build times are recorded apart.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import shlex
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import onnxruntime  # noqa: E402
import psutil  # noqa: E402
import torch  # noqa: E402

from flagperf.config.cases import load_case  # noqa: E402
from flagperf.config.plan import plan_run  # noqa: E402
from flagperf.config.vendors import load_vendor  # noqa: E402
from flagperf.inference.engines import EngineEnv, load_engine  # noqa: E402
from flagperf.inference.measure import Forward, pass_metrics, timed_pass  # noqa: E402
from flagperf.measure.casekit import CaseContext  # noqa: E402
from flagperf.measure.timing import TimingPlan  # noqa: E402

log = logging.getLogger("bench.inference")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--images", type=int, default=128, help="synthetic images per pass (whole batches)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    case = load_case("resnet50-infer")
    planned = plan_run(cases=["resnet50-infer"], vendor="cpu", results_dir="unused",
                       sets=[f"batch_size={args.batch_size}", f"synthetic_images={args.images}", "repeat=1",
                             "compiler=onnxruntime"])
    config = case.module.Config.model_validate(planned.cases[0].config)
    spec = load_vendor("cpu").spec_table()
    ctx = CaseContext("cpu", spec, TimingPlan(0, 1.0, 1), log, shares_host_memory=True)
    loader = case.module.build_dataloader(config)
    model = case.module.create_model(config).eval()

    def eager(inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], float]:
        return case.module.model_forward(model, inputs), 0.0

    rows: dict[str, dict[str, float]] = {}
    builds: dict[str, float] = {}
    load_before = psutil.getloadavg()[0]

    def measure(name: str, fn: Forward) -> None:
        stats = timed_pass(name, loader, fn, None, lambda: None, config, log)
        metrics = {m.name.removeprefix(f"{name}_"): m for m in
                   pass_metrics(stats, config, ctx, synthetic=True, accuracy_name=None)}
        rows[name] = {"whole": metrics["whole"].value, "core": metrics["core"].value,
                      "latency_p50_ms": metrics["latency"].p50 or 0.0, "latency_p99_ms": metrics["latency"].p99 or 0.0,
                      "mfu": metrics["core"].mfu or 0.0, "non_inference_s": stats.non_inference_seconds}
        log.info("%s: core %.2f images/s, whole %.2f images/s", name, rows[name]["core"], rows[name]["whole"])

    first = next(iter(loader))[0]
    with torch.no_grad():
        reference = eager([first])[0][0]
    # Each path is measured before the next one is built: an idle ONNX Runtime thread pool or Inductor's
    # compile workers must not share the two cores with the path being timed.
    measure("eager", eager)
    with tempfile.TemporaryDirectory() as tmp:
        env = EngineEnv(device=torch.device("cpu"), work_dir=Path(tmp), case="resnet50-infer", log=log)
        onnx = Path(tmp) / "resnet50.onnx"
        started = time.perf_counter()
        case.module.export_model(model, config, onnx)
        builds["onnx_export_s"] = time.perf_counter() - started
        started = time.perf_counter()
        ort_engine = load_engine("cpu", "onnxruntime").engine_class()(config, onnx, None, env)
        builds["onnxruntime_build_s"] = time.perf_counter() - started

        def ort(inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], float]:
            return case.module.engine_forward(ort_engine, inputs)

        # The paths agree before their speeds are compared.
        torch.testing.assert_close(ort([first])[0][0], reference, rtol=1e-3, atol=1e-3)
        measure("onnxruntime", ort)
        inductor = load_engine("cpu", "inductor").engine_class()(config, None, model, env)
        started = time.perf_counter()
        with torch.no_grad():
            out, compile_s = inductor([first])  # compiles on this shape, then runs the batch once more
        builds["inductor_compile_s"] = compile_s
        builds["inductor_first_call_s"] = time.perf_counter() - started
        torch.testing.assert_close(out[0], reference, rtol=1e-3, atol=1e-3)

        def compiled(inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], float]:
            return case.module.engine_forward(inductor, inputs)

        measure("inductor", compiled)

    ratios = {f"{name}/eager": {k: rows[name][k] / rows["eager"][k] for k in ("core", "whole")}
              for name in ("onnxruntime", "inductor")}
    command = shlex.join(["python", "bench/inference_resnet50.py", *sys.argv[1:]])
    record = {
        "recorded": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": command,
        "machine": {"cpu": platform.processor() or spec.device, "device": spec.device,
                    "usable_cpus": len(psutil.Process().cpu_affinity() or []),
                    "torch": torch.__version__, "onnxruntime": onnxruntime.__version__,
                    "torch_threads": torch.get_num_threads()},
        "batch_size": config.batch_size, "images_per_pass": len(loader) * config.batch_size,
        "precision": config.precision, "flops_per_image": config.flops,
        "peak_fp32": spec.peaks["fp32"].model_dump() if "fp32" in spec.peaks else None,
        "builds": builds, "results": rows, "ratios": ratios,
        "load_average_1min": {"before": load_before, "after": psutil.getloadavg()[0]},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "inference_resnet50.json").write_text(json.dumps(record, indent=2) + "\n")
    lines = [
        "# ResNet-50 inference on this CPU: eager vs ONNX Runtime vs Inductor",
        "",
        f"Recorded {record['recorded']} with `{command}` on {spec.device} "
        f"({record['machine']['usable_cpus']} usable CPUs, torch {torch.__version__}, onnxruntime "
        f"{onnxruntime.__version__}). ResNet-50 (transformers, random weights), FP32, batch {config.batch_size}, "
        f"{record['images_per_pass']} synthetic images per pass, one warm-up batch, the same batches for all "
        "three; outputs checked equal (1e-3) before timing. whole and core are FlagPerf's definitions "
        "(flagperf.inference.measure); MFU = 4.12e9 FLOP per image x core / the fp32 peak of the vendor's spec.",
        "",
        "| path | core images/s | whole images/s | latency p50 / p99 per batch (ms) | MFU | core vs eager |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        ratio = 1.0 if name == "eager" else ratios[f"{name}/eager"]["core"]
        lines.append(f"| {name} | {row['core']:.2f} | {row['whole']:.2f} | {row['latency_p50_ms']:.1f} / "
                     f"{row['latency_p99_ms']:.1f} | {row['mfu']:.1%} | {ratio:.2f}x |")
    load = record["load_average_1min"]
    lines += ["", f"1-minute load average {load['before']:.2f} before and {load['after']:.2f} after (2 cores: "
              "anything above about 2 means other work shared the machine during the run).",
              "", "Build times (untimed in the figures above): "
              + ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v:.1f} s" for k, v in builds.items()) + "."]
    (args.out / "inference_resnet50.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
