"""What an exported ONNX file or a built engine file was made from, so that reusing it is checked.

FlagPerf's exist_onnx_path / exist_compiler_path take any file: one exported for another case, another model
shape, another attention or batch size is compiled and measured as if it were this round's model (its figures
then carry this config's FLOPs and name). Here every file the pipeline writes gets a record beside it
(``<file>.flagperf.json``): the case, the model-defining config values, the batch size (unless the file's
batch axis is symbolic), the compiler (engine files) and the file's SHA-256. A reused file is checked against
this round's config before anything runs:

  record agrees              used; the result's inference notes say it was checked
  record disagrees           refused, one line naming the key that chose the file and the values that differ
  no record, or another file a vendor's own ONNX (FlagPerf's adaptation flow) or a file changed since: used,
                             and every inference figure carries a warning that it was not checked
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from flagperf.config.engines import INFERENCE_ENGINES, declared_options
from flagperf.errors import CaseUserError
from flagperf.inference.engines import EngineConfig  # a protocol: the config module checks files through here
from flagperf.results.schema import atomic_path


class ReusedFileError(CaseUserError):
    """A reused file that does not fit this round's config; the plan turns it into a ConfigError."""

    def __init__(self, where: str, key: str, message: str) -> None:
        self.where, self.key, self.message = where, key, message
        super().__init__(f"{where}: {key}: {message}")


RECORD_SUFFIX = ".flagperf.json"
RECORD_VERSION = 1

# Keys of every inference config that say how a round runs or is measured, not what the file holds. fp16 is
# among them: the file's own tensor types are recorded (and an engine reads them), and an FP32 ONNX file
# serves an FP16 case by design (flagperf.inference.onnxrt casts the inputs).
RUN_KEYS = frozenset({
    "timeout_s", "max_retries", "flops", "fp16", "compiler", "num_workers", "log_freq", "repeat", "no_validation",
    "exist_onnx_path", "exist_compiler_path", "warmup_batches", "torch_threads", "compute_batches",
    "compute_iterations", "keep_artifacts", "accuracy_tolerance", "batch_size",
})


def record_path(path: Path) -> Path:
    return path.with_name(path.name + RECORD_SUFFIX)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_identity(config: EngineConfig, engine_options: set[str]) -> dict[str, Any]:
    """The config values that define the model in a file: everything but the run keys, the engines' options,
    LoadGen's settings and the keys the case names as data-only (``artifact_neutral_keys``)."""
    neutral = RUN_KEYS | engine_options | getattr(type(config), "artifact_neutral_keys", frozenset())
    return {key: value for key, value in sorted(config.model_dump(mode="json").items())
            if key not in neutral and not key.startswith("loadgen_")}


def onnx_batch_is_symbolic(path: Path) -> bool | None:
    """Whether every graph input's first axis is symbolic (any batch size runs); None if the file cannot be
    read as ONNX here."""
    try:
        import onnx

        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # an unreadable file is the engine's to refuse, with its own message
        return None
    initializers = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]
    dims = [i.type.tensor_type.shape.dim for i in inputs]
    return bool(dims) and all(len(d) > 0 and not d[0].HasField("dim_value") for d in dims)


def expected_record(config: EngineConfig, case: str, kind: str, engine_options: set[str]) -> dict[str, Any]:
    record: dict[str, Any] = {"kind": kind, "case": case, "batch_size": config.batch_size,
                              "model": model_identity(config, engine_options)}
    if kind == "engine":
        record["compiler"] = config.compiler
    return record


def write_record(path: Path, config: EngineConfig, case: str, kind: str, engine_options: set[str],
                 precision: str | None) -> None:
    """The record of a file this round wrote (export or compile)."""
    record = expected_record(config, case, kind, engine_options)
    record.update(version=RECORD_VERSION, precision=precision, size=path.stat().st_size, sha256=sha256_of(path),
                  symbolic_batch=onnx_batch_is_symbolic(path) if path.suffix == ".onnx" else None)
    with atomic_path(record_path(path)) as tmp:
        tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def _differences(recorded: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    diffs = [f"{key} {recorded.get(key)!r} (now {expected[key]!r})" for key in ("case", "compiler")
             if key in expected and recorded.get(key) != expected[key]]
    if recorded.get("batch_size") != expected["batch_size"] and not recorded.get("symbolic_batch"):
        diffs.append(f"batch_size {recorded.get('batch_size')!r} (now {expected['batch_size']!r}; the file's "
                     "batch axis is fixed)")
    model, now = recorded.get("model") or {}, expected["model"]
    for key in sorted(set(model) | set(now)):
        if model.get(key, "(unset)") != now.get(key, "(unset)"):
            diffs.append(f"{key} {model.get(key, '(unset)')!r} (now {now.get(key, '(unset)')!r})")
    return diffs


def engine_options(vendor: str, compiler: str | None) -> set[str]:
    """Every key an engine of the vendor reads: how a file is compiled or run, not what model it holds. Another
    engine's broken engine.yaml is no concern of this round's (its keys cannot be set: the plan refuses them); the
    compiler's own is said."""
    options = declared_options(vendor, INFERENCE_ENGINES)
    options.of_engine(compiler)
    return options.keys()


def check_reused_files(config: EngineConfig, case: str, vendor: str, engine_reads_onnx: bool,
                       origins: dict[str, str], default_source: str) -> list[tuple[str, bool]]:
    """exist_compiler_path, or the exist_onnx_path the engine compiles, against its record: (statement,
    checked) for each; one made for another model is a user error. A missing file is left to the engine,
    which names it."""
    reused: list[tuple[str, str]] = []
    if config.compiler is None:
        return []
    if config.exist_compiler_path is not None:
        reused.append(("exist_compiler_path", "engine"))
    elif config.exist_onnx_path is not None and engine_reads_onnx:
        reused.append(("exist_onnx_path", "onnx"))
    results = []
    for key, kind in reused:
        path = Path(str(getattr(config, key)))
        if path.is_file():
            results.append(check_reuse(path, key, origins.get(key, default_source),
                                       expected_record(config, case, kind, engine_options(vendor, config.compiler))))
    return results


def check_reuse(path: Path, key: str, where: str, expected: dict[str, Any]) -> tuple[str, bool]:
    """Check a reused file against this round's config: (a statement for the result's notes, whether it was
    checked). A file made for another case or model is a user error naming ``where`` and ``key``."""
    record_file = record_path(path)
    if not record_file.is_file():
        return (f"{key} {path} has no record ({record_file.name}): not checked against this config (case, "
                "model, batch size); its figures are this model's only if the file is", False)
    try:
        recorded = json.loads(record_file.read_text(encoding="utf-8"))
        if not isinstance(recorded, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        raise ReusedFileError(where, key, f"{record_file} cannot be read ({exc}); remove it to use {path} "
                              "unchecked") from None
    if recorded.get("size") != path.stat().st_size or recorded.get("sha256") != sha256_of(path):
        return (f"{key} {path} has changed since {record_file.name} was written: not checked against this "
                "config; its figures are this model's only if the file is", False)
    if recorded.get("kind") != expected["kind"]:
        raise ReusedFileError(where, key, f"{path} is recorded as an {recorded.get('kind')} file, not an "
                              f"{expected['kind']} file")
    diffs = _differences(recorded, expected)
    if diffs:
        raise ReusedFileError(where, key, f"{path} was made for another model: {'; '.join(diffs)}. Make it "
                              f"again with this config (keep_artifacts: true), or remove {record_file.name} to use "
                              "it unchecked")
    return f"{key} {path} checked against its record: same case, model and batch size", True
