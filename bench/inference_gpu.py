"""Inference through the engine against bare loops of the same model, on one GPU, in interleaved pairs.

    python bench/inference_gpu.py [--budget-s 200] [--pairs 3] [--out bench/results]   # on the GPU host
    (three pairs of both cases: about 195 s on an H200 from a cold Inductor cache, Python's start included)
    python bench/inference_gpu.py --quick                                              # CPU smoke run

For resnet50-infer (fp16, batch 256, synthetic images) and bert-large-infer (fp16, batch 32, sequence 512),
pair after pair (engine, then bare; the cases taking turns):
  engine    one round of the case through the real pipeline (flagperf.entry.run_job, vendor nvidia, compiler
            inductor): validation_compute (eager) and inference_compute (Inductor), both forwards back to back
            on device-resident batches timed by the device's events, and FlagPerf's inference_core and whole
  bare      the same model built by the case's own create_model, the same number of device-resident batches
            cycled, forwards back to back: eager (the case's model_forward) and torch.compile with the engine's
            options (mode default; channels-last inside the graph for a convolutional model)
Both sides are measured alike: the same timer (device events on a GPU, the host clock on the CPU), the same
number of timed forwards, each side after a device synchronisation and the same idle sleep, on a stream of its
own (the round's, or the bare loops'), with Python's garbage collector paused, and the engine's issue-time probe
(three synchronised forwards) before the timed region on both. Reported per side: the median rate over the pairs
and its spread (min-max); per comparison: the median of the pair ratios. Targets (issue 25): every engine compute
figure >= 0.97 of its bare loop, resnet50-infer inference_compute >= 0.95 and inference_core >= 0.8 of bare
compiled (core >= 0.8 for every case), inference_whole >= 0.9 of core, GPU utilisation >= 90 % over the engine's
compute region (NVML at 20 Hz, the samples of its first second dropped: NVML averages over up to a second). A
median ratio above 1.03 is flagged as suspicious. ONNX Runtime's CUDA provider on resnet50-infer is compared the
same way when onnxruntime-gpu is installed (skipped with the reason otherwise).

Setup (each bare model built and compiled once, before the first pair, which also warms Inductor's cache for the
engine's compiles) is untimed. The records (inference_gpu.json and .md, inference_gpu_quick.* with --quick) are
rewritten after every pair, so a run stopped midway keeps what it finished; a pair starts only if the time the
case's previous pair took still fits in --budget-s. Exits 1 when a round fails, 2 with --strict when a target is
missed, 0 otherwise.
"""

from __future__ import annotations

import argparse
import gc
import logging
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

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
    too_few,
    verdict,
    write_record,
)
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

PAIRS = 3
IDLE_S = {"gpu": 0.5, "cpu": 0.2}  # the sleep before each timed side, after a device synchronisation
BARE_WARMUP = {"gpu": 10, "cpu": 3}  # bare forwards before the timed region (the engine's follow its passes)
ISSUE_PROBE = 3  # flagperf.inference.measure.ISSUE_SAMPLES: synchronised forwards before the engine's region
NVML_SETTLE_S = 1.0  # NVML's utilisation averages over up to a second: earlier samples see the idle before
UTIL_TARGET = 90.0
ORT_MISSING_GPU = "not available: onnxruntime-gpu not installed (does not fit the 64 MiB carry)"

# Comparison -> (engine figure, bare loop, target); the ORT variant has only the inference ones.
COMPARISONS = {
    "validation_compute / bare eager": ("validation_compute", "eager", PARITY),
    "inference_compute / bare compiled": ("inference_compute", "compiled", PARITY),
    "inference_core / bare compiled": ("inference_core", "compiled", 0.8),
}
ORT_COMPARISONS = {
    "inference_compute / bare onnxruntime": ("inference_compute", "onnxruntime", PARITY),
    "inference_core / bare onnxruntime": ("inference_core", "onnxruntime", 0.8),
}
# Issue 25's own figure for ResNet-50 (weaker than the parity target, recorded on its own).
EXTRA_TARGETS = {"resnet50-infer": {"inference_compute / bare compiled (issue: resnet50 compute)": 0.95}}
WHOLE_OVER_CORE = 0.9  # synthetic data: loading must not bound whole (whole and core differ by the copies)


