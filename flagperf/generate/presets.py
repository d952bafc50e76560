"""The generate family's model shape presets as plain data (no torch or transformers import), so that a case's
config is checked (`flagperf validate`, a run refused) without loading either; flagperf.generate.models builds
them with transformers' own config classes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flagperf.training.shapes import LLAMA_PRESETS, llama_config_kwargs, rope_kwargs


@dataclass(frozen=True)
class Preset:
    config_class: str  # the transformers config class, by name (transformers is imported where a model is built)
    shape: dict[str, Any]
    note: str


# Llama-3's shapes come from the one table of them (flagperf.training.shapes), with a decoder's settings: its
# context of 8K positions, the key/value cache, Llama-3's special tokens.
_LLAMA3_TOKENS = {"bos_token_id": 128000, "eos_token_id": 128001}


def _llama3(name: str) -> dict[str, Any]:
    return {**llama_config_kwargs(LLAMA_PRESETS[name], 8192, use_cache=True), **_LLAMA3_TOKENS}


PRESETS: dict[str, Preset] = {
    "llama-3-8b": Preset("LlamaConfig", _llama3("llama-3-8b"), "Meta-Llama-3-8B shape (8.0e9 parameters)"),
    "llama-3.2-1b": Preset("LlamaConfig", _llama3("llama-3.2-1b"), "Llama-3.2-1B shape (1.2e9 parameters)"),
    "qwen2.5-7b": Preset("Qwen2Config", {"vocab_size": 152064, "hidden_size": 3584, "num_hidden_layers": 28,
                                         "num_attention_heads": 28, "num_key_value_heads": 4,
                                         "intermediate_size": 18944, **rope_kwargs(1000000.0),
                                         "max_position_embeddings": 32768, "bos_token_id": 151643,
                                         "eos_token_id": 151643},
                         "Qwen2.5-7B shape (7.6e9 parameters)"),
    # CPU tests: real decoding in milliseconds; a vocabulary wide enough for the byte tokenizer.
    "tiny": Preset("LlamaConfig", {"vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2,
                                   "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
                                   "max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": 2},
                     "a 2-layer Llama for tests"),
}
