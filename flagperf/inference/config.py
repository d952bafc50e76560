"""An inference case's configuration: FlagPerf's keys, its four toggles, and which of the seven steps run.

FlagPerf's configurations.yaml keys load unchanged (batch_size, flops, fp16, compiler, num_workers,
log_freq, repeat, no_validation, exist_onnx_path, exist_compiler_path). The toggles keep FlagPerf's meaning:

  compiler: null             after framework validation, go straight to the summary
  no_validation: true        no model, no validation, no export; needs exist_onnx_path
  exist_onnx_path: <path>    no export; the compiler reads that file
  exist_compiler_path: <p>   no compilation; the engine is loaded from that file

Combinations that cannot run (or would measure nothing) are config errors naming the file and key, raised
before anything runs (check_toggles).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator

from flagperf.config.models import CaseConfig
from flagperf.errors import ConfigError
from flagperf.inference.engines import check_engine_toggles

NOT_APPLICABLE = "not applicable"  # the attention key of a model without attention
# Set (True) on a model create_model built with random weights (no checkpoint_path): its accuracy is chance level.
RANDOM_WEIGHTS = "flagperf_random_weights"

STEPS = ("init", "dataset_model", "validation", "export", "compile", "inference", "summary")
STEP_TITLES = {
    "init": "a. init: logger, config",
    "dataset_model": "b. dataset and model",
    "validation": "c. framework validation",
    "export": "d. ONNX export",
    "compile": "e. compile",
    "inference": "f. engine inference",
    "summary": "g. summary",
}

# FlagPerf writes per-item FLOPs as a product such as 2*512*0.33e9 (it eval()s the string). Only a product
# of plain numbers is accepted here: nothing is evaluated.
_NUMBER = r"\s*[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?\s*"
_PRODUCT = re.compile(rf"^{_NUMBER}(?:\*{_NUMBER})*$")


def parse_flops(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError("must be a number or a product such as 2*512*0.33e9")
    if isinstance(value, int | float):
        result = float(value)
    elif isinstance(value, str) and _PRODUCT.match(value):
        result = math.prod(float(part) for part in value.split("*"))
    else:
        raise ValueError(f"must be a number or a product such as 2*512*0.33e9 (got {value!r})")
    if not math.isfinite(result) or result <= 0:
        raise ValueError(f"must be a positive finite number (got {value!r})")
    return result


class InferenceConfig(CaseConfig):
    """Keys of every inference case. A case's ``Config`` subclasses it with its parameters.

    Extra keys are allowed (FlagPerf lets a vendor file add keys, with a warning): engines read their own
    keys from them through their typed options.
    """

    model_config = ConfigDict(extra="allow", frozen=True, strict=True, allow_inf_nan=False)

    # FlagPerf's configurations.yaml has no timeout or retry keys; these defaults make its files load.
    timeout_s: float = Field(default=86400.0, gt=0, description="FlagPerf's upper bound for a case: 24 h")
    max_retries: int = Field(default=0, ge=0, le=10)

    batch_size: int = Field(ge=1)
    flops: float = Field(description="FLOPs per item (an image, a sequence, a token): MFU's numerator")
    fp16: bool
    compiler: str | None
    num_workers: int = Field(ge=0, le=64)
    log_freq: int = Field(ge=1)
    repeat: int = Field(ge=1, description="passes over the data set in each of validation and inference")
    no_validation: bool
    exist_onnx_path: str | None
    exist_compiler_path: str | None
    warmup_batches: int = Field(default=1, ge=0, description="untimed batches before each timed pass "
                                "(compilation, allocator and cache warm-up are not throughput)")
    torch_threads: int | None = Field(default=None, ge=1, le=1024, description="torch's intra-op threads "
                                      "(torch.set_num_threads); null: torch's default, one per core")
    compute_batches: int = Field(default=4, ge=1, description="batches held on the device for *_compute")
    compute_iterations: int | None = Field(default=None, ge=1, description="forwards timed for *_compute; "
                                           "null: as many batches as the core pass timed")
    keep_artifacts: bool = Field(default=False, description="keep the exported ONNX and engine files after the "
                                 "round (for a later exist_onnx_path / exist_compiler_path run); false: removed")
    accuracy_tolerance: float = Field(default=0.01, ge=0, le=1, description=(
        "largest difference between the engine's accuracy and the eager model's (validation) before the "
        "inference accuracy carries a warning; as a fraction (0.01: one percentage point)"))
    attention: str | None = Field(default=None, description=(
        "the attention implementation the model runs: transformers' attn_implementation (sdpa, eager ...), or "
        f"'{NOT_APPLICABLE}' for a model without attention; stated in the result's throughput notes"))
    loadgen_scenarios: list[Literal["Offline", "SingleStream", "Server"]] = Field(default_factory=list)
    loadgen_min_duration_s: float = Field(default=10.0, gt=0)
    loadgen_min_query_count: int = Field(default=64, ge=1)
    loadgen_server_target_qps: float | None = Field(default=None, gt=0, description="null: half of what "
                                                    "SingleStream sustained (run SingleStream first)")
    loadgen_target_latency_ms: float = Field(default=1000.0, gt=0)
    loadgen_mlperf_conf: str | None = Field(default=None, description="MLPerf's mlperf.conf, read by LoadGen "
                                            "(submission rules); null: LoadGen's built-in copy")
    loadgen_user_conf: str | None = Field(default=None, description="a user.conf LoadGen reads over it")
    loadgen_model_name: str | None = Field(default=None, description="the model's name in those files "
                                           "(resnet50, bert-99 ...); null: the case name")
    loadgen_max_attempts: int = Field(default=3, ge=1, le=10, description="runs of a scenario that ends "
                                      "INVALID because it finished early (each sized from the rate it reached) "
                                      "or, for Server at a derived target QPS, missed its latency bound (each "
                                      "aimed lower)")

    @field_validator("flops", mode="before")
    @classmethod
    def _flops(cls, value: object) -> float:
        return parse_flops(value)

    @property
    def precision(self) -> Literal["fp16", "fp32"]:
        """The spec-table key MFU is taken against."""
        return "fp16" if self.fp16 else "fp32"

    # What one "item" is, for throughput and MFU; a decoding case counts generated tokens instead.
    item_name: ClassVar[str] = "samples"
    # The case loader checks that an inference case's Config is one of these.
    family: ClassVar[str] = "inference"
    # Keys that choose only the data (a folder, the synthetic set's size): a reused ONNX or engine file made
    # with other values is still this model (flagperf.inference.provenance compares all other keys).
    artifact_neutral_keys: ClassVar[frozenset[str]] = frozenset()

    def check_for_vendor(self, origins: dict[str, str], source: str, vendor: str | None,
                         files_are_local: bool, engine_roots: list[Path] | None = None) -> None:
        """The toggles and the engine they name, checked before anything runs (again in the case process).
        Without a vendor (`flagperf validate` on a case's defaults) there are no engines to check."""
        check_toggles(self, origins, source)
        if vendor:
            engine = check_engine_toggles(self, vendor, origins, source, check_files=files_are_local)
            if engine is not None and files_are_local:
                from flagperf.inference.provenance import ReusedFileError, check_reused_files

                # A file made for another model is refused here, before anything starts; the case folder's name
                # is the case's (its configurations.yaml is the source).
                try:
                    check_reused_files(self, Path(source).parent.name, vendor, engine.manifest.needs_onnx,
                                       origins, source)
                except ReusedFileError as exc:
                    raise ConfigError(exc.where, exc.key, exc.message) from None

    def items_per_sample(self) -> int:
        return 1

    def flops_scope(self) -> str | None:
        """What one item's FLOPs cover where the item leaves a choice (padded positions counted or not), for
        MFU's convention; None where it leaves none."""
        return None

    def attention_statement(self) -> str:
        if self.attention is None:
            return "attention: not stated by the case"
        if self.attention == NOT_APPLICABLE:
            return f"attention: {NOT_APPLICABLE} (the model has none)"
        return f"attention: {self.attention} (transformers attn_implementation)"


def check_toggles(config: InferenceConfig, origins: dict[str, str], default_source: str) -> None:
    """The combinations that cannot run, as one-line errors naming the file that set the key."""

    def fail(key: str, message: str) -> ConfigError:
        return ConfigError(origins.get(key, default_source), key, message)

    if config.no_validation and config.exist_onnx_path is None:
        raise fail("no_validation", "no_validation: true creates no model, so exist_onnx_path must name an "
                                    "ONNX file (FlagPerf asserts the same)")
    if config.compiler is None:
        if config.no_validation:
            raise fail("compiler", "compiler: null with no_validation: true runs neither validation nor "
                                   "inference: nothing would be measured")
        if config.exist_compiler_path is not None:
            raise fail("exist_compiler_path", "an engine file needs a compiler to load it; compiler is null")
        if config.exist_onnx_path is not None:
            raise fail("exist_onnx_path", "only the compile step reads it, and compiler: null skips that step")
    for key in ("loadgen_mlperf_conf", "loadgen_user_conf"):
        if getattr(config, key) is not None and not config.loadgen_scenarios:
            raise fail(key, "is read by LoadGen, and loadgen_scenarios is empty")
    if config.loadgen_scenarios and config.compiler is None:
        raise fail("loadgen_scenarios", "LoadGen drives the compiled engine; compiler is null")
    if len(set(config.loadgen_scenarios)) != len(config.loadgen_scenarios):
        raise fail("loadgen_scenarios", "lists a scenario more than once")
    scenarios = config.loadgen_scenarios
    if ("Server" in scenarios and config.loadgen_server_target_qps is None
            and "SingleStream" not in scenarios[:scenarios.index("Server")]):
        raise fail("loadgen_scenarios", "Server needs loadgen_server_target_qps, or SingleStream listed before "
                                        "it (its rate sets the Server target)")


NO_ONNX = "the engine compiles the PyTorch model"


def skipped_steps(config: InferenceConfig, engine_reads_onnx: bool = True) -> dict[str, str]:
    """Step -> why it does not run (FlagPerf's semantics); the steps not listed run. An engine that does not
    read ONNX (``engine_reads_onnx`` False: Inductor) skips the export: nothing would read the file."""
    skipped: dict[str, str] = {}
    if config.no_validation:
        skipped["validation"] = "no_validation: true"
        skipped["export"] = "no_validation: true"
    if config.compiler is None:
        skipped.setdefault("export", "compiler: null (nothing compiles an ONNX file)")
        skipped["compile"] = "compiler: null"
        skipped["inference"] = "compiler: null"
    if config.compiler is not None and not engine_reads_onnx:
        skipped.setdefault("export", NO_ONNX)  # an exist_onnx_path is not read either
    if config.exist_onnx_path is not None:
        skipped.setdefault("export", f"exist_onnx_path: {config.exist_onnx_path}")
    if config.exist_compiler_path is not None:
        skipped.setdefault("compile", f"exist_compiler_path: {config.exist_compiler_path} (loaded, not built)")
    return skipped

