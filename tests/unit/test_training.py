"""Training: real convergence on real data at 1x1 and 1x2 processes, PerfLog, bad configs."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from rounds import run_local_round

from flagperf.config.models import merge_vendor_overrides
from flagperf.config.plan import plan_run
from flagperf.errors import CaseUserError, ConfigError
from flagperf.measure.perflog import format_line, parse_file, parse_text
from flagperf.results.schema import RoundResult, read_result
from flagperf.training import launch
from flagperf.training.driver import FINISHED_KEYS
from flagperf.training.launch import TEARDOWN_MARKER, where_it_stopped


def run_digits(tmp_path: Path, *sets: str) -> tuple[int, Path]:
    return _run_case(tmp_path, "digits-mlp", *sets)


@pytest.mark.parametrize("nproc", [1, 2])
def test_digits_converges(tmp_path: Path, nproc: int) -> None:
    """master_port is held by another program: one node's processes meet at a store their launcher bound on a
    port the OS gave it, so two rounds (or test sessions) on one host never collide."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        code, out = run_digits(tmp_path, f"nproc_per_node={nproc}", f"master_port={taken.getsockname()[1]}")
    # A failure names its cause: the round's failure and the end of each rank's output.
    assert code == 0, (read_result(out / "result.json").failure, {
        log.name: log.read_text(errors="replace")[-1500:] for log in sorted(out.glob("rank*.out.log"))})
    result = read_result(out / "result.json")
    assert result.status == "success" and result.family == "training"
    assert result.convergence is not None and result.convergence.converged
    assert result.convergence.reached >= 0.95 and result.convergence.epochs < 30
    metrics = {m.name: m for m in result.metrics}
    assert metrics["training_throughput"].unit == "samples/s" and metrics["training_throughput"].value > 0
    assert metrics["final_accuracy"].value == result.convergence.reached
    assert metrics["final_accuracy"].unit == "fraction"  # the case's target_unit, as digits-infer's *_top1 says
    assert 0 < metrics["time_to_target"].value < metrics["e2e_time"].value
    assert metrics["samples_per_s_per_device"].value == pytest.approx(metrics["training_throughput"].value / nproc)
    for rank in range(nproc):
        log = parse_file(out / f"rank{rank}.out.log")
        events = list(log.events["event"])
        assert events[0] == "INIT_START" and events[-1] == "FINISHED" and "EVALUATE" in events
        assert {"INIT_END", "TRAIN_START", "EPOCH_BEGIN", "EPOCH_END", "TRAIN_END"} <= set(events)
        assert events.count("EPOCH_BEGIN") == result.convergence.epochs
        # STEP_END at step 1 and every log_freq (10) steps, FlagPerf's cadence.
        steps = [value["step"] for event, value in zip(events, log.events["value"], strict=True)
                 if event == "STEP_END"]
        assert steps and steps[0] == 1 and all(s == 1 or s % 10 == 0 for s in steps), steps
        assert steps == sorted(steps) and len(steps) >= 3
        assert tuple(log.finished()[rank]) == FINISHED_KEYS
        assert set(log.events["rank"]) == {rank}
        assert (TEARDOWN_MARKER in (out / f"rank{rank}.out.log").read_text()) is (nproc > 1)
        # where the processes met, so a rank left waiting for its peers says so in its log's tail
        assert (f"rank {rank} joined the process group at 127.0.0.1:"
                in (out / f"rank{rank}.out.log").read_text()) is (nproc > 1)


# digits-mlp's own training, with rank 1 aborted (SIGABRT, as a C++ library's std::terminate does) at one of two
# moments: when its interpreter exits, after the final barrier, or right after training, before it.
CRASHING_DIGITS = '''
import atexit
import os
import time

from flagperf.config.cases import load_case

_digits = load_case("digits-mlp").module
Config = _digits.Config


def run(config, ctx):
    if ctx.rank == 1 and os.environ["CRASH_AT"] in ("exit", "exit-hang"):
        atexit.register(os.abort)
    if ctx.rank == 0 and os.environ["CRASH_AT"] == "exit-hang":  # as a peer stuck in NCCL's destroy would
        atexit.register(time.sleep, 600)
    _digits.run(config, ctx)
    if ctx.rank == 1 and os.environ["CRASH_AT"] == "end":
        os.abort()
'''


