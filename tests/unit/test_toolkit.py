"""Vendor toolkits (flagperf.basespec.toolkit): finding, building, running and reading a vendor program.

The nvidia toolkit (cuBLASLt, nvcc) needs a GPU to run; here its 'unsupported' paths and its output format are
tested, and the build-run-read contract with a small real program of a test vendor's own."""

from __future__ import annotations

import json
import logging
import stat
import textwrap
from pathlib import Path

import pytest

from flagperf.basespec import toolkit
from flagperf.config.job import Job
from flagperf.config.plan import plan_run
from flagperf.entry import run_job
from flagperf.errors import EXIT_UNSUPPORTED, CaseUserError, Unsupported
from flagperf.measure.casekit import CaseContext
from flagperf.measure.timing import TimingPlan
from flagperf.paths import vendor_roots
from flagperf.results.metrics import gemm_ops
from flagperf.results.schema import Peak, SpecTable, read_result

NVIDIA = vendor_roots()[0] / "nvidia"
LOG = logging.getLogger("flagperf.case.test")
# The line cublaslt_gemm prints (vendor_images/nvidia/toolkits/cublaslt_gemm/gemm.cu), with H100-like figures.
RECORDED = ('{"program": "cublaslt_gemm", "precision": "int8", "m": 8192, "n": 8192, "k": 8192, "pattern": '
            '"normal", "fast_accum": 0, "layout": "TN", "device": "NVIDIA H100 80GB HBM3", "compute_capability": '
            '"9.0", "cuda_runtime": 13000, "cublaslt_version": 130002, "algorithms_offered": 8, "workspace_bytes": '
            '67108864, "window": [1700000005.0, 1700000010.1], "chunks": [[400, 0.502], [400, 0.503], [400, 0.501]]}')


def config(**extra: object) -> toolkit.Config:
    return toolkit.Config.model_validate({"provides": "gemm", "precisions": ["bf16", "int8", "fp8"], "m": 256,
                                          "n": 256, "k": 256, "warmup_iters": 1, "min_duration_s": 0.05,
                                          "min_iters": 2, "timeout_s": 60, "max_retries": 0, **extra})


def context(folder: Path | None, **peaks: Peak) -> CaseContext:
    spec = SpecTable(device="test device", peaks=peaks)
    return CaseContext("cpu", spec, TimingPlan(0, 0.05, 2), LOG, shares_host_memory=True, vendor_folder=folder)


def test_nvidia_toolkit_manifest_and_arguments() -> None:
    folder, manifest = toolkit.find_toolkit(NVIDIA, "gemm")
    assert folder.name == "cublaslt_gemm" and (folder / "gemm.cu").is_file()
    assert manifest.requires == ["nvcc"] and "{binary}" in manifest.build
    args = toolkit.program_arguments(config(fp8_format="e5m2", fp8_fast_accum=True), manifest, "fp8")
    assert args[:2] == ["--precision", "fp8e5m2"] and args[-2:] == ["--fast-accum", "1"]
    assert args[args.index("--min-seconds") + 1] == "0.05"


