"""Inference without a Prefect server: FlagPerf's file format and toggles, engines against eager PyTorch,
the real-accuracy case, LoadGen on the CPU, and bad inputs. Models are shrunk through their configurations
so every test runs in seconds on 2 cores; the steps run as plain functions here (see
tests/integration/test_inference_flow.py for the subflows)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import psutil
import pytest
import torch

from flagperf.config.cases import load_case
from flagperf.config.job import Job
from flagperf.config.plan import plan_run
from flagperf.config.vendors import load_vendor
from flagperf.entry import run_job
from flagperf.errors import CaseUserError, ConfigError
from flagperf.inference.config import InferenceConfig, parse_flops, skipped_steps
from flagperf.inference.data import in_main_process
from flagperf.inference.engines import EngineEnv, InferenceEngine, load_engine
from flagperf.measure.casekit import CaseContext
from flagperf.measure.timing import TimingPlan
from flagperf.results.metrics import percentile
from flagperf.results.schema import RoundResult, read_result
from tests.unit.childio import Lines

FLAGPERF_FORMAT = Path(__file__).resolve().parents[1] / "fixtures" / "flagperf_format"
TINY_RESNET = ["depths=[1, 1]", "hidden_sizes=[8, 16]", "flops=1.0e6", "batch_size=4", "synthetic_images=8"]
TINY_VIT = ["hidden_size=32", "num_hidden_layers=1", "num_attention_heads=2", "intermediate_size=64",
            "flops=1.0e6", "batch_size=2", "synthetic_images=4"]
TINY_BERT = ["vocab_size=200", "hidden_size=32", "num_hidden_layers=1", "num_attention_heads=2",
             "intermediate_size=64", "seq_len=16", "flops=1.0e6", "batch_size=4", "synthetic_sequences=8"]
TINY_LLAMA = ["vocab_size=128", "hidden_size=32", "num_hidden_layers=2", "num_attention_heads=4",
              "num_key_value_heads=2", "intermediate_size=64", "prompt_len=8", "new_tokens=4", "flops=1.0e5"]


def run_case(tmp_path: Path, case: str, *sets: str, name: str = "out") -> tuple[int, RoundResult, Path]:
    plan = plan_run(cases=[case], sets=list(sets), results_dir=tmp_path / "results")
    cp = plan.cases[0]
    job = Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, host="localhost", vendor="cpu",
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})
    out = tmp_path / name
    out.mkdir()
    code = run_job(job, out)
    return code, read_result(out / "result.json"), out


@pytest.fixture(autouse=True)
def _work_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exported models and engines go under the host's work root: here, the test's own folder."""
    monkeypatch.setenv("FLAGPERF_WORK_ROOT", str(tmp_path / "work"))


def metrics(result: RoundResult) -> dict[str, float]:
    return {m.name: m.value for m in result.metrics}


def plan_error(*sets: str, case: str = "digits-infer") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        plan_run(cases=[case], sets=list(sets), results_dir="unused")
    return info.value


# FlagPerf's files and the toggles -----------------------------------------------------------------------------

def test_flops_read_as_flagperf_writes_them() -> None:
    assert parse_flops(4.12e9) == 4.12e9
    assert parse_flops("2*512*0.33e9") == pytest.approx(2 * 512 * 0.33e9)
    assert parse_flops(" 2 * 9472 ") == 18944.0
    for bad in ("2*abc", "__import__('os')", "2**10", "-5", True, 0, "1e999*1e999"):
        with pytest.raises(ValueError):
            parse_flops(bad)


def test_flagperf_configurations_load_unchanged(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
                                                ) -> None:
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(FLAGPERF_FORMAT))
    case = load_case("flagperf-format")
    assert case.family == "inference" and "FlagPerf's resnet50 file verbatim" in case.manifest.description
    # The standard case: FlagPerf's file as it is, on the vendor whose engine it names.
    standard = plan_run(cases=["flagperf-format"], vendor="nvidia", results_dir="unused").cases[0]
    assert standard.config["flops"] == 4.12e9 and standard.config["compiler"] == "tensorrt"
    assert standard.config["fp16"] is True and standard.config["exist_onnx_path"] is None
    assert standard.origins["batch_size"].endswith("flagperf-format/configurations.yaml")
    assert standard.origins["image_size"].endswith("flagperf-format/parameters.yaml")
    # The cpu vendor's file overrides it under FlagPerf's rules (each change logged at DEBUG, one INFO summary).
    with caplog.at_level(logging.DEBUG, logger="flagperf.config"):
        cpu = plan_run(cases=["flagperf-format"], vendor="cpu", results_dir="unused").cases[0]
    assert cpu.config["compiler"] == "onnxruntime" and cpu.config["batch_size"] == 4
    assert cpu.vendor_changes["compiler"] == ["tensorrt", "onnxruntime"]
    assert cpu.origins["compiler"].endswith("vendor/cpu_configurations.yaml")
    assert any("compiler: 'tensorrt' -> 'onnxruntime'" in r.getMessage() for r in caplog.records
               if r.levelno == logging.DEBUG)
    (summary,) = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert summary.startswith(f"vendor cpu changes {len(cpu.vendor_changes)} case default(s) in 1 case(s) "
                              f"(flagperf-format: {len(cpu.vendor_changes)})"), summary


def _copy_flagperf_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vendor_yaml: str) -> Path:
    root = tmp_path / "cases"
    shutil.copytree(FLAGPERF_FORMAT, root)
    (root / "inference" / "flagperf-format" / "vendor" / "cpu_configurations.yaml").write_text(vendor_yaml)
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(root))
    return root


@pytest.mark.parametrize(("vendor_yaml", "key", "message"), [
    ("compiler: onnxruntime\nfp16: true\n", "fp16", "same value"),
    ("compiler: onnxruntime\nimage_size: 16\n", "image_size", "parameters are not vendor-overridable"),
    ("compiler: onnxruntime\nflops: 2*x\n", "flops", "product"),
    ("compiler: onnxruntime\nbatch_size: 0\n", "batch_size", "greater than or equal to 1"),
    # FlagPerf's nvidia vendor keys for its TensorRT class: refused with what replaces them, not carried silently
    ("compiler: onnxruntime\ntrt_tmp_path: nvidia_tmp/resnet50.trt\n", "trt_tmp_path", "exist_compiler_path"),
    ("compiler: onnxruntime\nhas_dynamic_axis: false\n", "has_dynamic_axis", "batch axis as symbolic"),
])
def test_bad_vendor_overrides_name_the_file_and_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    vendor_yaml: str, key: str, message: str) -> None:
    _copy_flagperf_case(tmp_path, monkeypatch, vendor_yaml)
    with pytest.raises(ConfigError) as info:
        plan_run(cases=["flagperf-format"], vendor="cpu", results_dir="unused")
    assert info.value.key == key and message in info.value.message
    assert info.value.source.endswith("vendor/cpu_configurations.yaml")


def _run_flagperf_format(tmp_path: Path, name: str) -> tuple[int, RoundResult]:
    plan = plan_run(cases=["flagperf-format"], vendor="cpu", results_dir=tmp_path / "results")
    cp = plan.cases[0]
    job = Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, host="localhost", vendor="cpu",
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})
    out = tmp_path / name
    out.mkdir()
    return run_job(job, out), read_result(out / "result.json")


def test_a_flagperf_key_that_does_nothing_here_is_refused_from_the_command_line() -> None:
    error = plan_error("torchtrt_full_compile=true")
    assert (error.source, error.key) == ("--set", "torchtrt_full_compile")
    assert "FlagPerf's torchtrt_full_compile is not read here" in error.message and "inductor" in error.message


