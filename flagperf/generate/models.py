"""Model shape presets, built with transformers' own config classes: random weights in the case's precision
unless ``checkpoint_path`` names a local save_pretrained folder (then its config and weights are used)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, LlamaConfig, PretrainedConfig, Qwen2Config

from flagperf.training.shapes import LLAMA_PRESETS, llama_config_kwargs, rope_kwargs

DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class Preset:
    config_class: type[PretrainedConfig]
    shape: dict[str, Any]
    note: str


# Llama-3's shapes come from the one table of them (flagperf.training.shapes), with a decoder's settings: its
# context of 8K positions, the key/value cache, Llama-3's special tokens.
_LLAMA3_TOKENS = {"bos_token_id": 128000, "eos_token_id": 128001}


def _llama3(name: str) -> dict[str, Any]:
    return {**llama_config_kwargs(LLAMA_PRESETS[name], 8192, use_cache=True), **_LLAMA3_TOKENS}


PRESETS: dict[str, Preset] = {
    "llama-3-8b": Preset(LlamaConfig, _llama3("llama-3-8b"), "Meta-Llama-3-8B shape (8.0e9 parameters)"),
    "llama-3.2-1b": Preset(LlamaConfig, _llama3("llama-3.2-1b"), "Llama-3.2-1B shape (1.2e9 parameters)"),
    "qwen2.5-7b": Preset(Qwen2Config, {"vocab_size": 152064, "hidden_size": 3584, "num_hidden_layers": 28,
                                       "num_attention_heads": 28, "num_key_value_heads": 4,
                                       "intermediate_size": 18944, **rope_kwargs(1000000.0),
                                       "max_position_embeddings": 32768, "bos_token_id": 151643,
                                       "eos_token_id": 151643},
                         "Qwen2.5-7B shape (7.6e9 parameters)"),
    # CPU tests: real decoding in milliseconds; a vocabulary wide enough for the byte tokenizer.
    "tiny": Preset(LlamaConfig, {"vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2,
                                 "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
                                 "max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": 2},
                   "a 2-layer Llama for tests"),
}


def model_config(preset: str, checkpoint_path: str | None) -> PretrainedConfig:
    """The transformers config: the checkpoint's own, or the preset's (SDPA attention either way)."""
    if checkpoint_path is not None:
        config = AutoConfig.from_pretrained(checkpoint_path, local_files_only=True)
    else:
        p = PRESETS[preset]
        config = p.config_class(**p.shape)
    config._attn_implementation = "sdpa"  # the same kernel for the engine and the bench's bare loop
    return config


def build_model(preset: str, checkpoint_path: str | None, precision: str, device: torch.device,
                seed: int = 0) -> torch.nn.Module:
    """A causal LM on ``device`` in eval mode, with no end-of-sequence token: every request decodes exactly
    max_new_tokens (random weights would otherwise stop at random places)."""
    from transformers import AutoModelForCausalLM

    dtype = DTYPE[precision]
    if checkpoint_path is not None:
        model = AutoModelForCausalLM.from_pretrained(checkpoint_path, local_files_only=True, dtype=dtype,
                                                     attn_implementation="sdpa")
        model = model.to(device)
    else:
        torch.manual_seed(seed)
        config = model_config(preset, None)
        # Initialise directly on the device in the target precision: an 8B model never exists in fp32.
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None  # the prompts are given as ids: generate adds nothing
    return model


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def checkpoint_exists(path: str | None) -> bool:
    return path is not None and (Path(path) / "config.json").is_file()
