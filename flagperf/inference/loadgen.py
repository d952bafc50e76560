"""MLPerf LoadGen drives a case's compiled engine as the system under test (SUT).

The query sample library (QSL) holds single samples cut from the case's own data loader; the SUT runs
them through the case's ``engine_forward`` (Offline: in batches of ``batch_size``, the last one padded to
that size so no new shape appears mid-test; SingleStream and Server: one sample per query). LoadGen writes
its own logs under ``loadgen/<scenario>/`` in the round's folder; its verdict, its figures and the settings it
ran with (its ``effective_*`` keys, not what was asked) are read back from mlperf_log_detail.txt into
result.json. Performance mode only: accuracy is FlagPerf's metric.

Sizing: LoadGen pre-generates its queries from the expected rate (Offline) or latency (SingleStream); a SUT
faster than expected runs out of queries before min_duration and the test is INVALID. The expectation is
measured through this SUT (the full path: sample gathering, the engine, synchronisation) with a margin, and
a scenario that still ends early is run again, sized from the rate LoadGen itself measured.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from flagperf.errors import CaseUserError, require
from flagperf.inference.config import InferenceConfig
from flagperf.inference.measure import as_inputs, drain
from flagperf.results.schema import LoadgenResult

# The engine's forward as the pipeline runs it: inputs -> (outputs, time spent outside inference).
Forward = Callable[[list[torch.Tensor]], tuple[Any, Any]]

log = logging.getLogger("flagperf.case.inference")

DETAIL_LOG = "mlperf_log_detail.txt"
MARGIN = 1.25  # expected rate x this (expected latency / this): a machine a little quicker than calibrated
CALIBRATION_S = 0.5  # at least this long per calibrated shape, so one slow or fast call does not set the size
MAX_SAMPLES = 1024  # samples held in memory for the QSL; LoadGen reuses them as its performance set


def collect_samples(loader: Any, limit: int) -> list[list[torch.Tensor]]:
    """Single samples (each a list of input tensors with a batch axis of 1) from the data loader."""
    samples: list[list[torch.Tensor]] = []
    for inputs, _labels in loader:
        batch = as_inputs(inputs)
        for i in range(batch[0].shape[0]):
            samples.append([x[i:i + 1] for x in batch])
            if len(samples) >= limit:
                return samples
    if not samples:
        raise CaseUserError("LoadGen: the data loader yielded no samples")
    return samples


class EngineSUT:
    """Runs queries through ``engine_forward``; responses carry no data (performance mode)."""

    def __init__(self, forward: Forward, sync: Callable[[], None], batch_size: int,
                 samples: list[list[torch.Tensor]]) -> None:
        self.engine_forward, self.sync, self.batch_size, self.samples = forward, sync, batch_size, samples
        self.queries = 0

    def forward(self, indices: list[int]) -> None:
        n = len(indices)
        padded = indices + [indices[-1]] * (self.batch_size - n) if 1 < n < self.batch_size else indices
        inputs = [torch.cat([self.samples[i][k] for i in padded]) for k in range(len(self.samples[0]))]
        outputs, _ = self.engine_forward(inputs)
        drain(outputs)
        self.sync()

    def issue_queries(self, query_samples: list[Any]) -> None:
        import mlperf_loadgen as lg

        for start in range(0, len(query_samples), self.batch_size):
            chunk = query_samples[start:start + self.batch_size]
            self.forward([q.index for q in chunk])
            lg.QuerySamplesComplete([lg.QuerySampleResponse(q.id, 0, 0) for q in chunk])
            self.queries += len(chunk)

    def flush_queries(self) -> None:
        return None

    def _timed(self, indices: list[int], min_seconds: float, min_repeats: int) -> float:
        """Seconds per call of this SUT's full path on ``indices``, timed over at least ``min_seconds``."""
        calls, started = 0, time.perf_counter()
        while calls < min_repeats or time.perf_counter() - started < min_seconds:
            self.forward(indices)
            calls += 1
        return (time.perf_counter() - started) / calls

    def calibrate(self, min_seconds: float = CALIBRATION_S, min_repeats: int = 3) -> dict[str, float]:
        """Both shapes the test will use, run first (a JIT engine compiles here, not inside LoadGen's clock),
        then timed through this SUT: LoadGen sizes its tests from these expected figures."""
        one = [0]
        full = [i % len(self.samples) for i in range(self.batch_size)]
        self.forward(one)
        self.forward(full)
        latency = self._timed(one, min_seconds, min_repeats)
        per_batch = self._timed(full, min_seconds, min_repeats)
        return {"latency_s": latency, "samples_per_s": self.batch_size / per_batch}


