"""The seven in-process steps of an inference round, as plain functions over one state object.

    a. init            config, toggles, the engine's library
    b. dataset_model   build_dataloader(config); create_model(config) unless no_validation
    c. validation      the eager model over the data (validation_whole/core)
    d. export          export_model(model, config, path) to ONNX
    e. compile         the vendor's engine, built once from (config, onnx_path, model), untimed
    f. inference       engine_forward over the data (inference_whole/core), then the LoadGen scenarios
    g. summary         metrics (computed here, once) and the report

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
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from flagperf.errors import CaseUserError
from flagperf.inference.config import STEP_TITLES, STEPS, InferenceConfig, check_toggles, skipped_steps
from flagperf.inference.engines import EngineDef, EngineEnv, InferenceEngine, check_engine_toggles
from flagperf.inference.measure import NonInference, PassStats, pass_metrics, timed_pass
from flagperf.measure.casekit import CaseContext
from flagperf.measure.timing import TimingPlan
from flagperf.results.schema import InferenceReport, LoadgenResult, Metric, SpecTable

log = logging.getLogger("flagperf.case.inference")


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
    loader: Any = None
    model: torch.nn.Module | None = None
    onnx_path: Path | None = None
    engine: InferenceEngine | None = None
    validation: PassStats | None = None
    inference: PassStats | None = None
    loadgen: list[LoadgenResult] = field(default_factory=list)
    steps: dict[str, str] = field(default_factory=dict)
    metrics: list[Metric] = field(default_factory=list)
    report: InferenceReport | None = None

    @property
    def ctx(self) -> CaseContext:
        return CaseContext(self.device.type, self.spec, TimingPlan(0, 1.0, 1), log,
                           shares_host_memory=self.shares_host_memory)

    def sync(self) -> None:
        if self.device.type != "cpu":
            torch.get_device_module(self.device.type).synchronize()

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
    log.info("case %s on %s (%s): compiler %s, %s, batch %d, %.4g FLOP per %s, repeat %d", run.case_name,
             run.vendor, run.spec.device, c.compiler, c.precision, c.batch_size, c.flops, c.item_name, c.repeat)
    log.info("toggles: no_validation %s, exist_onnx_path %s, exist_compiler_path %s", c.no_validation,
             c.exist_onnx_path, c.exist_compiler_path)
    run.engine_def = check_engine_toggles(c, run.vendor, run.origins, run.case_name)
    if run.engine_def is not None:
        run.engine_cls = run.engine_def.engine_class()  # a missing library fails here, before any work
        log.info("engine %s from %s", run.engine_def.manifest.name, run.engine_def.source)
    if c.loadgen_scenarios:
        from flagperf.inference.loadgen import require_loadgen

        require_loadgen()  # a missing package fails here, not after validation and compilation


def step_dataset_model(run: InferenceRun) -> None:
    run.loader = run.module.build_dataloader(run.config)
    what = getattr(run.dataset, "description", type(run.dataset).__name__)
    log.info("data: %s%s", what, " (synthetic inputs: throughput only, no accuracy)" if run.synthetic else "")
    if run.config.no_validation:
        log.info("no_validation: true: no model is created")
        return
    model = run.module.create_model(run.config)
    if not isinstance(model, torch.nn.Module):
        raise CaseUserError(f"create_model returned {type(model).__name__}, not a torch.nn.Module")
    # Halved before it moves: a large model never sits on the device in FP32 when FP16 is what runs.
    run.model = (model.half() if run.config.fp16 else model).to(run.device).eval()
    log.info("model: %s, %.4g parameters", type(model).__name__, sum(p.numel() for p in model.parameters()))


def _to_device(run: InferenceRun) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    def move(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        moved = [x.to(run.device, non_blocking=True) for x in inputs]
        return [x.half() if run.config.fp16 and x.is_floating_point() else x for x in moved]
    return move


def step_validation(run: InferenceRun) -> None:
    model = run.model

    def forward(inputs: list[torch.Tensor]) -> tuple[Any, float]:
        return run.module.model_forward(model, inputs), 0.0

    run.validation = timed_pass("validation", run.loader, forward, run.evaluator, run.sync, run.config, log,
                                to_device=_to_device(run))
    _log_pass(run.validation, run.config)


def step_export(run: InferenceRun) -> None:
    assert run.model is not None  # no_validation skips this step
    run.artifact_dir.mkdir(parents=True, exist_ok=True)
    path = run.artifact_dir / f"{run.case_name}_bs{run.config.batch_size}_fp16{run.config.fp16}.onnx"
    # Exported in FP32 on the CPU: an engine builds its own reduced precision from it (TensorRT's FP16 flag),
    # and the export does not depend on the device the validation ran on. The copy is made in host memory
    # (the model visits the CPU and goes back) so a large model never sits twice on the device.
    model = copy.deepcopy(run.model.cpu()).float().eval()
    run.model.to(run.device)
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # torch's exporters warn at length about tracing; the file is checked
        run.module.export_model(model, run.config, path)
    if not path.is_file() or path.stat().st_size == 0:
        raise CaseUserError(f"export_model wrote no ONNX file at {path}")
    run.onnx_path = path
    log.info("exported %s (%.1f MiB)", path, path.stat().st_size / 2**20)


def _engine_env(run: InferenceRun) -> EngineEnv:
    run.artifact_dir.mkdir(parents=True, exist_ok=True)
    return EngineEnv(device=run.device, work_dir=run.artifact_dir, case=run.case_name, log=log)


def _onnx_for_engine(run: InferenceRun) -> Path | None:
    if run.onnx_path is not None:
        return run.onnx_path
    return Path(run.config.exist_onnx_path) if run.config.exist_onnx_path else None


def step_compile(run: InferenceRun) -> None:
    assert run.engine_cls is not None
    started = time.perf_counter()
    try:
        run.engine = run.engine_cls(run.config, _onnx_for_engine(run), run.model, _engine_env(run))
    except (CaseUserError, MemoryError):
        raise
    except Exception as exc:
        if run.onnx_path is not None or run.config.exist_onnx_path is None:
            raise  # our own export failed to compile: a crash, reported with its traceback
        # The user's ONNX file: a file the engine cannot read is the config's fault, not worth a retry.
        raise _user_file_error(run, "exist_onnx_path", Path(run.config.exist_onnx_path), exc) from exc
    log.info("compiled in %.2f s (untimed)%s", time.perf_counter() - started,
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
        run.engine = load_engine_file(run)
    engine = run.engine

    def forward(inputs: list[torch.Tensor]) -> tuple[Any, NonInference]:
        return run.module.engine_forward(engine, inputs)

    run.inference = timed_pass("inference", run.loader, forward, run.evaluator, run.sync, run.config, log)
    _log_pass(run.inference, run.config)
    if run.config.loadgen_scenarios:
        from flagperf.inference.loadgen import run_scenarios  # mlperf_loadgen only when asked for

        run.loadgen = run_scenarios(run.config, run.loader, forward, run.sync, run.out_dir)


def _log_pass(stats: PassStats, config: InferenceConfig) -> None:
    log.info("%s: %d batches, %d %s, whole %.2f s, core %.2f s%s", stats.name, stats.batches, stats.items,
             config.item_name, stats.whole_seconds, sum(stats.core_seconds),
             f", accuracy {stats.accuracy:.4f}" if stats.accuracy is not None else "")


def step_summary(run: InferenceRun) -> None:
    c = run.config
    ctx = run.ctx
    accuracy_name = getattr(run.module, "ACCURACY", "accuracy")
    metrics: list[Metric] = []
    for stats in (run.validation, run.inference):
        if stats is not None:
            metrics += pass_metrics(stats, c, ctx, synthetic=run.synthetic, accuracy_name=accuracy_name)
    e2e = time.perf_counter() - run.started
    metrics.append(Metric(name="e2e_time", value=e2e, unit="s", note="steps a to g in the case process"))
    run.metrics = metrics
    steps = {name: run.steps.get(name, "ran") for name in STEPS}
    steps["summary"] = "ran"
    note = None
    if run.synthetic:
        note = "synthetic inputs: throughput only; no accuracy is reported"
    elif getattr(run.module, "ACCURACY", None) is None:
        note = "the case has no accuracy metric"
    run.report = InferenceReport(
        compiler=c.compiler, precision=c.precision, batch_size=c.batch_size, flops_per_item=c.flops,
        item=c.item_name, steps=steps, runner=run.runner, synthetic_data=run.synthetic,
        data=str(getattr(run.dataset, "description", type(run.dataset).__name__)), accuracy_note=note,
        e2e_time_s=e2e, non_inference_s=run.inference.non_inference_seconds if run.inference else 0.0,
        onnx_path=str(_onnx_for_engine(run)) if _onnx_for_engine(run) else None,
        engine_file=str(run.engine.engine_file) if run.engine and run.engine.engine_file else None,
        loadgen=run.loadgen,
    )
    by_name = {m.name: m for m in metrics}
    # FlagPerf's closing line, with its names, so a FlagPerf reader finds the figures where they expect.
    log.info("Finish Info: vendor %s, compiler %s, precision %s, batchsize %d, flops %.4g, e2e_time %.2f s, "
             "p_validation_whole %s, p_validation_core %s, p_inference_whole %s, *p_inference_core %s",
             run.vendor, c.compiler, c.precision, c.batch_size, c.flops, e2e,
             *(f"{by_name[n].value:.4g}" if n in by_name else "None"
               for n in ("validation_whole", "validation_core", "inference_whole", "inference_core")))


STEP_FUNCTIONS: dict[str, Callable[[InferenceRun], None]] = {
    "init": step_init, "dataset_model": step_dataset_model, "validation": step_validation,
    "export": step_export, "compile": step_compile, "inference": step_inference, "summary": step_summary,
}

StepRunner = Callable[[str, Callable[[InferenceRun], None], InferenceRun], None]


def plain_runner(name: str, fn: Callable[[InferenceRun], None], run: InferenceRun) -> None:
    log.info("step %s", STEP_TITLES[name])
    fn(run)


def run_steps(run: InferenceRun, runner: StepRunner = plain_runner) -> None:
    """The seven steps in order; the toggles skip some (recorded with the reason)."""
    skipped = skipped_steps(run.config)
    for name in STEPS:
        if name in skipped:
            run.steps[name] = f"skipped: {skipped[name]}"
            log.info("step %s: skipped (%s)", STEP_TITLES[name], skipped[name])
            continue
        try:
            runner(name, STEP_FUNCTIONS[name], run)
        except BaseException:
            run.steps[name] = "failed"
            raise
        run.steps[name] = "ran"
