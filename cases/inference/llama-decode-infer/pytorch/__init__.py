"""llama-decode-infer: greedy decoding, generated tokens/s and time to first token.

The engine step decodes with a KV cache (a static one: fixed shapes, so a compiler builds the decode step
once) through engines that compile the PyTorch model and expose it (``engine.module``, e.g. inductor);
engines that run the ONNX file (no cache in the graph) recompute the whole window for every token."""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
import transformers
from pydantic import Field
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

from flagperf.inference.config import InferenceConfig
from flagperf.inference.data import SyntheticDataset, loader
from flagperf.inference.engines import InferenceEngine
from flagperf.inference.hf import Logits, build, kv_cache_name
from flagperf.training.config import LocalPath
from flagperf.training.data import token_windows

ACCURACY = None  # decoding speed is the figure of merit; see README.md
# The ONNX export (TorchScript tracing) of transformers 5: without a padding mask it leaves causality to SDPA's
# is_causal and asks SDPA for enable_gqa where KV heads are shared, which the exporter cannot convert; a mask
# of ones makes it build the causal mask and repeat the KV heads, as 4.x does while tracing (same logits).
# 4.x must not get that mask: tracing its mask builder fails (unordered_map::at).
MASK_FOR_EXPORT = int(transformers.__version__.split(".")[0]) >= 5


class Config(InferenceConfig):
    item_name: ClassVar[str] = "tokens"
    artifact_neutral_keys: ClassVar[frozenset[str]] = frozenset({"data_path", "synthetic_prompts"})
    data_path: LocalPath = Field(description="1-D .npy of token ids for the prompts; null: synthetic")
    checkpoint_path: LocalPath = Field(description="a save_pretrained folder; null: random weights")
    synthetic_prompts: int = Field(ge=1)
    prompt_len: int = Field(ge=1)
    new_tokens: int = Field(ge=1)
    vocab_size: int = Field(ge=2)
    hidden_size: int = Field(ge=1)
    num_hidden_layers: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_key_value_heads: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    attention: Literal["sdpa", "eager"] = Field(description="transformers' attn_implementation of the model")
    seed: int

    def items_per_sample(self) -> int:
        return self.new_tokens  # throughput counts generated tokens


class Prompts(TensorDataset):
    synthetic = False

    def __init__(self, config: Config) -> None:
        assert config.data_path is not None
        windows = token_windows(config.data_path, config.prompt_len - 1, config.vocab_size)
        super().__init__(windows, torch.zeros(len(windows), dtype=torch.long))
        self.description = f"{config.data_path}: {len(windows)} prompts of {config.prompt_len} tokens"


def build_dataloader(config: Config) -> DataLoader:
    if config.data_path is not None:
        dataset: Any = Prompts(config)
    else:
        dataset = SyntheticDataset(config.synthetic_prompts,
                                   lambda g: torch.randint(0, config.vocab_size, (config.prompt_len,), generator=g),
                                   f"{config.prompt_len} random token ids")
    return loader(dataset, config.batch_size, config.num_workers)


def create_model(config: Config) -> torch.nn.Module:
    hf = LlamaConfig(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                     num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
                     num_key_value_heads=config.num_key_value_heads, intermediate_size=config.intermediate_size,
                     max_position_embeddings=max(2048, config.prompt_len + config.new_tokens),
                     attn_implementation=config.attention)
    return Decoder(build(LlamaForCausalLM, hf, config.checkpoint_path), config.new_tokens)


