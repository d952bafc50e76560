"""Generate on a real NVIDIA GPU (skipped without one): the `hf` engine decodes Llama-3.2-1B-shaped bf16 models
with exact token counts and the same tokens as a plain generate; throughput rises with concurrency; one round
through the entry with MFU against the bf16 datasheet peak; compile: true through generate's own compile."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from flagperf.config.job import Job
from flagperf.config.plan import plan_run
from flagperf.entry import run_job
from flagperf.generate.config import GenerateConfig
from flagperf.generate.driver import run_level
from flagperf.generate.engines import EngineEnv
from flagperf.generate.hf import Engine, generation_config, left_pad
from flagperf.generate.metrics import level_stats
from flagperf.generate.prompts import synthetic_prompts
from flagperf.inference.data import in_main_process
from flagperf.results.schema import read_result

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")]

CUDA = torch.device("cuda")


def test_hf_engine_on_cuda_decodes_exactly_and_scales_with_concurrency(tmp_path: Path) -> None:
    cfg = GenerateConfig.model_validate({"model": "llama-3.2-1b", "precision": "bf16", "engine": "hf",
                                         "input_len": 64, "max_new_tokens": 32, "concurrency": [1, 16],
                                         "requests": 16, "timeout_s": 600, "max_retries": 0})
    engine = Engine(cfg, EngineEnv(CUDA, tmp_path, logging.getLogger("test")))
    prompts = synthetic_prompts(16, cfg.input_len, engine.vocab_size, seed=0)
    rates = {}
    for concurrency in cfg.concurrency:
        traces, _, seconds, _ = run_level(engine, cfg, prompts, 0, concurrency)
        assert [t.output_tokens for t in traces] == [32] * 16
        assert all(t.arrival < t.token_times[0] < t.token_times[-1] for t in traces)
        rates[concurrency] = level_stats(concurrency, traces, seconds).tokens_per_s
    assert rates[16] > 2 * rates[1]
    batch = [p.ids for p in prompts.prompts[:4]]
    traces = engine.generate(batch, 8, 0)
    ids, mask = left_pad(batch, 0, CUDA)
    with torch.inference_mode():
        out = engine.model.generate(input_ids=ids, attention_mask=mask,
                                    generation_config=generation_config(8, 0, False))
    assert [t.output_ids for t in traces] == out[:, ids.shape[1]:].tolist()


@pytest.mark.parametrize("compile", [False, True])
def test_a_generate_round_on_the_gpu_reports_mfu_against_bf16(tmp_path: Path, compile: bool) -> None:
    plan = plan_run(cases=["llama3.2-1b-generate"], vendor="nvidia", results_dir=tmp_path / "r",
                    sets=["input_len=64", "max_new_tokens=32", "concurrency=[1, 8]", "requests=8", "duration_s=null",
                          f"compile={'true' if compile else 'false'}"])
    cp = plan.cases[0]
    job = Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, host="gpu", vendor="nvidia",
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})
    assert run_job(job, tmp_path) == 0
    result = read_result(tmp_path / "result.json")
    tokens = next(m for m in result.metrics if m.name == "output_tokens_per_s@c8")
    assert result.status == "success" and tokens.work == 8 * 32
    assert tokens.mfu is not None and 0 < tokens.mfu < 1 and tokens.mfu_peak_key == "bf16"


def test_llama_decode_infer_decodes_with_the_kv_cache_through_inductor_on_cuda(tmp_path: Path) -> None:
    """The inductor engine's compiled module decodes with the static KV cache: the same greedy tokens as eager
    decoding; the first decode (the compile) is non-inference time, the second is not."""
    from flagperf.config.cases import load_case
    from flagperf.inference.engines import EngineEnv as InferenceEnv
    from flagperf.inference.engines import load_engine

    sets = ["vocab_size=256", "hidden_size=64", "num_hidden_layers=2", "num_attention_heads=4",
            "num_key_value_heads=2", "intermediate_size=128", "prompt_len=16", "new_tokens=8", "flops=1.0e6",
            "batch_size=2", "compiler=inductor", "fp16=false"]
    module = load_case("llama-decode-infer").module
    cfg = module.Config.model_validate(plan_run(cases=["llama-decode-infer"], vendor="nvidia", sets=sets,
                                                results_dir="u").cases[0].config)
    model = module.create_model(cfg).eval().to(CUDA)
    inputs = [next(iter(in_main_process(module.build_dataloader(cfg))))[0]]
    env = InferenceEnv(device=CUDA, work_dir=tmp_path, case="llama-decode-infer", log=logging.getLogger("t"))
    engine = load_engine("nvidia", "inductor").engine_class()(cfg, None, model, env)
    assert engine.module is not None
    with torch.no_grad():
        eager = list(module.model_forward(model, [inputs[0].to(CUDA)]))[-1][0].cpu()
        steps, first = module.engine_forward(engine, inputs)
        cached = list(steps)[-1][0]
        steps, second = module.engine_forward(engine, inputs)
        again = list(steps)[-1][0]
    assert torch.equal(cached, eager) and torch.equal(again, eager)
    assert first() > 0 and second() == 0.0
