"""Vendor toolkits: FlagPerf's second flavour of base specs ("vendor-specific tools" beside "operators or
primitives"). The vendor folder supplies a program and how to build it; this kernel builds it on the host
(cached by content), runs it once per precision and reads its output into the same result schema.

A toolkit is a folder vendor_images/<vendor>/toolkits/<name>/ with toolkit.yaml:
  name, provides (the kind of program a case asks for: ``gemm``), description,
  requires     programs that must be on PATH to build it (a missing one: 'unsupported', with the reason)
  sources      the files whose content keys the build cache
  build        the build command as a list ({binary} = the output path, {python} = this interpreter), run in
               the folder, no shell
  precisions   case precision -> the program's name for it ({fp8_format} filled from the config)
The program prints one JSON line: ``chunks`` [[iterations, seconds], ...] and ``window`` [start, end] epoch
seconds of its timed region, plus anything else it wants recorded (kept in the metric's note); it exits 3
when the device has no kernel for the request (unsupported) and 2 on bad arguments.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import Field, field_validator

from flagperf.config.files import given_name, inside, regular_file
from flagperf.config.models import StrictModel, check_name, load_model
from flagperf.config.vendors import TOOLKITS_FOLDER
from flagperf.errors import CaseUserError, Unsupported
from flagperf.measure.casekit import CaseContext, TimedCaseConfig
from flagperf.paths import display_path
from flagperf.results.metrics import GEMM_CONVENTION, Chunk, gemm_ops
from flagperf.results.schema import Metric

TOOLKIT_FILE = "toolkit.yaml"
EXIT_USAGE, EXIT_UNSUPPORTED = 2, 3
BUILD_TIMEOUT_S = 600


class Config(TimedCaseConfig):
    provides: Literal["gemm"] = Field(description="the kind of vendor program to run")
    precisions: list[Literal["bf16", "fp16", "int8", "fp8"]] = Field(min_length=1)
    m: int = Field(gt=0, le=65536)
    n: int = Field(gt=0, le=65536)
    k: int = Field(gt=0, le=65536)
    data_pattern: Literal["normal", "uniform", "zeros"] = "normal"
    fp8_format: Literal["e4m3", "e5m2"] = "e4m3"
    fp8_fast_accum: bool = False


PROVIDES = get_args(Config.model_fields["provides"].annotation)  # what a toolkit case can ask for
PRECISIONS = get_args(get_args(Config.model_fields["precisions"].annotation)[0])  # what it asks of one


class ToolkitManifest(StrictModel):
    name: str  # also the built program's file name
    provides: str
    description: str
    requires: list[str] = Field(default_factory=list)
    sources: list[str] = Field(min_length=1)
    build: list[str] = Field(min_length=1)
    precisions: dict[str, str]

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "toolkit name")

    @field_validator("provides")
    @classmethod
    def _provides(cls, value: str) -> str:  # any other is never found: no case asks for it
        if value not in PROVIDES:
            raise ValueError(f"{value!r} is asked for by no toolkit case (they ask for {', '.join(PROVIDES)})")
        return value

    @field_validator("precisions")
    @classmethod
    def _precisions(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - set(PRECISIONS))
        if unknown:
            raise ValueError(f"{', '.join(map(repr, unknown))}: no toolkit case runs such a precision (they run "
                             f"{', '.join(PRECISIONS)})")
        return value


def load_toolkit_manifest(path: Path, vendor_folder: Path) -> ToolkitManifest:
    """<vendor folder>/toolkits/<name>/toolkit.yaml as a run and `flagperf validate` check it, building and running
    nothing: read as any config file (a regular file, no link out of the vendor folder), every key by the model
    (ConfigError with every finding, each naming the file and key), and each of ``sources`` a regular file inside
    the toolkit's folder (what it builds stays inside)."""
    inside(vendor_folder, path.relative_to(vendor_folder), given_name(path), None, "the vendor folder")
    manifest = load_model(path, ToolkitManifest)
    for index, source in enumerate(manifest.sources):
        regular_file(path.parent, source, display_path(path), f"sources.{index}", "the toolkit folder")
    return manifest


def find_toolkit(vendor_folder: Path | None, provides: str) -> tuple[Path, ToolkitManifest]:
    if vendor_folder is None:
        raise Unsupported(f"no vendor folder is known to this case, so no toolkit providing {provides!r}")
    for path in sorted((vendor_folder / TOOLKITS_FOLDER).glob(f"*/{TOOLKIT_FILE}")):
        manifest = load_toolkit_manifest(path, vendor_folder)
        if manifest.provides == provides:
            return path.parent, manifest
    raise Unsupported(f"vendor {vendor_folder.name} has no toolkit providing {provides!r} "
                      f"({vendor_folder.name}/{TOOLKITS_FOLDER}/*/{TOOLKIT_FILE})")


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flagperf" / "toolkits"