@dataclass
class Variant:
    """One comparison series: a case through one engine, with the shapes it runs at."""

    name: str
    case: str
    sets: list[str]
    iterations: int  # timed forwards of every compute region, engine and bare alike
    engine: str = "inductor"

    @property
    def comparisons(self) -> dict[str, tuple[str, str, float]]:
        return ORT_COMPARISONS if self.engine == "onnxruntime" else COMPARISONS


# The compute regions must outlast NVML's averaging (NVML_SETTLE_S) by half a second or more on an H200
# (ResNet-50's compiled forward of 256 images takes 9.5 ms there, BERT-large's of 32 x 512 tokens 37 ms), and
# three pairs of both cases must end within about 200 s, bare setup (the cold compiles, about 65 s) included.
RESNET_GPU = ["fp16=true", "batch_size=256", "synthetic_images=4096", "repeat=1", "num_workers=8"]
FULL = [
    Variant("resnet50-infer", "resnet50-infer", RESNET_GPU, 160),
    Variant("bert-large-infer", "bert-large-infer", ["fp16=true", "batch_size=32", "seq_len=512",
                                                     "synthetic_sequences=384", "repeat=1", "num_workers=4"], 60),
    Variant("resnet50-infer/onnxruntime", "resnet50-infer", RESNET_GPU, 160, engine="onnxruntime"),
]
# The smoke run's tiny models, on one thread: the tiny BERT takes 0.2 ms a forward, so it times more of them.
RESNET_CPU = ["fp16=false", "batch_size=4", "synthetic_images=64", "repeat=1", "num_workers=0", "depths=[1, 1]",
              "hidden_sizes=[8, 16]", "flops=1.0e6"]
QUICK = [
    Variant("resnet50-infer", "resnet50-infer", RESNET_CPU, 30),
    Variant("bert-large-infer", "bert-large-infer", [
        "fp16=false", "batch_size=2", "seq_len=16", "synthetic_sequences=200", "repeat=1", "num_workers=0",
        "vocab_size=200", "hidden_size=32", "num_hidden_layers=1", "num_attention_heads=2", "intermediate_size=64",
        "flops=1.0e6"], 300),
    Variant("resnet50-infer/onnxruntime", "resnet50-infer", RESNET_CPU, 30, engine="onnxruntime"),
]


def device_timer(device: torch.device) -> Any:
    """The engine's own clock for its compute passes: device events on an accelerator, the host's otherwise."""
    from flagperf.measure.device import device_clock

    return device_clock(device)


def ort_unavailable(device: torch.device) -> str | None:
    """Why the ONNX Runtime variant cannot run here (None: it can)."""
    try:
        import onnxruntime
    except ImportError as exc:
        return f"not available: onnxruntime not importable ({exc})"
    if device.type == "cuda" and "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return ORT_MISSING_GPU
    return None


# -- GPU utilisation ------------------------------------------------------------------------------------------
@dataclass
class UtilSampler:
    """GPU utilisation (NVML through torch) with host timestamps, sampled in a thread for the whole run (both
    sides share its small cost)."""

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

    def settled_mean(self, window: tuple[float, float] | list[float] | None) -> dict[str, Any]:
        """The mean of the samples inside a region, less its first NVML_SETTLE_S."""
        if self.reason is not None or not window:
            return {"percent": None, "samples": 0, "why": self.reason or "no window"}
        start, end = window[0] + NVML_SETTLE_S, window[1]
        inside = [u for t, u in self.samples if start <= t <= end]
        if not inside:
            return {"percent": None, "samples": 0,
                    "why": f"region of {window[1] - window[0]:.2f} s: nothing after NVML's {NVML_SETTLE_S:g} s"}
        return {"percent": sum(inside) / len(inside), "samples": len(inside), "why": None}


# -- the engine's side ----------------------------------------------------------------------------------------
@dataclass
class EngineRound:
    metrics: dict[str, Metric]
    onnx_path: Path | None
    seconds: float


class RoundFailed(Exception):
    pass


def variant_sets(variant: Variant) -> list[str]:
    sets = [*variant.sets, f"compiler={variant.engine}", f"compute_iterations={variant.iterations}"]
    if variant.engine == "onnxruntime":
        sets.append("keep_artifacts=true")  # the bare loop reads the engine's own ONNX file
    return sets


def engine_round(variant: Variant, vendor: str, sets: list[str], work: Path) -> EngineRound:
    started = time.perf_counter()
    plan = plan_run(cases=[variant.case], vendor=vendor, sets=sets, results_dir=work / "results")
    cp = plan.cases[0]
    job = Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, host="bench", vendor=vendor,
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})
    out = work / "round"
    out.mkdir(parents=True)
    code = run_job(job, out)
    result = read_result(out / "result.json")
    if code != 0 or result.status != "success":
        message = result.failure.message if result.failure else f"exit {code}"
        raise RoundFailed(f"{variant.name} through the engine: {message.splitlines()[0]}")
    onnx = result.inference.onnx_path if result.inference else None
    return EngineRound({m.name: m for m in result.metrics}, Path(onnx) if onnx else None,
                       time.perf_counter() - started)


# -- the bare side --------------------------------------------------------------------------------------------
@contextmanager
def gc_paused() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass
class BareLoops:
    """A variant's bare forwards (eager and compiled, or ONNX Runtime's), on resident batches, ready to time."""

    device: torch.device
    items_per_batch: int
    forwards: dict[str, Callable[[int], Any]]  # loop name -> forward of resident batch i
    stream: Any
    setup_s: float
    compile_s: float | None = None

    def sync(self) -> None:
        if self.device.type != "cpu":
            torch.get_device_module(self.device.type).synchronize()

    @contextmanager
    def on_stream(self) -> Iterator[None]:
        if self.stream is None:
            yield
            return
        with torch.get_device_module(self.device.type).stream(self.stream):
            yield

    def rate(self, loop: str, iterations: int, warmup: int, idle_s: float) -> tuple[float, tuple[float, float]]:
        """items/s of ``iterations`` forwards back to back, between two marks of the engine's clock, after
        an idle sleep, ``warmup`` forwards and the engine's issue-time probe; and the region's host window."""
        forward, clock = self.forwards[loop], device_timer(self.device)
        probe = ISSUE_PROBE if self.device.type != "cpu" else 0  # the engine probes only with a device clock
        self.sync()
        time.sleep(idle_s)
        with self.on_stream(), torch.inference_mode(), gc_paused():
            for i in range(warmup):
                forward(i)
            self.sync()
            for _ in range(probe):
                forward(0)
                self.sync()
            started_epoch, started = time.time(), time.perf_counter()
            first = clock.mark()
            for i in range(iterations):
                forward(i)
            last = clock.mark()
            self.sync()
            wall = time.perf_counter() - started
        return iterations * self.items_per_batch / clock.seconds(first, last), (started_epoch, started_epoch + wall)


def case_config(variant: Variant, vendor: str, sets: list[str]) -> tuple[Any, Any]:
    module = load_case(variant.case).module
    config = module.Config.model_validate(plan_run(cases=[variant.case], vendor=vendor, sets=sets,
                                                   results_dir="unused").cases[0].config)
    return module, config


def resident(module: Any, config: Any, device: torch.device, dtype: torch.dtype) -> list[list[torch.Tensor]]:
    """config.compute_batches batches from the case's loader (as many as the engine's compute pass cycles),
    made in this process, on the device (synchronised: another stream reads them)."""
    batches = []
    for inputs, _ in in_main_process(module.build_dataloader(config)):
        tensors = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
        batches.append([t.to(device, dtype if t.is_floating_point() else t.dtype) for t in tensors])
        if len(batches) >= config.compute_batches:
            break
    if device.type != "cpu":
        torch.get_device_module(device.type).synchronize()
    return batches


def remove_artifacts(folder: Path) -> None:
    """A round's kept ONNX and engine files, and the folders left empty up to the work root's artifacts
    folder (as the pipeline's finish_round does when it removes them itself)."""
    shutil.rmtree(folder, ignore_errors=True)
    for parent in folder.parents:
        if parent.name == "inference-artifacts":
            break
        try:
            parent.rmdir()
        except OSError:
            break


def new_stream(device: torch.device) -> Any:
    return torch.get_device_module(device.type).Stream(device) if device.type != "cpu" else None


def torch_loops(variant: Variant, vendor: str, sets: list[str], device: torch.device) -> BareLoops:
    """The case's model, eager (the case's model_forward) and compiled as the Inductor engine compiles it."""
    started = time.perf_counter()
    module, config = case_config(variant, vendor, sets)
    dtype = torch.float16 if config.fp16 else torch.float32
    batches = resident(module, config, device, dtype)
    eager = module.create_model(config)
    eager = (eager.half() if config.fp16 else eager).to(device).eval()
    # A model of its own for the compiled loop: the engine turns its model channels-last in place.
    target = module.create_model(config)
    target = (target.half() if config.fp16 else target).to(device).eval()
    if device.type != "cpu" and has_conv2d(target):
        target = ChannelsLast(target.to(memory_format=torch.channels_last))
    compiled = torch.compile(target, backend="inductor", mode="default", dynamic=False)
    stream = new_stream(device)
    loops = BareLoops(device, config.batch_size * config.items_per_sample(), {
        "eager": lambda i: module.model_forward(eager, batches[i % len(batches)]),
        "compiled": lambda i: compiled(*batches[i % len(batches)]),
    }, stream, 0.0)
    compile_started = time.perf_counter()
    with loops.on_stream(), torch.inference_mode():
        loops.forwards["compiled"](0)
        loops.sync()
    loops.compile_s = time.perf_counter() - compile_started
    loops.setup_s = time.perf_counter() - started
    return loops


def ort_loops(variant: Variant, vendor: str, sets: list[str], device: torch.device, onnx: Path) -> BareLoops:
    """ONNX Runtime on the engine's own ONNX file, the device's provider, inputs and outputs bound once to
    resident torch tensors (I/O binding on the GPU; NumPy arrays on the CPU), run back to back."""
    import numpy as np
    import onnxruntime as ort

    from flagperf.inference.onnxrt import NUMPY, ORT_TYPES

    started = time.perf_counter()
    module, config = case_config(variant, vendor, sets)
    stream = new_stream(device)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if device.type == "cuda":
        provider: Any = ("CUDAExecutionProvider", {"device_id": str(device.index or 0),
                                                   "user_compute_stream": str(stream.cuda_stream)})
    else:
        provider = "CPUExecutionProvider"
    session = ort.InferenceSession(str(onnx), options, providers=[provider])
    inputs, outputs = session.get_inputs(), session.get_outputs()
    batches = resident(module, config, device, ORT_TYPES[inputs[0].type])
    if device.type != "cuda":
        feeds = [{i.name: np.ascontiguousarray(t.to(ORT_TYPES[i.type]).numpy()) for i, t in zip(inputs, b, strict=True)}
                 for b in batches]
        loops = BareLoops(device, config.batch_size, {"onnxruntime": lambda i: session.run(
            None, feeds[i % len(feeds)])}, stream, 0.0)
    else:
        index, bindings, keep = device.index or 0, [], []
        for b in batches:
            binding = session.io_binding()
            for i, t in zip(inputs, b, strict=True):
                t = t.to(ORT_TYPES[i.type]).contiguous()
                keep.append(t)
                binding.bind_input(i.name, "cuda", index, NUMPY[t.dtype], tuple(t.shape), t.data_ptr())
            for o in outputs:
                shape = [config.batch_size if not isinstance(d, int) else d for d in o.shape]
                t = torch.empty(shape, dtype=ORT_TYPES[o.type], device=device)
                keep.append(t)
                binding.bind_output(o.name, "cuda", index, NUMPY[t.dtype], tuple(t.shape), t.data_ptr())
            bindings.append(binding)
        torch.cuda.synchronize(device)
        loops = BareLoops(device, config.batch_size, {"onnxruntime": lambda i: session.run_with_iobinding(
            bindings[i % len(bindings)])}, stream, 0.0)
        loops.keep = keep  # type: ignore[attr-defined]  # the bound tensors live as long as the loops
    with loops.on_stream():
        loops.forwards["onnxruntime"](0)
        loops.sync()
    loops.setup_s = time.perf_counter() - started
    return loops


# -- pairs ----------------------------------------------------------------------------------------------------
@dataclass
class Series:
    """A variant's pairs so far, and what stopped it."""

    variant: Variant
    pairs: list[dict[str, Any]] = field(default_factory=list)
    loops: BareLoops | None = None
    stopped: str | None = None
    failed: str | None = None
    skipped: str | None = None
    notes: dict[str, str] = field(default_factory=dict)
    onnx: Path | None = None

    def estimate_s(self) -> float:
        """The next pair's time: the last pair's (the compiles are warm from the setup)."""
        return self.pairs[-1]["seconds"] if self.pairs else 0.0


def run_pair(series: Series, number: int, vendor: str, sets: list[str], device: torch.device, work: Path,
             idle_s: float, warmup: int, util: UtilSampler) -> dict[str, Any]:
    variant = series.variant
    started = time.perf_counter()
    setup_s = 0.0  # a bare loop built in this pair: not part of the next pair's time
    if device.type != "cpu":
        torch.cuda.synchronize(device)
    time.sleep(idle_s)  # the same idle as before each bare loop
    engine = engine_round(variant, vendor, sets, work / f"pair{number}")
    m = engine.metrics
    if series.loops is None:  # ONNX Runtime's bare loop reads the file the first round exported
        if engine.onnx_path is None or not engine.onnx_path.is_file():
            raise RoundFailed(f"{variant.name}: the engine kept no ONNX file for the bare loop")
        series.onnx = work / engine.onnx_path.name
        shutil.copyfile(engine.onnx_path, series.onnx)
        try:
            series.loops = ort_loops(variant, vendor, sets, device, series.onnx)
        except Exception as exc:  # ONNX Runtime's own errors: the series fails, the others go on
            raise RoundFailed(f"{variant.name}: the bare ONNX Runtime loop: {type(exc).__name__}: {exc}") from exc
        setup_s = series.loops.setup_s
    if engine.onnx_path is not None:
        remove_artifacts(engine.onnx_path.parent)
    if not series.notes:  # how each figure was made, as the engine wrote it
        series.notes = {n: m[n].note or "" for n in ("validation_compute", "inference_core", "inference_compute")
                        if n in m}
    bare: dict[str, float] = {}
    bare_windows: dict[str, tuple[float, float]] = {}
    for loop in series.loops.forwards:
        bare[loop], bare_windows[loop] = series.loops.rate(loop, variant.iterations, warmup, idle_s)
    figures = ("validation_core", "validation_compute", "inference_whole", "inference_core", "inference_compute")
    pair = {
        "pair": number,
        "engine": {n: m[n].value for n in figures if n in m},
        "bare": bare,
        "engine_compute_latency_p50_ms": m["inference_compute_latency"].p50 if "inference_compute_latency" in m
        else None,
        "engine_cold_start_ms": m["inference_cold_start_latency"].value if "inference_cold_start_latency" in m
        else None,
        "engine_round_s": engine.seconds,
        "util_engine_compute": util.settled_mean(m["inference_compute"].window),
        "util_bare": util.settled_mean(bare_windows["onnxruntime" if variant.engine == "onnxruntime"
                                                    else "compiled"]),
        "warnings": {n: x.warning for n, x in m.items() if x.warning},
        "seconds": time.perf_counter() - started - setup_s,
    }
    log.info("%s pair %d: engine %s, bare %s (%.1f s)", variant.name, number,
             {k: round(v, 4) for k, v in pair["engine"].items()}, {k: round(v, 4) for k, v in bare.items()},
             pair["seconds"])
    return pair


