"""The generate family on the CPU with the tiny preset and real decoding: exact token counts, TTFT below the
request latency, throughput rising with concurrency, ROUGE on a file the test writes, bad prompt files as
one-line errors, discovery and vendor overrides, and one round through the entry with its report."""

from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from flagperf.config.cases import available_cases, load_case, resolve_case_config
from flagperf.config.job import Job
from flagperf.config.models import CASE_FOLDER
from flagperf.config.plan import plan_run
from flagperf.config.vendors import load_vendor
from flagperf.entry import run_job
from flagperf.errors import EXIT_OK, EXIT_USER_ERROR, CaseUserError, ConfigError
from flagperf.generate.config import GenerateConfig
from flagperf.generate.driver import run_generate, run_level
from flagperf.generate.engines import EngineEnv, RequestTrace, load_engine
from flagperf.generate.hf import Engine, generation_config, left_pad
from flagperf.generate.metrics import level_metrics, level_stats
from flagperf.generate.prompts import ByteTokenizer, read_prompt_file, rouge_scores, synthetic_prompts
from flagperf.inference.data import in_main_process
from flagperf.results.metrics import TransformerFlops
from flagperf.results.report import build_report
from flagperf.results.schema import read_result

CPU = torch.device("cpu")
BASE: dict[str, Any] = {"model": "tiny", "precision": "fp32", "engine": "hf", "input_len": 8, "max_new_tokens": 6,
                        "concurrency": [1, 8], "requests": 8, "timeout_s": 600, "max_retries": 0}


def config(**changes: Any) -> GenerateConfig:
    return GenerateConfig.model_validate({**BASE, **changes})


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    return Engine(config(), EngineEnv(CPU, tmp_path_factory.mktemp("engine"), logging.getLogger("test")))


@pytest.fixture(scope="module")
def levels(engine: Engine) -> dict[int, tuple[list[RequestTrace], list[int], float, tuple[float, float]]]:
    """Both levels served once by the same engine (real decoding), shared by the tests that read them."""
    cfg = config()
    prompts = synthetic_prompts(8, cfg.input_len, engine.vocab_size, seed=0)
    return {c: run_level(engine, cfg, prompts, 0, c) for c in cfg.concurrency}


def test_every_request_gets_exactly_max_new_tokens(levels: dict[int, Any]) -> None:
    for concurrency, (traces, served, seconds, _) in levels.items():
        assert len(traces) == len(served) == 8
        assert [t.output_tokens for t in traces] == [6] * 8
        assert all(len(t.output_ids) == 6 for t in traces)
        stats = level_stats(concurrency, traces, seconds)
        metric = {m.name: m for m in level_metrics(stats, (0.0, seconds), TransformerFlops(1000), "fp32", None)}
        assert metric[f"output_tokens_per_s@c{concurrency}"].work == 48
        assert metric[f"output_tokens_per_s@c{concurrency}"].value == pytest.approx(48 / seconds)
        assert metric[f"requests_per_s@c{concurrency}"].value == pytest.approx(8 / seconds)


def test_ttft_is_below_the_request_latency_and_tokens_come_in_order(levels: dict[int, Any]) -> None:
    for traces, _, _, _ in levels.values():
        for t in traces:
            assert t.arrival < t.token_times[0] < t.token_times[-1]
            assert t.token_times == sorted(t.token_times)


def test_throughput_rises_with_concurrency_on_the_same_engine(levels: dict[int, Any]) -> None:
    rate = {c: level_stats(c, traces, seconds).tokens_per_s for c, (traces, _, seconds, _) in levels.items()}
    assert rate[8] > rate[1]


def test_the_engine_decodes_what_a_plain_generate_decodes(engine: Engine) -> None:
    """The streamer's per-request tokens are generate's own output, in the right rows (padded batch too)."""
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19]]
    traces = engine.generate(prompts, 6, 0)
    ids, mask = left_pad(prompts, 0, CPU)
    with torch.inference_mode():
        out = engine.model.generate(input_ids=ids, attention_mask=mask,
                                    generation_config=generation_config(6, 0, False))
    assert [t.output_ids for t in traces] == out[:, ids.shape[1]:].tolist()
    assert [t.prompt_tokens for t in traces] == [5, 3, 7]


