"""Model shape presets, built with transformers' own config classes: random weights in the case's precision
unless ``checkpoint_path`` names a local save_pretrained folder (then its config and weights are used)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoConfig, PretrainedConfig

from flagperf.generate.presets import PRESETS as PRESETS

DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def model_config(preset: str, checkpoint_path: str | None) -> PretrainedConfig:
    """The transformers config: the checkpoint's own, or the preset's (SDPA attention either way)."""
    if checkpoint_path is not None:
        config = AutoConfig.from_pretrained(checkpoint_path, local_files_only=True)
    else:
        p = PRESETS[preset]
        config = getattr(transformers, p.config_class)(**p.shape)
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


# Random weights served by a server process: the preset is written to a local folder once (per preset,
# precision and seed) with a tokenizer, since a server reads a model folder, never a Python object.
WORD_PREFIX = "t"  # token id i is the word "t<i>": text of n words is exactly n tokens both ways
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% if not loop.last %} {% endif %}{% endfor %}"


def word_tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer over the whole vocabulary ("t0".."t<V-1>", split on whitespace, decoded with
    spaces) and no special tokens: decoding n ids gives n words and encoding them gives the same n ids, so a
    client's count of the text's tokens equals the server's count of what it generated. Its inputs leave out
    token_type_ids (generate refuses them); its chat template joins the messages' contents with a space, so
    a chat prompt of n words is n prompt tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"{WORD_PREFIX}{i}": i for i in range(vocab_size)}
    core = Tokenizer(models.WordLevel(vocab, unk_token=f"{WORD_PREFIX}0"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with a space
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, model_input_names=["input_ids", "attention_mask"])
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def random_checkpoint(preset: str, precision: str, seed: int, root: Path, device: torch.device) -> Path:
    """The preset with random weights as a save_pretrained folder under ``root`` (made once, then reused),
    with the word tokenizer. Written to a temporary folder and renamed: a folder that exists is complete."""
    import shutil
    import tempfile

    folder = root / f"{preset}-{precision}-seed{seed}"
    if checkpoint_exists(str(folder)):
        return folder
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))
    try:
        model = build_model(preset, None, precision, device, seed)
        model.generation_config.eos_token_id = PRESETS[preset].shape.get("eos_token_id")
        model.save_pretrained(staging)
        word_tokenizer(int(model.config.vocab_size)).save_pretrained(staging)
        del model
        try:
            staging.rename(folder)
        except OSError:  # another round made it meanwhile: theirs is complete too
            if not checkpoint_exists(str(folder)):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder
