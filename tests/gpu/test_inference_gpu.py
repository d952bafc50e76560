"""Inference on a real NVIDIA GPU (skipped without one; TensorRT tests also skip without tensorrt).

What only a GPU can show: TensorRT builds an FP16 engine from the exported ONNX, saves it, and the saved
file reloads through exist_compiler_path; its outputs agree with eager FP16 within FP16 tolerance; a corrupt
.plan file is a user error; Inductor runs on CUDA; MFU is taken against the fp16 datasheet peak."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from flagperf.config.job import Job
from flagperf.config.plan import plan_run
from flagperf.entry import run_job
from flagperf.results.schema import RoundResult, read_result

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")]

TINY_RESNET = ["depths=[1, 1]", "hidden_sizes=[16, 32]", "batch_size=8", "synthetic_images=64", "repeat=2"]


def run_case(tmp_path: Path, name: str, *sets: str) -> tuple[int, RoundResult]:
    plan = plan_run(cases=["resnet50-infer"], vendor="nvidia", sets=list(sets), results_dir=tmp_path / "r")
    cp = plan.cases[0]
    job = Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, host="gpu", vendor="nvidia",
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})
    out = tmp_path / name
    out.mkdir()
    code = run_job(job, out)
    return code, read_result(out / "result.json")


def test_tensorrt_fp16_builds_saves_and_reloads(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt")
    code, result = run_case(tmp_path, "build", *TINY_RESNET, "keep_artifacts=true")
    assert code == 0, result.failure
    assert result.inference.artifacts.startswith("kept")
    plan_file = Path(str(result.inference.engine_file))
    assert plan_file.suffix == ".plan" and plan_file.stat().st_size > 0
    core = next(m for m in result.metrics if m.name == "inference_core")
    assert core.mfu_peak_key == "fp16" and core.mfu is not None and 0 < core.mfu < 1
    code, again = run_case(tmp_path, "reload", *TINY_RESNET, "no_validation=true", "exist_onnx_path=foo",
                           f"exist_compiler_path={plan_file}")
    assert code == 0, again.failure
    assert again.inference.steps["compile"].startswith("skipped") and again.inference.steps["inference"] == "ran"


def fp16_resnet_onnx(tmp_path: Path) -> tuple[Any, Any, torch.nn.Module, Path]:
    """The tiny ResNet's case module, config, FP16 model, and its ONNX file exported as step d does for an
    engine with onnx_precision: case (FP16 weights and inputs)."""
    from flagperf.config.cases import load_case

    module = load_case("resnet50-infer").module
    config = module.Config.model_validate(plan_run(cases=["resnet50-infer"], vendor="nvidia", sets=TINY_RESNET,
                                                   results_dir="u").cases[0].config)
    model = module.create_model(config).eval().half()
    onnx = tmp_path / "m.onnx"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)
    try:
        module.export_model(model, config, onnx)
    finally:
        torch.set_default_dtype(previous)
    return module, config, model, onnx


def test_tensorrt_matches_eager_fp16(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt")
    import logging

    from flagperf.inference.engines import EngineEnv, load_engine

    _, config, model, onnx = fp16_resnet_onnx(tmp_path)  # strongly typed FP16, TensorRT 10 and 11
    env = EngineEnv(device=torch.device("cuda"), work_dir=tmp_path, case="t", log=logging.getLogger("t"))
    tensorrt = load_engine("nvidia", "tensorrt").engine_class()
    engine = tensorrt(config, onnx, None, env)
    x = torch.randn(config.batch_size, 3, config.crop, config.crop).half()
    with torch.no_grad():
        expected = model.cuda()(x.cuda()).float().cpu()
    got, foo = engine([x])
    torch.cuda.synchronize()
    assert foo == 0.0 and got[0].dtype == torch.float16
    torch.testing.assert_close(got[0].float().cpu(), expected, rtol=2e-2, atol=2e-2)
    # The saved file reloads (exist_compiler_path) and runs on a batch already on the device.
    assert engine.engine_file is not None
    reloaded = tensorrt(config, None, None, env, engine_path=engine.engine_file)
    again, _ = reloaded([x.cuda()])
    torch.cuda.synchronize()
    torch.testing.assert_close(again[0].float().cpu(), expected, rtol=2e-2, atol=2e-2)


def test_onnxruntime_cuda_matches_eager(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime has no CUDA execution provider (onnxruntime-gpu is not installed)")
    code, result = run_case(tmp_path, "ort", *TINY_RESNET, "compiler=onnxruntime", "fp16=false")
    assert code == 0, result.failure
    names = {m.name for m in result.metrics}
    assert {"inference_core", "inference_compute"} <= names
    # Parity, on the engine's own stream as a round runs it: FP16 file (onnx_precision: case), CUDA provider.
    import logging
    import types

    from flagperf.config.vendors import load_vendor
    from flagperf.inference.engines import EngineEnv, load_engine
    from flagperf.inference.pipeline import InferenceRun

    _, config, model, onnx = fp16_resnet_onnx(tmp_path)
    run = InferenceRun(case_name="t", module=types.ModuleType("t"), config=config, vendor="nvidia",
                       spec=load_vendor("nvidia").spec_table(), device=torch.device("cuda"),
                       shares_host_memory=False, out_dir=tmp_path, artifact_dir=tmp_path)
    x = torch.randn(config.batch_size, 3, config.crop, config.crop).half()
    with torch.no_grad():
        expected = model.cuda()(x.cuda()).float().cpu()
    env = EngineEnv(device=run.device, work_dir=tmp_path, case="t", log=logging.getLogger("t"))
    with run.on_stream():
        engine = load_engine("nvidia", "onnxruntime").engine_class()(config, onnx, None, env)
        got, _ = engine([x.pin_memory()])  # the core path: an asynchronous copy, then ORT on the same stream
        resident, _ = engine([x.cuda(non_blocking=True)])  # the compute path
    torch.cuda.synchronize()
    for out in (got, resident):
        torch.testing.assert_close(out[0].float().cpu(), expected, rtol=2e-2, atol=2e-2)


def test_a_round_runs_on_a_stream_of_its_own_given_to_onnxruntime(tmp_path: Path) -> None:
    """Never the legacy default stream: TensorRT synchronises after each enqueue on it, and ONNX Runtime
    reads its handle 0 as none given."""
    pytest.importorskip("onnxruntime")
    import types

    from flagperf.config.vendors import load_vendor
    from flagperf.inference.onnxrt import provider_options
    from flagperf.inference.pipeline import InferenceRun

    run = InferenceRun(case_name="t", module=types.ModuleType("t"), config=None, vendor="nvidia",  # type: ignore[arg-type]
                       spec=load_vendor("nvidia").spec_table(), device=torch.device("cuda"),
                       shares_host_memory=False, out_dir=tmp_path, artifact_dir=tmp_path)
    with run.on_stream():
        stream = torch.cuda.current_stream()
        assert stream.cuda_stream != 0 and stream == run.stream
        options = provider_options("CUDAExecutionProvider", run.device)
        assert options["user_compute_stream"] == str(stream.cuda_stream)
        trt_options = provider_options("TensorrtExecutionProvider", run.device, fp16=True, cache_dir=tmp_path)
        assert trt_options["trt_fp16_enable"] == "True" and trt_options["trt_engine_cache_path"] == str(tmp_path)
    assert torch.cuda.current_stream().cuda_stream == 0


def test_a_corrupt_plan_file_is_a_user_error(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt")
    bad = tmp_path / "bad.plan"
    bad.write_bytes(b"not an engine")
    code, result = run_case(tmp_path, "bad", *TINY_RESNET, f"exist_compiler_path={bad}")
    assert code == 2 and "exist_compiler_path" in result.failure.message


def test_inductor_on_cuda(tmp_path: Path) -> None:
    code, result = run_case(tmp_path, "inductor", *TINY_RESNET, "compiler=inductor")
    assert code == 0, result.failure
    m = {x.name: x for x in result.metrics}
    assert {"inference_core", "validation_core", "inference_compute", "validation_compute"} <= set(m)
    assert result.inference.steps["export"] == "skipped: the engine compiles the PyTorch model"
    assert "cuda events" in str(m["inference_compute"].note)
    assert m["inference_compute_latency"].p50 > 0 and m["inference_compute"].mfu is not None