def read_detail(path: Path) -> dict[str, Any]:
    """LoadGen's ':::MLLOG {json}' lines as key -> value (the last value of a repeated key)."""
    values: dict[str, Any] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if ":::MLLOG" not in line:
            continue
        try:
            entry = json.loads(line.split(":::MLLOG", 1)[1])
        except ValueError:
            continue
        values[str(entry.get("key"))] = entry.get("value")
    return values


def summarise(scenario: str, detail: dict[str, Any], requested: dict[str, Any], log_dir: str,
              attempts: int = 1) -> LoadgenResult:
    """One scenario's result from LoadGen's detail log: its verdict, figures and the settings it ran with."""
    result = {k: v for k, v in detail.items() if k.startswith("result_")}
    for key in ("early_stopping_met", "early_stopping_result"):
        if key in detail:
            result[key] = detail[key]
    validity = str(result.get("result_validity", "missing"))
    throughput_key = {"Offline": "result_samples_per_second", "Server": "result_completed_samples_per_sec",
                      "SingleStream": "result_qps_with_loadgen_overhead"}[scenario]
    throughput = result.get(throughput_key)
    latency: dict[str, float] = {}
    for key, value in result.items():
        if key.endswith("_latency_ns") and isinstance(value, int | float):
            name = key.removeprefix("result_").removesuffix("_latency_ns")  # 90.00_percentile, mean, min, max
            if name.endswith("_percentile"):
                name = f"p{float(name.removesuffix('_percentile')):g}"
            latency[name] = value / 1e6
    # SingleStream's reported metric is the early-stopping estimate of its p90, not the plain p90.
    early = detail.get("early_stopping_latency_ss")
    if scenario == "SingleStream" and isinstance(early, int | float) and early > 0:
        latency["early_stopping_p90"] = early / 1e6
    effective = {k.removeprefix("effective_"): v for k, v in detail.items() if k.startswith("effective_")}
    return LoadgenResult(scenario=scenario, mode="PerformanceOnly", valid=validity == "VALID",
                         result_validity=validity, samples_per_s=float(throughput) if throughput is not None else None,
                         latency_ms=latency, settings=effective, requested=requested, summary=result,
                         log_dir=log_dir, attempts=attempts, invalid_reason=_invalid_reason(detail, validity))


def _invalid_reason(detail: dict[str, Any], validity: str) -> str | None:
    if validity == "VALID":
        return None
    reasons = [str(detail[k]).strip().rstrip(".") for k in ("result_invalid_reason", "error_runtime") if detail.get(k)]
    unmet = [k.removeprefix("result_").removesuffix("_met").replace("_", " ") for k in
             ("result_perf_constraints_met", "result_min_duration_met", "result_min_queries_met",
              "early_stopping_met") if detail.get(k) is False]
    if unmet:
        reasons.insert(0, "not met: " + ", ".join(unmet))
    return "; ".join(reasons) or f"LoadGen said {validity}"


def ended_early(detail: dict[str, Any]) -> bool:
    """INVALID only because the SUT outran the queries LoadGen had generated for min_duration."""
    return detail.get("result_validity") != "VALID" and detail.get("result_min_duration_met") is False


def overloaded(scenario: str, detail: dict[str, Any]) -> bool:
    """A Server test INVALID because its latency bound was missed: the target QPS was more than the system
    sustains within that bound."""
    return scenario == "Server" and detail.get("result_perf_constraints_met") is False


SERVER_BACKOFF = 0.6  # a re-run's target QPS, as a share of the last one's at most