def crashing_round(tmp_path: Path, case_root: Path, monkeypatch: pytest.MonkeyPatch, crash_at: str
                   ) -> tuple[int, Path, RoundResult]:
    """One round of digits-mlp at 1x2 with rank 1 crashing at ``crash_at``: exit code, folder, result."""
    folder = case_root / "training" / "digits-crash"
    folder.mkdir(parents=True)
    definition = (Path(__file__).parents[2] / "cases/training/digits-mlp/case.yaml").read_text()
    (folder / "case.yaml").write_text(definition.replace("name: digits-mlp", "name: digits-crash"))
    (folder / "train.py").write_text(CRASHING_DIGITS)
    monkeypatch.setenv("CRASH_AT", crash_at)
    code, out = run_local_round(tmp_path, "digits-crash", "nproc_per_node=2")
    return code, out, read_result(out / "result.json")


def test_a_crash_after_the_final_barrier_keeps_the_figures_and_says_so(
        tmp_path: Path, case_root: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    code, _, result = crashing_round(tmp_path, case_root, monkeypatch, "exit")
    assert code == 0 and result.status == "success", result.failure
    assert result.convergence is not None and result.convergence.converged
    throughput = next(m for m in result.metrics if m.name == "training_throughput")
    assert throughput.value > 0 and "rank 1 exited -6 while leaving the process group" in throughput.note
    printed = capfd.readouterr().out
    assert "warning: rank 1 exited -6" in printed and "Fatal Python error: Aborted" in printed


def test_a_peer_that_does_not_end_after_a_teardown_crash_is_stopped(
        tmp_path: Path, case_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "TEARDOWN_GRACE_S", 3.0)
    started = time.monotonic()
    code, _, result = crashing_round(tmp_path, case_root, monkeypatch, "exit-hang")
    assert code == 0 and result.status == "success", result.failure
    assert time.monotonic() - started < 600  # rank 0 was stopped: waited for, its sleep alone would take 600 s
    note = next(m for m in result.metrics if m.name == "training_throughput").note
    assert "rank 0 was stopped after 3 s still leaving the process group" in note
    assert "rank 1 exited -6 while leaving the process group" in note


def test_a_crash_before_the_final_barrier_fails_the_round_and_shows_the_rank_output(
        tmp_path: Path, case_root: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, result = crashing_round(tmp_path, case_root, monkeypatch, "end")
    assert code != 0 and result.status != "success"
    assert result.failure is not None and result.failure.kind == "infrastructure"
    assert result.failure.message.startswith("rank 1 exited -6 before the final barrier (see rank1.out.log)")
    printed = capfd.readouterr().out
    assert "a process of this node failed: rank 1 exited -6; the end of rank1.out.log:" in printed
    # faulthandler's stack of the aborting thread, in the lines shown
    assert "Fatal Python error: Aborted" in printed and "in run" in printed
    assert TEARDOWN_MARKER not in (out / "rank1.out.log").read_text()


def test_not_converging_is_a_result_not_a_failure(tmp_path: Path) -> None:
    code, out = run_digits(tmp_path, "max_epochs=1", "lr=0.0001", "momentum=0.0")
    result = read_result(out / "result.json")
    assert code == 0 and result.status == "success"
    assert result.convergence.converged is False and result.convergence.epochs == 1
    assert result.convergence.reached < 0.95


def test_perflog_round_trip() -> None:
    value = {"e2e_time": 1.5, "converged": True, "nested": {"a": [1, 2]}}
    line = format_line("FINISHED", value, file="train.py", lineno=7, time_ms=123, rank=3)
    assert line.startswith("[PerfLog] {")
    log = parse_text(f"noise\n{line}\n[PerfLog] {{truncated\n")
    assert log.malformed == 1 and log.lines == 3
    assert log.finished() == {3: value}
    row = log.events.iloc[0]
    assert (row["event"], row["rank"], row["time_ms"]) == ("FINISHED", 3, 123)


def test_where_it_stopped(tmp_path: Path) -> None:
    lines = [format_line("EPOCH_BEGIN", {"epoch": 1}, file="t.py", lineno=1, time_ms=1, rank=0),
             format_line("STEP_END", {"step": 10, "epoch": 1}, file="t.py", lineno=1, time_ms=2, rank=0),
             format_line("EPOCH_BEGIN", {"epoch": 2}, file="t.py", lineno=1, time_ms=3, rank=0),
             format_line("STEP_END", {"step": 20, "epoch": 2}, file="t.py", lineno=1, time_ms=4, rank=0)]
    path = tmp_path / "rank0.out.log"
    path.write_text("\n".join(lines) + "\n[PerfLog] {\"event\": \"STEP_E")  # killed mid-line
    text = where_it_stopped(parse_file(path))
    assert "STEP_END (epoch 2, step 20" in text and "2 epoch(s) begun" in text
    assert where_it_stopped(parse_text("")) == "no PerfLog event was written (it stopped during start-up)"


def test_a_rank_that_never_met_its_peers_says_where_it_waited(tmp_path: Path) -> None:
    """A 2-node round whose ranks never meet (MASTER_ADDR:MASTER_PORT unreachable from a node) ends with torch's
    timeout and no PerfLog event: the round's failure names the address it waited at, not only "start-up"."""
    log = tmp_path / "rank1.out.log"
    log.write_text("flagperf: rank 1 of 2 joining the process group at 10.231.0.11:29501 (gloo, waiting up to 600 s "
                   "for every rank)\n[E1125 07:06:01 socket.cpp:1028] [c10d] The client socket has timed out after "
                   "600000ms while trying to connect to (10.231.0.11, 29501).\n", encoding="utf-8")
    metrics, convergence, problem = launch.training_result(tmp_path, first_rank=1)
    assert (metrics, convergence) == ([], None)
    assert problem is not None and problem.startswith(
        "no FINISHED event in rank1.out.log: it never joined the process group at 10.231.0.11:29501 (")
    with log.open("a") as out:  # it did join: then it stopped before any event, as before
        out.write("flagperf: rank 1 joined the process group at 10.231.0.11:29501\n")
    assert launch.never_joined(log) is None
    assert launch.training_result(tmp_path, first_rank=1)[2] == (
        "no FINISHED event in rank1.out.log: no PerfLog event was written (it stopped during start-up)")


def test_vendor_may_change_only_mutable_keys() -> None:
    with pytest.raises(ConfigError) as info:
        merge_vendor_overrides({"hidden": 128, "lr": 0.05}, {}, {"hidden": 256}, defaults_source="case.yaml",
                               vendor_source="vendor/acme.yaml", mutable=["lr"])
    assert info.value.source == "vendor/acme.yaml" and info.value.key == "hidden"
    assert "mutable list (lr)" in info.value.message
    merged = merge_vendor_overrides({"hidden": 128, "lr": 0.05}, {}, {"lr": 0.1}, defaults_source="case.yaml",
                                    vendor_source="vendor/acme.yaml", mutable=["lr"])
    assert merged.values["lr"] == 0.1


@pytest.mark.parametrize(("setting", "key"), [("foo=1", "foo"), ("target=0.5", "target"),
                                              ("nproc_per_node=0", "nproc_per_node")])
def test_bad_training_settings(tmp_path: Path, setting: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        plan_run(cases=["digits-mlp"], sets=[setting], results_dir=tmp_path)
    assert info.value.key == key and "\n" not in str(info.value)


def test_more_processes_than_the_host_allows_is_refused_before_any_round(tmp_path: Path) -> None:
    from flagperf.hosts.capacity import check_scale

    plan = plan_run(cases=["digits-mlp"], sets=["nproc_per_node=64"], results_dir=tmp_path)
    probe = json.loads(json.dumps({"host": {"usable_cpus": 2}, "device_count": 1}))
    with pytest.raises(ConfigError) as info:
        check_scale(plan, ["localhost"], {"localhost": probe})
    assert info.value.key == "nproc_per_node" and "has 2 usable CPU cores" in info.value.message
    plan = plan_run(cases=["digits-mlp"], sets=["nnodes=2"], results_dir=tmp_path)
    with pytest.raises(ConfigError, match="asks for 2 nodes; the inventory has 1 host"):
        check_scale(plan, ["localhost"], {"localhost": probe})


def test_scale_file_applies_only_at_its_scale(tmp_path: Path) -> None:
    at_1x2 = plan_run(cases=["digits-mlp"], sets=["nproc_per_node=2"], results_dir=tmp_path).cases[0]
    assert at_1x2.config["batch_size"] == 48
    assert at_1x2.origins["batch_size"].endswith("vendor/cpu/config_cpux1x2.yaml")
    at_1x1 = plan_run(cases=["digits-mlp"], results_dir=tmp_path).cases[0]
    assert at_1x1.config["batch_size"] == 32
    # Run overrides still win over the scale file.
    explicit = plan_run(cases=["digits-mlp"], sets=["nproc_per_node=2", "batch_size=16"], results_dir=tmp_path)
    assert explicit.cases[0].config["batch_size"] == 16


@pytest.mark.parametrize(("text", "words"), [
    # The same words as the settings file's (merge_vendor_overrides): the keys a vendor may change are named.
    ("hidden: 64\n", "hidden: is not in the case's mutable list (nproc_per_node, nnodes, batch_size, lr, momentum, "
                     "cpu_threads, log_freq, master_port, timeout_s); a vendor may change only those"),
    ("target: 0.5\n", "target: is a case parameter; parameters are not vendor-overridable"),
                                             ("nproc_per_node: 4\n", "contradicts the file name"),
                                             ("batch_size: 32\n", "already has")])
def test_bad_scale_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, words: str) -> None:
    import shutil

    root = tmp_path / "cases"
    case_dir = root / "training" / "digits-copy"
    shutil.copytree(Path(__file__).resolve().parents[2] / "cases" / "training" / "digits-mlp", case_dir)
    manifest = case_dir / "case.yaml"
    manifest.write_text(manifest.read_text().replace("name: digits-mlp", "name: digits-copy"))
    (case_dir / "vendor" / "cpu" / "config_cpux1x2.yaml").write_text(text)
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(root))
    with pytest.raises(ConfigError) as info:
        plan_run(cases=["digits-copy"], sets=["nproc_per_node=2"], results_dir=tmp_path)
    assert info.value.source.endswith("config_cpux1x2.yaml") and words in str(info.value)


def test_llama_pretrain_reports_tokens_per_second_and_mfu(tmp_path: Path) -> None:
    code, out = _run_case(tmp_path, "llama-pretrain", "synthetic_sequences=96", "max_epochs=1", "batch_size=8",
                          "cpu_threads=1")
    assert code == 0
    result = read_result(out / "result.json")
    metrics = {m.name: m for m in result.metrics}
    tokens = metrics["tokens_per_s"]
    assert tokens.unit == "tokens/s"
    assert tokens.value == pytest.approx(metrics["training_throughput"].value * 64)  # seq_len tokens per sample
    assert "synthetic data" in tokens.convention and tokens.mfu_peak_key == "fp32"
    finished = parse_file(out / "rank0.out.log").finished()[0]
    params = finished["extra"]["parameters"]
    from flagperf.config.vendors import load_vendor

    peak = load_vendor("cpu").spec_table().peaks["fp32"].value * 1e12
    # The tiny preset: 2 layers, hidden 128, sequence 64; the input embedding table is not in `parameters`.
    assert params == finished["extra"]["parameters_total"] - 256 * 128
    assert finished["extra"]["flops_per_token"] == 6 * params + 12 * 2 * 128 * 64
    assert tokens.mfu == pytest.approx((6 * params + 12 * 2 * 128 * 64) * tokens.value / peak)
    assert "12 x layers x hidden x seq_len" in tokens.convention
    assert metrics["tokens_per_s_per_device"].value == tokens.value  # one process
    assert metrics["peak_memory"].unit == "GiB" and metrics["peak_memory"].value > 0.05  # torch alone is more
    assert finished["extra"]["torch_threads"] == 1 and finished["extra"]["optimizer"] == "AdamW"
    assert result.convergence.metric == "eval_loss" and result.convergence.epochs == 1


def test_llama_pretrain_reads_a_local_token_file(tmp_path: Path) -> None:
    import numpy as np

    from flagperf.config.cases import load_case

    module = load_case("llama-pretrain").module
    tokens = np.arange(1000) % 200
    np.save(tmp_path / "tokens.npy", tokens)
    plan = plan_run(cases=["llama-pretrain"], sets=[f"data_path={tmp_path / 'tokens.npy'}"], results_dir=tmp_path)
    config = module.Config.model_validate(plan.cases[0].config)
    data, synthetic = module.sequences(config)
    assert not synthetic and data.shape == (15, 65)
    assert data[1, 0] == 64 and data[0, -1] == data[1, 0]  # consecutive windows of the file
    np.save(tmp_path / "bad.npy", np.full(100, 300))
    bad = module.Config.model_validate({**plan.cases[0].config, "data_path": str(tmp_path / "bad.npy")})
    with pytest.raises(CaseUserError, match=r"token ids in \[0, 256\)"):
        module.sequences(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        plan_run(cases=["llama-pretrain"], sets=["data_path=/nonexistent.npy"], results_dir=tmp_path)


_run_case = run_local_round


def test_resnet50_reads_an_imagenet_style_folder(tmp_path: Path) -> None:
    """A two-class folder of generated images (red and blue, with noise): the real reading and training code,
    on a ResNet shrunk through its configuration."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", 12), ("val", 4)):
        for label, colour in (("blue", 2), ("red", 0)):
            folder = tmp_path / "imagenet" / split / label
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 60, (40, 48, 3), dtype=np.uint8)
                pixels[..., colour] = 220
                Image.fromarray(pixels).save(folder / f"{i}.png")
    # The tiny preset (basic blocks): torch 2.13's CPU channels-last backward crashes on a bottleneck block
    # squeezed to 2 channels at 224 x 224 (real ResNet-50 widths are fine).
    code, out = _run_case(tmp_path, "resnet50", f"data_dir={tmp_path / 'imagenet'}", "model=tiny",
                          "hidden_sizes=[8, 32]", "batch_size=8", "num_workers=0", "max_epochs=3", "lr=0.05",
                          "log_freq=1", "cpu_threads=1")
    result = read_result(out / "result.json")
    assert code == 0, result.failure
    assert result.convergence.metric == "top1" and 0.0 <= result.convergence.reached <= 1.0
    assert next(m for m in result.metrics if m.name == "training_throughput").value > 0


def test_resnet50_without_a_folder_is_a_user_error(tmp_path: Path) -> None:
    code, out = _run_case(tmp_path, "resnet50")
    result = read_result(out / "result.json")
    assert code == 2 and result.failure.kind == "user" and "set data_dir" in result.failure.message
    with pytest.raises(ConfigError, match="needs train/<class>/ and val/<class>/"):
        plan_run(cases=["resnet50"], sets=[f"data_dir={tmp_path}"], results_dir=tmp_path / "r")


def test_bert_masked_lm_on_synthetic_tokens_fp16_with_a_grad_scaler(tmp_path: Path) -> None:
    code, out = _run_case(tmp_path, "bert", "model=tiny", "hidden_size=48", "seq_len=32", "synthetic_sequences=64",
                          "batch_size=8", "max_epochs=2", "lr=0.003", "precision=fp16", "cpu_threads=1")
    result = read_result(out / "result.json")
    assert code == 0, result.failure
    assert result.convergence.metric == "mlm_accuracy" and result.convergence.epochs <= 2
    tokens = next(m for m in result.metrics if m.name == "tokens_per_s")
    assert "synthetic data" in tokens.convention and tokens.mfu_peak_key == "fp16"
    from flagperf.config.vendors import load_vendor

    fp16 = load_vendor("cpu").spec_table().peaks.get("fp16")
    assert (tokens.mfu is not None) == bool(fp16 and fp16.supported)  # no peak, no MFU (most CPUs lack fp16)
    extra = parse_file(out / "rank0.out.log").finished()[0]["extra"]
    assert extra["parameters"] < extra["flops_per_token"] / 6  # attention's share counted beside 6 x N


def test_model_shapes_are_presets_with_explicit_sizes(tmp_path: Path) -> None:
    from flagperf.config.cases import load_case

    module = load_case("llama-pretrain").module

    def shape(*sets: str, vendor: str = "cpu"):
        case = plan_run(cases=["llama-pretrain"], sets=list(sets), vendor=vendor, results_dir=tmp_path).cases[0]
        return module.Config.model_validate(case.config).shape(), case

    tiny, _ = shape()
    assert (tiny.hidden_size, tiny.num_layers, tiny.vocab_size) == (128, 2, 256)
    one_b, _ = shape("model=llama-3.2-1b")
    assert (one_b.hidden_size, one_b.num_layers, one_b.num_kv_heads, one_b.tie_embeddings) == (2048, 16, 8, True)
    wider, _ = shape("model=llama-3-8b", "num_layers=2")  # an explicit size replaces the preset's, the rest stay
    assert (wider.hidden_size, wider.intermediate_size, wider.num_layers) == (4096, 14336, 2)
    with pytest.raises(ConfigError, match=r"unknown model preset 'llama-9'.*known: llama-3-8b, llama-3\.2-1b, tiny"):
        shape("model=llama-9")
    with pytest.raises(ConfigError, match="must divide evenly"):
        shape("num_heads=3")
    # The vendor's scale file picks the shape at its scale (vendor/nvidia/config_nvidiax1x1.yaml).
    gpu, case = shape(vendor="nvidia")
    assert gpu == one_b and case.config["precision"] == "bf16" and case.config["seq_len"] == 2048
    assert case.origins["model"].endswith("vendor/nvidia/config_nvidiax1x1.yaml")
    eight, case = shape("nproc_per_node=8", vendor="nvidia")
    assert eight.hidden_size == 4096 and case.config["parallel"] == "fsdp"
    bert = load_case("bert").module
    large = bert.Config.model_validate(plan_run(cases=["bert"], results_dir=tmp_path).cases[0].config).shape()
    assert (large.hidden_size, large.num_layers, large.num_heads) == (1024, 24, 16)
    resnet = load_case("resnet50").module
    r50 = resnet.Config.model_validate(plan_run(cases=["resnet50"], results_dir=tmp_path).cases[0].config).shape()
    assert r50.depths == (3, 4, 6, 3) and r50.hidden_sizes == (256, 512, 1024, 2048)
    # ResNet-50's published 4.1 G multiply-adds per 224 x 224 image, times 2 per multiply-add, times 3 for training.
    assert resnet.training_flops_per_image(r50, 1000, 224) == pytest.approx(3 * 2 * 4.09e9, rel=0.01)


def test_matmul_parameters_count_a_tied_table_once() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from flagperf.training.shapes import matmul_parameters

    sizes = {"vocab_size": 100, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
             "num_attention_heads": 2}
    tied = LlamaForCausalLM(LlamaConfig(**sizes, tie_word_embeddings=True))
    untied = LlamaForCausalLM(LlamaConfig(**sizes, tie_word_embeddings=False))
    total_tied = sum(p.numel() for p in tied.parameters())  # the shared table once
    assert matmul_parameters(tied) == total_tied  # looked up and multiplied by: counted once, as the head
    assert matmul_parameters(untied) == sum(p.numel() for p in untied.parameters()) - 100 * 16


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_llama_across_two_processes_over_gloo(tmp_path: Path, parallel: str) -> None:
    """DDP and FSDP2 (fully_shard) across two processes on the tiny preset: the loss falls, both ranks agree,
    per-device figures are the total's half, and warmup steps are left out of the timed region."""
    import math

    code, out = _run_case(tmp_path, "llama-pretrain", "nproc_per_node=2", f"parallel={parallel}", "batch_size=8",
                          "synthetic_sequences=128", "max_steps=6", "warmup_steps=2", "max_epochs=3",
                          "log_freq=2", "cpu_threads=1")
    result = read_result(out / "result.json")
    assert code == 0, result.failure
    metrics = {m.name: m for m in result.metrics}
    finished = [parse_file(out / f"rank{r}.out.log").finished()[r] for r in (0, 1)]
    extra = finished[0]["extra"]
    assert extra["parallel"] == parallel and extra["world_size"] == 2
    assert (extra.get("fsdp_units") == 2) == (parallel == "fsdp")  # the two decoder layers, then the root
    assert finished[0]["steps"] == 6 and result.convergence.steps == 6
    # 4 timed steps (the first two are warm-up) x 8 samples x 2 processes
    timed = metrics["training_throughput"].value * metrics["training_throughput"].measured_seconds
    assert timed == pytest.approx(4 * 8 * 2)
    assert metrics["tokens_per_s_per_device"].value == pytest.approx(metrics["tokens_per_s"].value / 2)
    assert len(extra["peak_memory_bytes_per_device"]) == 2
    # Both ranks evaluate the same model: the same loss, below a uniform guess over the 256-token vocabulary.
    assert finished[0]["final_metric"] == pytest.approx(finished[1]["final_metric"], rel=1e-5)
    assert finished[0]["final_metric"] < math.log(256) - 0.3
    steps = parse_file(out / "rank0.out.log").events
    losses = [v["loss"] for e, v in zip(steps["event"], steps["value"], strict=True) if e == "STEP_END"]
    assert len(losses) == 4 and all(isinstance(x, float) for x in losses)  # steps 1, 2, 4, 6


def test_cpu_threads_and_oversubscription(monkeypatch: pytest.MonkeyPatch) -> None:
    from flagperf.training.worker import cpu_threads, oversubscribed, usable_cores

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    cores = usable_cores()
    assert cpu_threads(3) == 3 and cpu_threads(None) == max(1, cores // 2)
    assert oversubscribed(0.0, max(1, cores // 2)) is None
    message = oversubscribed(cores + 4.0, 1)
    assert message is not None and f"on {cores} usable cores before 2 torch thread(s)" in message


def test_resnet_on_synthetic_images_channels_last(tmp_path: Path) -> None:
    code, out = _run_case(tmp_path, "resnet50", "model=tiny", "synthetic_images=32", "batch_size=8",
                          "max_epochs=1", "log_freq=1", "cpu_threads=1", "precision=bf16")
    result = read_result(out / "result.json")
    assert code == 0, result.failure
    throughput = next(m for m in result.metrics if m.name == "training_throughput")
    assert throughput.mfu is not None and throughput.mfu_peak_key == "bf16"
    assert "synthetic data" in throughput.convention
    extra = parse_file(out / "rank0.out.log").finished()[0]["extra"]
    assert extra["channels_last"] is True and extra["synthetic_data"] is True
    assert result.convergence.steps == 4  # 32 images in batches of 8