class Decoder(Logits):
    """Input ids in, logits out (what is exported); it also knows how many tokens to generate."""

    def __init__(self, model: LlamaForCausalLM, new_tokens: int) -> None:
        super().__init__(model, ("input_ids",))
        self.new_tokens = new_tokens
        self.cache_name = kv_cache_name(model)  # looked up here: a compiled forward must not inspect

    def forward(self, input_ids: torch.Tensor, past_key_values: StaticCache | None = None,  # type: ignore[override]
                cache_position: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of the whole window (what is exported), or of the new positions against the KV cache."""
        if past_key_values is None:
            if MASK_FOR_EXPORT and torch.jit.is_tracing():
                return self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits
            return super().forward(input_ids)
        return self.model(input_ids=input_ids, **{self.cache_name: past_key_values}, cache_position=cache_position,
                          use_cache=True).logits


def evaluator(outputs: list[torch.Tensor], labels: torch.Tensor) -> float:
    raise NotImplementedError("llama-decode-infer has no accuracy metric")  # ACCURACY is None: never called


def model_forward(model: torch.nn.Module, inputs: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    """Greedy decoding with the KV cache; yields after each generated token (the first yield is TTFT)."""
    assert isinstance(model, Decoder)
    ids = inputs[0]
    out = model.model(input_ids=ids, use_cache=True)
    cache = getattr(out, model.cache_name)
    tokens = [out.logits[:, -1].argmax(dim=-1, keepdim=True)]
    yield tokens
    for _ in range(model.new_tokens - 1):
        out = model.model(input_ids=tokens[-1], **{model.cache_name: cache}, use_cache=True)
        cache = getattr(out, model.cache_name)
        tokens.append(out.logits[:, -1].argmax(dim=-1, keepdim=True))
        yield tokens
    yield [torch.cat(tokens, dim=1)]


def window(config: Config) -> int:
    """The engine's fixed sequence length: the prompt and every generated token but the last."""
    return config.prompt_len + config.new_tokens - 1


def export_model(model: torch.nn.Module, config: Config, path: Path) -> None:
    # A fixed sequence length: a traced Llama bakes its length into reshapes, and a fixed shape is what
    # TensorRT and ONNX Runtime optimise best. Causal attention makes the right padding harmless.
    example = torch.zeros(config.batch_size, window(config), dtype=torch.long)
    torch.onnx.export(model, (example,), str(path), input_names=["input_ids"], output_names=["logits"],
                      dynamic_axes={"input_ids": {0: "batch"}, "logits": {0: "batch"}}, dynamo=False)


# Batch shapes each module engine has decoded once (its compile then is not inference, as the engine's own
# __call__ reports it); weak, so an engine that is gone takes its entry with it.
_COMPILED: weakref.WeakKeyDictionary[InferenceEngine, set[tuple[int, ...]]] = weakref.WeakKeyDictionary()


def cached_decode(module: torch.nn.Module, prompt: torch.Tensor, config: Config, device: torch.device
                  ) -> Iterator[list[torch.Tensor]]:
    """Greedy decoding with a static KV cache through ``module`` (a Decoder, compiled or not): the prompt
    fills the cache once, then each step feeds one token at its position. Tokens come back on the CPU."""
    decoder: Decoder = module  # type: ignore[assignment]  # a compiled module forwards attributes to its Decoder
    cache = StaticCache(config=decoder.model.config, max_cache_len=config.prompt_len + config.new_tokens)
    ids = prompt.to(device)
    logits = module(ids, cache, torch.arange(config.prompt_len, device=device))
    generated = [logits[:, -1].argmax(dim=-1, keepdim=True)]
    yield [t.cpu() for t in generated]
    for i in range(config.new_tokens - 1):
        position = torch.tensor([config.prompt_len + i], device=device)
        logits = module(generated[-1], cache, position)
        generated.append(logits[:, -1].argmax(dim=-1, keepdim=True))
        yield [t.cpu() for t in generated]
    yield [torch.cat(generated, dim=1).cpu()]


def engine_forward(engine: InferenceEngine, inputs: list[torch.Tensor]
                   ) -> tuple[Iterator[list[torch.Tensor]], Callable[[], float]]:
    """Greedy decoding through the engine. An engine that exposes its compiled module decodes with the KV
    cache (cached_decode). Otherwise through its full-window forward (no cache in the exported graph): the
    prompt sits at the left of a fixed window, each new token is written after it, and the logits at the
    last filled position give the next token."""
    config: Config = engine.config  # type: ignore[assignment]
    non_inference = [0.0]  # summed over the engine calls (e.g. Inductor compiling on its first call)
    module = getattr(engine, "module", None)
    if module is not None:
        seen = _COMPILED.setdefault(engine, set())
        if tuple(inputs[0].shape) not in seen:
            # The first decode of a batch shape compiles (prefill and decode step): timed apart, as the
            # engine's own __call__ does, and not counted as inference; the batch then decodes for real.
            started = time.perf_counter()
            for _ in cached_decode(module, inputs[0], config, engine.env.device):
                pass
            non_inference[0] = time.perf_counter() - started
            seen.add(tuple(inputs[0].shape))
        return cached_decode(module, inputs[0], config, engine.env.device), lambda: non_inference[0]

    def decode() -> Iterator[list[torch.Tensor]]:
        prompt = inputs[0]
        ids = torch.zeros(prompt.shape[0], window(config), dtype=prompt.dtype)
        ids[:, :config.prompt_len] = prompt
        generated: list[torch.Tensor] = []
        for i in range(config.new_tokens):
            (logits, *_), foo = engine([ids])
            non_inference[0] += foo
            token = logits[:, config.prompt_len - 1 + i].argmax(dim=-1, keepdim=True).cpu().to(ids.dtype)
            generated.append(token)
            if i + 1 < config.new_tokens:
                ids[:, config.prompt_len + i] = token[:, 0]
            yield generated
        yield [torch.cat(generated, dim=1)]

    return decode(), lambda: non_inference[0]