def resized(scenario: str, expected: dict[str, float], detail: dict[str, Any]) -> dict[str, float]:
    """The expectation for a re-run, from what LoadGen measured in the run that ended early: 1.5 times that
    rate, but at most 10 times the last guess, since a short run's rate is optimistic (LoadGen's per-sample
    work grows with the query; a 2 s test sized from a tiny query's rate once ran 44 s). A Server test that
    missed its latency bound is aimed lower: at most SERVER_BACKOFF of its last target, and at most 0.8 of
    the rate it completed."""
    new = dict(expected)
    if overloaded(scenario, detail) and "server_qps" in expected:
        target = SERVER_BACKOFF * expected["server_qps"]
        completed = detail.get("result_completed_samples_per_sec")
        if isinstance(completed, int | float) and completed > 0:
            target = min(target, 0.8 * float(completed))
        new["server_qps"] = target
        return new
    if scenario == "Offline" and isinstance(detail.get("result_samples_per_second"), int | float):
        grow = float(detail["result_samples_per_second"]) * 1.5 / expected["samples_per_s"]
        new["samples_per_s"] = expected["samples_per_s"] * min(max(grow, 1.5), 10.0)
    elif scenario == "SingleStream" and isinstance(detail.get("result_mean_latency_ns"), int | float):
        shrink = expected["latency_s"] * 1.5 / (float(detail["result_mean_latency_ns"]) / 1e9)
        new["latency_s"] = expected["latency_s"] / min(max(shrink, 1.5), 10.0)
    return new


def scenario_settings(c: InferenceConfig, scenario: str, expected: dict[str, float], model_name: str
                  ) -> tuple[Any, dict[str, Any]]:
    """LoadGen's TestSettings for a scenario, and what was asked of it (LoadGen logs what it made of it).
    MLPerf's mlperf.conf / a user.conf, when given, are read last: their rules win over ours."""
    import mlperf_loadgen as lg

    settings = lg.TestSettings()
    settings.scenario = getattr(lg.TestScenario, scenario)
    settings.mode = lg.TestMode.PerformanceOnly
    asked: dict[str, Any] = {}
    if c.loadgen_mlperf_conf is None and c.loadgen_user_conf is None:
        settings.min_duration_ms = int(c.loadgen_min_duration_s * 1000)
        settings.min_query_count = c.loadgen_min_query_count
        asked |= {"min_duration_ms": settings.min_duration_ms, "min_query_count": c.loadgen_min_query_count}
    if scenario == "Offline":
        settings.offline_expected_qps = MARGIN * expected["samples_per_s"]
        asked["offline_expected_qps"] = settings.offline_expected_qps
    elif scenario == "SingleStream":
        settings.single_stream_expected_latency_ns = max(1, int(expected["latency_s"] / MARGIN * 1e9))
        asked["single_stream_expected_latency_ns"] = settings.single_stream_expected_latency_ns
    else:
        qps = c.loadgen_server_target_qps or expected.get("server_qps")
        if qps is None:
            raise CaseUserError("LoadGen Server needs loadgen_server_target_qps, or SingleStream listed before it")
        settings.server_target_qps = qps
        settings.server_target_latency_ns = int(c.loadgen_target_latency_ms * 1e6)
        asked |= {"server_target_qps": qps, "server_target_latency_ns": settings.server_target_latency_ns}
    for key, conf_type in (("loadgen_mlperf_conf", 0), ("loadgen_user_conf", 1)):
        path = getattr(c, key)
        if path is None:
            continue
        if not Path(path).is_file():
            raise CaseUserError(f"{key}: {path} is not a file")
        if settings.FromConfig(str(path), model_name, scenario, conf_type) != 0:
            raise CaseUserError(f"{key}: LoadGen could not read {path} for model {model_name!r}, {scenario}")
        asked[key] = str(path)
    return settings, asked


def _ran_at(detail: dict[str, Any], qps: float | None) -> bool:
    """Whether LoadGen ran at the target QPS we asked for (it logs two decimals)."""
    ran = detail.get("effective_target_qps")
    return qps is not None and isinstance(ran, int | float) and abs(ran - qps) <= 0.01 * qps


