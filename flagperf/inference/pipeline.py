"""The seven in-process steps of an inference round, as plain functions over one state object.

    a. init            config, toggles, the engine's library
    b. dataset_model   build_dataloader(config); create_model(config) unless no_validation
    c. validation      the eager model over the data (validation_whole/core/compute), FLOPs counted
    d. export          export_model(model, config, path) to ONNX (skipped for an engine that reads no ONNX)
    e. compile         the vendor's engine, built once from (config, onnx_path, model), untimed
    f. inference       engine_forward over the data (inference_whole/core/compute), then LoadGen's scenarios
    g. summary         metrics (computed here, once), raw latencies and the report
After the steps, the round's ONNX and engine files are removed unless keep_artifacts (finish_round).

The data path is the pipeline's, not the case's: the case's loader is rebuilt (flagperf.inference.data.
with_data_path) so that batches are made by its workers in the dtype each pass takes, prefetched, and pinned
on an accelerator so that the copy inside core is an asynchronous DMA; a synthetic data set's few distinct
batches are made once per pass instead (loading a synthetic batch is not work the chip is judged by).

Which steps run is decided by the toggles (flagperf.inference.config.skipped_steps). ``run_steps`` takes a
runner, so the same functions run as Prefect subflows or as plain calls (flagperf.inference.subflows).

A case module (cases/inference/<model>/pytorch/__init__.py) provides:
  Config                                   subclass of InferenceConfig with the case's parameters
  build_dataloader(config) -> DataLoader   batches of (inputs, labels); drop_last=True
  create_model(config) -> nn.Module
  evaluator(outputs, labels) -> float      a batch's score on the CPU (e.g. top-1 accuracy)
  model_forward(model, inputs) -> outputs  one batch, eager (may yield per generated token)
  export_model(model, config, path)        write the ONNX file at path
  engine_forward(engine, inputs) -> (outputs, non-inference seconds); a generator's seconds may be a
                                           callable, read once the generator is consumed
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.utils.data import DataLoader

from flagperf.errors import CaseUserError
from flagperf.inference.config import (
    NOT_APPLICABLE,
    RANDOM_WEIGHTS,
    STEP_TITLES,
    STEPS,
    InferenceConfig,
    check_toggles,
    skipped_steps,
)
from flagperf.inference.data import (
    SyntheticBatches,
    in_flight_batches,
    in_main_process,
    makes_batches_once,
    with_data_path,
)
from flagperf.inference.engines import EngineDef, EngineEnv, InferenceEngine, check_engine_toggles
from flagperf.inference.measure import (
    ComputeStats,
    Forward,
    NonInference,
    PassStats,
    compute_metrics,
    compute_pass,
    drain,
    pass_metrics,
    resident_batches,
    timed_pass,
    with_convention,
)
from flagperf.inference.provenance import check_reused_files, engine_options, write_record
from flagperf.measure.casekit import CaseContext
from flagperf.measure.device import device_clock, device_module, synchronize
from flagperf.measure.timing import TimingPlan
from flagperf.results.schema import InferenceReport, LoadgenResult, Metric, SpecTable

log = logging.getLogger("flagperf.case.inference")
LATENCIES_FILE = "latencies.json"
ARTIFACTS_FOLDER = "inference-artifacts"  # under the host's work root; see finish_round


@dataclass
class InferenceRun:
    """Everything the steps share; each step reads what earlier steps left here."""

    case_name: str
    module: ModuleType
    config: InferenceConfig
    vendor: str
    spec: SpecTable
    device: torch.device
    shares_host_memory: bool
    out_dir: Path  # the round's folder: small files only, it is collected into the results
    artifact_dir: Path  # ONNX and engine files (hundreds of MB to GB), kept on the host for reuse
    origins: dict[str, str] = field(default_factory=dict)
    runner: str = "plain functions"
    started: float = field(default_factory=time.perf_counter)
    engine_def: EngineDef | None = None
    engine_cls: type[InferenceEngine] | None = None
    loader: Any = None  # the case's own loader (never iterated: each pass rebuilds it for its dtype)
    model: torch.nn.Module | None = None
    onnx_path: Path | None = None
    engine: InferenceEngine | None = None
    validation: PassStats | None = None
    inference: PassStats | None = None
    validation_compute: ComputeStats | None = None
    inference_compute: ComputeStats | None = None
    flops_per_item: float | None = None  # counted on the configured model (step c)
    flops_source: str | None = None
    model_load_s: float | None = None
    compile_s: float | None = None
    loadgen: list[LoadgenResult] = field(default_factory=list)
    steps: dict[str, str] = field(default_factory=dict)
    metrics: list[Metric] = field(default_factory=list)
    report: InferenceReport | None = None
    stream: Any = None  # the round's own device stream (on_stream)
    reused: list[tuple[str, bool]] = field(default_factory=list)  # (statement, checked) per reused file
    random_weights: bool = False  # create_model built random weights (no checkpoint_path)

    @contextmanager
    def on_stream(self) -> Iterator[None]:
        """The round's own stream as the current one, in whichever thread runs this (a stream is current per
        thread). Never the legacy default stream: TensorRT synchronises after every enqueue on it, ONNX Runtime
        reads its handle 0 as "none given" and runs on a stream of its own, and it serialises with every other
        stream. Models, copies, engines and the device's events all use torch's current stream."""
        module = device_module(self.device)
        if module is None or not hasattr(module, "Stream") or not hasattr(module, "stream"):
            yield
            return
        if self.stream is None:
            self.stream = module.Stream(self.device)
        with module.stream(self.stream):
            yield

    @property
    def ctx(self) -> CaseContext:
        return CaseContext(self.device.type, self.spec, TimingPlan(0, 1.0, 1), log,
                           shares_host_memory=self.shares_host_memory)

    def sync(self) -> None:
        synchronize(self.device)

    @property
    def dataset(self) -> Any:
        return getattr(self.loader, "dataset", None)

    @property
    def synthetic(self) -> bool:
        return bool(getattr(self.dataset, "synthetic", False))

    @property
    def evaluator(self) -> Callable[[list[torch.Tensor], Any], float] | None:
        """The case's evaluator, unless the inputs are synthetic or the case has no accuracy (ACCURACY None)."""
        if self.synthetic or getattr(self.module, "ACCURACY", "accuracy") is None:
            return None
        return self.module.evaluator