def test_no_compiler_is_unsupported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a host without the CUDA compiler
    folder, manifest = toolkit.find_toolkit(NVIDIA, "gemm")
    with pytest.raises(Unsupported, match="cublaslt_gemm: nvcc not found on PATH"):
        toolkit.build(folder, manifest, cache=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_vendor_without_toolkit_is_unsupported(tmp_path: Path) -> None:
    plan = plan_run(cases=["toolkit-gemm"], sets=["min_duration_s=0.05"], results_dir=tmp_path, run_id="r")
    cp = plan.cases[0]
    job = Job(run_id="r", case="toolkit-gemm", family="base", round=1, host="localhost", vendor="cpu",
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, command="pytest",
              image={"status": "none"})
    assert run_job(job, tmp_path) == EXIT_UNSUPPORTED
    result = read_result(tmp_path / "result.json")
    assert result.status == "unsupported"
    assert result.failure is not None and "vendor cpu has no toolkit providing 'gemm'" in result.failure.message


def test_recorded_output_reads_into_the_schema() -> None:
    data = toolkit.parse_output("cuBLASLt warming up\n" + RECORDED + "\n", "cublaslt_gemm")
    ctx = context(NVIDIA, int8=Peak(value=1979.0, unit="TOPS", source="datasheet"))
    metric = toolkit.to_metric(ctx, config(m=8192, n=8192, k=8192), "int8", data, "cublaslt_gemm")
    assert (metric.name, metric.unit) == ("toolkit_gemm_int8", "TOPS")
    assert metric.value == pytest.approx(gemm_ops(8192, 8192, 8192) * 1200 / 1.506 / 1e12)
    assert metric.ratio == pytest.approx(metric.value / 1979)
    assert metric.window == [1700000005.0, 1700000010.1] and metric.chunks == 3
    assert ctx.measured_seconds == pytest.approx(1.506)
    assert metric.note is not None and "layout TN" in metric.note and "device NVIDIA H100 80GB HBM3" in metric.note


@pytest.mark.parametrize(("text", "match"), [("", "no JSON line"), ('{"chunks": []}', "chunks"),
                                             ('{"chunks": [[1, 0.1]], "window": [2, 1]}', "window")])
def test_bad_output_is_a_crash(text: str, match: str) -> None:
    with pytest.raises(RuntimeError, match=match):
        toolkit.parse_output(text, "prog")


PROGRAM = textwrap.dedent("""\
    #!/usr/bin/env python3
    import json, sys, time
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    if args["--precision"] == "fp8e4m3":
        print("no fp8 kernel on this device", file=sys.stderr)
        sys.exit(3)
    if args["--precision"] == "bad":
        sys.exit(2)
    start = time.time()
    print(json.dumps({"program": "toy", "precision": args["--precision"], "pattern": args["--pattern"],
                      "window": [start, start + 0.2], "chunks": [[10, 0.1], [10, 0.1]]}))
    """)


@pytest.fixture
def toy_vendor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A vendor folder whose gemm toolkit is a Python program 'built' by copying it (a real build command)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = tmp_path / "toy" / "toolkits" / "toy_gemm"
    folder.mkdir(parents=True)
    (folder / "prog.py").write_text(PROGRAM)
    (folder / "prog.py").chmod(0o755)
    (folder / "toolkit.yaml").write_text(json.dumps({
        "name": "toy_gemm", "provides": "gemm", "description": "test", "requires": ["cp"], "sources": ["prog.py"],
        "build": ["cp", "prog.py", "{binary}"], "precisions": {"bf16": "bf16", "fp8": "fp8{fp8_format}"}}))
    return tmp_path / "toy"


def test_build_run_and_read(toy_vendor: Path, tmp_path: Path) -> None:
    tflops = Peak(value=1.0, unit="TFLOPS", source="test")
    ctx = context(toy_vendor, bf16=tflops, fp8=tflops)
    metrics = toolkit.run(config(data_pattern="zeros"), ctx)
    # int8: not in this toolkit (skipped); fp8: the program said unsupported (skipped); bf16 measured.
    assert [m.name for m in metrics] == ["toolkit_gemm_bf16"]
    assert metrics[0].value == pytest.approx(gemm_ops(256, 256, 256) * 20 / 0.2 / 1e12)
    assert "pattern zeros" in (metrics[0].note or "")
    built = list((tmp_path / "cache" / "flagperf" / "toolkits").glob("toy_gemm-*/toy_gemm"))
    assert len(built) == 1 and built[0].stat().st_mode & stat.S_IXUSR
    before = built[0].stat().st_mtime_ns
    toolkit.run(config(precisions=["bf16"]), ctx)
    assert built[0].stat().st_mtime_ns == before  # the same content is not built again


def test_every_precision_refused_is_unsupported(toy_vendor: Path) -> None:
    tflops = Peak(value=1.0, unit="TFLOPS", source="test")
    with pytest.raises(Unsupported, match="fp8: no fp8 kernel on this device"):
        toolkit.run(config(precisions=["fp8"]), context(toy_vendor, fp8=tflops))
    no_fp8 = Peak(value=None, unit="TFLOPS", source="fp8 needs compute capability 8.9", supported=False)
    with pytest.raises(Unsupported, match="none of fp8 on test device"):
        toolkit.run(config(precisions=["fp8"]), context(toy_vendor, fp8=no_fp8))


def test_program_usage_error_is_the_users(toy_vendor: Path) -> None:
    folder, manifest = toolkit.find_toolkit(toy_vendor, "gemm")
    broken = manifest.model_copy(update={"precisions": {"bf16": "bad"}})
    (folder / "toolkit.yaml").write_text(broken.model_dump_json())
    with pytest.raises(CaseUserError, match="refused its arguments"):
        toolkit.run(config(precisions=["bf16"]), context(toy_vendor))