def summarise(series: Series, device: torch.device) -> dict[str, Any]:
    v = series.variant
    pairs = series.pairs
    judged = device.type != "cpu"  # the CPU smoke run shows both paths ran; its ratios say nothing
    comparisons: dict[str, Any] = {}
    for name, (figure, loop, target) in v.comparisons.items():
        comparisons[name] = compare([p["engine"][figure] for p in pairs], [p["bare"][loop] for p in pairs], target,
                                    judged)
    for name, target in EXTRA_TARGETS.get(v.name, {}).items():
        base = comparisons[name.split(" (")[0]]
        comparisons[name] = {**base, "target": target, "suspicious": False, "passed": None
                             if base["ratio_median"] is None or not judged else base["ratio_median"] >= target}
    whole = compare([p["engine"]["inference_whole"] for p in pairs],
                    [p["engine"]["inference_core"] for p in pairs], WHOLE_OVER_CORE, judged)
    whole["suspicious"] = False  # two engine figures: not a comparison with a bare loop
    comparisons["inference_whole / inference_core"] = whole
    util = [p["util_engine_compute"]["percent"] for p in pairs if p["util_engine_compute"]["percent"] is not None]
    bare_util = [p["util_bare"]["percent"] for p in pairs if p["util_bare"]["percent"] is not None]
    util_median = statistics.median(util) if util else None
    why = next((p["util_engine_compute"]["why"] for p in pairs if p["util_engine_compute"]["why"]), None)
    return {
        "comparisons": comparisons,
        "util_engine_compute_percent": util_median,
        "util_engine_compute_range": [min(util), max(util)] if util else None,
        "util_bare_percent": statistics.median(bare_util) if bare_util else None,
        "util_why_missing": None if util else why,
        "util_passed": None if util_median is None else util_median >= UTIL_TARGET,
        "engine_compute_latency_p50_ms": statistics.median(
            [p["engine_compute_latency_p50_ms"] for p in pairs if p["engine_compute_latency_p50_ms"] is not None]
        ) if any(p["engine_compute_latency_p50_ms"] is not None for p in pairs) else None,
    }


def judgement(all_series: list[Series], device: torch.device) -> tuple[list[str], list[str]]:
    """(targets missed, suspicious ratios) over every variant with pairs."""
    missed: list[str] = []
    suspicious: list[str] = []
    for s in all_series:
        if not s.pairs:
            continue
        summary = summarise(s, device)
        for name, c in summary["comparisons"].items():
            if c["passed"] is False:
                missed.append(f"{s.variant.name}: {name} {c['ratio_median']:.3f} < {c['target']}")
            if c["suspicious"]:
                suspicious.append(f"{s.variant.name}: {name} {c['ratio_median']:.3f} > {SUSPICIOUS}")
        if summary["util_passed"] is False:
            missed.append(f"{s.variant.name}: GPU utilisation over the engine's compute region "
                          f"{summary['util_engine_compute_percent']:.0f} % < {UTIL_TARGET:.0f} %")
    return missed, suspicious


# -- records --------------------------------------------------------------------------------------------------
def record(all_series: list[Series], device: torch.device, budget: Budget,
           header: dict[str, Any], finished: bool) -> tuple[dict[str, Any], str]:
    missed, suspicious = judgement(all_series, device)
    cases: dict[str, Any] = {}
    for s in all_series:
        entry: dict[str, Any] = {"case": s.variant.case, "engine": s.variant.engine, "sets": s.variant.sets,
                                 "iterations": s.variant.iterations, "pairs_done": len(s.pairs),
                                 "stopped": s.stopped, "failed": s.failed, "skipped": s.skipped}
        if s.loops is not None:
            entry["bare_setup_s"], entry["bare_compile_s"] = s.loops.setup_s, s.loops.compile_s
        if s.pairs:
            entry["summary"] = summarise(s, device)
        entry["pairs"], entry["notes"] = s.pairs, s.notes
        cases[s.variant.name] = entry
    rec = {**header, "recorded": datetime.now(timezone.utc).isoformat(timespec="seconds"), "finished": finished,
           "elapsed_s": budget.elapsed(), "cases": cases, "missed": missed, "suspicious": suspicious,
           "failed": [f"{s.variant.name}: {s.failed}" for s in all_series if s.failed],
           "too_few_pairs": [x for s in all_series if finished and not s.skipped
                             and (x := too_few(s.variant.name, len(s.pairs), header["settings"]["pairs"]))]}
    return rec, markdown(rec)


