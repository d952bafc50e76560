"""The operation case config (cases/operation/<group>/case.yaml ``configurations``, vendor/<vendor>.yaml overrides)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from flagperf.config.engines import checked_engine_manifest, engine_folders, root_engines
from flagperf.config.memory import DeviceMemory, MemoryNeed
from flagperf.config.models import HIDDEN_INPUT, KEY_OF_MODEL_ERROR, CaseConfig
from flagperf.config.vendors import available_vendors
from flagperf.errors import ConfigError, FlagperfError, validation_message
from flagperf.measure.inductor_modes import CUDA_GRAPH_MODES, INDUCTOR_MODE_HELP, InductorMode
from flagperf.operation.manifest import (
    IMPLEMENTATIONS_FOLDER,
    INDUCTOR_MODE,
    ImplementationManifest,
    checked_implementations,
    implementation_names,
)
from flagperf.operation.operators import ELEMENT_BYTES, FP8, MAX_DIM, OPERATORS, Dims, ModelShape, Operator, shape_label
from flagperf.operation.shape_sets import SHAPE_SETS
from flagperf.training.shapes import BERT_PRESETS, LLAMA_PRESETS

# The model shapes operators are sized from: the project's one table of Llama and BERT shapes.
MODEL_SHAPES: dict[str, ModelShape] = {
    **{name: ModelShape(name, s.hidden_size, s.intermediate_size, s.num_heads, s.num_kv_heads, s.vocab_size)
       for name, s in LLAMA_PRESETS.items()},
    **{name: ModelShape(name, s.hidden_size, s.intermediate_size, s.num_heads, s.num_heads, s.vocab_size)
       for name, s in BERT_PRESETS.items() if name != "tiny"},
}

# Models, batch sizes and sequence lengths multiply into points, each timed for a while: a grid is a few dozen.
MAX_LIST = 64

# energy_intervals: 0 (no energy loop) or at least 3 monitor intervals, so that the loop holds 2 samples or more of
# the energy source with some jitter in the sampling; at most 100, a point's energy loop is not a soak test.
ENERGY_MIN_INTERVALS, ENERGY_MAX_INTERVALS = 3, 100

# Per dtype: rtol, and atol before the operator's scale for the shape (sqrt of a GEMM's K, say). Outputs in
# half precision are rounded to 11 (fp16) or 8 (bf16) significant bits, which bounds what rtol can ask.
DEFAULT_TOLERANCES: dict[str, dict[str, float]] = {
    "fp32": {"rtol": 1e-5, "atol": 1e-5},
    "fp16": {"rtol": 1e-3, "atol": 1e-3},
    "bf16": {"rtol": 1.6e-2, "atol": 1e-2},
    FP8: {"rtol": 1.6e-2, "atol": 1e-2},  # fp8 inputs are exact in the reference; the output is bf16
}

# An accelerator's cache flush is at least Triton's do_bench buffer (256 MB; TritonBench's and FlagGems' kernel
# timings too): torch reports the L2 alone, and a memory-side cache behind it (AMD's Infinity Cache) would keep a
# twice-the-L2 flush's inputs where the vendor does not declare it (flagperf.operation.timer.MEMORY_SIDE_CACHE).
# Not on the CPU, whose flush (twice its last-level cache) already empties the host's caches.
ACCELERATOR_FLUSH_FLOOR = 256 * 2**20


def flush_floor(memory_side_bytes: int | None) -> tuple[int, str]:
    """The least an accelerator's cache flush allocates (timer.flush_bytes, its last-level cache not yet known):
    ACCELERATOR_FLUSH_FLOOR, or twice a memory-side cache where that is more; and why, in words ("" for the floor)."""
    if memory_side_bytes and 2 * memory_side_bytes > ACCELERATOR_FLUSH_FLOOR:
        return 2 * memory_side_bytes, " (twice the memory-side cache of the vendor's spec table)"
    return ACCELERATOR_FLUSH_FLOOR, ""


@dataclass(frozen=True)
class PlannedPoint:
    op: Operator
    dtype: str
    dims: Dims
    source: str
    model: ModelShape | None = None  # the model the shape came from; None: given or from a shape set
    shape_set: str | None = None  # the named shape set it came from (shape_sets)


class ModelSizes(BaseModel):
    """A model of the lab's own, by the sizes a preset gives (``models: [{name: qwen2-7b, hidden: 3584, ...}]``):
    the operators' shapes are derived from it as from a preset."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    hidden: int = Field(ge=1, le=MAX_DIM)
    intermediate: int = Field(ge=1, le=MAX_DIM)
    heads: int = Field(ge=1, le=MAX_DIM)
    kv_heads: int | None = Field(default=None, ge=1, le=MAX_DIM, description="default: heads")
    vocab: int = Field(ge=1, le=MAX_DIM)

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSizes:
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads}): head_dim = "
                             "hidden / heads")
        if self.heads % (self.kv_heads or self.heads):
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        return self

    def shape(self) -> ModelShape:
        return ModelShape(self.name, self.hidden, self.intermediate, self.heads, self.kv_heads or self.heads,
                          self.vocab)