def test_metric_definitions_on_known_timestamps() -> None:
    traces = [RequestTrace(arrival=0.0, prompt_tokens=4, token_times=[0.5, 0.6, 0.8, 1.1], output_ids=[1] * 4),
              RequestTrace(arrival=0.0, prompt_tokens=4, token_times=[0.5, 0.7, 0.9, 1.1], output_ids=[1] * 4)]
    stats = level_stats(2, traces, 2.0)
    assert stats.ttft.p50 == pytest.approx(0.5)
    assert stats.tpot is not None and stats.tpot.mean == pytest.approx(0.2)  # (1.1 - 0.5) / 3 for both
    assert stats.itl is not None and stats.itl.count == 6 and stats.itl.p50 == pytest.approx(0.2)
    assert stats.per_user.mean == pytest.approx(4 / 1.1)
    assert stats.tokens_per_s == 4.0 and stats.requests_per_s == 1.0
    from flagperf.results.schema import Peak

    peak = Peak(value=1.0, unit="TFLOPS", source="test")
    flops = TransformerFlops(10**9, layers=2, hidden=8)
    tokens = next(m for m in level_metrics(stats, (10.0, 12.0), flops, "bf16", peak) if m.name.startswith("output"))
    # Each request: prefill of 4 tokens over 4 (2e9 + 4*2*8*4 each), then 3 decode steps over 5, 6, 7 tokens.
    per_request = 4 * (2e9 + 4 * 2 * 8 * 4) + 3 * 2e9 + 4 * 2 * 8 * (5 + 6 + 7)
    assert tokens.mfu == pytest.approx(2 * per_request / 2.0 / 1e12) and tokens.window == [10.0, 12.0]
    assert "prefill and decode" in tokens.convention and "4 x layers x hidden x context" in tokens.convention