def markdown(rec: dict[str, Any]) -> str:
    m = rec["machine"]
    s = rec["settings"]
    state = "finished" if rec["finished"] else "**partial** (still running, or stopped)"
    lines = [f"# Inference through the engine vs bare loops ({'CPU smoke run' if rec['quick'] else m['device']})",
             "",
             f"Recorded {rec['recorded']} ({state}, {rec['elapsed_s']:.0f} s from the process's start, budget "
             f"{budget_phrase(s['budget_s'])}) with `{rec['command']}`; code "
             f"{rec['code']}, bench {', '.join(f'{k} {v}' for k, v in rec['bench'].items())}; machine "
             f"{m['device']}, driver {m.get('driver', '-')}, torch {m['torch']} (CUDA {m.get('cuda', '-')}), "
             f"host {m['host']} ({m['cpu']}). Host allocator, both sides: {rec['host_allocator']}.", "",
             f"Method: {s['pairs']} interleaved pairs per case (engine round through flagperf.entry.run_job, then "
             f"the bare loops), cases taking turns; timer: {s['timer']}; the same timed forwards on both sides "
             f"({', '.join(f'{k}: {v}' for k, v in s['iterations'].items())}); a device synchronisation and "
             f"{s['idle_s']:g} s idle before each side and each bare loop; bare loops: {s['bare_warmup']} warm-up "
             "forwards, then "
             + (f"the engine's issue-time probe ({s['issue_probe']} synchronised forwards, as the engine's compute "
                "pass does)" if s["issue_probe"] else "no issue-time probe (the engine probes only with device "
                                                      "events)")
             + "; the engine's compute regions follow its own passes. Rates: median (min-max) over "
             f"the pairs; ratios: median (min-max) of the pair ratios. A median ratio above {SUSPICIOUS} is flagged "
             f"as suspicious. GPU utilisation: {s['gpu_util']}.", ""]
    for name, case in rec["cases"].items():
        lines.append(f"## {name}")
        lines.append("")
        if case["skipped"]:
            lines += [f"Skipped: {case['skipped']}", ""]
            continue
        lines.append(f"{case['pairs_done']} of {s['pairs']} pairs, {case['iterations']} timed forwards each"
                     + (f"; stopped: {case['stopped']}" if case["stopped"] else "")
                     + (f"; **FAILED**: {case['failed']}" if case["failed"] else "")
                     + (f"; bare setup {case['bare_setup_s']:.1f} s (compile {case['bare_compile_s']:.1f} s)"
                        if case.get("bare_compile_s") is not None else ""))
        lines.append("")
        if "summary" not in case:
            continue
        summary = case["summary"]
        lines += ["| comparison | engine, median (min-max) | bare / reference, median (min-max) | "
                  "ratio, median (min-max) | target | verdict |", "|---|---|---|---|---|---|"]
        for cname, c in summary["comparisons"].items():
            target = f">= {c['target']}" if c["target"] is not None else "-"
            lines.append(f"| {cname} | {rate_cell(c['engine'])} | {rate_cell(c['bare'])} | {ratio_cell(c)} | "
                         f"{target} | {verdict(c)} |")
        u = summary["util_engine_compute_percent"]
        util_cell = (f"{u:.0f} % ({summary['util_engine_compute_range'][0]:.0f}-"
                     f"{summary['util_engine_compute_range'][1]:.0f})" if u is not None
                     else summary["util_why_missing"] or "-")
        bare_u = summary["util_bare_percent"]
        lines.append(f"| GPU utilisation over the compute region | {util_cell} | "
                     f"{f'{bare_u:.0f} %' if bare_u is not None else '-'} | | >= {UTIL_TARGET:.0f} % | "
                     f"{'-' if summary['util_passed'] is None else 'pass' if summary['util_passed'] else '**MISSED**'}"
                     " |")
        lines.append("")
        for n, note in case["notes"].items():
            lines.append(f"- {n}: {note}")
        for p in case["pairs"]:
            for metric, warning in p["warnings"].items():
                lines.append(f"- pair {p['pair']}, {metric}: {warning}")
        lines.append("")
    if rec["quick"]:
        lines.append("Smoke run: both paths ran; ratios and utilisation are not judged on a shared CPU.")
    else:
        lines += outcome_lines(rec)
    lines += [""] + [f"**Suspicious** (engine above its bare loop): {x}" for x in rec["suspicious"]]
    lines += [f"**Failed**: {x}" for x in rec["failed"]]
    lines += [f"**Too few pairs**: {x}" for x in rec.get("too_few_pairs", [])]
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU smoke run: tiny models, vendor cpu")
    parser.add_argument("--strict", action="store_true", help="exit 2 when a target is missed")
    parser.add_argument("--cases", nargs="+", help="variants to run (default: all); names as in the record")
    parser.add_argument("--pairs", type=int, default=PAIRS, help="interleaved pairs per case (at least 3 to judge)")
    parser.add_argument("--budget-s", type=float, default=None, help="stop pairing when the next pair would not "
                        "end within this many seconds of the start (default: no limit)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="folder for the records")
    args = parser.parse_args()
    budget = Budget(args.budget_s)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    vendor = "cpu" if args.quick else "nvidia"
    device = torch.device("cpu" if args.quick else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("FAILED: no CUDA device visible to torch (use --quick for the CPU smoke run)", file=sys.stderr)
        return 1
    variants = QUICK if args.quick else FULL
    if args.cases:
        unknown = sorted(set(args.cases) - {v.name for v in variants})
        if unknown:
            print(f"--cases: unknown {', '.join(unknown)} (known: {', '.join(v.name for v in variants)})",
                  file=sys.stderr)
            return 2
        variants = [v for v in variants if v.name in args.cases]
    if args.quick:
        # One intra-op thread on both sides: on a shared 2-core VM a second thread is descheduled at random
        # and every forward waits for it, which makes any ratio noise.
        torch.set_num_threads(1)
    kind = "cpu" if args.quick else "gpu"
    idle_s, warmup = IDLE_S[kind], BARE_WARMUP[kind]
    # A case process keeps freed host memory for reuse (flagperf.measure.hostmemory): this process runs the
    # engine's rounds (run_job) and the bare loops, both under that setting, made here before either runs.
    allocator = keep_freed_host_memory()
    name = "inference_gpu_quick" if args.quick else "inference_gpu"
    all_series = [Series(v) for v in variants]
    with tempfile.TemporaryDirectory() as tmp, UtilSampler(device) as util:
        header = {"command": command_line(), "code": code_identity(),
                  "bench": bench_identity(Path(__file__), ROOT / "bench" / "paired.py"),
                  "machine": machine(device.type), "host_allocator": allocator, "quick": args.quick,
                  "settings": {"pairs": args.pairs, "budget_s": args.budget_s, "idle_s": idle_s,
                               "bare_warmup": warmup, "issue_probe": ISSUE_PROBE if device.type != "cpu" else 0,
                               "iterations": {v.name: v.iterations for v in variants},
                               "timer": device_timer(device).name,
                               "gpu_util": util.reason or f"torch.cuda.utilization (NVML) at 20 Hz, the first "
                                                          f"{NVML_SETTLE_S:g} s of each region dropped"},
                  "targets": {"parity": PARITY, "suspicious_above": SUSPICIOUS, "util_percent": UTIL_TARGET,
                              "whole_over_core": WHOLE_OVER_CORE, "extra": EXTRA_TARGETS}}

        def save(finished: bool = False) -> dict[str, Any]:
            rec, md = record(all_series, device, budget, header, finished)
            write_record(args.out, name, rec, md)
            return rec

        # Setup: every bare model built and compiled before the first pair (this also fills Inductor's cache,
        # so every engine round compiles alike and the first pair's time predicts the next ones').
        for s in all_series:
            if s.variant.engine == "onnxruntime":
                s.skipped = ort_unavailable(device)
                continue  # its bare loop reads the ONNX file of the first engine round
            s.loops = torch_loops(s.variant, vendor, variant_sets(s.variant), device)
            log.info("%s: bare loops built and compiled in %.1f s", s.variant.name, s.loops.setup_s)
        save()
        for number in range(1, args.pairs + 1):
            for s in all_series:
                if s.skipped or s.failed or s.stopped:
                    continue
                if not budget.fits(s.estimate_s()):
                    s.stopped = (f"budget: pair {number} (about {s.estimate_s():.0f} s) would end after "
                                 f"{args.budget_s:g} s")
                    log.info("%s: %s", s.variant.name, s.stopped)
                    continue
                try:
                    s.pairs.append(run_pair(s, number, vendor, variant_sets(s.variant), device,
                                            Path(tmp) / s.variant.name.replace("/", "-"), idle_s, warmup, util))
                except RoundFailed as exc:
                    s.failed = str(exc)
                    print(f"FAILED: {exc}", file=sys.stderr)
                save()
        rec = save(finished=True)
    print(markdown(rec))
    if rec["failed"]:
        return 1
    if rec["missed"]:
        print("TARGETS MISSED: " + "; ".join(rec["missed"]), file=sys.stderr)
        return 2 if args.strict else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