def step_init(run: InferenceRun) -> None:
    c = run.config
    check_toggles(c, run.origins, run.case_name)
    if c.torch_threads is not None:
        torch.set_num_threads(c.torch_threads)
    log.info("case %s on %s (%s): compiler %s, %s, batch %d, %.4g FLOP per %s, repeat %d", run.case_name,
             run.vendor, run.spec.device, c.compiler, c.precision, c.batch_size, c.flops, c.item_name, c.repeat)
    log.info("toggles: no_validation %s, exist_onnx_path %s, exist_compiler_path %s", c.no_validation,
             c.exist_onnx_path, c.exist_compiler_path)
    run.engine_def = check_engine_toggles(c, run.vendor, run.origins, run.case_name)
    if run.engine_def is not None:
        run.engine_cls = run.engine_def.engine_class()  # a missing library fails here, before any work
        log.info("engine %s from %s", run.engine_def.manifest.name, run.engine_def.source)
        if engine_precision(run) != c.precision:
            log.warning("fp16: true, but engine %s reads an FP32 ONNX file: its inference figures are FP32 ones "
                        "(MFU against the fp32 peak); validation runs the model in FP16", c.compiler)
    if run.engine_def is not None:
        # Checked by the plan too where the files are local; here again on the host that reads them.
        run.reused = check_reused_files(c, run.case_name, run.vendor, run.engine_def.manifest.needs_onnx,
                                        run.origins, run.case_name)
        for statement, checked in run.reused:
            (log.info if checked else log.warning)("%s", statement)
    if c.loadgen_scenarios:
        from flagperf.inference.loadgen import require_loadgen

        require_loadgen()  # a missing package fails here, not after validation and compilation
        for key in ("loadgen_mlperf_conf", "loadgen_user_conf"):
            path = getattr(c, key)
            if path is not None and not Path(path).is_file():
                raise CaseUserError(f"{run.origins.get(key, run.case_name)}: {key}: {path} is not a file")


def step_dataset_model(run: InferenceRun) -> None:
    run.loader = run.module.build_dataloader(run.config)
    what = getattr(run.dataset, "description", type(run.dataset).__name__)
    log.info("data: %s%s", what, " (synthetic inputs: throughput only, no accuracy)" if run.synthetic else "")
    if run.config.no_validation:
        log.info("no_validation: true: no model is created")
        return
    run.sync()
    started = time.perf_counter()
    model = run.module.create_model(run.config)
    if not isinstance(model, torch.nn.Module):
        raise CaseUserError(f"create_model returned {type(model).__name__}, not a torch.nn.Module")
    check_attention(run.config, model)
    run.random_weights = any(getattr(m, RANDOM_WEIGHTS, False) for m in model.modules())
    # Halved before it moves: a large model never sits on the device in FP32 when FP16 is what runs.
    run.model = (model.half() if run.config.fp16 else model).to(run.device).eval()
    run.sync()
    run.model_load_s = time.perf_counter() - started
    log.info("model: %s, %.4g parameters%s, built and on %s in %.2f s; %s", type(model).__name__,
             sum(p.numel() for p in model.parameters()),
             ", random weights (checkpoint_path: null)" if run.random_weights else "", run.device, run.model_load_s,
             run.config.attention_statement())


def attention_of(model: torch.nn.Module) -> str | None:
    """transformers' attn_implementation of the first transformers model inside ``model`` (read off its config,
    so transformers is not imported for a model without one); None for other models."""
    for module in model.modules():
        implementation = getattr(getattr(module, "config", None), "_attn_implementation", None)
        if isinstance(implementation, str):
            return implementation
    return None


def check_attention(config: InferenceConfig, model: torch.nn.Module) -> None:
    """The attention the result states is the one the model runs: a transformers model built with another one
    (a checkpoint's loader picking its own) is an error, not a mislabelled figure."""
    stated = config.attention
    runs = attention_of(model)
    if stated is None or stated == NOT_APPLICABLE or runs is None:
        return
    if runs != stated:
        raise CaseUserError(f"attention: {stated} is configured, but create_model built a model that runs {runs}")


def engine_precision(run: InferenceRun) -> str:
    """The spec-table key of what the engine runs: what the built engine says (its tensors' types), else the
    case's, unless an FP16 case's engine reads an FP32 ONNX file (its figures are FP32 ones, and MFU is taken
    against the FP32 peak)."""
    if run.engine is not None and run.engine.precision is not None:
        return run.engine.precision
    if run.engine_def is None or not run.config.fp16:
        return run.config.precision
    return "fp16" if run.engine_def.manifest.input_dtype(run.config) == torch.float16 else "fp32"


def _model_dtype(run: InferenceRun) -> torch.dtype:
    return torch.float16 if run.config.fp16 else torch.float32


def _pass_loader(run: InferenceRun, dtype: torch.dtype) -> Any:
    return with_data_path(run.loader, run.device, dtype)


def data_path_note(run: InferenceRun) -> str:
    workers = getattr(run.loader, "num_workers", 0)
    if not isinstance(run.loader, DataLoader):
        return f"the case's own loader ({type(run.loader).__name__}), used as it is"
    copies = ("pinned host memory, asynchronous copies" if run.device.type != "cpu"
              else "host memory (CPU device)")
    if makes_batches_once(run.loader):
        return (f"synthetic: each pass's batches made once in its input dtype, before it is timed, and reused "
                f"(no loading inside whole; the copy to the device stays inside whole and core); {copies}")
    if run.device.type != "cpu":
        held = in_flight_batches(with_data_path(run.loader, run.device, None))
        copies += (f"; a warm-up of at least {held} batch{'es' if held != 1 else ''}, so each pinned buffer the "
                   "loader holds is allocated before the timed pass" if held else "")
    return (f"batches made in each pass's input dtype by {workers} worker(s)"
            f"{' with prefetch' if workers else ' in the main process'}; {copies}; compute-pass batches made "
            "in the main process")