def run_scenario(c: InferenceConfig, sut: EngineSUT, scenario: str, expected: dict[str, float], out_dir: Path,
                 model_name: str = "") -> LoadgenResult:
    """One scenario; run again (up to loadgen_max_attempts) when it ended early, sized from LoadGen's own rate."""
    import mlperf_loadgen as lg

    relative = Path("loadgen") / scenario  # result.json names the folder inside the round's results
    log_dir = out_dir / relative
    for attempt in range(1, c.loadgen_max_attempts + 1):
        settings, asked = scenario_settings(c, scenario, expected, model_name)
        log_dir.mkdir(parents=True, exist_ok=True)
        log_settings = lg.LogSettings()
        log_settings.log_output.outdir = str(log_dir)
        log_settings.log_output.copy_summary_to_stdout = False
        log_settings.enable_trace = False
        sut_handle = lg.ConstructSUT(sut.issue_queries, sut.flush_queries)
        qsl_handle = lg.ConstructQSL(len(sut.samples), len(sut.samples), lambda _s: None, lambda _s: None)
        started = time.perf_counter()
        try:
            lg.StartTestWithLogSettings(sut_handle, qsl_handle, settings, log_settings)
        finally:
            lg.DestroyQSL(qsl_handle)
            lg.DestroySUT(sut_handle)
        if not (log_dir / DETAIL_LOG).is_file():
            raise RuntimeError(f"LoadGen wrote no {DETAIL_LOG} in {log_dir}")
        detail = read_detail(log_dir / DETAIL_LOG)
        if ended_early(detail) and attempt < c.loadgen_max_attempts:
            log.info("LoadGen %s ended early (attempt %d, %.1f s): sized again from the rate it measured",
                     scenario, attempt, time.perf_counter() - started)
            expected = resized(scenario, expected, detail)
            continue
        # A target QPS the case derived that missed the latency bound: lower it. Not the user's own figure, nor
        # one a conf file set (LoadGen reads those last: the lowered value would not be what ran).
        derived = c.loadgen_server_target_qps is None and _ran_at(detail, asked.get("server_target_qps"))
        if overloaded(scenario, detail) and derived and attempt < c.loadgen_max_attempts:
            expected = resized(scenario, expected, detail)
            log.info("LoadGen Server missed its latency bound at %.4g QPS (attempt %d): run again at %.4g QPS",
                     asked.get("server_target_qps", 0.0), attempt, expected["server_qps"])
            continue
        break
    result = summarise(scenario, detail, asked, relative.as_posix(), attempts=attempt)
    figures = (f"{result.samples_per_s:.4g} samples/s" if result.samples_per_s is not None else "-",
               {k: round(v, 3) for k, v in result.latency_ms.items()})
    if result.valid:
        log.info("LoadGen %s: VALID, %s, latency %s ms (%.1f s)", scenario, *figures, time.perf_counter() - started)
    else:
        log.warning("LoadGen %s: %s after %d attempt(s): %s (figures not valid: %s, latency %s ms)", scenario,
                    result.result_validity, attempt, result.invalid_reason, *figures)
    return result


def require_loadgen() -> None:
    require("mlperf_loadgen", "inference", "loadgen_scenarios")


def run_scenarios(config: InferenceConfig, loader: Any, forward: Forward, sync: Callable[[], None], out_dir: Path,
                  model_name: str = "") -> list[LoadgenResult]:
    """LoadGen's scenarios over the engine's forward (the same path the timed pass measured)."""
    require_loadgen()
    samples = collect_samples(loader, MAX_SAMPLES)
    sut = EngineSUT(forward, sync, config.batch_size, samples)
    expected = sut.calibrate()
    results = []
    model_name = config.loadgen_model_name or model_name
    for scenario in config.loadgen_scenarios:
        result = run_scenario(config, sut, scenario, expected, out_dir, model_name)
        if scenario == "SingleStream" and result.latency_ms.get("mean"):
            expected["server_qps"] = 0.5 * 1e3 / result.latency_ms["mean"]
        results.append(result)
    return results
