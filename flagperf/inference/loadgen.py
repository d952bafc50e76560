"""MLPerf LoadGen drives a case's compiled engine as the system under test (SUT).

The query sample library (QSL) holds single samples cut from the case's own data loader; the SUT runs
them through the case's ``engine_forward`` (Offline: in batches of ``batch_size``, the last one padded to
that size so no new shape appears mid-test; SingleStream and Server: one sample per query). LoadGen writes
its own logs under ``loadgen/<scenario>/`` in the round's folder; its verdict and figures are read back from
mlperf_log_detail.txt, verbatim, into result.json. Performance mode only: accuracy is FlagPerf's metric.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from flagperf.errors import CaseUserError, require
from flagperf.inference.config import InferenceConfig
from flagperf.inference.measure import as_inputs
from flagperf.results.schema import LoadgenResult

# The engine's forward as the pipeline runs it: inputs -> (outputs, time spent outside inference).
Forward = Callable[[list[torch.Tensor]], tuple[Any, Any]]

log = logging.getLogger("flagperf.case.inference")

DETAIL_LOG = "mlperf_log_detail.txt"
OFFLINE_MARGIN = 2.0
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


def _outputs(result: Any) -> Any:
    """A forward's outputs; a generator (a decoding loop) is run to its end."""
    if isinstance(result, Iterator):
        last = None
        for last in result:  # noqa: B007 - the last value yielded is the output
            pass
        return last
    return result


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
        _outputs(outputs)
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

    def calibrate(self, repeats: int = 3) -> dict[str, float]:
        """Both shapes the test will use, run first (a JIT engine compiles here, not inside LoadGen's clock),
        then timed through this SUT: LoadGen sizes its tests from these expected figures, and a guess far
        off makes an Offline test INVALID (too short) or needlessly long."""
        one = [0]
        full = [i % len(self.samples) for i in range(self.batch_size)]
        self.forward(one)
        self.forward(full)
        started = time.perf_counter()
        for _ in range(repeats):
            self.forward(one)
        latency = (time.perf_counter() - started) / repeats
        started = time.perf_counter()
        for _ in range(repeats):
            self.forward(full)
        return {"latency_s": latency, "samples_per_s": repeats * self.batch_size / (time.perf_counter() - started)}


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


def summarise(scenario: str, detail: dict[str, Any], settings: dict[str, Any], log_dir: Path) -> LoadgenResult:
    result = {k: v for k, v in detail.items() if k.startswith("result_")}
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
    return LoadgenResult(scenario=scenario, mode="PerformanceOnly", valid=validity == "VALID",
                         result_validity=validity, samples_per_s=float(throughput) if throughput is not None else None,
                         latency_ms=latency, settings=settings, summary=result, log_dir=str(log_dir))


def run_scenario(c: InferenceConfig, sut: EngineSUT, scenario: str, expected: dict[str, float], out_dir: Path
                 ) -> LoadgenResult:
    import mlperf_loadgen as lg

    settings = lg.TestSettings()
    settings.scenario = getattr(lg.TestScenario, scenario)
    settings.mode = lg.TestMode.PerformanceOnly
    settings.min_duration_ms = int(c.loadgen_min_duration_s * 1000)
    settings.min_query_count = c.loadgen_min_query_count
    recorded: dict[str, Any] = {"min_duration_ms": settings.min_duration_ms,
                                "min_query_count": c.loadgen_min_query_count,
                                "performance_sample_count": len(sut.samples)}
    if scenario == "Offline":
        # LoadGen issues one Offline query of expected_qps x min_duration samples; if the SUT then runs faster
        # than calibrated the test ends early and is INVALID. Twice the calibrated rate keeps it valid (at
        # worst about twice min_duration long) when the machine gets quieter between calibration and test.
        settings.offline_expected_qps = OFFLINE_MARGIN * expected["samples_per_s"]
        recorded["offline_expected_qps"] = settings.offline_expected_qps
    elif scenario == "SingleStream":
        settings.single_stream_expected_latency_ns = int(expected["latency_s"] * 1e9)
        recorded["single_stream_expected_latency_ns"] = settings.single_stream_expected_latency_ns
    else:
        qps = c.loadgen_server_target_qps or expected.get("server_qps")
        if qps is None:
            raise CaseUserError("LoadGen Server needs loadgen_server_target_qps, or SingleStream listed before it")
        settings.server_target_qps = qps
        settings.server_target_latency_ns = int(c.loadgen_target_latency_ms * 1e6)
        recorded |= {"server_target_qps": qps, "server_target_latency_ns": settings.server_target_latency_ns}
    log_dir = out_dir / "loadgen" / scenario
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
    result = summarise(scenario, read_detail(log_dir / DETAIL_LOG), recorded, log_dir)
    log.info("LoadGen %s: %s, %s samples/s, latency %s ms (%.1f s)", scenario, result.result_validity,
             f"{result.samples_per_s:.4g}" if result.samples_per_s is not None else "-",
             {k: round(v, 3) for k, v in result.latency_ms.items()}, time.perf_counter() - started)
    return result


def require_loadgen() -> None:
    require("mlperf_loadgen", "inference", "loadgen_scenarios")


def run_scenarios(config: InferenceConfig, loader: Any, forward: Forward, sync: Callable[[], None], out_dir: Path
                  ) -> list[LoadgenResult]:
    """LoadGen's scenarios over the engine's forward (the same path the timed pass measured)."""
    require_loadgen()
    samples = collect_samples(loader, MAX_SAMPLES)
    sut = EngineSUT(forward, sync, config.batch_size, samples)
    expected = sut.calibrate()
    results = []
    for scenario in config.loadgen_scenarios:
        result = run_scenario(config, sut, scenario, expected, out_dir)
        if scenario == "SingleStream" and result.latency_ms.get("mean"):
            expected["server_qps"] = 0.5 * 1e3 / result.latency_ms["mean"]
        results.append(result)
    return results