def test_batch_figures_state_their_convention_and_where_a_serving_engines_differs() -> None:
    """Every figure of a batch engine's level says how it was counted. The serving engines' figures share their names
    and formulas, not their clock: a batch engine times a request from its arrival at the engine to its tokens, a
    serving engine from the client's send to the chunks it receives and the end of the stream. Each latency and
    per-user convention says which it is, and names the other's, on both sides."""
    from flagperf.generate.points import CONVENTIONS as SERVING

    traces = [RequestTrace(arrival=0.0, prompt_tokens=4, token_times=[0.5, 0.6, 0.8, 1.1], output_ids=[1] * 4)]
    metrics = {m.name.split("@")[0]: m for m in level_metrics(level_stats(1, traces, 2.0), (0.0, 2.0),
                                                               TransformerFlops(1000), "fp32", None)}
    assert set(metrics) == {"output_tokens_per_s", "tokens_per_s_per_user", "requests_per_s", "ttft_s", "tpot_s",
                            "itl_s", "e2el_s"}
    assert all(m.convention for m in metrics.values()), [n for n, m in metrics.items() if not m.convention]
    assert metrics["output_tokens_per_s"].convention.startswith("output tokens of the level's timed requests")
    assert "prefill and decode" in metrics["output_tokens_per_s"].convention  # and its MFU's
    for what in ("tokens_per_s_per_user", "ttft_s", "tpot_s", "itl_s", "e2el_s"):
        assert "A serving engine's" in metrics[what].convention, what
        assert "a batch engine's" in SERVING[what], what
        assert metrics[what].convention != SERVING[what]
    assert "last token - arrival" in metrics["tokens_per_s_per_user"].convention
    # A latency records the same tail as in every family (inference's too): p95 and the spread are never missing.
    for what in ("ttft_s", "tpot_s", "itl_s", "e2el_s"):
        m = metrics[what]
        assert m.p95 is not None and m.std is not None, what
        assert m.p50 <= m.p90 <= m.p95 <= m.p99, what
        assert "p95" in m.convention and "p95" in SERVING[what], what
    assert metrics["itl_s"].std == pytest.approx(statistics.stdev([0.1, 0.2, 0.3]))
    assert "E2EL" in SERVING["tokens_per_s_per_user"] and "end of the response stream" in SERVING["e2el_s"]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_rouge_is_computed_against_the_file_references(tmp_path: Path) -> None:
    pytest.importorskip("rouge_score")
    prompts = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "Summarise: the cat sat on the mat.", "reference": "a cat sat"},
        {"prompt": "Summarise: rain fell all day.", "reference": "it rained"},
        {"prompt": "No reference here."}])
    cfg = GenerateConfig.model_validate({**BASE, "prompts_path": prompts.name, "input_len": 32, "concurrency": [3],
                                         "requests": 3, "max_new_tokens": 4}, context={CASE_FOLDER: tmp_path})
    outcome = run_generate(cfg, "cpu", load_vendor("cpu").spec_table(), CPU, tmp_path)
    metric = {m.name: m for m in outcome.metrics}
    texts = outcome.outputs[3]
    expected = rouge_scores(texts[:2], ["a cat sat", "it rained"])
    assert metric["rougeL@c3"].value == pytest.approx(expected["rougeL"])
    assert metric["rouge1@c3"].iterations == 2  # the prompt without a reference is not scored
    assert rouge_scores(["the cat sat on the mat"], ["the cat sat on the mat"])["rougeL"] == pytest.approx(1.0)


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("bad.jsonl", '{"prompt": "a"}\n{"prompt": \n', "bad.jsonl: line 2: not JSON"),
    ("nokey.jsonl", '{"text": "a"}\n', "nokey.jsonl: line 1: prompt: missing or empty"),
    ("ref.jsonl", '{"prompt": "a", "reference": 3}\n', "ref.jsonl: line 1: reference: must be text"),
    ("empty.jsonl", "\n", "empty.jsonl: no prompts in the file"),
    ("cols.csv", "text,reference\na,b\n", "cols.csv: prompt: the header has no 'prompt' column"),
    ("p.txt", "hello\n", "p.txt: prompts_path must be a .jsonl or .csv file"),
])
def test_a_bad_prompt_file_is_one_line_naming_file_and_key(tmp_path: Path, name: str, text: str,
                                                            expected: str) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CaseUserError) as err:
        read_prompt_file(str(path))
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_csv_prompts_and_the_byte_tokenizer(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text('prompt,reference\n"héllo, world",greeting\nbye,\n', encoding="utf-8")
    assert read_prompt_file(str(path)) == [("héllo, world", "greeting"), ("bye", None)]
    tok = ByteTokenizer(512)
    assert tok.decode(tok.encode("héllo")) == "héllo"


def test_config_rules() -> None:
    with pytest.raises(ValidationError, match="exactly one of requests and duration_s"):
        config(duration_s=5.0)
    with pytest.raises(ValidationError, match="exactly one of requests and duration_s"):
        config(requests=None)
    with pytest.raises(ValidationError, match="not a preset"):
        config(model="gpt-5")
    with pytest.raises(ValidationError, match="listed twice"):
        config(concurrency=[1, 1])
    with pytest.raises(ValidationError, match="does not exist"):
        config(prompts_path="/data/no/such/file.jsonl")
    with pytest.raises(ValidationError, match="is outside the data roots"):
        config(prompts_path="/no/such/file.jsonl")


@pytest.mark.parametrize(("preset", "parameters"), [("llama-3-8b", 8_030_261_248), ("llama-3.2-1b", 1_235_814_400),
                                                    ("qwen2.5-7b", 7_615_616_512)])
def test_presets_have_the_published_parameter_counts(preset: str, parameters: int) -> None:
    """Built on the meta device (no memory): the published counts of Meta-Llama-3-8B, Llama-3.2-1B (tied
    embeddings) and Qwen2.5-7B. Llama's shapes are training's table (flagperf.training.shapes), not a copy."""
    from transformers import AutoModelForCausalLM

    from flagperf.generate.models import model_config
    from flagperf.training.shapes import LLAMA_PRESETS

    config = model_config(preset, None)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()) == parameters
    assert config.use_cache and config.max_position_embeddings >= 8192
    if preset in LLAMA_PRESETS:
        shape = LLAMA_PRESETS[preset]
        assert (config.hidden_size, config.num_hidden_layers, config.num_key_value_heads) == (
            shape.hidden_size, shape.num_layers, shape.num_kv_heads)


def test_cases_are_discovered_by_folder_with_vendor_overrides() -> None:
    names = [n for n in available_cases() if load_case(n).family == "generate"]
    assert {"llama3-8b-generate", "qwen2.5-7b-generate", "llama3.2-1b-generate", "tiny-llama-generate"} <= set(names)
    case = load_case("llama3-8b-generate")
    cpu = resolve_case_config(case, "cpu", [])
    nvidia = resolve_case_config(case, "nvidia", [])
    assert cpu.values["concurrency"] == [1, 4] and nvidia.values["concurrency"] == [1, 4, 32]
    assert nvidia.values["requests"] is None and nvidia.values["duration_s"] == 60
    assert set(nvidia.vendor_changes) == {"requests", "duration_s"}


def test_engines_are_vendor_folders_and_a_missing_package_is_one_line() -> None:
    assert load_engine("cpu", "hf").engine_class() is Engine
    with pytest.raises(ConfigError, match="unknown engine 'vllm' for vendor cpu"):
        resolve_case_config(load_case("tiny-llama-generate"), "cpu", [("--set", {"engine": "vllm"})])
    vllm = load_engine("nvidia", "vllm")
    if vllm.manifest.requires and __import__("importlib").util.find_spec("vllm") is None:
        with pytest.raises(CaseUserError, match=r"engine vllm .* needs the Python package\(s\) vllm") as err:
            vllm.engine_class()
        assert "\n" not in str(err.value)


def _job(tmp_path: Path, *sets: str) -> Job:
    plan = plan_run(cases=["tiny-llama-generate"], sets=list(sets), results_dir=tmp_path / "results")
    cp = plan.cases[0]
    return Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, host="localhost", vendor="cpu",
               config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})


def test_one_round_through_the_entry_and_the_report(tmp_path: Path) -> None:
    """run_job as the case process runs it: result.json with the level metrics, then the report's serving
    table and trade-off plot built from it."""
    job = _job(tmp_path, "input_len=8", "max_new_tokens=4", "concurrency=[1, 2]", "requests=2")
    run_dir = tmp_path / "results" / job.run_id
    out = run_dir / job.case / "round1" / "localhost_noderank0"
    out.mkdir(parents=True)
    assert run_job(job, out) == EXIT_OK
    result = read_result(out / "result.json")
    assert result.status == "success" and result.family == "generate"
    names = {m.name for m in result.metrics}
    assert {"output_tokens_per_s@c1", "ttft_s@c2", "tpot_s@c2", "itl_s@c1", "tokens_per_s_per_user@c2"} <= names
    assert result.measured_seconds > 0
    # A power monitor's file beside the result, as the controller collects it: 100 W throughout, so each
    # level's energy per output token is 100 W x its timed window / its output tokens.
    window = [m.window for m in result.metrics if m.window]
    start, end = min(w[0] for w in window) - 1.0, max(w[1] for w in window) + 1.0
    # 4 samples or more inside the shortest window, however fast this host ran it: energy per work needs 2
    interval = min(0.05, min(w[1] - w[0] for w in window) / 4)
    steps = int((end - start) / interval) + 2
    samples = [{"type": "sample", "t": start + interval * i, "power_w": 100.0} for i in range(steps)]
    (out / "monitor_system.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"type": "header", "monitor": "system", "interval_s": interval}, *samples]) + "\n", encoding="utf-8")
    build_report(run_dir)
    report = (run_dir / "report.md").read_text(encoding="utf-8")
    assert "## LLM serving (generate)" in report and "| tiny-llama-generate | 2 |" in report
    assert (run_dir / "plots" / "serving_tradeoff.png").stat().st_size > 0
    from flagperf.results.serving import serving_levels
    from flagperf.results.summary import summarize

    for level in serving_levels(run_dir, summarize(run_dir).rows):
        tokens = next(m for m in result.metrics if m.name == f"output_tokens_per_s@c{level['concurrency']}")
        assert tokens.window is not None and tokens.work == 2 * 4
        expected = 100.0 * (tokens.window[1] - tokens.window[0]) / tokens.work
        assert level["energy_per_token_j"] == pytest.approx(expected, rel=1e-6)


def test_a_bad_prompt_file_fails_the_round_as_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prompts file of a case, in the case's folder (a copy of tiny-llama-generate): a bad line fails the
    round as a user error naming the file."""
    import yaml

    manifest = yaml.safe_load(load_case("tiny-llama-generate").manifest_path.read_text(encoding="utf-8"))
    manifest["name"] = "bad-prompts-generate"
    folder = tmp_path / "cases" / "generate" / "bad-prompts-generate"
    folder.mkdir(parents=True)
    (folder / "case.yaml").write_text(yaml.safe_dump(manifest), encoding="utf-8")
    bad = folder / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\nnot json\n', encoding="utf-8")
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(tmp_path / "cases"))
    plan = plan_run(cases=["bad-prompts-generate"], sets=["prompts_path=bad.jsonl"], results_dir=tmp_path / "results")
    cp = plan.cases[0]
    assert cp.config["prompts_path"] == "bad.jsonl"
    job = Job(run_id=plan.run_id, case=cp.name, family=cp.family, round=1, host="localhost", vendor="cpu",
              config=cp.config, config_origins=cp.origins, run_overrides=cp.run_overrides, image={})
    assert run_job(job, tmp_path) == EXIT_USER_ERROR
    result = read_result(tmp_path / "result.json")
    assert result.failure is not None and result.failure.kind == "user"
    assert result.failure.message.startswith(f"{bad.resolve()}: line 2: not JSON")


TINY_LLAMA = ["vocab_size=128", "hidden_size=32", "num_hidden_layers=2", "num_attention_heads=4",
              "num_key_value_heads=2", "intermediate_size=64", "prompt_len=8", "new_tokens=5", "flops=1.0e5",
              "batch_size=2"]


def test_llama_decode_infer_decodes_with_the_kv_cache_through_an_engine_module(tmp_path: Path) -> None:
    """An engine that exposes its module (as inductor does, compiled) decodes with the static KV cache: the
    same greedy tokens as eager decoding, one yield per token; the first batch shape's decode is reported as
    non-inference (a compile, with a compiler), later ones are not."""
    from flagperf.inference.engines import EngineEnv as InferenceEnv
    from flagperf.inference.engines import InferenceEngine

    class ModuleEngine(InferenceEngine):
        """The contract's module path with no compiler in between: the eager Decoder itself."""

        def __init__(self, config: Any, onnx_path: Path | None, model: torch.nn.Module | None,
                     env: InferenceEnv, *, engine_path: Path | None = None) -> None:
            super().__init__(config, onnx_path, model, env, engine_path=engine_path)
            self.module = model

        def __call__(self, inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], float]:
            raise AssertionError("the KV-cache path never calls the full-window forward")

    module = load_case("llama-decode-infer").module
    cfg = module.Config.model_validate(plan_run(cases=["llama-decode-infer"], sets=TINY_LLAMA,
                                                results_dir="u").cases[0].config)
    model = module.create_model(cfg).eval()
    inputs = [next(iter(in_main_process(module.build_dataloader(cfg))))[0]]
    engine = ModuleEngine(cfg, None, model, InferenceEnv(CPU, tmp_path, "llama-decode-infer", logging.getLogger()))
    with torch.no_grad():
        eager = list(module.model_forward(model, inputs))
        steps, first_foo = module.engine_forward(engine, inputs)
        cached = list(steps)
        again, second_foo = module.engine_forward(engine, inputs)
        assert torch.equal(list(again)[-1][0], cached[-1][0])
    assert len(cached) == len(eager) == cfg.new_tokens + 1
    assert cached[-1][0].shape == (2, cfg.new_tokens) and torch.equal(cached[-1][0], eager[-1][0])
    assert [len(step) for step in cached[:-1]] == list(range(1, cfg.new_tokens + 1))
    assert first_foo() > 0 and second_foo() == 0.0


def test_a_family_drivers_config_is_checked_without_the_driver_or_torch() -> None:
    """A case's config is checked (`flagperf validate`, a run refused for bad input) with the driver's Config taken
    from FAMILY_CONFIGS: it is the class the driver runs with, and checking a generate or an operation case loads
    neither torch nor transformers (seconds a user waits for a one-line refusal)."""
    import importlib
    import subprocess
    import sys

    from flagperf.config.models import FAMILY_CONFIGS, FAMILY_DRIVERS
    from flagperf.paths import PROJECT_ROOT

    assert FAMILY_CONFIGS.keys() == FAMILY_DRIVERS.keys()
    for family, driver in FAMILY_DRIVERS.items():
        module, _, name = FAMILY_CONFIGS[family].partition(":")
        assert importlib.import_module(driver).Config is getattr(importlib.import_module(module), name), family
    code = ("import sys\nfrom flagperf.config.cases import load_case, resolve_case_config\n"
            "for name in ('tiny-llama-serve', 'llama3-8b-generate', 'op-gemm', 'op-attention'):\n"
            "    resolve_case_config(load_case(name), 'cpu', [])\n"
            "print(sorted({'torch', 'transformers', 'flagperf.generate.driver', 'flagperf.operation.driver'}\n"
            "             & set(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
