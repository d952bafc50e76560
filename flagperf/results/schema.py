"""The result schema shared by every case family, and the on-disk layout of a run.

results/<run-id>/<case>/round<N>/<host>_noderank<K>/result.json   (FlagPerf's layout)
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flagperf.results.bounded import read_bounded
from flagperf.results.limits import MAX_NNODES, MAX_ROUNDS  # noqa: F401 - the planner's limits, read here too
from flagperf.results.metrics import STATISTICS

SCHEMA_VERSION = 1
RESULT_FILE = "result.json"
MONITOR_FILE = "monitor.jsonl"
CASE_LOG_FILE = "case.log"
# How the case process logs (python -m flagperf.entry): the controller relays each line at the level it names.
CASE_LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"
# (a round that measures every device marks each device process's lines with "[device N] ")
_CASE_LOG_LINE = re.compile(r"(\[device \d+\] )?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "
                            r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) (.*)", re.S)


class CaseLogFormatter(logging.Formatter):
    """CASE_LOG_FORMAT on every line of a record: a multi-line message (a failure's, a traceback) keeps its time
    and level on each line, so the relay, which sees lines, gives the whole of it the record's level."""

    def __init__(self) -> None:
        super().__init__(CASE_LOG_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        first, *rest = super().format(record).split("\n")
        if not rest:
            return first
        prefix = f"{record.asctime} {record.levelname} "
        return "\n".join([first, *(prefix + line for line in rest)])


def case_log_line(line: str) -> tuple[int, str]:
    """A case.log line as (level, message) for the controller's log: a line the case logged in CASE_LOG_FORMAT at
    its own level (at least INFO, which the run's log keeps), with the case's time (the host's, when the line was
    made; a transport may deliver it later) and without its level, which the relay shows; anything else it printed
    (a library's output) at INFO, as printed."""
    logged = _CASE_LOG_LINE.fullmatch(line)
    if logged is None:
        return logging.INFO, line
    device, made, level, message = logged.groups()
    return max(logging.getLevelName(level), logging.INFO), f"{device or ''}{made} {message}"


ATTEMPT_FAILURE_FILE = "failure.txt"  # in an attempt's folder: why that attempt failed (it was then retried)
# Failure messages the evaluation acts on: it stops when the results folder cannot take more, and keeps the
# host's copy of a round it could not collect (a retry collects it from there).
RESULTS_UNWRITABLE = "the results folder cannot be written"
KEPT_ON_HOST = "its files are kept on the host at"


class _Model(BaseModel):
    # No NaN or infinity: result files stay valid JSON and every figure is a number a report can draw.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Peak(_Model):
    """One figure of a vendor spec table. ``supported`` False means the device cannot do it at all."""

    value: float | None = Field(description="None when the peak is not known for this device")
    unit: str
    source: str = Field(description="datasheet reference or the derivation, with the inputs used")
    supported: bool = True
    dense: bool = True
    bound: Literal["exact", "lower"] = Field(
        default="exact", description="exact: a datasheet figure, or one derived from the device's maximum clock; "
        "lower: a lower bound of the real peak (derived from a base or current clock the device may run above), "
        "so a ratio or MFU against it is an upper estimate and a figure above it is no fault")
    bound_reason: str | None = Field(default=None, max_length=300, description="bound: lower: why the figure is "
                                     "only a lower bound, in a few words (the report shows it)")

    @model_validator(mode="after")
    def _bound_says_why(self) -> Peak:
        if self.bound == "lower" and not (self.bound_reason or "").strip():
            raise ValueError("bound: lower needs bound_reason saying why the peak is only a lower bound")
        if self.bound == "exact" and self.bound_reason is not None:
            raise ValueError("bound_reason goes with bound: lower (an exact peak needs no reason)")
        return self

    @property
    def estimated(self) -> bool:
        """A lower bound of the real peak: ratios and MFU against it are upper estimates."""
        return self.bound == "lower"


# How a share of an estimated peak (bound: lower) is written wherever one is shown: the real share is at most that.
UPPER_ESTIMATE = "≤ "
ESTIMATED_PEAK_LEGEND = ("≤: measured against an estimated peak, a lower bound of this machine's real peak, so the "
                         "ratio or MFU is an upper estimate (the real share is at most that); a figure above such a "
                         "peak means the estimate is low, not that the figure is wrong.")


class SpecTable(_Model):
    device: str
    peaks: dict[str, Peak]


class ShapeSearch(_Model):
    """A max-achievable figure's search (flagperf.basespec.shapesearch): where it looked and what it found."""

    shape: dict[str, int] = Field(description="the best shape found, re-measured for this metric's value")
    search_value: float = Field(description="the best shape's rate during the search (short measurement)")
    shapes_tried: int
    budget_s: float
    spent_s: float
    stopped: str = Field(description="converged, budget or grid exhausted")
    ranges: dict[str, list[int]] = Field(description="axis -> [low, high] searched")
    step: int
    top: list[dict[str, float]] = Field(default_factory=list, description="the fastest shapes tried, m n k value")


class Metric(_Model):
    name: str
    value: float = Field(description="the headline, formed as `statistic` says (a rate: total work / total "
                         "measured time; a latency: the mean)")
    unit: str
    p50: float | None = None
    p10: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = Field(default=None, description="latency metrics: the 99th percentile")
    std: float | None = Field(default=None, description="latency metrics: sample standard deviation")
    cv: float | None = Field(default=None, description="coefficient of variation across timed chunks")
    chunks: int = 0
    iterations: int = 0
    measured_seconds: float = 0.0
    peak: Peak | None = None
    ratio: float | None = Field(default=None, description="value / peak.value, when the peak is known")
    convention: str | None = Field(default=None, description="how work or bytes are counted")
    statistic: str | None = Field(default=None, description="how value is formed from what was timed, one of "
                                  "flagperf.results.metrics.STATISTICS (rate, rate@median, mean, single, loadgen; "
                                  "docs/results.md, Conventions); None in records written before it was stated")
    note: str | None = None
    window: list[float] | None = Field(default=None, description="[start, end] epoch seconds of the timed region "
                                       "(what the monitors' power, utilisation and chip state beside the figure are "
                                       "taken over)")
    mfu: float | None = Field(default=None, description="model FLOP/s (flops per item x items/s) / peak FLOP/s "
                                                       "of the precision used")
    mfu_peak_key: str | None = Field(default=None, description="spec-table key of the peak MFU is taken against")
    mfu_peak: Peak | None = Field(default=None, description="that peak: value, unit and source (the report shows "
                                                            "it beside the MFU)")
    work: float | None = Field(default=None, description="total work in the timed region, in unit x seconds "
                               "(a `rate` is work / measured_seconds; without `energy_window`, energy per work is "
                               "the energy over `window` / work)")
    energy_window: list[float] | None = Field(default=None, description="[start, end] epoch seconds that energy per "
                                              "work is taken over where that is not `window`: a loop of the same "
                                              "call back to back at a steady rate (operation: the energy loop, else "
                                              "the host loop, with no cache flush), whose energy is its mean power "
                                              "between the samples inside it x its length; None: `window`")
    energy_work: float | None = Field(default=None, ge=0, description="the work done in `energy_window`, in unit x "
                                      "seconds: energy per work is the energy over `energy_window` / energy_work")
    energy_intervals: int | None = Field(default=None, ge=1, description="operation: the case's energy_intervals "
                                         "(the energy loop asked to last this many of the monitors' sampling "
                                         "intervals); None: no energy loop asked")
    energy_loop_ran: bool | None = Field(default=None, description="operation, with energy_intervals: whether this "
                                         "figure's energy loop ran (`energy_window` is it); False: it did not (out of "
                                         "memory, no monitor interval), `energy_window` is the host loop's or none; "
                                         "None: not said (a record from before: energy_intervals was set only where "
                                         "it ran)")
    energy_per_work_absent: str | None = Field(default=None, description="why the figure has no energy per work "
                                               "whatever the monitors sampled (operation: no loop of the point's "
                                               "calls alone ran)")
    warning: str | None = Field(default=None, description="why a reader should not take the figure plainly "
                                                          "(the report shows it beside the figure)")
    search: ShapeSearch | None = Field(default=None, description="max-achievable figures: the shape search")
    device: int | None = Field(default=None, description="the host's device this figure is of, where the round "
                                                         "measured every device (None: the round's one device)")

    @model_validator(mode="after")
    def _known_statistic(self) -> Metric:
        if self.statistic is not None and self.statistic not in STATISTICS:
            raise ValueError(f"statistic {self.statistic!r} is none of {', '.join(STATISTICS)}")
        for name in ("window", "energy_window"):  # read as (start, end) by the analysis
            span = getattr(self, name)
            if span is not None and (len(span) != 2 or span[0] > span[1]):
                raise ValueError(f"{name} must be [start, end] with start <= end, got {span}")
        if (self.energy_window is None) != (self.energy_work is None):
            raise ValueError("energy_window and energy_work go together (the work done in that window)")
        return self


class Failure(_Model):
    kind: Literal["infrastructure", "user", "unsupported"]
    message: str
    # HOST:FOLDER of a half round the controller kept on its host for the lab to look at (flows.host_round
    # .HalfRoundKept): the run's clean-up leaves it there. A field of its own, never read out of the message, which may
    # quote a case log or an endpoint's answer.
    kept_at: str | None = None


class Convergence(_Model):
    """Training: whether the case's target was reached within its budget (not reaching it is a result)."""

    metric: str
    target: float
    reached: float | None
    converged: bool
    epochs: int
    steps: int


class LoadgenResult(_Model):
    """One MLPerf LoadGen scenario, as LoadGen itself reported it (mlperf_log_detail.txt)."""

    scenario: str
    mode: str
    valid: bool = Field(description="LoadGen's own verdict: result_validity == VALID")
    result_validity: str
    samples_per_s: float | None = Field(description="LoadGen's throughput figure for the scenario")
    latency_ms: dict[str, float] = Field(default_factory=dict, description="mean and percentiles, ms")
    settings: dict[str, Any] = Field(default_factory=dict, description="the settings LoadGen ran with, as it "
                                     "logged them (its effective_* keys)")
    requested: dict[str, Any] = Field(default_factory=dict, description="what the engine asked of LoadGen")
    summary: dict[str, Any] = Field(default_factory=dict, description="LoadGen's result_* keys, verbatim")
    log_dir: str = Field(description="LoadGen's logs, relative to the round's folder in the results")
    attempts: int = Field(default=1, description="runs of the scenario (re-run when it ended early)")
    invalid_reason: str | None = Field(default=None, description="why LoadGen did not call it VALID")


class InferenceReport(_Model):
    """What an inference round did, beside its metrics: the steps, the toggles' effect, the data used."""

    compiler: str | None
    precision: str
    batch_size: int
    flops_per_item: float
    item: str
    steps: dict[str, str] = Field(description="step -> 'ran', 'skipped: <why>' or 'failed'")
    runner: str = Field(description="'prefect subflows' or 'plain functions (<why>)'")
    synthetic_data: bool
    data: str = Field(description="the data set read, or what the synthetic inputs were")
    accuracy_note: str | None = None
    e2e_time_s: float
    non_inference_s: float = Field(default=0.0, description="engine-reported non-inference time (foo_time)")
    onnx_path: str | None = None
    engine_file: str | None = None
    loadgen: list[LoadgenResult] = Field(default_factory=list)
    flops_source: str | None = Field(default=None, description="where flops_per_item came from: counted on the "
                                     "configured model, or the configured figure and why it was not counted")
    flops_configured: float | None = Field(default=None, description="the case file's flops (FlagPerf's figure)")
    artifacts: str | None = Field(default=None, description="what became of the ONNX and engine files")
    latencies_file: str | None = Field(default=None, description="raw per-batch seconds, in the round's folder")
    data_path: str | None = Field(default=None, description="how batches reached the device")


# A point's reference_sample without a host sample: "none: <reason>; <why>", the reason a few words the same for
# every shape (what an operator's headline counts: flagperf.results.operators.no_sample_reason), why in full.
NO_SAMPLE_SEPARATOR = "; "
# The reasons a point has no host sample, in those few words (the reason part is one of them, nothing else):
HOST_FAILED = "the host could not compute it"  # a host sample that failed (memory, a dtype)
TOO_MANY_LOGITS = "too many logits for the host's float64 pass"  # cross_entropy past the streamed pass
ROW_OVER_HOST_COPY = "one row of logits over a host copy"  # cross_entropy whose one row is over a host copy
NONE_DEFINED = "none defined for "  # + the operator's name: an operator without a host sample


def is_no_sample_reason(text: str) -> bool:
    """Whether ``text`` is one of the short reasons above (and not the start of an older record's full text)."""
    return text in (HOST_FAILED, TOO_MANY_LOGITS, ROW_OVER_HOST_COPY) or text.startswith(NONE_DEFINED)


class OperatorPoint(_Model):
    """One operator x dtype x shape x implementation of an operation round (flagperf.operation). A point that
    failed its correctness check has the error and no figure; a skipped one says why it did not run."""

    operator: str
    group: str
    dtype: str
    shape: dict[str, int]
    source: str = Field(description="where the shape came from: '<model preset> b<batch> s<seq>', '<shape set> "
                        "<its source>' (flaggems-core BlasBenchmark [2, 384, 384, 384]) or 'given'")
    implementation: str
    status: Literal["passed", "failed", "skipped"]
    error: str | None = Field(default=None, description="failed: the wrong result or the exception; skipped: why")
    metric: str | None = Field(default=None, description="the name of this point's figure among the metrics")
    latency_s: float | None = Field(default=None, description="median over the timed iterations")
    latency_p10_s: float | None = None
    latency_p90_s: float | None = None
    latency_spread: float | None = Field(default=None, description="(p90 - p10) / (2 x median) of the per-iteration "
                                         "latencies: the +- noise of one timed iteration around the median")
    latency_ci_low_s: float | None = Field(default=None, description="the median's 95% confidence interval, low end: "
                                           "an order statistic of the iterations (docs/operation.md, Timing); "
                                           "None under 6 iterations, too few for a 95% interval")
    latency_ci_high_s: float | None = Field(default=None, description="the median's 95% confidence interval, high end")
    host_latency_s: float | None = Field(default=None, description="host clock: wall time per call of as many calls "
                                         "back to back (no flush, one synchronisation at the end), dispatch included")
    iterations: int = 0
    rewarmed: bool | None = Field(default=None, description="where the flush empties the host's caches too (the "
                                  "CPU): whether each flush was followed by the untimed call on a copy of the "
                                  "inputs (false: timed without it, no memory for the copy or its output, so the "
                                  "call's code and state were cold too); null where there is no such call (no flush, a "
                                  "flush that leaves the host's caches alone, or a call over 10x its flush, where "
                                  "it would change nothing)")
    warmup_calls: int = Field(default=0, description="untimed calls before the timed iterations (warm-up by time)")
    clock_floor_s: float | None = Field(default=None, description="the median the clock measures for an empty "
                                        "interval (its resolution and the cost of marking), in the same round")
    near_clock_floor: bool = Field(default=False, description="the clock floor is over 10% of the median "
                                   "latency: the figure includes up to that much of the timer's own cost")
    flops: float | None = Field(default=None, description="FLOPs of one call (compute-bound operators)")
    bytes: float | None = Field(default=None, description="bytes of one call: inputs read once, outputs written once")
    value: float | None = Field(default=None, description="TFLOPS or GB/s at the median latency")
    unit: str | None = None
    roofline: float | None = Field(default=None, description="roofline time / measured time: max(FLOPs / peak "
                                                             "FLOP/s, bytes / peak bandwidth) over the median")
    roofline_basis: str | None = None
    roofline_estimated: bool = Field(default=False, description="the roofline uses a peak that is an estimate (a "
                                     "lower bound of the real one): the share is an upper estimate")
    reference: str | None = Field(default=None, description="how the reference was computed (dtype, device)")
    reference_sample: str | None = Field(default=None, description="a point over reference_cpu_max_elements, "
                                         "whose reference is the device's own kernels: the float64 host reference "
                                         "of a sample of its output it was also held to (which elements), or 'none: "
                                         "reason; why' (reason: a few words, the same for every shape; why: in "
                                         "full); null for a point whose reference is float64 on the host already")
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    tolerance: dict[str, float] | None = Field(default=None, description="rtol, atol (atol scaled for the shape)")
    aten_ops: list[str] = Field(default_factory=list, description="the aten operators the native call dispatches")
    note: str | None = Field(default=None, description="a passed point: what it lacks and why (its host loop ran out "
                             "of memory: no host latency, no energy per work)")


class OperationReport(_Model):
    """What an operation round measured, point by point, and how."""

    timing: str = Field(description="the clock, warm-up, iterations and statistics")
    flush: str = Field(description="what was done between iterations to empty the cache, or why nothing was")
    graphs: str = Field(description="CUDA-graph replay, or why not")
    energy: str | None = Field(default=None, description="the energy loop energy per work is taken over (its "
                               "length: energy_intervals x the monitors' interval), or why none ran; None in records "
                               "written before it existed")
    counting: dict[str, str] = Field(description="operator -> FLOP and byte counting formulas")
    tolerances: dict[str, dict[str, float]] = Field(description="dtype -> rtol, atol (before the shape's scale)")
    implementations: dict[str, str] = Field(default_factory=dict, description="name -> engine folder, or why absent")
    points: list[OperatorPoint] = Field(default_factory=list)


class DeviceRun(_Model):
    """One device of a round that measured every device of its host (one process per device)."""

    index: int = Field(ge=0, description="the host's device index (the vendor's numbering; a CPU slice's number)")
    visible: str | None = Field(default=None, description="what the device's process was narrowed to: the "
                                "visible-devices value, or the CPU cores of a slice")
    device: str | None = Field(default=None, description="the device's name as its process saw it")
    status: Literal["success", "unsupported", "failed"]
    failure: Failure | None = None
    duration_s: float = Field(ge=0)
    measured_seconds: float = Field(ge=0)


class DeviceSpread(_Model):
    """One metric over a host's devices: the host's min, median and max, and which device was lowest."""

    metric: str
    unit: str
    devices: int = Field(ge=1)
    min: float
    median: float
    max: float
    min_device: int = Field(description="the device index with the lowest figure")


class Provenance(_Model):
    engine_version: str
    git_revision: str | None
    git_dirty: bool | None
    source_digest: str | None = Field(default=None, description="sha256 of the code that ran "
                                      "(flagperf.results.provenance.source_digest), with or without git")
    command: str | None = None
    python: str
    libraries: dict[str, str]
    host: dict[str, Any]
    image: dict[str, Any]
    config_origins: dict[str, str]
    run_overrides: dict[str, dict[str, Any]]
    attempt: int = 1
    adaptation: dict[str, Any] | None = Field(
        default=None, description="the vendor's adaptation of the case that was applied (cases/<family>/<case>/"
                                  "vendor/<vendor>/: environment file, requirements, csrc build, extern hooks used)")
    spec_settings: dict[str, Any] = Field(
        default_factory=dict, description="the settings the vendor's spec module read (vendor.yaml's spec_settings "
                                          "with the inventory's for this host over them)")
    spec_settings_origins: dict[str, str] = Field(
        default_factory=dict, description="spec_settings key -> where its value came from: the vendor's vendor.yaml, "
                                          "or the inventory file and key that set it for this host")


class RoundResult(_Model):
    schema_version: Literal[1] = SCHEMA_VERSION
    run_id: str
    case: str
    family: str
    round: int = Field(ge=1)
    host: str
    node_rank: int = Field(ge=0)
    vendor: str
    status: Literal["success", "unsupported", "failed"]
    failure: Failure | None = None
    started_at: datetime
    finished_at: datetime
    duration_s: float = Field(ge=0, description="wall time of the case process")
    measured_seconds: float = Field(ge=0, description="sum of the timed windows inside the case")
    startup_s: float | None = Field(default=None, ge=0,
                                    description="case process start to case start: interpreter and imports")
    device: str | None = None
    metrics: list[Metric] = Field(default_factory=list)
    convergence: Convergence | None = None
    inference: InferenceReport | None = None
    operation: OperationReport | None = None
    config: dict[str, Any]
    provenance: Provenance | None = None
    devices: list[DeviceRun] = Field(default_factory=list, description="every device of the host, where the "
                                     "round measured each (its metrics carry the device index)")
    device_spread: list[DeviceSpread] = Field(default_factory=list, description="per metric: the host's "
                                              "min, median and max over its devices")


def round_dir(run_dir: Path, case: str, round_no: int, host: str, node_rank: int = 0) -> Path:
    return run_dir / case / f"round{round_no}" / f"{host}_noderank{node_rank}"


def node_groups(config: dict[str, Any], names: list[str]) -> list[list[str]]:
    """The hosts of the inventory (``names``, in its order) a case's round runs on, in groups, each group's hosts
    together: a single-node case on every host on its own; an nnodes-node case on the first nnodes hosts together
    (FlagPerf: HOSTS[0] is the master); a case that loads an endpoint on its ``endpoint.client_host`` alone, where it
    names one (the plan refuses one that names no host, and an endpoint case on several hosts without one)."""
    endpoint = config.get("endpoint")
    client = endpoint.get("client_host") if isinstance(endpoint, dict) else None
    if client is not None and client in names:
        return [[client]]
    nnodes = config.get("nnodes", 1)
    # a whole number the planner allows: 1e999 (a float) or 3.5 is no count of hosts; ValueError, as int() raised
    if isinstance(nnodes, bool) or not isinstance(nnodes, int) or not 1 <= nnodes <= MAX_NNODES:
        raise ValueError(f"nnodes must be a whole number from 1 to {MAX_NNODES}, got {nnodes!r}")
    return [names[:nnodes]] if nnodes > 1 else [[name] for name in names]


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary name beside ``path`` to write to; on success it is flushed to disk and renamed over
    ``path`` (readers see the old file or the whole new one), on any failure it is removed: a full disk
    leaves neither a 0-byte file nor a stray temporary one, nor a folder it made for it. Each name is known
    before it is made, so an interrupt at any point leaves nothing of it."""
    made: list[Path] = []  # the folders this write made itself, deepest first: only those go with a failed one
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    try:
        for folder in reversed([f for f in (path.parent, *path.parent.parents) if not f.exists()]):
            made.insert(0, folder)  # before it is made: an interrupt just after leaves nothing of it either
            try:
                folder.mkdir()
            except FileExistsError:  # another writer made it meanwhile: theirs, never removed here
                made.remove(folder)
        os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))  # O_EXCL: never another's file
        yield tmp
        with open(tmp, "rb+") as handle:  # a delayed-allocation file system reports ENOSPC here, not at write
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # made 0600 until whole; results are meant to be read by the team
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        for folder in made:  # only while empty: another writer may have put a file there meanwhile
            with suppress(OSError):
                folder.rmdir()
        raise
    # The new name (and the folders made for it) on disk too: until its folder is flushed, a power cut can leave
    # the old file, or none, though the data was flushed. The deepest first: each is then an entry of the next.
    for folder in dict.fromkeys([path.parent, *(f.parent for f in made)]):
        sync_folder(folder)


def sync_folder(folder: Path) -> None:
    """Flush ``folder``'s entries to disk (a name renamed or made in it); a file system that cannot flush a folder
    (EINVAL: some network and FUSE ones) is left to its own guarantees."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def folder_problem(folder: Path) -> str | None:
    """Why results cannot be written to ``folder`` (made if missing), or None: checked by writing a file
    with data in it (an empty one fits on a full disk) and flushing it (where the disk reports a full one)."""
    try:
        if folder.exists() and not folder.is_dir():
            return "is a file, not a folder"
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder) as probe:
            probe.write(b"flagperf")
            probe.flush()
            os.fsync(probe.fileno())
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        return f"cannot write there: {getattr(exc, 'strerror', None) or exc}"
    return None


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that readers see the old file or the whole new one, never half of it."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def write_result(path: Path, result: RoundResult) -> None:
    write_json_atomic(path, result.model_dump(mode="json"))


def read_result(path: Path) -> RoundResult:
    """A round's result.json; OSError when it cannot be opened, ValueError when it is no result (a FIFO, never
    waited on; larger than MAX_RECORD_BYTES, never read whole; not valid)."""
    return RoundResult.model_validate_json(read_bounded(path))