def _to_device(run: InferenceRun) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    def move(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        # The loader already made the batch in the model's dtype; the cast is a no-op kept for a case whose
        # own loader the pipeline could not rebuild.
        moved = [x.to(run.device, non_blocking=True) for x in inputs]
        return [x.half() if run.config.fp16 and x.is_floating_point() else x for x in moved]
    return move


def _resident(run: InferenceRun, dtype: torch.dtype, to_device: Callable[[list[torch.Tensor]], list[torch.Tensor]],
              timed: Any) -> list[list[torch.Tensor]]:
    """The compute pass's batches, made in this process and left on the device: a pass loader's workers
    would go on making (and pinning) their prefetched batches in the background while the compute pass is
    timed, and a host busy with that falls behind a fast device (the device's events then time its idling).
    Synthetic batches the timed pass made once (``timed``) are taken from it, not made again."""
    source = timed if isinstance(timed, SyntheticBatches) else in_main_process(_pass_loader(run, dtype))
    return resident_batches(source, to_device, run.config.compute_batches)


def _on_device(run: InferenceRun) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    return lambda inputs: [x.to(run.device, non_blocking=True) for x in inputs]


def _compute(run: InferenceRun, name: str, batches: list[list[torch.Tensor]], forward: Forward,
             stats: PassStats) -> ComputeStats:
    """The pass again on inputs already on the device, forwards back to back, timed by the device's events."""
    c = run.config
    computed = compute_pass(name, batches, forward, device_clock(run.device), run.sync,
                            iterations=c.compute_iterations or stats.batches, warmup=max(1, c.warmup_batches),
                            items_per_sample=c.items_per_sample())
    log.info("%s compute: %d forwards, %.2f ms per batch (%s)", name, len(computed.seconds),
             1e3 * sum(computed.seconds) / len(computed.seconds), computed.clock)
    return computed


def attention_flops(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any) -> int:
    """A fused attention kernel's FLOPs: query x key-transposed and scores x value, for every query head (grouped
    key/value heads broadcast to them), every position of the shapes counted (padded or causally masked ones
    too, as torch counts them). Shapes are (batch, heads, positions, head size)."""
    batch, heads, queries, head_size = query_shape
    keys, value_size = key_shape[-2], value_shape[-1]
    return 2 * batch * heads * queries * keys * (head_size + value_size)


# torch's fused attention kernels, forward: torch's FlopCounterMode has no formula for the CPU's (SDPA's FLOPs would
# go uncounted there, and the same model count fewer FLOPs on a CPU than on a GPU), and its own formula for the
# others refuses grouped key/value heads in some versions.
FUSED_ATTENTION_KERNELS = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                           "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                           "_scaled_dot_product_fused_attention_overrideable")


def attention_flop_formulas() -> dict[Any, Any]:
    """FlopCounterMode's custom_mapping: attention_flops for each fused attention kernel this torch has."""
    return {getattr(torch.ops.aten, name): attention_flops for name in FUSED_ATTENTION_KERNELS
            if hasattr(torch.ops.aten, name)}


def count_flops(run: InferenceRun, batch: list[torch.Tensor]) -> float | None:
    """FLOPs per item of the configured model on one real batch (torch's FlopCounterMode: matmuls,
    convolutions, attention), so MFU follows the model's shape whatever the overrides. Every position of the
    batch's shape is counted, padded ones included: they are computed (the case's flops_scope says so)."""
    from torch.utils.flop_counter import FlopCounterMode

    assert run.model is not None
    counter = FlopCounterMode(display=False, custom_mapping=attention_flop_formulas())
    with torch.inference_mode(), counter:
        result = run.module.model_forward(run.model, batch)
        if isinstance(result, Iterator):
            for _ in result:
                pass
    total = counter.get_total_flops()
    items = batch[0].shape[0] * run.config.items_per_sample()
    return total / items if total > 0 and items > 0 else None


def _set_flops(run: InferenceRun, batch: list[torch.Tensor] | None) -> None:
    c = run.config
    counted = count_flops(run, batch) if batch is not None and run.model is not None else None
    if counted is None:
        why = "no_validation: true, no model to count" if run.model is None else "the counter saw no FLOPs"
        run.flops_per_item, run.flops_source = c.flops, f"configured flops ({why})"
        return
    run.flops_per_item = counted
    run.flops_source = (f"counted on the configured model (torch FlopCounterMode, one batch of {c.batch_size}); "
                        f"configured flops {c.flops:.4g}")
    if abs(counted - c.flops) > 0.25 * c.flops:
        log.warning("FLOPs per %s: counted %.4g on the configured model, the config says %.4g (MFU uses the "
                    "count; a config figure that does not follow the model's shape would mislead)",
                    c.item_name.rstrip("s"), counted, c.flops)


def step_validation(run: InferenceRun) -> None:
    model = run.model

    def forward(inputs: list[torch.Tensor]) -> tuple[Any, float]:
        return run.module.model_forward(model, inputs), 0.0

    loader = _pass_loader(run, _model_dtype(run))
    run.validation = timed_pass("validation", loader, forward, run.evaluator, run.sync, run.config, log,
                                to_device=_to_device(run), min_warmup=in_flight_batches(loader))
    _log_pass(run.validation, run.config)
    batches = _resident(run, _model_dtype(run), _to_device(run), loader)
    del loader  # its workers end here, before the compute pass and the engine's pass
    run.validation_compute = _compute(run, "validation", batches, forward, run.validation)
    _set_flops(run, batches[0])


@contextmanager
def _export_precision(half: bool) -> Iterator[None]:
    """FP16 export: the model in FP16, and the case's example inputs made in FP16 (they are made with
    torch's default dtype)."""
    if not half:
        yield
        return
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def step_export(run: InferenceRun) -> None:
    assert run.model is not None  # no_validation skips this step
    run.artifact_dir.mkdir(parents=True, exist_ok=True)
    path = run.artifact_dir / f"{run.case_name}_bs{run.config.batch_size}_fp16{run.config.fp16}.onnx"
    # Exported on the CPU, in FP32 unless the engine takes the case's precision (onnx_precision: case: TensorRT
    # builds strongly typed networks, 11 has no FP16 builder flag; ORT's CUDA provider runs the graph's types).
    # The copy is made in host memory (the model visits the CPU and goes back) so a large model never sits twice
    # on the device.
    half = (run.config.fp16 and run.engine_def is not None
            and run.engine_def.manifest.onnx_precision == "case")
    model = copy.deepcopy(run.model.cpu())
    model = (model.half() if half else model.float()).eval()
    run.model.to(run.device)
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad(), _export_precision(half):
        warnings.simplefilter("ignore")  # torch's exporters warn at length about tracing; the file is checked
        run.module.export_model(model, run.config, path)
    if not path.is_file() or path.stat().st_size == 0:
        raise CaseUserError(f"export_model wrote no ONNX file at {path}")
    run.onnx_path = path
    write_record(path, run.config, run.case_name, "onnx", engine_options(run.vendor, run.config.compiler),
                 "fp16" if half else "fp32")
    log.info("exported %s (%.1f MiB)", path, path.stat().st_size / 2**20)


def _engine_env(run: InferenceRun) -> EngineEnv:
    run.artifact_dir.mkdir(parents=True, exist_ok=True)
    return EngineEnv(device=run.device, work_dir=run.artifact_dir, case=run.case_name, log=log)


def _reads_onnx(run: InferenceRun) -> bool:
    return run.engine_def is not None and run.engine_def.manifest.needs_onnx


def _onnx_for_engine(run: InferenceRun) -> Path | None:
    """The ONNX file the engine compiles: none for an engine that reads none (an exist_onnx_path is ignored)."""
    if not _reads_onnx(run):
        return None
    if run.onnx_path is not None:
        return run.onnx_path
    return Path(run.config.exist_onnx_path) if run.config.exist_onnx_path else None


def _onnx_compiled(run: InferenceRun) -> Path | None:
    """The ONNX file the engine was built from: none where it was loaded from exist_compiler_path (FlagPerf's
    flow sets exist_onnx_path to any placeholder then; the result must not name it as the engine's source)."""
    return None if run.config.exist_compiler_path is not None else _onnx_for_engine(run)


def step_compile(run: InferenceRun) -> None:
    assert run.engine_cls is not None
    started = time.perf_counter()
    try:
        run.engine = run.engine_cls(run.config, _onnx_for_engine(run), run.model, _engine_env(run))
    except (CaseUserError, MemoryError):
        raise
    except Exception as exc:
        if run.onnx_path is not None or run.config.exist_onnx_path is None or not _reads_onnx(run):
            raise  # our own export (or the model) failed to compile: a crash, reported with its traceback
        # The user's ONNX file: a file the engine cannot read is the config's fault, not worth a retry.
        raise _user_file_error(run, "exist_onnx_path", Path(run.config.exist_onnx_path), exc) from exc
    run.compile_s = time.perf_counter() - started
    if run.engine.engine_file is not None and run.engine.engine_file.is_file():
        write_record(run.engine.engine_file, run.config, run.case_name, "engine",
                     engine_options(run.vendor, run.config.compiler), run.engine.precision)
    log.info("compiled in %.2f s (untimed)%s", run.compile_s,
             f", engine file {run.engine.engine_file}" if run.engine.engine_file else "")


def _user_file_error(run: InferenceRun, key: str, path: Path, exc: Exception) -> CaseUserError:
    where = run.origins.get(key, run.case_name)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return CaseUserError(f"{where}: {key}: {path} cannot be loaded by engine {run.config.compiler}: {first}")


def load_engine_file(run: InferenceRun) -> InferenceEngine:
    """exist_compiler_path: the engine is loaded, not built; a file it cannot load is the config's fault."""
    assert run.engine_cls is not None and run.config.exist_compiler_path is not None
    path = Path(run.config.exist_compiler_path)
    try:
        engine = run.engine_cls(run.config, _onnx_for_engine(run), run.model, _engine_env(run), engine_path=path)
    except (CaseUserError, MemoryError):
        raise
    except Exception as exc:
        raise _user_file_error(run, "exist_compiler_path", path, exc) from exc
    log.info("engine loaded from %s (compile step skipped)", path)
    return engine


def step_inference(run: InferenceRun) -> None:
    if run.engine is None:
        started = time.perf_counter()
        run.engine = load_engine_file(run)
        run.compile_s = time.perf_counter() - started
    engine = run.engine

    def forward(inputs: list[torch.Tensor]) -> tuple[Any, NonInference]:
        return run.module.engine_forward(engine, inputs)

    assert run.engine_def is not None
    loader = _pass_loader(run, run.engine_def.manifest.input_dtype(run.config))
    run.inference = timed_pass("inference", loader, forward, run.evaluator, run.sync, run.config, log,
                               min_warmup=in_flight_batches(loader))
    _log_pass(run.inference, run.config)
    batches = _resident(run, run.engine_def.manifest.input_dtype(run.config), _on_device(run), loader)
    # LoadGen's samples are made in this process: taking a few from the pass loader would leave its workers
    # mid-epoch, alive with their prefetched batches until the loader is collected.
    samples_from = in_main_process(loader)
    del loader  # its workers end here, before the compute pass and LoadGen
    run.inference_compute = _compute(run, "inference", batches, forward, run.inference)
    if run.flops_per_item is None:
        _set_flops(run, None)
    if run.config.loadgen_scenarios:
        from flagperf.inference.loadgen import run_scenarios  # mlperf_loadgen only when asked for

        def forward_on_stream(inputs: list[torch.Tensor]) -> tuple[Any, NonInference]:
            with run.on_stream():  # LoadGen issues queries from threads of its own
                result, non_inference = forward(inputs)
                return drain(result), non_inference  # a decoding loop runs here, on the round's stream

        run.loadgen = run_scenarios(run.config, samples_from, forward_on_stream, run.sync, run.out_dir,
                                    run.case_name)


def _log_pass(stats: PassStats, config: InferenceConfig) -> None:
    log.info("%s: %d batches, %d %s, whole %.2f s, core %.2f s%s", stats.name, stats.batches, stats.items,
             config.item_name, stats.whole_seconds, sum(stats.core_seconds),
             f", accuracy {stats.accuracy:.4f}" if stats.accuracy is not None else "")


def step_summary(run: InferenceRun) -> None:
    c = run.config
    ctx = run.ctx
    accuracy_name = getattr(run.module, "ACCURACY", "accuracy")
    flops = run.flops_per_item if run.flops_per_item is not None else c.flops
    metrics: list[Metric] = []
    passes = ((run.validation, run.validation_compute, c.precision),
              (run.inference, run.inference_compute, engine_precision(run)))
    for stats, computed, precision in passes:
        if stats is not None:
            metrics += pass_metrics(stats, c, ctx, synthetic=run.synthetic, accuracy_name=accuracy_name,
                                    flops_per_item=flops, precision=precision)
        if computed is not None:
            metrics += compute_metrics(computed, c, ctx, flops_per_item=flops, precision=precision)
    metrics += _setup_metrics(run) + _loadgen_metrics(run)
    metrics = _with_accuracy_reference(run, _with_reuse_notes(run, metrics))
    if run.random_weights:
        accuracy = f"_{getattr(run.module, 'ACCURACY', 'accuracy')}"
        metrics = [with_convention(m, RANDOM_WEIGHTS_NOTE) if m.name.endswith(accuracy) else m for m in metrics]
    e2e = time.perf_counter() - run.started
    metrics.append(Metric(name="e2e_time", value=e2e, unit="s", note="steps a to g in the case process",
                          statistic="single", convention="FlagPerf's e2e_time: steps a to g in the case process, "
                                                         "untimed compile and set-up included"))
    run.metrics = metrics
    steps = {name: run.steps.get(name, "ran") for name in STEPS}
    steps["summary"] = "ran"
    note = None
    if run.synthetic:
        note = "synthetic inputs: throughput only; no accuracy is reported"
    elif getattr(run.module, "ACCURACY", None) is None:
        note = "the case has no accuracy metric"
    elif run.random_weights:
        note = RANDOM_WEIGHTS_NOTE
    run.report = InferenceReport(
        compiler=c.compiler, precision=c.precision, batch_size=c.batch_size, flops_per_item=flops,
        item=c.item_name, steps=steps, runner=run.runner, synthetic_data=run.synthetic,
        data=str(getattr(run.dataset, "description", type(run.dataset).__name__)), accuracy_note=note,
        e2e_time_s=e2e, non_inference_s=run.inference.non_inference_seconds if run.inference else 0.0,
        onnx_path=str(_onnx_compiled(run)) if _onnx_compiled(run) else None,
        engine_file=str(run.engine.engine_file) if run.engine and run.engine.engine_file else None,
        loadgen=run.loadgen, flops_source=run.flops_source or "configured flops", flops_configured=c.flops,
        latencies_file=write_latencies(run), data_path=data_path_note(run),
    )
    by_name = {m.name: m for m in metrics}
    # FlagPerf's closing line, with its names, so a FlagPerf reader finds the figures where they expect.
    log.info("Finish Info: vendor %s, compiler %s, precision %s, batchsize %d, flops %.4g, e2e_time %.2f s, "
             "p_validation_whole %s, p_validation_core %s, p_inference_whole %s, *p_inference_core %s",
             run.vendor, c.compiler, c.precision, c.batch_size, flops, e2e,
             *(f"{by_name[n].value:.4g}" if n in by_name else "None"
               for n in ("validation_whole", "validation_core", "inference_whole", "inference_core")))
    for m in metrics:
        if m.warning:
            log.warning("%s: %s", m.name, m.warning)


RANDOM_WEIGHTS_NOTE = ("random weights (checkpoint_path: null; nothing is downloaded): the accuracy is chance level, "
                      "a check that the engine agrees with the eager model, not the model's accuracy")


def _with_reuse_notes(run: InferenceRun, metrics: list[Metric]) -> list[Metric]:
    """Every figure of the engine says which reused file it came from; one that was not checked against this
    config warns (it may be another model's figure under this model's name and FLOPs)."""
    if not run.reused:
        return metrics
    note = "; ".join(statement for statement, _ in run.reused)
    unchecked = "; ".join(statement for statement, checked in run.reused if not checked)
    updated = []
    for m in metrics:
        if m.name.startswith(("inference_", "loadgen_")):
            update: dict[str, Any] = {"note": f"{m.note}; {note}" if m.note else note}
            if unchecked:
                update["warning"] = f"{m.warning}; {unchecked}" if m.warning else unchecked
            m = m.model_copy(update=update)
        updated.append(m)
    return updated


def _with_accuracy_reference(run: InferenceRun, metrics: list[Metric]) -> list[Metric]:
    """FlagPerf's accuracy check: the engine's accuracy against the eager, unexported model's (validation) on
    the same data. Both are scored against the data's labels; the difference is stated, and one above
    accuracy_tolerance warns (the engine computes another function than the model)."""
    name = getattr(run.module, "ACCURACY", "accuracy")
    by_name = {m.name: m for m in metrics}
    eager, engine = by_name.get(f"validation_{name}"), by_name.get(f"inference_{name}")
    updated = []
    for m in metrics:
        if m is eager:
            m = with_convention(m.model_copy(update={"note": f"{name} of the eager PyTorch model (not exported) "
                                                             f"against the data's labels; {m.note}"}),
                                "the eager PyTorch model (not exported): FlagPerf's reference")
        elif m is engine:
            if eager is None:
                reference = "no eager reference (validation did not run or scored nothing)"
                warning = m.warning
            else:
                difference = m.value - eager.value
                reference = (f"the eager model (validation) scored {eager.value:.4f} on the same data: difference "
                             f"{difference:+.4f}")
                warning = m.warning
                if abs(difference) > run.config.accuracy_tolerance:
                    too_far = (f"differs from the eager model's {eager.value:.4f} by {difference:+.4f}, more than "
                               f"accuracy_tolerance {run.config.accuracy_tolerance}: the engine does not compute "
                               "what the model does")
                    warning = f"{warning}; {too_far}" if warning else too_far
            m = with_convention(m.model_copy(update={"note": f"{name} of the engine's outputs against the data's "
                                                             f"labels; {reference}; {m.note}", "warning": warning}),
                                f"the engine's outputs; reference: {reference}")
        updated.append(m)
    return updated


def _setup_metrics(run: InferenceRun) -> list[Metric]:
    """Model load and engine build: the one-time costs a deployment pays before the first answer."""
    metrics = []
    if run.model_load_s is not None:
        metrics.append(Metric(name="model_load_time", value=run.model_load_s, unit="s", iterations=1,
                              statistic="single",
                              note="create_model (weights built or read) and the move to the device, synchronised",
                              convention="create_model and the move to the device, synchronised"))
    if run.compile_s is not None:
        how = "loaded from exist_compiler_path" if run.config.exist_compiler_path else "built (step e)"
        metrics.append(Metric(name="engine_build_time", value=run.compile_s, unit="s", iterations=1,
                              statistic="single", note=f"the engine {how}, untimed in the throughput figures",
                              convention=f"the engine {how}; outside every throughput figure"))
    return metrics


def _loadgen_metrics(run: InferenceRun) -> list[Metric]:
    """Each LoadGen scenario's figure as a metric, so the report shows it, and an INVALID one loudly."""
    metrics = []
    for r in run.loadgen:
        if r.samples_per_s is None:
            continue
        warning = None if r.valid else (f"LoadGen says {r.result_validity} after {r.attempts} attempt(s): "
                                        f"{r.invalid_reason}; not a valid MLPerf figure")
        metrics.append(Metric(name=f"loadgen_{r.scenario.lower()}", value=r.samples_per_s,
                              unit=f"{run.config.item_name}/s", warning=warning, statistic="loadgen",
                              convention=f"MLPerf LoadGen {r.scenario}'s own figure, from its summary",
                              note=f"MLPerf LoadGen {r.scenario}, {r.result_validity} (its latencies are under "
                                   f"inference.loadgen; logs in {r.log_dir})"))
    return metrics


def write_latencies(run: InferenceRun) -> str | None:
    """Every timed batch's seconds, kept beside result.json (the metrics hold only their statistics)."""
    passes: dict[str, Any] = {}
    for stats, computed in ((run.validation, run.validation_compute), (run.inference, run.inference_compute)):
        if stats is not None:
            passes[stats.name] = {"core_s": stats.core_seconds, "cold_start_s": stats.cold_start_seconds,
                                  "batch_items": stats.items_per_batch}
            if stats.first_item_seconds:
                passes[stats.name]["first_item_s"] = stats.first_item_seconds
        if computed is not None:
            passes.setdefault(computed.name, {})["compute_s"] = computed.seconds
            passes[computed.name]["compute_clock"] = computed.clock
    if not passes:
        return None
    run.out_dir.mkdir(parents=True, exist_ok=True)
    (run.out_dir / LATENCIES_FILE).write_text(json.dumps(passes) + "\n", encoding="utf-8")
    return LATENCIES_FILE


def finish_round(run: InferenceRun) -> str:
    """Remove the round's ONNX and engine files unless keep_artifacts (they are hundreds of MB to GB a round),
    with the folders left empty up to the work root's inference-artifacts folder; say what was done."""
    folder = run.artifact_dir
    if not folder.exists():
        outcome = "none written"
    elif run.config.keep_artifacts:
        outcome = f"kept in {folder} (keep_artifacts: true; for exist_onnx_path / exist_compiler_path)"
    else:
        shutil.rmtree(folder, ignore_errors=True)
        outcome = f"removed at the end of the round ({folder}; keep_artifacts: false)"
        if ARTIFACTS_FOLDER in folder.parts:
            for parent in folder.parents:
                try:
                    parent.rmdir()  # only an empty folder goes
                except OSError:
                    break
                if parent.name == ARTIFACTS_FOLDER:
                    break
    if run.report is not None:
        run.report.artifacts = outcome
    log.info("artifacts: %s", outcome)
    return outcome


STEP_FUNCTIONS: dict[str, Callable[[InferenceRun], None]] = {
    "init": step_init, "dataset_model": step_dataset_model, "validation": step_validation,
    "export": step_export, "compile": step_compile, "inference": step_inference, "summary": step_summary,
}

StepRunner = Callable[[str, Callable[[InferenceRun], None], InferenceRun], None]


def plain_runner(name: str, fn: Callable[[InferenceRun], None], run: InferenceRun) -> None:
    log.info("step %s", STEP_TITLES[name])
    fn(run)


def _on_round_stream(fn: Callable[[InferenceRun], None]) -> Callable[[InferenceRun], None]:
    def step(run: InferenceRun) -> None:
        with run.on_stream():
            fn(run)
    return step


def run_steps(run: InferenceRun, runner: StepRunner = plain_runner) -> None:
    """The seven steps in order; the toggles skip some (recorded with the reason), and so does an engine that
    reads no ONNX (known once step a has loaded it)."""
    for name in STEPS:
        reads_onnx = run.engine_def.manifest.needs_onnx if run.engine_def is not None else True
        skipped = skipped_steps(run.config, reads_onnx)
        if name in skipped:
            run.steps[name] = f"skipped: {skipped[name]}"
            log.info("step %s: skipped (%s)", STEP_TITLES[name], skipped[name])
            continue
        try:
            runner(name, _on_round_stream(STEP_FUNCTIONS[name]), run)
        except BaseException:
            run.steps[name] = "failed"
            raise
        run.steps[name] = "ran"