def build(folder: Path, manifest: ToolkitManifest, cache: Path | None = None) -> Path:
    """The program, built once per content (sources + build command) and reused by later rounds."""
    missing = [tool for tool in manifest.requires if shutil.which(tool) is None]
    if missing:
        raise Unsupported(f"toolkit {manifest.name}: {', '.join(missing)} not found on PATH; it is built on the "
                          "host with the vendor's compiler")
    digest = hashlib.sha256(json.dumps(manifest.build).encode())
    for source in manifest.sources:
        digest.update((folder / source).read_bytes())
    out_dir = (cache or cache_root()) / f"{manifest.name}-{digest.hexdigest()[:16]}"
    binary = out_dir / manifest.name
    if binary.is_file():
        return binary
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = out_dir / f".{manifest.name}.{os.getpid()}"  # a concurrent round never runs a half-written file
    command = [part.replace("{binary}", str(staging)).replace("{python}", sys.executable) for part in manifest.build]
    try:
        done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired:
        raise Unsupported(f"toolkit {manifest.name}: the build took over {BUILD_TIMEOUT_S} s") from None
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise Unsupported(f"toolkit {manifest.name}: the build failed ({command[0]} exited {done.returncode}): "
                          f"{tail}")
    staging.replace(binary)
    return binary


def program_arguments(config: Config, manifest: ToolkitManifest, precision: str) -> list[str]:
    name = manifest.precisions[precision].replace("{fp8_format}", config.fp8_format)
    timing = config.timing
    return ["--precision", name, "--m", str(config.m), "--n", str(config.n), "--k", str(config.k),
            "--warmup", str(timing.warmup_iters), "--min-seconds", repr(timing.min_duration_s),
            "--min-iters", str(timing.min_iters), "--pattern", config.data_pattern,
            "--fast-accum", "1" if config.fp8_fast_accum else "0"]


def parse_output(text: str, program: str) -> dict[str, Any]:
    """The program's JSON line (the last line that parses), checked for what the metric needs."""
    for line in reversed(text.strip().splitlines()):
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict):
            chunks, window = data.get("chunks"), data.get("window")
            if not (isinstance(chunks, list) and chunks and all(
                    isinstance(c, list) and len(c) == 2 and c[0] > 0 and c[1] > 0 for c in chunks)):
                raise RuntimeError(f"{program}: output has no valid 'chunks' [[iterations, seconds], ...]")
            if not (isinstance(window, list) and len(window) == 2 and window[0] <= window[1]):
                raise RuntimeError(f"{program}: output has no valid 'window' [start, end]")
            return data
    raise RuntimeError(f"{program}: printed no JSON line")


def to_metric(ctx: CaseContext, config: Config, precision: str, data: dict[str, Any], toolkit: str) -> Metric:
    chunks = [Chunk(iterations=int(i), seconds=float(s)) for i, s in data["chunks"]]
    ctx.record_external(chunks, (float(data["window"][0]), float(data["window"][1])))
    facts = {k: v for k, v in data.items() if k not in ("chunks", "window", "m", "n", "k", "program")}
    note = (f"vendor toolkit {toolkit}: {config.m}x{config.k} @ {config.k}x{config.n}, "
            + ", ".join(f"{k} {v}" for k, v in facts.items()))
    unit = "TOPS" if precision == "int8" else "TFLOPS"
    return ctx.rate_metric(f"toolkit_gemm_{precision}", chunks, gemm_ops(config.m, config.n, config.k), unit, 1e12,
                           peak_key=precision, convention=GEMM_CONVENTION, note=note)


def run(config: Config, ctx: CaseContext) -> list[Metric]:
    folder, manifest = find_toolkit(ctx.vendor_folder, config.provides)
    wanted = []
    for precision in config.precisions:
        if precision not in manifest.precisions:
            ctx.log.warning("toolkit %s has no %s; skipped", manifest.name, precision)
            continue
        peak = ctx.spec.peaks.get(precision)
        if peak is not None and not peak.supported:
            ctx.log.warning("%s skipped: %s", precision, peak.source)
            continue
        wanted.append(precision)
    if not wanted:
        raise Unsupported(f"toolkit {manifest.name}: none of {', '.join(config.precisions)} on {ctx.spec.device}")
    binary = build(folder, manifest)
    metrics: list[Metric] = []
    refused: list[str] = []
    for precision in wanted:
        command = [str(binary), *program_arguments(config, manifest, precision)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=config.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{manifest.name} {precision}: no answer in {config.timeout_s:g} s") from None
        message = (done.stderr.strip().splitlines() or [""])[-1]
        if done.returncode == EXIT_UNSUPPORTED:
            ctx.log.warning("%s %s unsupported: %s", manifest.name, precision, message)
            refused.append(f"{precision}: {message}")
            continue
        if done.returncode == EXIT_USAGE:
            raise CaseUserError(f"{manifest.name} refused its arguments: {message}")
        if done.returncode != 0:
            raise RuntimeError(f"{manifest.name} {precision} exited {done.returncode}: {message}")
        metrics.append(to_metric(ctx, config, precision, parse_output(done.stdout, manifest.name), manifest.name))
    if not metrics:
        raise Unsupported(f"toolkit {manifest.name}: {'; '.join(refused)}")
    return metrics
