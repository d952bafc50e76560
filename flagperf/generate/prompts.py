"""Prompts: synthetic token ids of a fixed length, or a local jsonl/csv file with ``prompt`` and an optional
``reference`` (then the outputs are scored with ROUGE). Text goes through the checkpoint's tokenizer, or,
for random weights, through a byte tokenizer (one id per UTF-8 byte), so no download is ever needed."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from flagperf.config.files import read_config_text
from flagperf.errors import CaseUserError, install_command
from flagperf.generate.config import MAX_DATA_FILE_BYTES

BYTE_OFFSET = 3  # ids 0, 1, 2: pad, bos, eos (the tiny preset's), then one id per byte value


class Tokenizer(Protocol):
    pad_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """Text as UTF-8 bytes, shifted past the special ids: exact round trips, any vocabulary of >= 259 ids."""

    pad_id = 0

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 256 + BYTE_OFFSET:
            raise CaseUserError(f"the byte tokenizer needs a vocabulary of at least {256 + BYTE_OFFSET} ids "
                                f"(the model has {vocab_size})")

    def encode(self, text: str) -> list[int]:
        return [b + BYTE_OFFSET for b in text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        return bytes(i - BYTE_OFFSET for i in ids if BYTE_OFFSET <= i < 256 + BYTE_OFFSET).decode("utf-8", "replace")


class HfTokenizer:
    """A checkpoint's own tokenizer (read from the folder, never downloaded)."""

    def __init__(self, folder: str) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else (self.tokenizer.eos_token_id or 0))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=True))

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))


def tokenizer_for(checkpoint_path: str | None, vocab_size: int) -> Tokenizer:
    if checkpoint_path is not None and any((Path(checkpoint_path) / name).is_file() for name in
                                           ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return HfTokenizer(checkpoint_path)
    return ByteTokenizer(vocab_size)


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    reference: str | None = None


@dataclass(frozen=True)
class PromptSet:
    prompts: list[Prompt]
    description: str

    @property
    def has_references(self) -> bool:
        return any(p.reference is not None for p in self.prompts)


def synthetic_prompts(count: int, length: int, vocab_size: int, seed: int) -> PromptSet:
    """Random ids above the special ones: every prompt exactly ``length`` tokens."""
    g = torch.Generator().manual_seed(seed)
    low = min(BYTE_OFFSET, vocab_size - 1)
    prompts = [Prompt(torch.randint(low, vocab_size, (length,), generator=g).tolist()) for _ in range(count)]
    return PromptSet(prompts, f"{count} synthetic prompts of {length} random token ids")


def read_data_text(path: str, key: str) -> str:
    """A prompts or ShareGPT file's text, read as config files are: only a regular file (never a FIFO, a device
    or a folder; checked on the open file too) of at most MAX_DATA_FILE_BYTES; else one line naming it and key."""
    return read_config_text(Path(path), path, key, MAX_DATA_FILE_BYTES, "a prompts or ShareGPT file")


def load_json(text: str, where: str) -> object:
    """JSON text, or one CaseUserError line (also for nesting too deep for the parser)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CaseUserError(f"{where}: not JSON ({exc.msg}, line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise CaseUserError(f"{where}: not read: JSON nested too deeply") from None


def read_prompt_file(path: str) -> list[tuple[str, str | None]]:
    """(prompt, reference) rows of a jsonl or csv file; any problem is one line naming the file and the key."""
    return prompt_rows(path, read_prompt_text(path))


def read_prompt_text(path: str) -> str:
    """A prompts file's text (read_data_text), once its name says it is one (.jsonl or .csv)."""
    if Path(path).suffix not in (".jsonl", ".csv"):
        raise CaseUserError(f"{path}: prompts_path must be a .jsonl or .csv file")
    return read_data_text(path, "prompts_path")


def prompt_rows(path: str, text: str) -> list[tuple[str, str | None]]:
    """(prompt, reference) rows of a jsonl or csv file's ``text`` (read_prompt_text); any problem is one line naming
    the file and the key."""
    file = Path(path)
    rows: list[tuple[str, str | None]] = []
    if file.suffix == ".jsonl":
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                rows.append(_row(load_json(line, f"{path}: line {number}"), f"{path}: line {number}"))
    elif file.suffix == ".csv":
        try:
            reader = csv.DictReader(io.StringIO(text, newline=""))
            if reader.fieldnames is None or "prompt" not in reader.fieldnames:
                raise CaseUserError(f"{path}: prompt: the header has no 'prompt' column "
                                    f"(columns: {', '.join(reader.fieldnames or []) or 'none'})")
            for number, record in enumerate(reader, 2):
                rows.append(_row(record, f"{path}: line {number}"))
        except csv.Error as exc:
            raise CaseUserError(f"{path}: cannot read: {exc}") from None
    else:
        raise CaseUserError(f"{path}: prompts_path must be a .jsonl or .csv file")
    if not rows:
        raise CaseUserError(f"{path}: no prompts in the file")
    return rows


def _row(record: object, where: str) -> tuple[str, str | None]:
    if not isinstance(record, dict):
        raise CaseUserError(f"{where}: expected an object with a 'prompt' key")
    prompt = record.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise CaseUserError(f"{where}: prompt: missing or empty")
    reference = record.get("reference")
    if reference is not None and not isinstance(reference, str):
        raise CaseUserError(f"{where}: reference: must be text")
    return prompt, (reference or None)


def file_prompts(path: str, tokenizer: Tokenizer, max_len: int) -> PromptSet:
    """The file's prompts, each cut to its last ``max_len`` tokens (the end of a prompt is what it asks)."""
    prompts = [Prompt(tokenizer.encode(text)[-max_len:], reference) for text, reference in read_prompt_file(path)]
    lengths = [len(p.ids) for p in prompts]
    return PromptSet(prompts, f"{path}: {len(prompts)} prompts of {min(lengths)}-{max(lengths)} tokens")


def require_rouge() -> None:
    """A prompt file with references is scored: without the package that is one line, before any decoding."""
    if importlib.util.find_spec("rouge_score") is None:
        raise CaseUserError(f"the prompt file has references, and ROUGE needs the rouge-score package: "
                            f"{install_command('generate')}")


def rouge_scores(predictions: list[str], references: list[str]) -> dict[str, float]:
    """Mean ROUGE-1/2/L F1 (Google's rouge-score package, as FlagPerf's XSum case reports them)."""
    require_rouge()
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    totals = {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    for prediction, reference in zip(predictions, references, strict=True):
        scores = scorer.score(reference, prediction)
        for key in totals:
            totals[key] += scores[key].fmeasure
    return {key: value / len(predictions) for key, value in totals.items()}