def test_a_vendor_key_for_its_engine_warns_and_is_checked_by_the_engine(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    root = _copy_flagperf_case(tmp_path, monkeypatch, "compiler: onnxruntime\nfp16: false\nbatch_size: 4\n"
                                                      "ort_intra_op_threads: 1\n")
    case = plan_run(cases=["flagperf-format"], vendor="cpu", results_dir="unused").cases[0]
    assert case.vendor_new_keys == ["ort_intra_op_threads"] and case.config["ort_intra_op_threads"] == 1
    code, result = _run_flagperf_format(tmp_path, "good")
    assert code == 0, result.failure
    assert result.inference.steps["inference"] == "ran"
    vendor_file = root / "inference" / "flagperf-format" / "vendor" / "cpu_configurations.yaml"
    vendor_file.write_text("compiler: onnxruntime\nfp16: false\nbatch_size: 4\nort_intra_op_threads: -1\n")
    # Checked by the engine's Options when the run is planned: one line naming the file and key.
    with pytest.raises(ConfigError) as info:
        plan_run(cases=["flagperf-format"], vendor="cpu", results_dir="unused")
    assert str(info.value) == (f"{vendor_file}: ort_intra_op_threads: engine onnxruntime: Input should be greater "
                               "than or equal to 0 (got -1)")
    # And again in the case process (a plan made where the engine's library is missing): a user error.
    job = Job(run_id="r", case="flagperf-format", family="inference", round=1, host="localhost", vendor="cpu",
              config={**case.config, "ort_intra_op_threads": -1}, config_origins=case.origins, run_overrides={},
              image={})
    (tmp_path / "bad").mkdir()
    code = run_job(job, tmp_path / "bad")
    failure = read_result(tmp_path / "bad" / "result.json").failure
    assert code == 2 and "ort_intra_op_threads" in failure.message and "onnxruntime" in failure.message


@pytest.mark.parametrize(("sets", "key", "message"), [
    (["no_validation=true"], "no_validation", "exist_onnx_path must name an ONNX file"),
    (["compiler=null", "no_validation=true", "exist_onnx_path=x.onnx"], "compiler", "nothing would be measured"),
    (["compiler=null", "exist_compiler_path=x.plan"], "exist_compiler_path", "needs a compiler"),
    (["compiler=null", "exist_onnx_path=x.onnx"], "exist_onnx_path", "skips that step"),
    (["exist_onnx_path=/no/such/model.onnx"], "exist_onnx_path", "is not a file"),
    (["exist_compiler_path=/no/such/engine.ort.onnx"], "exist_compiler_path", "is not a file"),
    (["compiler=tensorrt"], "compiler", "unknown compiler 'tensorrt' for vendor cpu"),
    (["compiler=no-such-engine"], "compiler", "engines in vendor_images/cpu/engines/: inductor, onnxruntime"),
    (["compiler=inductor", "no_validation=true", "exist_onnx_path=x.onnx"], "no_validation", "creates none"),
    (["compiler=null", "loadgen_scenarios=[Offline]"], "loadgen_scenarios", "compiler is null"),
    (["loadgen_scenarios=[Offline, Offline]"], "loadgen_scenarios", "more than once"),
    (["loadgen_scenarios=[Burst]"], "loadgen_scenarios.0", "Offline"),
    (["loadgen_scenarios=[Server, SingleStream]"], "loadgen_scenarios", "SingleStream listed before it"),
    (["flops=2*abc"], "flops", "a product such as"),
])
def test_impossible_toggles_fail_before_anything_runs(sets: list[str], key: str, message: str) -> None:
    error = plan_error(*sets)
    assert error.key == key and message in error.message, error
    assert error.source == "--set"  # the layer that set the offending key


def test_an_engine_that_cannot_load_files_refuses_exist_compiler_path(tmp_path: Path) -> None:
    engine = tmp_path / "engine.bin"
    engine.write_bytes(b"x")
    error = plan_error("compiler=inductor", f"exist_compiler_path={engine}")
    assert error.key == "exist_compiler_path" and "cannot load an engine file" in error.message


def test_skipped_steps_follow_flagperf() -> None:
    base = {"batch_size": 1, "flops": 1.0, "fp16": False, "compiler": "onnxruntime", "num_workers": 0, "log_freq": 1,
            "repeat": 1, "no_validation": False, "exist_onnx_path": None, "exist_compiler_path": None}

    def skipped(**changes: object) -> set[str]:
        return set(skipped_steps(InferenceConfig.model_validate({**base, **changes})))

    assert skipped() == set()
    assert skipped(compiler=None) == {"export", "compile", "inference"}
    assert skipped(no_validation=True, exist_onnx_path="m.onnx") == {"validation", "export"}
    assert skipped(exist_onnx_path="m.onnx") == {"export"}
    assert skipped(exist_compiler_path="e.plan") == {"compile"}
    assert skipped(no_validation=True, exist_onnx_path="foo", exist_compiler_path="e") == {"validation", "export",
                                                                                            "compile"}


# The real-accuracy case, engines against eager -----------------------------------------------------------------

def test_digits_accuracy_through_eager_and_onnxruntime_agree(tmp_path: Path) -> None:
    code, result, out = run_case(tmp_path, "digits-infer")
    assert code == 0 and result.status == "success" and result.family == "inference"
    m = {x.name: x for x in result.metrics}
    assert m["validation_top1"].value >= 0.95  # trained by the case itself, on real data
    assert m["inference_top1"].value == m["validation_top1"].value  # same weights, same data, same answers
    report = result.inference
    assert report is not None and report.synthetic_data is False and report.accuracy_note is None
    assert report.runner == "plain functions (the job carries no Prefect context)"
    assert set(report.steps.values()) == {"ran"}
    # Models and engines were made on the host, outside the round folder the controller collects, and removed
    # at the end of the round: nothing is left in the work root.
    artifacts = tmp_path / "work" / "inference-artifacts" / result.run_id / "digits-infer" / "round1" / "attempt1"
    assert Path(str(report.onnx_path)).parent == artifacts and Path(str(report.engine_file)).parent == artifacts
    assert report.artifacts is not None and report.artifacts.startswith("removed at the end of the round")
    assert not list(out.glob("*.onnx")) and not [p for p in (tmp_path / "work").rglob("*") if p.is_file()]
    # FLOPs counted on the configured model: 2 x (64x128 + 128x10) per image, the case file's figure too.
    assert report.flops_per_item == 18944 and report.flops_source.startswith("counted on the configured model")
    # One-time costs and raw latencies.
    assert m["model_load_time"].value > 0 and m["engine_build_time"].value > 0
    raw = json.loads((out / str(report.latencies_file)).read_text())
    for prefix in ("validation", "inference"):
        assert len(raw[prefix]["core_s"]) == 33 and len(raw[prefix]["compute_s"]) == 33
        assert m[f"{prefix}_latency"].p50 == pytest.approx(1e3 * percentile(raw[prefix]["core_s"], 50))
        assert m[f"{prefix}_cold_start_latency"].value == pytest.approx(1e3 * raw[prefix]["cold_start_s"])
        compute, compute_latency = m[f"{prefix}_compute"], m[f"{prefix}_compute_latency"]
        assert compute.iterations == 33 and compute.mfu is not None and "host clock" in str(compute.note)
        assert compute_latency.p50 <= compute_latency.p90 <= compute_latency.p95 <= compute_latency.p99
        assert compute_latency.std is not None
    for prefix in ("validation", "inference"):
        whole, core, latency = m[f"{prefix}_whole"], m[f"{prefix}_core"], m[f"{prefix}_latency"]
        assert core.value > whole.value > 0  # core leaves out loading and evaluation
        assert core.iterations == 3 * 11 and whole.iterations == 3 * 11  # repeat 3 x 11 full batches of 32
        assert core.mfu is not None and core.mfu_peak_key == "fp32" and whole.mfu is None
        fp32 = load_vendor("cpu").spec_table().peaks["fp32"]  # the same table the case process read
        assert fp32.unit == "TFLOPS" and fp32.value
        assert core.mfu == pytest.approx(18944 * core.value / (fp32.value * 1e12))  # flops per image x images/s
        assert latency.unit == "ms" and latency.p50 <= latency.p90 <= latency.p99
        assert core.window is not None and core.window[0] < core.window[1]
    assert result.measured_seconds == pytest.approx(m["validation_core"].measured_seconds
                                                    + m["inference_core"].measured_seconds)
    # Every figure says what it counts where the report shows it (its convention), accuracy against what.
    assert all(x.convention for x in result.metrics), [x.name for x in result.metrics if not x.convention]
    assert m["inference_whole"].convention.startswith("FlagPerf's whole: samples / wall time of the 3 pass(es)")
    assert "attention: not applicable" in m["inference_core"].convention
    assert "copy to the device + forward, synchronised" in m["inference_latency"].convention
    assert "against the data's labels" in m["inference_top1"].convention
    assert "reference: the eager model (validation) scored" in m["inference_top1"].convention


def _engine(name: str, config: InferenceConfig, onnx: Path | None, model: torch.nn.Module | None,
            tmp_path: Path) -> InferenceEngine:
    env = EngineEnv(device=torch.device("cpu"), work_dir=tmp_path, case="t", log=logging.getLogger("t"))
    return load_engine("cpu", name).engine_class()(config, onnx, model, env)


def _case_parts(case: str, *sets: str) -> tuple[ModuleType, InferenceConfig, torch.nn.Module, list[torch.Tensor]]:
    module = load_case(case).module
    config = module.Config.model_validate(plan_run(cases=[case], sets=list(sets), results_dir="u").cases[0].config)
    model = module.create_model(config).eval()
    # One batch in this process: a worker loader's iterator, left to the garbage collector, had its workers
    # terminated later, in another test ("DataLoader worker exited unexpectedly").
    inputs, _ = next(iter(in_main_process(module.build_dataloader(config))))
    return module, config, model, [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)


@pytest.mark.parametrize(("case", "sets"), [("resnet50-infer", TINY_RESNET), ("vit-l-16-infer", TINY_VIT),
                                           ("bert-large-infer", TINY_BERT)])
def test_onnxruntime_matches_eager(tmp_path: Path, case: str, sets: list[str]) -> None:
    module, config, model, inputs = _case_parts(case, *sets)
    onnx = tmp_path / "model.onnx"
    module.export_model(model, config, onnx)
    engine = _engine("onnxruntime", config, onnx, None, tmp_path)
    with torch.no_grad():
        expected = module.model_forward(model, inputs)[0]
    got, foo = module.engine_forward(engine, inputs)
    assert foo == 0.0 and got[0].shape == expected.shape
    torch.testing.assert_close(got[0], expected, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(got[0], torch.zeros_like(got[0]))


def test_llama_engine_decodes_the_same_tokens_as_the_kv_cache(tmp_path: Path) -> None:
    """The engine path (fixed window, no cache) and eager decoding with the KV cache: same greedy tokens."""
    module, config, model, inputs = _case_parts("llama-decode-infer", *TINY_LLAMA)
    onnx = tmp_path / "llama.onnx"
    module.export_model(model, config, onnx)
    engine = _engine("onnxruntime", config, onnx, None, tmp_path)
    with torch.no_grad():
        eager = list(module.model_forward(model, inputs))
    steps, _ = module.engine_forward(engine, inputs)
    compiled = list(steps)
    assert len(eager) == len(compiled) == config.new_tokens + 1  # one yield per token, then the output
    assert torch.equal(eager[-1][0], compiled[-1][0]) and eager[-1][0].shape == (1, config.new_tokens)


def test_an_inductor_round_records_why_it_exported_nothing(tmp_path: Path) -> None:
    from flagperf.inference.config import NO_ONNX

    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not read")  # an exist_onnx_path that an engine reading no ONNX never opens
    code, result, _ = run_case(tmp_path, "digits-infer", "repeat=1", "compiler=inductor", f"exist_onnx_path={junk}")
    assert code == 0, result.failure
    assert result.inference.steps["export"] == f"skipped: {NO_ONNX}" == "skipped: the engine compiles the PyTorch model"
    assert result.inference.steps["compile"] == result.inference.steps["inference"] == "ran"
    assert result.inference.onnx_path is None
    assert {"inference_core", "inference_compute", "inference_compute_latency"} <= {m.name for m in result.metrics}


def test_inductor_matches_eager_and_reports_its_compile_as_non_inference(tmp_path: Path) -> None:
    module, config, model, inputs = _case_parts("digits-infer")
    engine = _engine("inductor", config, None, model, tmp_path)
    with torch.no_grad():
        expected = module.model_forward(model, inputs)[0]
        first, compile_s = engine(inputs)
        again, foo = engine(inputs)
    torch.testing.assert_close(first[0], expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again[0], expected, rtol=1e-5, atol=1e-5)
    assert compile_s > 0 and foo == 0.0


def test_inductor_casts_only_inputs_that_need_it_and_compiles_each_shape_once(tmp_path: Path) -> None:
    module, config, model, inputs = _case_parts("digits-infer")
    config = config.model_copy(update={"fp16": True})
    engine = _engine("inductor", config, None, model.half(), tmp_path)
    halves = [x.half() if x.is_floating_point() else x for x in inputs]
    with torch.no_grad():
        expected = module.model_forward(model, halves)[0]
        cast, compile_s = engine(inputs)  # FP32 batch from a loader: cast by the engine
        resident, again = engine(halves)  # already FP16: the same compiled graph, nothing compiled again
    assert compile_s > 0 and again == 0.0
    assert cast[0].dtype == resident[0].dtype == torch.float16
    torch.testing.assert_close(cast[0], expected, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(resident[0], cast[0])
    assert engine.signatures == {tuple((x.shape, x.dtype, x.device) for x in inputs): False,
                                 tuple((x.shape, x.dtype, x.device) for x in halves): True}


# The other cases, shrunk ---------------------------------------------------------------------------------------

def test_synthetic_inputs_give_throughput_and_no_accuracy(tmp_path: Path) -> None:
    code, result, _ = run_case(tmp_path, "resnet50-infer", *TINY_RESNET)
    assert code == 0, result.failure
    names = metrics(result)
    assert {"validation_core", "inference_core", "inference_latency", "e2e_time"} <= set(names)
    assert not any(name.endswith("top1") for name in names)  # never invented
    assert result.inference.synthetic_data and "synthetic inputs" in result.inference.accuracy_note
    assert result.inference.data.startswith("synthetic: 8 x 3x224x224")
    core = next(m for m in result.metrics if m.name == "inference_core")
    assert core.unit == "images/s" and core.note.endswith("attention: not applicable (the model has none)")


def test_resnet50_reads_an_imagenet_style_folder(tmp_path: Path) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for label, colour in (("blue", 2), ("red", 0)):
        (tmp_path / "val" / label).mkdir(parents=True)
        for i in range(4):
            pixels = rng.integers(0, 40, (40, 48, 3), dtype=np.uint8)
            pixels[..., colour] = 220
            Image.fromarray(pixels).save(tmp_path / "val" / label / f"{i}.png")
    code, result, _ = run_case(tmp_path, "resnet50-infer", *TINY_RESNET, f"data_dir={tmp_path / 'val'}")
    assert code == 0, result.failure
    m = metrics(result)
    assert 0.0 <= m["validation_top1"] <= 1.0 and m["inference_top1"] == pytest.approx(m["validation_top1"])
    assert result.inference.synthetic_data is False and "8 images in 2 classes" in result.inference.data
    # No checkpoint_path: random weights, so the accuracy is chance level, and the result says so.
    assert result.inference.accuracy_note.startswith("random weights (checkpoint_path: null")
    assert "not the model's accuracy" in next(x for x in result.metrics if x.name == "inference_top1").convention


def test_bert_masked_lm_accuracy_on_a_token_file(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.npy"
    np.save(tokens, (np.arange(400) * 7 % 200).astype(np.int64))
    code, result, _ = run_case(tmp_path, "bert-large-infer", *TINY_BERT, f"data_path={tokens}")
    assert code == 0, result.failure
    m = metrics(result)
    assert m["inference_mlm_accuracy"] == pytest.approx(m["validation_mlm_accuracy"], abs=0.02)
    assert next(x for x in result.metrics if x.name == "inference_core").unit == "sequences/s"


def test_bert_runs_sdpa_attention_on_padded_sequences() -> None:
    """A lab's BERT: SDPA attention, and synthetic sequences padded as real batches are (lengths spread between the
    minimum and seq_len, [PAD] after the real tokens, mask 0 there), the same from one build to the next."""
    from flagperf.inference.pipeline import attention_of

    module, config, model, (ids, mask) = _case_parts("bert-large-infer", *TINY_BERT, "synthetic_sequences=64",
                                                     "batch_size=16")
    assert config.attention == "sdpa" and attention_of(model) == "sdpa"
    lengths = mask.sum(dim=1)
    assert (mask == 0).any() and lengths.min() >= config.min_length() == 4 and lengths.max() <= config.seq_len
    assert len(set(lengths.tolist())) > 1  # lengths vary, not one padded length for all
    assert torch.equal(mask, (torch.arange(config.seq_len) < lengths[:, None]).long())  # padding on the right
    assert bool((ids[mask == 0] == module.PAD_ID).all())
    again = next(iter(in_main_process(module.build_dataloader(config))))[0]
    assert torch.equal(again[0], ids) and torch.equal(again[1], mask)  # deterministic, from the seed
    with torch.inference_mode(), torch.profiler.profile() as profile:
        logits = module.model_forward(model, [ids, mask])[0]
    assert any(e.key == "aten::scaled_dot_product_attention" for e in profile.key_averages())
    # The mask is honoured: a padded sequence's real positions come out as the sequence alone would.
    short = int(lengths.argmin())
    alone = module.model_forward(model, [ids[short:short + 1, :lengths[short]], mask[short:short + 1, :lengths[short]]])
    torch.testing.assert_close(logits[short, :lengths[short]], alone[0][0], rtol=1e-4, atol=1e-4)


def test_a_model_that_runs_another_attention_than_configured_is_refused() -> None:
    from flagperf.inference.pipeline import check_attention

    _module, config, model, _inputs = _case_parts("bert-large-infer", *TINY_BERT)
    check_attention(config, model)  # sdpa configured, sdpa built
    with pytest.raises(CaseUserError, match="attention: eager is configured, but create_model built a model that "
                                            "runs sdpa"):
        check_attention(config.model_copy(update={"attention": "eager"}), model)


def test_llama_decoding_reports_tokens_and_time_to_first_token(tmp_path: Path) -> None:
    code, result, _ = run_case(tmp_path, "llama-decode-infer", *TINY_LLAMA)
    assert code == 0, result.failure
    by = {m.name: m for m in result.metrics}
    assert by["inference_core"].unit == "tokens/s" and by["inference_core"].iterations == 4  # 4 prompts
    ttft, latency = by["inference_time_to_first_token"], by["inference_latency"]
    assert 0 < ttft.p50 < latency.p50  # the first token comes before the last
    assert "validation_time_to_first_token" in by
    assert result.inference.accuracy_note == "synthetic inputs: throughput only; no accuracy is reported"
    # Prompts from a token file: real inputs, and still no accuracy (the case has none to give).
    tokens = tmp_path / "tokens.npy"
    np.save(tokens, (np.arange(200) % 128).astype(np.int64))
    code, result, _ = run_case(tmp_path, "llama-decode-infer", *TINY_LLAMA, f"data_path={tokens}", name="file")
    assert code == 0, result.failure
    assert result.inference.synthetic_data is False
    assert result.inference.accuracy_note == "the case has no accuracy metric"
    assert not any("accuracy" in m.name for m in result.metrics)


# LoadGen -------------------------------------------------------------------------------------------------------

def test_loadgen_scenarios_on_the_cpu(tmp_path: Path) -> None:
    """Offline and SingleStream VALID: LoadGen's tests are sized from this machine's own measured rate (run again
    when one ends early), so any machine gets there unless a digits query takes milliseconds (a 2-core CPU
    answers one in well under 1 ms), too few for SingleStream's early-stopping estimate in 0.5 s."""
    import mlperf_loadgen  # noqa: F401  (installed with the test extra: a missing package fails the test)
    code, result, out = run_case(tmp_path, "digits-infer", "repeat=1", "loadgen_min_duration_s=0.5",
                                 "loadgen_min_query_count=16", "loadgen_scenarios=[Offline, SingleStream, Server]")
    assert code == 0, result.failure
    runs = {r.scenario: r for r in result.inference.loadgen}
    assert list(runs) == ["Offline", "SingleStream", "Server"]
    for scenario, run in runs.items():
        assert run.result_validity in ("VALID", "INVALID") and run.valid == (run.result_validity == "VALID")
        assert run.samples_per_s is not None and run.samples_per_s > 0, scenario
        assert run.latency_ms["p50"] <= run.latency_ms["p90"] <= run.latency_ms["p99"], scenario
        assert (out / "loadgen" / scenario / "mlperf_log_summary.txt").is_file()
        assert run.summary["result_validity"] == run.result_validity  # LoadGen's own words, verbatim
    assert runs["Offline"].valid and runs["SingleStream"].valid  # a 2-core CPU meets these easily
    # Server was aimed at half of what SingleStream sustained.
    assert runs["Server"].requested["server_target_qps"] == pytest.approx(
        0.5 * 1e3 / runs["SingleStream"].latency_ms["mean"])
    asked = runs["Server"].requested["server_target_qps"]
    assert runs["Server"].settings["target_qps"] == pytest.approx(asked, rel=1e-4)  # logged to 2 decimals
    # The settings are LoadGen's as it logged them: Offline is one query, whatever min_query_count was asked.
    offline = runs["Offline"]
    assert offline.requested["min_query_count"] == 16 and offline.settings["min_query_count"] == 1
    assert offline.settings["min_duration_ms"] == 500 and offline.settings["scenario"] == "Offline"
    # SingleStream's reported figure: the early-stopping estimate of its p90, beside the plain p90.
    assert runs["SingleStream"].latency_ms["early_stopping_p90"] >= runs["SingleStream"].latency_ms["p90"]
    for scenario, run in runs.items():  # the copy in the round's folder, not a scratch path
        assert run.log_dir == f"loadgen/{scenario}" and (out / run.log_dir / "mlperf_log_detail.txt").is_file()


@pytest.fixture
def one_thread() -> object:
    """digits-infer's torch_threads: 1, as its round sets it (its training step waits on a second thread
    whenever another process holds that core)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _digits_sut(tmp_path: Path, at_least_s: float = 0.0) -> tuple[InferenceConfig, object]:
    """digits-infer's model as LoadGen's system under test; with ``at_least_s``, no query is answered sooner than
    that after it was issued, however fast the machine (a floor by construction, not a measured figure)."""
    from flagperf.inference.loadgen import EngineSUT, collect_samples

    module, config, model, _ = _case_parts("digits-infer", "loadgen_min_duration_s=0.3", "loadgen_min_query_count=8",
                                           "loadgen_scenarios=[Offline]")
    config = config.model_copy(update={"loadgen_max_attempts": 6})
    samples = collect_samples(in_main_process(module.build_dataloader(config)), 64)

    def forward(inputs: list[torch.Tensor]) -> tuple[object, float]:
        answer_at = time.perf_counter() + at_least_s
        outputs = module.model_forward(model, inputs)
        while (left := answer_at - time.perf_counter()) > 0:
            time.sleep(left)  # a lower bound on the answer's time: sleep may overrun, never fall short
        return outputs, 0.0

    return config, EngineSUT(forward, lambda: None, config.batch_size, samples)


def test_an_offline_test_that_ended_early_is_run_again_sized_from_loadgens_rate(tmp_path: Path,
                                                                                one_thread: object) -> None:
    """Told the SUT does a fiftieth of the rate it was just measured at, LoadGen generates too few samples and
    the test ends before min_duration: INVALID. The re-run is sized from the rate LoadGen measured. The rate is
    this machine's own, measured here: the first test ends early unless the SUT ran 40 times slower under
    LoadGen than a moment before."""
    from flagperf.inference.loadgen import MARGIN, run_scenario

    config, sut = _digits_sut(tmp_path)
    with torch.inference_mode():
        first_guess = sut.calibrate(min_seconds=0.2)["samples_per_s"] / 50
        result = run_scenario(config, sut, "Offline", {"samples_per_s": first_guess, "latency_s": 1.0}, tmp_path)
    assert result.attempts >= 2 and result.valid, result.invalid_reason
    assert result.requested["offline_expected_qps"] > first_guess * MARGIN  # not the first, wrong guess
    assert result.settings["target_qps"] == pytest.approx(result.requested["offline_expected_qps"], rel=1e-4)


def test_a_server_test_that_missed_its_latency_bound_is_run_again_at_a_lower_qps(tmp_path: Path,
                                                                                  one_thread: object) -> None:
    """A SUT that answers no query sooner than 10 ms after it was issued, held to a 2 ms latency bound, misses it
    on any machine: a target QPS the case derived is lowered and run again until the attempts are spent, a
    target the user gave is their test, reported INVALID as it is."""
    from flagperf.inference.loadgen import SERVER_BACKOFF, run_scenario

    config, sut = _digits_sut(tmp_path, at_least_s=0.010)
    config = config.model_copy(update={"loadgen_target_latency_ms": 2.0, "loadgen_max_attempts": 3})
    target = 200.0  # twice what a 10 ms SUT completes: a short test, whose queries all miss the bound
    expected = {"samples_per_s": 1.0, "latency_s": 1.0, "server_qps": target}
    with torch.inference_mode():
        derived = run_scenario(config, sut, "Server", expected, tmp_path / "derived")
        given = run_scenario(config.model_copy(update={"loadgen_server_target_qps": target}), sut, "Server",
                             expected, tmp_path / "given")
    assert not given.valid and given.attempts == 1 and given.summary["result_perf_constraints_met"] is False
    assert given.invalid_reason.startswith("not met: perf constraints")
    assert given.latency_ms["min"] >= 10.0 and given.requested["server_target_qps"] == target
    assert derived.attempts == 3 and not derived.valid  # lowered twice, and missed at every target
    assert derived.summary["result_perf_constraints_met"] is False and derived.latency_ms["min"] >= 10.0
    assert derived.requested["server_target_qps"] <= SERVER_BACKOFF ** 2 * target
    assert derived.settings["target_qps"] == pytest.approx(derived.requested["server_target_qps"], rel=1e-4)


def test_an_invalid_scenario_is_a_warning_beside_its_figure() -> None:
    """LoadGen's INVALID verdict reaches the report: the figure is kept, with LoadGen's reasons beside it."""
    import types

    from flagperf.inference.loadgen import summarise
    from flagperf.inference.pipeline import InferenceRun, _loadgen_metrics

    detail = {"result_validity": "INVALID", "result_perf_constraints_met": False, "result_min_duration_met": True,
              "result_invalid_reason": "Reduce target QPS to improve latency.",
              "result_completed_samples_per_sec": 321.0, "result_99.00_percentile_latency_ns": 4e6}
    result = summarise("Server", detail, {"server_target_qps": 360.0}, "loadgen/Server", attempts=3)
    assert not result.valid and result.samples_per_s == 321.0 and result.latency_ms["p99"] == 4.0
    assert result.invalid_reason == "not met: perf constraints; Reduce target QPS to improve latency"
    run = InferenceRun(case_name="c", module=types.ModuleType("c"), config=_config(), vendor="cpu",
                       spec=load_vendor("cpu").spec_table(), device=torch.device("cpu"), shares_host_memory=True,
                       out_dir=Path("o"), artifact_dir=Path("a"), loadgen=[result])
    (metric,) = _loadgen_metrics(run)
    assert metric.name == "loadgen_server" and metric.value == 321.0
    assert metric.warning == ("LoadGen says INVALID after 3 attempt(s): not met: perf constraints; Reduce target "
                              "QPS to improve latency; not a valid MLPerf figure")


def test_a_user_conf_is_read_by_loadgen(tmp_path: Path, one_thread: object) -> None:
    from flagperf.inference.loadgen import run_scenario

    user_conf = tmp_path / "user.conf"
    user_conf.write_text("*.Offline.min_duration = 700\n*.Offline.min_query_count = 1\n*.Offline.target_qps = 2000\n")
    config, sut = _digits_sut(tmp_path)
    config = config.model_copy(update={"loadgen_user_conf": str(user_conf)})
    with torch.inference_mode():
        result = run_scenario(config, sut, "Offline", {"samples_per_s": 5000.0, "latency_s": 1e-3}, tmp_path,
                              "digits")
    assert result.settings["min_duration_ms"] == 700  # as LoadGen logged it: the file won over the case
    assert result.requested["loadgen_user_conf"] == str(user_conf)


# Bad inputs at run time ----------------------------------------------------------------------------------------

def test_a_corrupt_engine_file_is_a_user_error_naming_it(tmp_path: Path) -> None:
    engine = tmp_path / "broken.ort.onnx"
    engine.write_bytes(b"this is not a model")
    code, result, _ = run_case(tmp_path, "digits-infer", "repeat=1", f"exist_compiler_path={engine}")
    assert code == 2 and result.status == "failed" and result.failure.kind == "user"
    assert "exist_compiler_path" in result.failure.message and str(engine) in result.failure.message
    assert "onnxruntime" in result.failure.message


def test_a_corrupt_onnx_file_is_refused_when_compiled(tmp_path: Path) -> None:
    onnx = tmp_path / "broken.onnx"
    onnx.write_bytes(b"\x00\x01 not onnx")
    code, result, _ = run_case(tmp_path, "digits-infer", "repeat=1", "no_validation=true", f"exist_onnx_path={onnx}")
    assert code == 2 and result.failure.kind == "user"
    assert f"exist_onnx_path: {onnx} cannot be loaded by engine onnxruntime" in result.failure.message
    assert result.failure.message.startswith("--set: ")  # the layer that named the file


def test_a_missing_engine_library_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine_dir = tmp_path / "vendors" / "cpu" / "engines" / "fancyrt"
    engine_dir.mkdir(parents=True)
    (engine_dir / "engine.yaml").write_text(
        "name: fancyrt\ndescription: an engine whose library is not installed\nfile: engine.py\n"
        "requires:\n  - {import: fancyrt_not_installed, pip: fancyrt==1.2.3}\n")
    (engine_dir / "engine.py").write_text("import fancyrt_not_installed\n")
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(tmp_path / "vendors"))
    code, result, _ = run_case(tmp_path, "digits-infer", "compiler=fancyrt")
    assert code == 2 and result.failure.kind == "user"
    assert "fancyrt==1.2.3" in result.failure.message and "engine fancyrt" in result.failure.message
    assert result.inference is None  # it stopped in step a, before any data or model was touched
    with pytest.raises(CaseUserError, match=r"fancyrt==1\.2\.3"):
        load_engine("cpu", "fancyrt").engine_class()


INFERENCE_CASES = ["digits-infer", "resnet50-infer", "vit-l-16-infer", "bert-large-infer", "llama-decode-infer"]


@pytest.mark.parametrize("vendor", ["cpu", "nvidia"])
def test_every_inference_case_plans_on_every_vendor(vendor: str) -> None:
    plan = plan_run(cases=INFERENCE_CASES, vendor=vendor, results_dir="unused")
    compilers = {c.name: c.config["compiler"] for c in plan.cases}
    if vendor == "nvidia":  # FlagPerf's standard case: TensorRT in FP16
        assert set(compilers.values()) == {"tensorrt"}
        assert all(c.config["fp16"] for c in plan.cases if c.name != "digits-infer")  # digits compares accuracy
    else:
        assert set(compilers.values()) == {"onnxruntime"}
        assert not any(c.config["fp16"] for c in plan.cases)


def test_every_engine_declares_the_config_keys_its_options_read() -> None:
    """engine.yaml's options list the engine's Options fields (a plan reads the list without importing the
    engine, whose library may be missing there): the class itself, or its source for TensorRT, which is not
    installed here."""
    import ast

    from flagperf.config.engines import INFERENCE_ENGINES, engine_folders

    for vendor in ("cpu", "nvidia"):
        for name in engine_folders(vendor, INFERENCE_ENGINES):
            engine = load_engine(vendor, name)
            if engine.manifest.file is None:
                fields = set(engine.engine_class().Options.model_fields)
            else:
                tree = ast.parse((engine.folder / engine.manifest.file).read_text())
                options = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Options")
                fields = {n.target.id for n in options.body
                          if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
            assert fields and set(engine.manifest.options) == fields, (vendor, name)


def test_an_engines_option_is_set_from_the_command_line_for_the_compiler_that_reads_it(tmp_path: Path) -> None:
    plan = plan_run(cases=["resnet50-infer"], sets=["compiler=inductor", "inductor_mode=reduce-overhead",
                                                    "inductor_channels_last=true"], results_dir="unused")
    config = plan.cases[0].config
    assert config["inductor_mode"] == "reduce-overhead" and config["inductor_channels_last"] is True
    assert plan.cases[0].origins["inductor_mode"] == "--set"
    module, _, model, _ = _case_parts("resnet50-infer", *TINY_RESNET)
    engine = _engine("inductor", module.Config.model_validate(config), None, model, tmp_path)
    assert engine.options.inductor_mode == "reduce-overhead" and engine.channels_last and not engine.cuda_graphs
    # The default compiler on the CPU is onnxruntime, which does not read it; an unknown key is still refused.
    assert str(plan_error("inductor_mode=max-autotune", case="resnet50-infer")) == (
        "--set: inductor_mode: an option of engine inductor, not read by compiler onnxruntime")
    assert "no selected case has this key" in str(plan_error("inductor_mod=default", case="resnet50-infer"))
    with pytest.raises(CaseUserError, match="inductor_mode"):
        _engine("inductor", module.Config.model_validate({**config, "inductor_mode": "fastest"}), None, model,
                tmp_path)
    # A value the engine's Options refuse is refused when the run is planned, not after validation ran.
    assert str(plan_error("compiler=inductor", "inductor_mode=fastest", case="resnet50-infer")).startswith(
        "--set: inductor_mode: engine inductor: Input should be 'default', 'reduce-overhead'")


def test_nvidia_engines_share_inductor_and_tensorrt_names_its_package() -> None:
    import ast
    import importlib.util

    tensorrt = load_engine("nvidia", "tensorrt")
    assert tensorrt.manifest.needs_onnx and tensorrt.manifest.loads_engine_files
    ast.parse((tensorrt.folder / "engine.py").read_text())  # written for a GPU host; at least well-formed here
    if importlib.util.find_spec("tensorrt") is None:
        # Not installed here (a GPU host's package): the tests in tests/gpu build, save, reload and run it.
        with pytest.raises(CaseUserError, match=r"tensorrt>=10,<12 \(the 10.x or 11.x Python API\)"):
            tensorrt.engine_class()
    # One Inductor and one ONNX Runtime implementation, pointed at by both vendors' folders.
    assert load_engine("nvidia", "inductor").engine_class() is load_engine("cpu", "inductor").engine_class()
    assert load_engine("nvidia", "onnxruntime").engine_class() is load_engine("cpu", "onnxruntime").engine_class()


def test_a_generators_non_inference_time_is_read_once_it_is_consumed() -> None:
    """A decoding forward yields per token; what its engine spent outside inference (a compile on the first
    call) is only known after the last token, so it comes as a callable and is still left out of core."""
    from flagperf.inference.measure import timed_pass

    config = InferenceConfig(batch_size=2, flops=1.0, fp16=False, compiler="x", num_workers=0, log_freq=100,
                             repeat=1, no_validation=False, exist_onnx_path=None, exist_compiler_path=None,
                             warmup_batches=0)
    batches = [(torch.zeros(2, 3), None)] * 3

    def forward(inputs: list[torch.Tensor]):
        spent = [0.0]

        def decode():
            for _ in range(2):
                time.sleep(0.05)  # "compiling": not inference
                spent[0] += 0.05
                yield [inputs[0]]

        return decode(), lambda: spent[0]

    stats = timed_pass("inference", batches, forward, None, lambda: None, config, logging.getLogger("t"))
    assert stats.batches == 3 and stats.non_inference_seconds == pytest.approx(0.3)


def test_files_on_remote_hosts_are_checked_where_the_case_runs() -> None:
    """exist_onnx_path names a file on the host that runs the case: with SSH hosts the controller cannot see
    it, so the plan leaves the check to step (a) on the host; with local hosts it is refused up front."""
    remote = [{"name": "h1", "address": "10.1.2.3", "transport": "ssh"}]
    plan = plan_run(cases=["digits-infer"], sets=["exist_onnx_path=/data/on/the/host/model.onnx"],
                    results_dir="unused", hosts=remote)
    assert plan.cases[0].config["exist_onnx_path"] == "/data/on/the/host/model.onnx"
    with pytest.raises(ConfigError, match="is not a file"):
        plan_run(cases=["digits-infer"], sets=["exist_onnx_path=/data/on/the/host/model.onnx"],
                 results_dir="unused", hosts=[{"name": "localhost", "transport": "local"}])


# Timing with exact answers: a fake device clock -----------------------------------------------------------------

class FakeDevice:
    """A device whose forwards take programmed times: marks read its clock, as device events would."""

    name = "fake device events"

    def __init__(self, durations: list[float]) -> None:
        self.now, self.durations, self.calls = 0.0, durations, 0

    def mark(self) -> float:
        return self.now

    def seconds(self, start: float, end: float) -> float:
        return end - start

    def forward(self, inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], float]:
        self.now += self.durations[self.calls % len(self.durations)]
        self.calls += 1
        return inputs, 0.0


def _config(**over: object) -> InferenceConfig:
    keys = dict(batch_size=2, flops=1.0e6, fp16=False, compiler="x", num_workers=0, log_freq=100, repeat=1,
                no_validation=False, exist_onnx_path=None, exist_compiler_path=None, warmup_batches=0)
    return InferenceConfig(**(keys | over))


def _ctx() -> CaseContext:
    return CaseContext("cpu", load_vendor("cpu").spec_table(), TimingPlan(0, 1.0, 1), logging.getLogger("t"),
                       shares_host_memory=True)


def test_compute_metrics_on_a_fake_device_clock_are_exact() -> None:
    from flagperf.inference.measure import compute_metrics, compute_pass

    device = FakeDevice([0.010, 0.020, 0.030, 0.040])
    batches = [[torch.zeros(2, 3)], [torch.ones(2, 3)]]
    # The warm-up forward and the three that time the host's issuing run first (and advance the clock), but
    # fall before the first mark.
    device.durations = [5.0, 1.0, 1.0, 1.0, 0.010, 0.020, 0.030, 0.040]
    stats = compute_pass("inference", batches, device.forward, device, lambda: None, iterations=4, warmup=1)
    assert stats.seconds == pytest.approx([0.010, 0.020, 0.030, 0.040]) and stats.clock == "fake device events"
    throughput, latency = compute_metrics(stats, _config(), _ctx(), flops_per_item=1.0e6)
    assert throughput.name == "inference_compute" and throughput.value == pytest.approx(8 / 0.1)  # 4 x 2 items
    assert throughput.p50 == pytest.approx((100 + 200 / 3) / 2)  # median of 200, 100, 66.7, 50 items/s
    peak = load_vendor("cpu").spec_table().peaks["fp32"]
    assert throughput.mfu == pytest.approx(1.0e6 * 80 / (peak.value * 1e12))
    assert latency.value == pytest.approx(25.0) and latency.p50 == pytest.approx(25.0)
    assert latency.p90 == pytest.approx(37.0) and latency.p95 == pytest.approx(38.5)  # linear interpolation
    assert latency.p99 == pytest.approx(39.7) and latency.std == pytest.approx(12.909944487358056)
    assert throughput.warning is None  # the headline is within the chunks' spread


def test_a_compute_figure_the_host_cannot_feed_is_flagged_host_bound() -> None:
    """Issuing one forward onto an idle device (the last warm-up) is timed by the host: when that takes about
    as long as the device's median forward, the device waited for the host and the figure says so."""
    from flagperf.inference.measure import compute_metrics, compute_pass
    from flagperf.measure.device import HostClock

    def run(host_cost: float, clock: object | None = None, decoding: bool = False) -> object:
        device, host = FakeDevice([0.010]), [0.0]

        def forward(inputs: list[torch.Tensor]) -> tuple[object, float]:
            host[0] += host_cost + 0.5  # half a second of it the engine's non-inference work (a compile)
            outputs, _ = device.forward(inputs)
            return (iter([outputs]) if decoding else outputs), 0.5

        return compute_pass("inference", [[torch.zeros(2, 3)]], forward, clock or device, lambda: None,
                            iterations=5, warmup=2, now=lambda: host[0])

    fed = run(0.001)
    assert fed.issue_seconds == pytest.approx(0.001) and fed.host_bound() is None
    throughput, _ = compute_metrics(fed, _config(), _ctx())
    assert throughput.warning is None and "issuing one forward takes the host 1 ms" in str(throughput.note)
    starved = run(0.0095)
    assert starved.issue_seconds == pytest.approx(0.0095)
    throughput, _ = compute_metrics(starved, _config(), _ctx())
    assert str(throughput.warning).startswith("host-bound: issuing one forward takes the host 9.5 ms, running it "
                                              "takes the device 10 ms (median)")
    assert run(0.05, clock=HostClock()).issue_seconds is None  # the host clock has no device time to compare
    assert run(0.05, decoding=True).issue_seconds is None  # a decoding loop waits for its tokens


def test_a_headline_far_from_its_median_is_flagged_and_the_collector_is_paused() -> None:
    """Nine 1 ms batches and one of 91 ms: the total says 100 ms for 10 batches, a typical batch took 1 ms."""
    import gc

    from flagperf.inference.measure import pass_metrics, timed_pass

    clock = FakeDevice([0.001] * 9 + [0.091])
    collector: list[bool] = []

    def forward(inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], float]:
        collector.append(gc.isenabled())
        return clock.forward(inputs)

    batches = [(torch.zeros(2, 3), None)] * 10
    stats = timed_pass("validation", batches, forward, None, lambda: None, _config(), logging.getLogger("t"),
                       now=clock.mark)
    assert stats.core_seconds == pytest.approx([0.001] * 9 + [0.091]) and collector == [False] * 10
    assert gc.isenabled()  # restored after the timed region
    m = {x.name: x for x in pass_metrics(stats, _config(), _ctx(), synthetic=True, accuracy_name=None)}
    assert m["validation_core"].value == pytest.approx(20 / 0.1) and m["validation_core"].p50 == pytest.approx(2000)
    assert "differ by 90%" in str(m["validation_core"].warning)
    assert m["validation_latency"].value == pytest.approx(10.0) and m["validation_latency"].p50 == pytest.approx(1.0)
    # The mean latency is that same total: 10 ms against a median of 1 ms.
    assert str(m["validation_latency"].warning).startswith("mean (ms) 10 and median 1 differ by 900%")
    even = FakeDevice([0.001])
    steady = timed_pass("validation", batches[:5], even.forward, None, lambda: None, _config(),
                        logging.getLogger("t"), now=even.mark)
    assert all(x.warning is None for x in pass_metrics(steady, _config(), _ctx(), synthetic=True, accuracy_name=None))


def test_an_mfu_above_100_percent_is_an_error_in_the_report() -> None:
    from flagperf.results.summary import mfu_cell

    assert mfu_cell(2.998).startswith("**error**: 299.8%") and mfu_cell(0.5) == "50.0%"


def test_flops_follow_the_models_shape(tmp_path: Path) -> None:
    """bert-large-infer --set seq_len=32 kept the case file's flops for 512 tokens (MFU 300 %); the count
    follows the configured shape: every matmul of one layer, attention included, and the MLM head."""
    def bert(seq: int, hidden: int = 32, inter: int = 64, vocab: int = 200) -> int:
        layer = 4 * 2 * seq * hidden * hidden + 2 * 2 * seq * seq * hidden + 2 * 2 * seq * hidden * inter
        return layer + 2 * seq * hidden * hidden + 2 * seq * hidden * vocab

    for seq in (16, 32):
        sets = [s for s in TINY_BERT if not s.startswith("seq_len")] + [f"seq_len={seq}", "repeat=1"]
        code, result, _ = run_case(tmp_path, "bert-large-infer", *sets, name=f"seq{seq}")
        assert code == 0, result.failure
        assert result.inference.flops_per_item == bert(seq) and result.inference.flops_configured == 1.0e6
        core = next(m for m in result.metrics if m.name == "inference_core")
        # What runs is stated: the attention, and that padded positions are counted (they are computed).
        assert core.note.endswith("attention: sdpa (transformers attn_implementation)")
        assert "attention: sdpa" in core.convention  # where the report shows it
        assert core.convention.endswith(f"; MFU = {bert(seq):.4g} FLOP per sequence (all {seq} positions of a "
                                          "sequence, padded positions included: they are computed (masked out of "
                                          "attention), not skipped) x sequences/s / fp32 peak")
        assert "attention: sdpa" in next(m for m in result.metrics if m.name == "validation_compute").note
        assert core.mfu == pytest.approx(bert(seq) * core.value / (load_vendor("cpu").spec_table().peaks["fp32"].value
                                                                   * 1e12))


def test_fused_attention_counts_as_the_matmuls_it_replaces() -> None:
    """SDPA's fused kernel (the CPU's too, which torch's counter has no formula for) counts what the eager
    matmul-softmax-matmul counts, grouped key/value heads included."""
    from torch.nn.functional import scaled_dot_product_attention
    from torch.utils.flop_counter import FlopCounterMode

    from flagperf.inference.pipeline import attention_flop_formulas

    q, k, v = torch.randn(2, 4, 16, 8), torch.randn(2, 2, 16, 8), torch.randn(2, 2, 16, 8)
    mask = torch.ones(2, 1, 16, 16, dtype=torch.bool).tril()

    def count(attention: object) -> int:
        counter = FlopCounterMode(display=False, custom_mapping=attention_flop_formulas())
        with torch.inference_mode(), counter:
            attention()  # type: ignore[operator]
        return counter.get_total_flops()

    def eager() -> torch.Tensor:
        keys, values = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        scores = (q @ keys.transpose(-1, -2)).masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return scores @ values

    expected = 2 * (2 * 4 * 16 * 16 * 8) * 2  # two matmuls of batch x heads x 16 x 16 x 8, 2 FLOPs each
    assert count(eager) == expected
    assert count(lambda: scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)) == expected


def test_pss_counts_forked_workers_shared_pages_once() -> None:
    from flagperf.monitoring.system import process_tree_memory, process_tree_rss

    held = 64 * 2**20
    script = ("import os, sys, time\n"
              f"buf = bytearray({held})\n"
              "for i in range(0, len(buf), 4096): buf[i] = 1\n"  # touched: resident, shared after fork
              "kids = [os.fork() for _ in range(2)]\n"  # first fork: 2 children; the second: 4 processes in all
              "sys.stdout.write('ready\\n'); sys.stdout.flush()\n"
              "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        lines = Lines(proc.stdout)  # each line within 120 s, or the test fails with what it said
        assert [lines.next() for _ in range(4)] == ["ready\n"] * 4  # every process has forked
        rss = process_tree_rss(proc.pid)
        memory = process_tree_memory(proc.pid)
        pss, uss = memory["case_pss_bytes"], memory["case_uss_bytes"]
        assert rss is not None and pss is not None and uss is not None
        assert rss > 4 * held  # four processes, each counting the shared buffer
        assert held <= pss < rss - 2 * held  # the buffer counted about once
        assert uss < pss
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait(timeout=60)


def test_artifacts_are_kept_when_asked(tmp_path: Path) -> None:
    code, result, _ = run_case(tmp_path, "digits-infer", "repeat=1", "keep_artifacts=true")
    assert code == 0, result.failure
    assert result.inference.artifacts.startswith("kept in") and Path(str(result.inference.engine_file)).is_file()


def test_an_engine_that_reads_no_onnx_skips_the_export() -> None:
    from flagperf.inference.config import NO_ONNX

    config = _config()
    assert skipped_steps(config, engine_reads_onnx=False) == {"export": NO_ONNX}
    given = _config(exist_onnx_path="m.onnx")
    assert skipped_steps(given, engine_reads_onnx=False) == {"export": NO_ONNX}  # the file is not read either
    assert skipped_steps(given) == {"export": "exist_onnx_path: m.onnx"}
    assert skipped_steps(config) == {}
    assert load_engine("cpu", "inductor").manifest.needs_onnx is False
    assert load_engine("nvidia", "tensorrt").manifest.onnx_precision == "case"
    assert load_engine("nvidia", "tensorrt").manifest.input_dtype(_config(fp16=True)) == torch.float16
    assert load_engine("cpu", "onnxruntime").manifest.input_dtype(_config(fp16=True)) == torch.float32


def test_an_fp16_case_is_reported_in_the_precision_its_engine_runs() -> None:
    """An engine that reads an FP32 ONNX file (ONNX Runtime on the CPU) runs an FP16 case in FP32: its figures
    are FP32 ones, and MFU is taken against the FP32 peak. On NVIDIA, ONNX Runtime and TensorRT get the file
    in the case's precision."""
    import types

    from flagperf.inference.pipeline import InferenceRun, engine_precision

    def run_for(vendor: str, engine: str, fp16: bool) -> str:
        run = InferenceRun(case_name="c", module=types.ModuleType("c"), config=_config(fp16=fp16, compiler=engine),
                           vendor=vendor, spec=load_vendor("cpu").spec_table(), device=torch.device("cpu"),
                           shares_host_memory=True, out_dir=Path("o"), artifact_dir=Path("a"))
        run.engine_def = load_engine(vendor, engine)
        return engine_precision(run)

    assert run_for("cpu", "onnxruntime", fp16=True) == "fp32"
    assert run_for("nvidia", "onnxruntime", fp16=True) == "fp16"
    assert run_for("nvidia", "tensorrt", fp16=True) == "fp16"
    assert run_for("cpu", "inductor", fp16=True) == "fp16"
    assert run_for("nvidia", "onnxruntime", fp16=False) == "fp32"
    assert load_engine("nvidia", "onnxruntime").manifest.input_dtype(_config(fp16=True)) == torch.float16


def test_batches_are_made_in_the_passes_dtype_by_the_workers() -> None:
    from torch.utils.data import DataLoader

    from flagperf.inference.data import makes_batches_once, with_data_path

    images = [(torch.randn(3, 4, 4), i) for i in range(8)]  # a data set that is not synthetic
    base = DataLoader(images, batch_size=4, drop_last=True, num_workers=1)
    assert not makes_batches_once(base)
    half = with_data_path(base, torch.device("cpu"), torch.float16)
    # Not iterated: its worker's batch is what torch's default collate makes from items cast to FP16 (tested
    # below); iterating a worker loader here lets torch's SIGCHLD handler report another test's dead worker.
    assert isinstance(half, DataLoader) and half.num_workers == 1 and half.prefetch_factor == 2
    assert half.dataset is base.dataset and not half.pin_memory  # pinned only for an accelerator
    assert with_data_path(base, torch.device("cuda"), torch.float16).pin_memory  # not iterated: no CUDA here
    inputs, labels = half.collate_fn(images[:4])
    assert inputs.dtype == torch.float16 and labels.tolist() == [0, 1, 2, 3]
    assert torch.equal(inputs, torch.stack([x for x, _ in images[:4]]).half())


@pytest.mark.parametrize(("batch_size", "distinct"), [(4, 2), (16, 1), (6, 4), (12, 2)])
def test_a_synthetic_data_sets_batches_are_made_once_and_come_in_the_loaders_order(
        batch_size: int, distinct: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A synthetic data set repeats its few distinct items: its batches are made once per pass, in the pass's
    dtype, as views of one block of pool + batch - 1 items, and handed out in the order and number the case's
    loader gives, with no item made again and no worker."""
    from torch.utils.data import DataLoader

    from flagperf.inference.data import SyntheticBatches, SyntheticDataset, loader, with_data_path

    dataset = SyntheticDataset(96, lambda g: torch.randn(3, generator=g), "3 random floats")
    dataset.pool = dataset.pool[:8]  # 8 distinct items: batch k and k + 8 / gcd(batch_size, 8) are equal
    base = loader(dataset, batch_size, num_workers=2)
    expected = list(DataLoader(dataset, batch_size=batch_size, drop_last=True))
    ring = with_data_path(base, torch.device("cpu"), torch.float16)
    assert isinstance(ring, SyntheticBatches) and not ring.pinned and len(ring.ring) == distinct
    assert ring.block[0].shape == (8 + batch_size - 1, 3)  # every batch is a view of this one block
    assert in_main_process(ring) is ring
    made: list[int] = []
    monkeypatch.setattr(SyntheticDataset, "__getitem__", lambda self, i: made.append(i) or (self.pool[0], -1))
    for epoch in range(2):
        got = list(ring)
        assert len(got) == len(ring) == len(base) == 96 // batch_size, epoch
        for (inputs, labels), (want, want_labels) in zip(got, expected, strict=True):
            assert inputs.dtype == torch.float16 and torch.equal(inputs, want.half())
            assert inputs.untyped_storage().data_ptr() == ring.block[0].untyped_storage().data_ptr()
            assert torch.equal(labels, want_labels)
    assert made == []  # nothing was made again while the batches were handed out
    shuffled = DataLoader(dataset, batch_size=4, shuffle=True, drop_last=True)
    assert isinstance(with_data_path(shuffled, torch.device("cpu"), torch.float16), DataLoader)  # order kept
    own_collate = DataLoader(dataset, batch_size=4, drop_last=True, collate_fn=lambda items: items)
    assert isinstance(with_data_path(own_collate, torch.device("cpu"), torch.float16), DataLoader)


def test_an_fp16_round_on_an_fp32_onnx_engine_reports_each_pass_in_its_precision(tmp_path: Path) -> None:
    """ONNX Runtime on the CPU reads an FP32 ONNX file: in an FP16 case, validation (the model in FP16) and
    inference (the engine in FP32) are each reported, and their MFU taken, in the precision that ran."""
    code, result, _ = run_case(tmp_path, "resnet50-infer", *TINY_RESNET, "fp16=true", "compiler=onnxruntime")
    assert code == 0, result.failure
    m = {x.name: x for x in result.metrics}
    assert m["validation_core"].mfu_peak_key == m["validation_compute"].mfu_peak_key == "fp16"
    assert m["inference_core"].mfu_peak_key == m["inference_compute"].mfu_peak_key == "fp32"
    assert m["inference_core"].mfu is not None
    assert str(result.inference.data_path).startswith("synthetic: each pass's batches made once")


def test_restarting_a_loader_the_warm_up_left_mid_epoch_is_not_timed() -> None:
    """A persistent-worker loader drains the batches its workers prefetched when a new epoch starts: for the
    first timed epoch that leftover of the warm-up falls before the clock starts; later epochs' starts are
    the pass's own data loading, as in FlagPerf."""
    from flagperf.inference.measure import timed_pass

    clock = [0.0]

    class RestartingLoader:
        def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            clock[0] += 1.0  # the drain and restart of an epoch
            return iter([(torch.zeros(2, 3), torch.zeros(2)) for _ in range(3)])

    def forward(inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], float]:
        clock[0] += 0.01
        return inputs, 0.0

    stats = timed_pass("inference", RestartingLoader(), forward, None, lambda: None,
                       _config(warmup_batches=1, repeat=2), logging.getLogger("t"), now=lambda: clock[0])
    assert stats.batches == 6 and stats.core_seconds == pytest.approx([0.01] * 6)
    assert stats.wall_seconds == pytest.approx(6 * 0.01 + 1.0)  # the second epoch's start only


def test_items_are_cast_before_torchs_collate_stacks_them_and_after_a_cases_own() -> None:
    """With torch's default collate the batch is written once, in the pass's dtype (no FP32 batch made and
    then halved); a case's own collate gets its items as the dataset made them, and its batch is cast after."""
    from torch.utils.data import default_collate

    from flagperf.inference.data import CastInputs

    items = [(torch.randn(3, 4), 1), (torch.randn(3, 4), 2)]
    inputs, labels = CastInputs(default_collate, torch.float16)(items)
    assert inputs.dtype == torch.float16 and labels.tolist() == [1, 2]
    assert torch.equal(inputs, torch.stack([x for x, _ in items]).half())
    ids, _ = CastInputs(default_collate, torch.float16)([(torch.arange(4), 0), (torch.arange(4), 1)])
    assert ids.dtype == torch.int64  # token ids are never cast

    seen: list[torch.dtype] = []

    def own(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        seen.extend(x.dtype for x, _ in batch)
        return torch.stack([x * 2 for x, _ in batch]), torch.tensor([label for _, label in batch])

    inputs, _ = CastInputs(own, torch.float16)(items)
    assert seen == [torch.float32, torch.float32] and inputs.dtype == torch.float16
    assert torch.equal(inputs, (torch.stack([x for x, _ in items]) * 2).half())


def test_warm_up_passes_through_every_batch_a_pinning_loader_holds() -> None:
    """Page-locked buffers are allocated the first time each in-flight batch is made: that is start-up work,
    so the warm-up covers the workers' prefetched batches plus the one in use before any batch is timed."""
    from torch.utils.data import DataLoader

    from flagperf.inference.data import in_flight_batches
    from flagperf.inference.measure import timed_pass

    data = [(torch.full((2,), float(i)), i) for i in range(40)]
    pinned = DataLoader(data, batch_size=2, num_workers=2, prefetch_factor=3, pin_memory=False)
    pinned.pin_memory = True  # what with_data_path sets on an accelerator (this torch has none to pin for)
    assert in_flight_batches(pinned) == 2 * 3 + 1
    assert in_flight_batches(DataLoader(data, batch_size=2, num_workers=2, prefetch_factor=3)) == 0
    unpinned_main = DataLoader(data, batch_size=2)
    assert in_flight_batches(unpinned_main) == 0
    unpinned_main.pin_memory = True
    assert in_flight_batches(unpinned_main) == 1

    calls: list[float] = []

    def forward(inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], float]:
        calls.append(float(inputs[0][0, 0]))
        return inputs, 0.0

    stats = timed_pass("inference", DataLoader(data, batch_size=2), forward, None, lambda: None,
                       _config(warmup_batches=1), logging.getLogger("t"), min_warmup=7)
    assert calls[:7] == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0] and stats.batches == 20 and len(calls) == 27
    stats = timed_pass("inference", DataLoader(data, batch_size=2), forward, None, lambda: None,
                       _config(warmup_batches=3), logging.getLogger("t"), min_warmup=1)
    assert len(calls) == 27 + 3 + 20  # the config's warm-up when it asks for more


def test_main_process_batches_match_the_loaders_own_for_every_kind_of_loader() -> None:
    """in_main_process batches as the case's loader does: a batch sampler, an iterable data set, or a map-style
    one whose items are already batches (batch_size=None); a loader of the case's own kind is left as is."""
    from torch.utils.data import DataLoader, IterableDataset

    from flagperf.inference.data import with_data_path

    class Stream(IterableDataset):
        def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
            return iter([(torch.full((2,), float(i)), i) for i in range(5)])

    loaders = [DataLoader([(torch.full((2,), float(i)), i) for i in range(5)], batch_size=2, drop_last=True,
                          num_workers=1),
               DataLoader(Stream(), batch_size=2, drop_last=True, num_workers=1),
               DataLoader([(torch.zeros(3, 2), torch.zeros(3))] * 2, batch_size=None, num_workers=1)]
    pairs = [(torch.tensor([[0.0, 0.0], [1.0, 1.0]]), [0, 1]), (torch.tensor([[2.0, 2.0], [3.0, 3.0]]), [2, 3])]
    expected = [pairs, pairs, [(torch.zeros(3, 2), [0.0, 0.0, 0.0])] * 2]
    # The worker loaders are not iterated here: a worker of another test that died would be reported by
    # torch's process-wide SIGCHLD handler inside this one.
    for base, batches in zip(loaders, expected, strict=True):
        main = in_main_process(base)
        assert main.num_workers == 0 and not main.pin_memory
        got = [(inputs, labels.tolist()) for inputs, labels in main]
        assert len(got) == len(batches)
        for (inputs, labels), (want, want_labels) in zip(got, batches, strict=True):
            assert torch.equal(inputs, want) and labels == want_labels
    none_batched = with_data_path(loaders[2], torch.device("cpu"), torch.float16)
    assert none_batched.batch_size is None and none_batched.batch_sampler is None  # no batch axis added
    assert next(iter(in_main_process(none_batched)))[0].shape == (3, 2)
    own = [(torch.zeros(1, 2), torch.zeros(1))]
    assert in_main_process(own) is own


class _RecordingItems(torch.utils.data.Dataset):
    """Synthetic items that append (process id, time) to a file as each is made, from any process."""

    synthetic = True

    def __init__(self, path: Path, count: int) -> None:
        self.path, self.count = path, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(0.02)  # a batch of 4 takes a worker 80 ms: its prefetched batches outlast a short pause
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(f"{os.getpid()} {time.time()}\n")
        return torch.full((8,), float(index)), -1


def test_no_worker_makes_batches_while_the_compute_pass_is_timed(tmp_path: Path) -> None:
    """The compute pass's resident batches are made in the case process: before, they were taken from the
    pass's worker loader, whose workers then went on making their prefetched batches during the timed
    compute region (on an H100 the host fell behind ResNet-50 and the device's events timed its idling)."""
    import types

    from torch.utils.data import DataLoader

    from flagperf.inference.pipeline import InferenceRun, step_dataset_model, step_validation

    record = tmp_path / "items.txt"
    module = types.ModuleType("recording_case")
    module.build_dataloader = lambda config: DataLoader(  # type: ignore[attr-defined]
        _RecordingItems(record, 100), batch_size=4, drop_last=True, num_workers=2, persistent_workers=True)
    module.create_model = lambda config: torch.nn.Linear(8, 2)  # type: ignore[attr-defined]

    def model_forward(model: torch.nn.Module, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        time.sleep(0.003)  # a forward long enough for background workers to show up in the window
        return [model(*inputs)]

    module.model_forward = model_forward  # type: ignore[attr-defined]
    config = _config(batch_size=4, num_workers=2, compute_batches=4, compute_iterations=60, warmup_batches=1)
    run = InferenceRun(case_name="recording", module=module, config=config, vendor="cpu",
                       spec=load_vendor("cpu").spec_table(), device=torch.device("cpu"), shares_host_memory=True,
                       out_dir=tmp_path / "out", artifact_dir=tmp_path / "artifacts")
    step_dataset_model(run)
    step_validation(run)
    assert run.validation is not None and run.validation.batches == 25
    assert run.validation_compute is not None and len(run.validation_compute.seconds) == 60
    start, end = run.validation_compute.window
    made = [(int(pid), float(at)) for pid, at in (line.split() for line in record.read_text().splitlines())]
    workers = {pid for pid, _ in made if pid != os.getpid()}
    assert len(workers) == 2  # the timed pass's batches came from its workers
    assert [at for pid, at in made if pid == os.getpid()]  # the resident batches were made here
    assert not [(pid, at) for pid, at in made if start <= at <= end], "items made inside the compute window"
    assert run.flops_per_item is not None  # counted on a resident batch


def test_an_engine_that_builds_strongly_typed_gets_an_fp16_onnx_file(tmp_path: Path) -> None:
    """TensorRT 11 has no FP16 builder flag: an engine declaring onnx_precision: case gets the file in the
    case's precision (FP16 inputs and weights); an FP32 engine (ONNX Runtime) keeps FP32."""
    import onnx

    from flagperf.inference.pipeline import InferenceRun, step_export

    module, config, model, _ = _case_parts("resnet50-infer", *TINY_RESNET)
    config = config.model_copy(update={"fp16": True})
    types = {}
    for vendor, engine in (("nvidia", "tensorrt"), ("cpu", "onnxruntime")):
        run = InferenceRun(case_name="resnet50-infer", module=module, config=config, vendor=vendor,
                           spec=load_vendor("cpu").spec_table(), device=torch.device("cpu"), shares_host_memory=True,
                           out_dir=tmp_path / "out", artifact_dir=tmp_path / engine)
        run.engine_def, run.model = load_engine(vendor, engine), model.half()
        step_export(run)
        graph = onnx.load(str(run.onnx_path)).graph
        types[engine] = graph.input[0].type.tensor_type.elem_type
        assert torch.get_default_dtype() == torch.float32  # restored after the export
    assert types == {"tensorrt": onnx.TensorProto.FLOAT16, "onnxruntime": onnx.TensorProto.FLOAT}


def test_the_report_says_which_memory_it_shows() -> None:
    from flagperf.results.summary import case_memory_cell

    gib = 2**30
    assert case_memory_cell({"case_pss_bytes_max": 0.5 * gib, "case_uss_bytes_max": 0.25 * gib,
                             "case_rss_bytes_max": 1.5 * gib}) == "PSS 0.5, USS 0.25"
    assert case_memory_cell({"case_rss_bytes_max": 1.5 * gib}) == "RSS (summed) 1.5"


def test_the_report_lists_the_figures_warnings() -> None:
    import pandas as pd

    from flagperf.results.summary import RunSummary, render_warnings

    summary = RunSummary(run_id="r", rows=pd.DataFrame(), not_measured=[], counts={},
                         headline=[{"case": "digits-infer", "metric": "validation_core", "warnings": ["far"]},
                                   {"case": "digits-infer", "metric": "inference_core", "warnings": []}])
    lines = render_warnings(summary)
    assert lines[:4] == ["## Warnings", "", "- digits-infer / validation_core: far", ""]
    assert not any("inference_core" in line for line in lines)  # a figure without warnings is not listed
    # The same warning of several figures of a case (a serving sweep's points) is one line naming them all.
    summary.headline = [{"case": "serve", "metric": f"itl_s@c{n}", "warnings": ["per chunk"]} for n in (1, 2, 4)]
    summary.headline.append({"case": "serve", "metric": "ttft_s@c4", "warnings": ["per chunk", "far"]})
    assert render_warnings(summary)[2:5] == ["- serve / itl_s@c1, itl_s@c2, itl_s@c4, ttft_s@c4: per chunk",
                                             "- serve / ttft_s@c4: far", ""]


# Reused files (exist_onnx_path, exist_compiler_path) are checked against what they were made from --------------

@pytest.fixture(scope="module")
def kept_resnet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny ResNet round's ONNX and engine files, kept (with the records written beside them)."""
    tmp = tmp_path_factory.mktemp("kept")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FLAGPERF_WORK_ROOT", str(tmp / "work"))
        code, result, _ = run_case(tmp, "resnet50-infer", *TINY_RESNET, "repeat=1", "compiler=onnxruntime",
                                   "keep_artifacts=true")
    assert code == 0, result.failure
    return Path(str(result.inference.onnx_path)), Path(str(result.inference.engine_file))


@pytest.mark.parametrize("key", ["exist_onnx_path", "exist_compiler_path"])
def test_a_reused_file_made_for_another_model_is_refused_before_anything_runs(kept_resnet: tuple[Path, Path],
                                                                             key: str) -> None:
    reused = kept_resnet[0] if key == "exist_onnx_path" else kept_resnet[1]
    wider = [s for s in TINY_RESNET if not s.startswith("hidden_sizes")] + ["hidden_sizes=[8, 32]"]
    error = plan_error(*wider, "compiler=onnxruntime", f"{key}={reused}", case="resnet50-infer")
    assert (error.source, error.key) == ("--set", key)
    assert error.message.startswith(f"{reused} was made for another model: hidden_sizes [8, 16] (now [8, 32])")
    assert "\n" not in str(error)


def test_a_reused_file_made_for_this_model_is_used_and_said_to_be_checked(tmp_path: Path,
                                                                           kept_resnet: tuple[Path, Path]) -> None:
    # Another data set size and repeat are not another model; a symbolic batch axis takes any batch size.
    onnx = kept_resnet[0]
    sets = [s for s in TINY_RESNET if not s.startswith(("synthetic_images", "batch_size"))]
    code, result, _ = run_case(tmp_path, "resnet50-infer", *sets, "synthetic_images=4", "batch_size=2", "repeat=1",
                               "compiler=onnxruntime", f"exist_onnx_path={onnx}")
    assert code == 0, result.failure
    core = next(m for m in result.metrics if m.name == "inference_core")
    assert f"exist_onnx_path {onnx} checked against its record" in str(core.note) and core.warning is None


def test_flagperfs_engine_only_flow_checks_the_engine_file_and_names_no_onnx(tmp_path: Path,
                                                                              kept_resnet: tuple[Path, Path]) -> None:
    # FlagPerf's adaptation flow: no model, a placeholder ONNX path, the engine file loaded as it is.
    engine = kept_resnet[1]
    code, result, _ = run_case(tmp_path, "resnet50-infer", *TINY_RESNET, "repeat=1", "compiler=onnxruntime",
                               "no_validation=true", "exist_onnx_path=foo", f"exist_compiler_path={engine}")
    assert code == 0, result.failure
    assert result.inference.onnx_path is None  # "foo" was never read
    core = next(m for m in result.metrics if m.name == "inference_core")
    assert f"exist_compiler_path {engine} checked against its record" in str(core.note) and core.warning is None


def test_a_reused_file_without_a_record_is_flagged_in_every_inference_figure(tmp_path: Path,
                                                                             kept_resnet: tuple[Path, Path]) -> None:
    foreign = tmp_path / "vendor.onnx"  # a vendor's own ONNX (FlagPerf's adaptation flow): no record beside it
    shutil.copy(kept_resnet[0], foreign)
    code, result, _ = run_case(tmp_path, "resnet50-infer", *TINY_RESNET, "repeat=1", "compiler=onnxruntime",
                               "no_validation=true", f"exist_onnx_path={foreign}")
    assert code == 0, result.failure
    rates = [m for m in result.metrics if m.name in ("inference_whole", "inference_core", "inference_compute")]
    assert len(rates) == 3
    for m in rates:
        assert f"exist_onnx_path {foreign} has no record" in str(m.warning), m.name
    assert not any("has no record" in str(m.warning) for m in result.metrics if m.name.startswith("validation"))


def test_the_engines_accuracy_is_stated_against_the_eager_models() -> None:
    from flagperf.inference import pipeline
    from flagperf.results.schema import Metric

    class Run:  # what _with_accuracy_reference reads of a round
        module = ModuleType("case")
        config = _config(accuracy_tolerance=0.01)

    Run.module.ACCURACY = "top1"
    eager = Metric(name="validation_top1", value=0.90, unit="fraction", note="the case's evaluator")
    close, far = (Metric(name="inference_top1", value=v, unit="fraction", note="the case's evaluator")
                  for v in (0.905, 0.80))
    _, checked = pipeline._with_accuracy_reference(Run, [eager, close])  # type: ignore[arg-type]
    assert "eager model (validation) scored 0.9000 on the same data: difference +0.0050" in str(checked.note)
    assert checked.warning is None
    _, flagged = pipeline._with_accuracy_reference(Run, [eager, far])  # type: ignore[arg-type]
    assert "differs from the eager model's 0.9000 by -0.1000" in str(flagged.warning)


def test_the_job_s_prefect_context_carries_no_secret_of_the_profile_headers_or_result_store() -> None:
    """job.json got the sign-in through the active Prefect profile (serialized as it is: `prefect config set
    PREFECT_API_AUTH_STRING=...` puts it there), a proxy's sign-in in the client's custom headers, and the result
    store's block configuration with its secrets (serialize_context includes them). Now none of them: the profile
    keeps its name, the flow run its own and its result store nothing (the steps persist no results)."""
    import json
    import uuid

    from prefect import flow
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.objects import FlowRun
    from prefect.context import FlowRunContext, use_profile
    from prefect.filesystems import SMB
    from prefect.results import ResultStore
    from prefect.settings import (
        PREFECT_API_AUTH_STRING,
        PREFECT_API_KEY,
        PREFECT_CLIENT_CUSTOM_HEADERS,
        Profile,
    )

    from flagperf.inference.subflows import portable_context

    @flow(name="evaluate")
    def evaluate() -> None:
        return None

    secrets = ["lab:sign-in-secret", "pnu_key_secret", "proxy-header-secret", "smb-password-secret"]
    profile = Profile(name="lab", settings={PREFECT_API_AUTH_STRING: secrets[0], PREFECT_API_KEY: secrets[1],
                                            PREFECT_CLIENT_CUSTOM_HEADERS: {"X-Proxy-Auth": secrets[2]}})
    with use_profile(profile, override_environment_variables=True, include_current_context=False):
        store = ResultStore(result_storage=SMB(share_path="/share", smb_host="nas", smb_username="lab",
                                               smb_password=secrets[3]))
        with FlowRunContext(flow=evaluate, flow_run=FlowRun(flow_id=uuid.uuid4(), name="round-1"),
                            client=SyncPrefectClient("http://127.0.0.1:9/api"), task_runner=evaluate.task_runner,
                            result_store=store, parameters={}, detached=True):
            context = portable_context()
    text = json.dumps(context)
    assert [secret for secret in secrets if secret in text] == []
    assert context["settings_context"]["profile"] == {"name": "lab", "settings": {}}
    assert context["flow_run_context"]["flow_name"] == "evaluate"
    assert context["flow_run_context"]["flow_run"]["name"] == "round-1"
    assert context["flow_run_context"]["result_store"] == {}