def model_shape(model: str | ModelSizes) -> ModelShape:
    return model.shape() if isinstance(model, ModelSizes) else MODEL_SHAPES[model]


class Tolerance(BaseModel):
    """An override of the dtype's default rtol, atol or both (the one not given keeps its default)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    rtol: float | None = Field(default=None, ge=0)
    atol: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _something(self) -> Tolerance:
        if self.rtol is None and self.atol is None:
            raise ValueError("give rtol, atol or both")
        return self


def _about(key: str, message: str) -> PydanticCustomError:
    """A rule between keys, broken: its one line names ``key`` (and the file it came from)."""
    return PydanticCustomError(HIDDEN_INPUT, message, {KEY_OF_MODEL_ERROR: key})


class OperationConfig(CaseConfig):
    family: ClassVar[str] = "operation"

    operators: list[str] = Field(min_length=1, description="operators of flagperf.operation.operators")
    dtypes: list[Literal["fp32", "fp16", "bf16", "fp8"]] = Field(min_length=1)
    models: list[str | ModelSizes] = Field(
        default_factory=list, max_length=MAX_LIST,
        description="model shape presets the shapes are taken from, or a model's sizes ({name, hidden, "
                    "intermediate, heads, kv_heads, vocab})")
    batch_sizes: list[int] = Field(default_factory=lambda: [1], max_length=MAX_LIST,
                                   description="with seq_lens: the token grid")
    seq_lens: list[int] = Field(default_factory=lambda: [128], max_length=MAX_LIST)
    shape_sets: list[str] = Field(
        default_factory=list, description="named shape sets of flagperf/operation/shape_sets.py (flaggems-core: "
                                          "FlagGems' core benchmark shapes), each operator's shapes in it")
    shapes: dict[str, list[dict[str, Any]]] = Field(
        default_factory=dict, description="operator -> shapes given by the user ({dimension: size})")
    implementations: list[str] | None = Field(
        default=None, description="engine folders of vendor_images/<vendor>/operation/ to compare (native first); "
                                  "null: every one the vendor has")
    warmup_s: float = Field(gt=0, description="warm-up per point and implementation, by time")
    rep_s: float = Field(gt=0, description="timed time per point and implementation (iterations = rep_s / one)")
    min_iters: int = Field(ge=1)
    max_iters: int = Field(ge=1)
    flush_cache: bool = Field(description="write a buffer twice the last-level cache (on an accelerator at least "
                                             "256 MiB, Triton's) between timed iterations")
    cuda_graphs: bool = Field(description="time graph replays of the call where the device has graphs")
    energy_intervals: int = Field(
        default=0, description=f"0: no energy loop (energy per work over the host loop, rarely long enough to hold "
                               f"2 monitor samples); {ENERGY_MIN_INTERVALS} to {ENERGY_MAX_INTERVALS}: after the host "
                               "loop, each passed point's calls back to back for this many of the monitors' sampling "
                               "intervals, energy per work taken over that loop")
    inductor_mode: InductorMode = Field(
        default="default", description=f"{INDUCTOR_MODE_HELP}, for the implementation that compiles (compile); the "
                                       "kernel search takes minutes of compiling per shape, and a CUDA graph copies "
                                       "a call's inputs into its static buffers on every call, which the timing "
                                       "includes")
    reference_cpu_max_elements: int = Field(
        ge=0, description="points with at most this many input elements get a float64 reference on the host CPU; "
                          "larger ones a float32 (float64 for fp32 points) reference on the device")
    tolerances: dict[str, Tolerance] = Field(
        default_factory=dict, description="dtype -> rtol and/or atol overrides (one not given keeps the dtype's "
                                          "default)")
    seed: int = 0

    @field_validator("operators")
    @classmethod
    def _operators(cls, value: list[str]) -> list[str]:
        for name in value:
            if name not in OPERATORS:
                raise ValueError(f"unknown operator {name!r} (known: {', '.join(OPERATORS)})")
        if len(set(value)) != len(value):
            raise ValueError("an operator is listed twice")
        return value

    @field_validator("models", mode="before")
    @classmethod
    def _models(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value  # the field's own check says what it should be
        models: list[Any] = []
        for i, entry in enumerate(value):
            if isinstance(entry, dict):
                try:
                    entry = ModelSizes.model_validate(entry)
                except ValidationError as exc:
                    first = exc.errors()[0]
                    where = ".".join(str(part) for part in first["loc"])
                    message = validation_message(first)
                    raise ValueError(f"[{i}]{'.' + where if where else ''}: {message} (a model's sizes: "
                                     f"{', '.join(ModelSizes.model_fields)})") from None
            elif isinstance(entry, str) and entry not in MODEL_SHAPES:
                raise ValueError(f"unknown model shape {entry!r} (known: {', '.join(MODEL_SHAPES)}; or give its "
                                 "sizes: {name, hidden, intermediate, heads, kv_heads, vocab})")
            models.append(entry)
        names = [m.name if isinstance(m, ModelSizes) else m for m in models]
        if len(set(names)) != len(names):
            raise ValueError("a model is listed twice")
        return models

    @field_validator("shape_sets")
    @classmethod
    def _shape_sets(cls, value: list[str]) -> list[str]:
        for name in value:
            if name not in SHAPE_SETS:
                raise ValueError(f"unknown shape set {name!r} (known: {', '.join(SHAPE_SETS)})")
        if len(set(value)) != len(value):
            raise ValueError("a shape set is listed twice")
        return value

    @field_validator("batch_sizes", "seq_lens")
    @classmethod
    def _sizes(cls, value: list[int]) -> list[int]:
        if any(v < 1 or v > MAX_DIM for v in value):
            raise ValueError(f"every size must be from 1 to {MAX_DIM}")
        return value

    @field_validator("dtypes")
    @classmethod
    def _dtypes(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("a dtype is listed twice")
        operators = info.data.get("operators") or []
        for dtype in value:
            if operators and not any(dtype in OPERATORS[o].dtypes for o in operators):
                has = [o.name for o in OPERATORS.values() if dtype in o.dtypes]
                raise ValueError(f"none of the operators ({', '.join(operators)}) has a {dtype} form (those that "
                                 f"do: {', '.join(has)})")
        return value

    @field_validator("shapes")
    @classmethod
    def _shapes(cls, value: dict[str, list[dict[str, Any]]], info: ValidationInfo) -> dict[str, list[dict[str, Any]]]:
        operators = info.data.get("operators") or []
        for name, shapes in value.items():
            if name not in operators:
                raise ValueError(f"{name}: not among this case's operators ({', '.join(operators)})")
            for i, dims in enumerate(shapes):
                problem = OPERATORS[name].check_dims(dims)
                if problem:
                    raise ValueError(f"{name}[{i}]: {problem}")
        return value

    @field_validator("tolerances")
    @classmethod
    def _tolerances(cls, value: dict[str, Tolerance]) -> dict[str, Tolerance]:
        unknown = sorted(set(value) - set(DEFAULT_TOLERANCES))
        if unknown:
            raise ValueError(f"unknown dtype {unknown[0]!r} (dtypes: {', '.join(DEFAULT_TOLERANCES)})")
        return value

    @field_validator("energy_intervals")
    @classmethod
    def _energy_intervals(cls, value: int) -> int:
        if value != 0 and not ENERGY_MIN_INTERVALS <= value <= ENERGY_MAX_INTERVALS:
            raise ValueError(f"must be 0 (no energy loop) or {ENERGY_MIN_INTERVALS} to {ENERGY_MAX_INTERVALS} monitor "
                             f"intervals (got {value}): a shorter loop may hold fewer than 2 monitor samples")
        return value

    @field_validator("implementations")
    @classmethod
    def _implementations(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or len(set(value)) != len(value)):
            raise ValueError("list each implementation once (or null for all of the vendor's)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> OperationConfig:
        if self.max_iters < self.min_iters:
            raise ValueError(f"max_iters ({self.max_iters}) must be at least min_iters ({self.min_iters})")
        if not self.models and not self.shapes and not self.shape_sets:
            raise ValueError("give model shapes (models), a named shape set (shape_sets) or shapes of your own "
                             "(shapes): there is nothing to measure")
        # a point's warm-up, its timed loop and its host loop (up to rep_s worth again)
        if self.warmup_s + 2 * self.rep_s >= self.timeout_s:
            raise ValueError(f"warmup_s + 2 x rep_s (the timed iterations, then the host's loop of as many calls "
                             f"back to back) must be well below timeout_s ({self.timeout_s:g})")
        if self.inductor_mode in CUDA_GRAPH_MODES and self.cuda_graphs:
            raise _about("inductor_mode", f"{self.inductor_mode} compiles into CUDA graphs, and cuda_graphs: true "
                         "would capture those inside a graph of its own (a nested capture): set cuda_graphs: false "
                         "or inductor_mode: max-autotune-no-cudagraphs (or default)")
        # a mode none of the implementations reads is refused with the vendor (check_for_vendor): which folder
        # reads it is its engine.yaml's fact (options), not its name's
        return self

    def memory_need(self) -> MemoryNeed | None:
        """The largest point's inputs and output in its dtype: a lower bound on what its round allocates (the
        reference and an implementation's work space come on top), so that a shape no host can hold is refused
        with the plan (flagperf.hosts.capacity), not met by a failed allocation or, where the device is the
        host's memory, by a host that swaps. The CPU's rewarm after each flush (a copy of the inputs and the
        output it holds) is not counted: the round leaves it out where it does not fit (driver.rewarm_fits) and
        says so on the point, so that the plan never refuses a shape the timing itself can hold. The cache flush's
        buffer, allocated for the whole round beside every point, depends on the device (``on_device``, taken on
        each host's probe): on an accelerator flush_floor, on a device that is the host's CPU nothing (twice its
        last-level cache, a few hundred MiB at most, is well within the share kept free); without a device, an
        accelerator's without a memory-side cache."""
        points = plan_points(self)
        if not points:
            return None
        worst = max(points, key=lambda p: p.op.allocated_bytes(p.dims, ELEMENT_BYTES[p.dtype]))
        need = worst.op.allocated_bytes(worst.dims, ELEMENT_BYTES[worst.dtype])
        keys: tuple[str, ...] = ("batch_sizes", "seq_lens", "models")
        if worst.shape_set is not None:
            keys = ("shape_sets",)
        elif worst.model is None:
            keys = ("shapes",)
        elif 2 * worst.op.allocated_bytes(worst.op.from_model(worst.model, 1, 1), ELEMENT_BYTES[worst.dtype]) > need:
            keys = ("models",)  # the model's own tensor (an embedding table) is most of it: no batch makes it fit
        what = f"{worst.op.name} {shape_label(worst.dims)} in {worst.dtype} ({worst.source}; its inputs and output"
        alone = MemoryNeed(need, f"{what} alone)", keys)
        if not self.flush_cache:
            return alone

        def on_device(device: DeviceMemory) -> MemoryNeed:
            if device.shares_host_memory:
                return alone._replace(what=f"{what} alone: the cache flush's buffer, twice the host's last-level "
                                           "cache, is left to the share kept free)")
            flush, why = flush_floor(device.memory_side_cache_bytes)
            return MemoryNeed(need + flush, f"{what}, and the cache flush's {flush / 2**20:.0f} MiB buffer{why}: "
                              "flush_cache: false leaves it out)", keys)

        return on_device(DeviceMemory(shares_host_memory=False))._replace(on_device=on_device)

    def tolerance(self, dtype: str) -> dict[str, float]:
        given = self.tolerances.get(dtype)
        overrides = given.model_dump(exclude_none=True) if given else {}
        return {**DEFAULT_TOLERANCES[dtype], **overrides}

    def check_for_vendor(self, origins: dict[str, str], source: str, vendor: str | None,
                         files_are_local: bool, engine_roots: list[Path] | None = None) -> None:
        """Each implementation named is a folder of the vendor (its packages are checked on the host), and a mode
        other than default is read by one of those compared (engine.yaml's options; the host checks the classes
        again, driver.load_implementations). Without a vendor (`flagperf validate` on a case's defaults) the
        implementations named are looked up in every vendor installed here."""
        given = origins.get("implementations", source)
        if vendor:
            names = self.implementations if self.implementations is not None else implementation_names(vendor)
            manifests = checked_implementations(vendor, names, given)
            readers = {name for name, m in manifests.items() if INDUCTOR_MODE in m.options}
        else:
            # a vendor not installed here is judged by its own folder alone, never by another vendor's of the name;
            # without one (engine_roots None) by every installed vendor's, whose broken files are vendor check's
            # findings: in the default mode nothing is asked of them, whether the case lists implementations or not
            every_vendor = engine_roots is None
            if every_vendor and self.inductor_mode == "default":
                return  # nothing to ask of every installed vendor's implementations (their files are vendor check's)
            roots = ([engine_folders(v, IMPLEMENTATIONS_FOLDER) for v in available_vendors()] if engine_roots is None
                     else [root_engines(root, IMPLEMENTATIONS_FOLDER) for root in engine_roots])
            if self.implementations is not None:
                names = self.implementations
            else:  # null: every folder of those read here (the vendor's own, for a vendor not installed here)
                names = sorted({name for folders in roots for name in folders})
                if not names:
                    return  # no implementation known here: whether one reads the mode is known with the vendor
            # each folder named, checked as the plan checks it: a broken engine.yaml is that file's error (its key),
            # never taken as a manifest without options and blamed on the case's inductor_mode
            read = [{name: _checked_manifest(folders[name]) for name in names if name in folders} for folders in roots]
            broken = [m for found in read for m in found.values() if isinstance(m, FlagperfError)]
            if broken and not every_vendor:  # the vendor's own folder: its broken file is the case's error here
                raise broken[0]
            declared = [{name: m for name, m in found.items() if isinstance(m, ImplementationManifest)}
                        for found in read]
            if not all(any(name in found for found in read) for name in names):
                return  # one of them is in no folder read here: whether it reads the mode is known with the vendor
            readers = {name for found in declared for name, m in found.items() if INDUCTOR_MODE in m.options}
            if not readers and broken:
                if self.implementations is not None:
                    # the case's own choice, and no readable folder of it reads the mode: the broken file is why
                    # (one of another installed vendor's that does read it lets the case pass: vendor check's finding)
                    raise broken[0]
                # read across every installed vendor for a case's defaults, one engine.yaml is broken (that vendor's
                # finding, not the case's): whether it reads the mode is unknown here
                return
        if self.inductor_mode != "default" and not readers:
            compared = f"{', '.join(names) or 'none'}{f' of vendor {vendor}' if vendor else ''}"
            order = list(origins)  # in the order the layers set them (resolve_case_config)
            chosen, mode = origins.get("implementations"), origins.get(INDUCTOR_MODE)
            if chosen is not None and (mode is None or order.index("implementations") > order.index(INDUCTOR_MODE)):
                # the implementations were chosen after the mode (a vendor's file, --set, a case's own --set after
                # the general one): that choice is the change
                raise ConfigError(chosen, "implementations",
                                  f"none of {compared} reads {INDUCTOR_MODE}: {self.inductor_mode} (from "
                                  f"{mode or source}; their engine.yaml lists no {INDUCTOR_MODE} under options): the "
                                  "mode would change nothing (list one that compiles, such as compile, or set "
                                  "inductor_mode: default)")
            raise ConfigError(mode or source, INDUCTOR_MODE,
                              f"{self.inductor_mode} is torch.compile's mode, and none of the implementations "
                              f"compared ({compared}) reads it (their engine.yaml lists no {INDUCTOR_MODE} under "
                              "options): it would change nothing (set inductor_mode: default, or list one that "
                              "compiles, such as compile)")


def _checked_manifest(folder: Path) -> ImplementationManifest | FlagperfError:
    """The implementation's engine.yaml, checked; where it is broken, its error (one line naming the file and key),
    raised or not by the caller: read against every installed vendor, one vendor's broken file is not always an
    error of the case."""
    try:
        return checked_engine_manifest(folder, ImplementationManifest)
    except FlagperfError as exc:
        return exc


def plan_points(config: OperationConfig) -> list[PlannedPoint]:
    """Operators x dtypes x shapes: from the model shapes x batch sizes x sequence lengths, then the named shape
    sets, then the user's; a shape met twice is measured once (the first source is kept)."""
    planned: list[PlannedPoint] = []
    seen: set[tuple[str, str, tuple[tuple[str, int], ...]]] = set()
    for name in config.operators:
        op = OPERATORS[name]
        shapes: list[tuple[Dims, str, ModelShape | None, str | None]] = [
            (op.from_model(shape, b, s), f"{shape.name} b{b} s{s}", shape, None)
            for shape in map(model_shape, config.models) for b in config.batch_sizes for s in config.seq_lens]
        shapes += [(dict(dims), source, None, set_name) for set_name in config.shape_sets
                   for dims, source in SHAPE_SETS[set_name].get(name, [])]
        shapes += [({d: int(dims[d]) for d in op.dims}, "given", None, None) for dims in config.shapes.get(name, [])]
        for dtype in config.dtypes:
            if dtype not in op.dtypes:
                continue
            for dims, source, model, set_name in shapes:
                key = (name, dtype, tuple(dims.items()))
                if key not in seen:
                    seen.add(key)
                    planned.append(PlannedPoint(op, dtype, dims, source, model, set_name))
    return planned
