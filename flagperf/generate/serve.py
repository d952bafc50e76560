"""One round of a generate case on a serving engine: the vendor's server (or a running endpoint) loaded over
the OpenAI HTTP API, point by point.

  1. the model folder: ``checkpoint_path``, or the preset with random weights saved once to a local folder
     (flagperf.generate.models.random_checkpoint) with a word tokenizer
  2. the prompts as text: synthetic (``input_len`` random tokens, ``max_new_tokens`` out), a prompts file
     (jsonl/csv, optional references), or a ShareGPT-style JSON file
  3. the server from the engine folder's command (flagperf.generate.server), its log kept as server.log in
     the round folder; or the case's ``endpoint``
  4. per point (each concurrency, then each request rate): warm-up requests, the server's Prometheus text
     before, the timed requests, the Prometheus text after (server_metrics/<label>.{before,after}.prom),
     the point's metrics (flagperf.generate.points); every request in requests.jsonl as it ends. Each phase of
     each point sends prompts of its own, never sent before in the round (a server's prefix cache, on by default
     in vLLM and SGLang, would serve a resent prompt's prefill from the cache, as MLPerf forbids): the synthetic
     set holds one prompt per request the round plans, made as the load reaches them, and where a file has fewer
     prompts than that, the resent ones are counted per point and said in the point's warning. An endpoint lives
     across rounds: a round there starts after every prompt the run's earlier rounds, attempts and retries sent it
     (the Job's prompt_positions, from their prompt_positions.json: flagperf.results.prompt_positions), and after the
     most that rounds dispatched but never collected may have sent (the Job's prompt_reservations: stream_start)
  5. the server stopped (its whole process group), also on failure

Files in the round folder: requests.jsonl, server.log, server_metrics/, serving.json (the points: label,
kind, level, window, counts, the SLO, the server's command), and at an endpoint prompt_positions.json. A server
that dies during the load fails the round as an infrastructure failure (retried) with the metrics of the points it
finished; a server that exits before it is ready, or is not ready within ``ready_timeout_s``, is a user error with
its log's tail. A point whose every timed request failed is a failed point (flagperf.generate.points): the other
points are measured, then the round fails (not retried) in one line naming it and its first error.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import copy
import hashlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import httpx
import torch
from pydantic import ValidationError

from flagperf.config.endpoints import Endpoint
from flagperf.config.engines import missing_requirements
from flagperf.config.models import CASE_FOLDER
from flagperf.errors import CaseUserError, FlagperfError, MissingExtra, extra_for
from flagperf.generate.config import GenerateConfig
from flagperf.generate.engines import EngineDef
from flagperf.generate.loadgen import (
    DRAIN_S,
    KEEPALIVE_S,
    REQUESTS_FILE,
    Load,
    PhaseRun,
    RecordWriter,
    RequestRecord,
    ServingPrompt,
    Target,
    TokenCounter,
    first_answer,
    load_client,
    run_phase,
)
from flagperf.generate.models import DTYPE, PRESETS, WORD_PREFIX, model_config, random_checkpoint
from flagperf.generate.points import (
    bundled_chunks,
    chunks_note,
    failed_point_message,
    failed_point_metrics,
    point_label,
    point_metrics,
    point_stats,
    quality_metrics,
)
from flagperf.generate.prompts import load_json, prompt_rows, read_data_text, read_prompt_text, require_rouge
from flagperf.generate.server import (
    SERVER_LOG,
    ServerFailed,
    ServerProcess,
    ServerSpec,
    scrape_metrics,
    start_server,
)
from flagperf.results.prompt_positions import (
    PROMPT_POSITIONS,
    Reservation,
    SeenReach,
    passed_over,
    write_positions,
)
from flagperf.results.schema import Failure, Metric, atomic_path

SERVING_FILE = "serving.json"
SERVER_METRICS = "server_metrics"
# Synthetic prompts a round's set holds at most (its size: one per request the round plans, or this many for duration_s
# points, whose count is not known before); past it prompts are sent again, counted and warned. They are made as the
# load reaches them (SyntheticPrompts), each phase's before it starts (a duration_s phase's estimate; the rest in a
# worker thread as it runs: PromptMaker). Measured on 2 idle cores with a byte-level BPE of
# 32k ids: 3.7 ms a prompt of 1024 tokens and 33 ms one of 8192 (two encodes and two decodes), 4.6 and 44 ms where the
# chat template is counted per prompt (a third encode); three to four times that with other work on the cores.
MAX_SYNTHETIC = 8192
SHAREGPT_MIN_TOKENS = 4  # vLLM's filter: shorter prompts or replies are left out
ENV_REFERENCE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")

log = logging.getLogger("flagperf.case.generate")


@dataclass
class ServingOutcome:
    metrics: list[Metric]
    measured_seconds: float
    prompts: str
    failure: Failure | None = None
    points: list[dict[str, Any]] = field(default_factory=list)


class Tokens:
    """The model folder's tokenizer for making and counting text, or none (an endpoint with no local
    folder: prompts are words of the word tokenizer and output tokens are counted as output chunks)."""

    def __init__(self, folder: Path | None) -> None:
        self.tokenizer: Any = None
        self.folder = folder
        self._digest: str | None = None
        if folder is not None and any((folder / name).is_file() for name in
                                      ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        # Per API: the tokens the chat template (chat) or the special tokens (completions) add to every prompt where
        # that is the same for any text, else None (each prompt is counted through the template); and how many
        # prompts the constant was checked on against the full count (it is trusted from CHECKED_PROMPTS on).
        self._overhead: dict[str, int | None] = {}
        self._checked: dict[str, int] = {}

    def count(self, text: str) -> int:
        if self.tokenizer is None:
            return len(text.split())
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def counts(self, texts: list[str]) -> list[int]:
        """``count`` of each text, in one call (a fast tokenizer encodes a batch in parallel)."""
        if self.tokenizer is None or not texts:
            return [len(text.split()) for text in texts]
        return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def counter(self) -> TokenCounter | None:
        return self.count if self.tokenizer is not None else None

    def digest(self) -> str | None:
        """The SHA-256 of the files the tokenizer was read from (tokenizer_digest), None without a tokenizer: what,
        with the vocabulary's size, decides the synthetic prompts' text, wherever the folder lies and however it is
        named (a copy, a link, a relative path)."""
        if self.tokenizer is None or self.folder is None:
            return None
        if self._digest is None:
            self._digest = tokenizer_digest(self.folder, self.tokenizer)
        return self._digest

    def clone(self) -> Tokens:
        """The same counts from a tokenizer of its own: for a worker thread that makes prompts, while a phase's counting
        thread counts outputs with this one (a fast tokenizer used from two threads at once raises "Already
        borrowed")."""
        twin = copy.copy(self)
        twin.tokenizer = copy.deepcopy(self.tokenizer)
        twin._overhead, twin._checked = dict(self._overhead), dict(self._checked)
        return twin

    def sent_count(self, text: str, api: str) -> int | None:
        """The prompt's tokens as a server with this tokenizer counts them: chat, the user message through the chat
        template with the generation prompt (as vLLM, SGLang and transformers serve apply it); completions, the text
        with the tokenizer's special tokens (a BOS). None where the client cannot tell (no tokenizer, no template)."""
        return self.sent_counts([text], api)[0]

    def sent_counts(self, texts: list[str], api: str, counts: list[int] | None = None) -> list[int | None]:
        """``sent_count`` of each text, in one call. With ``counts`` (each text's ``count``), a template whose added
        tokens are the same for any text (``overhead``) costs no encode: count + its tokens, once the constant held
        on CHECKED_PROMPTS prompts counted in full."""
        if self.tokenizer is None or not texts:
            return [None] * len(texts)
        overhead = self.overhead(api) if counts is not None else None
        if counts is not None and overhead is not None and self._checked.get(api, 0) >= CHECKED_PROMPTS:
            return [n + overhead for n in counts]
        exact = self._sent_in_full(texts, api)
        if counts is not None and overhead is not None:
            if all(e == n + overhead for e, n in zip(exact, counts, strict=True)):
                self._checked[api] = self._checked.get(api, 0) + len(texts)
            else:  # the tokenizer's pipeline treats the text differently inside the template: in full from now on
                self._overhead[api] = None
        return exact

    def _sent_in_full(self, texts: list[str], api: str) -> list[int | None]:
        from jinja2 import TemplateError  # transformers renders chat templates with jinja2

        try:
            if api == "chat":
                rendered = self.tokenizer.apply_chat_template([[{"role": "user", "content": t}] for t in texts],
                                                              tokenize=False, add_generation_prompt=True)
                # The rendered template holds its special tokens as text: encoded without adding more, as
                # apply_chat_template(tokenize=True) and the servers do.
                ids = self.tokenizer(list(rendered), add_special_tokens=False)["input_ids"]
            else:
                ids = self.tokenizer(texts, add_special_tokens=True)["input_ids"]
        except (ValueError, TypeError, KeyError, TemplateError):  # no chat template, or one a lone user message
            return [None] * len(texts)                                # does not fit
        return [len(row) for row in ids]

    def overhead(self, api: str) -> int | None:
        """The tokens every prompt gains as sent, where that is one number for any text; else None. Completions:
        the special tokens the tokenizer's post-processor adds (a BOS). Chat: the template renders the message as
        P + text + Q with P and Q the same for any text (checked with texts that start and end with whitespace, which
        a template that trims the message changes), P ends with an added token and Q starts with one (or is empty),
        neither of which strips whitespace next to the text: the tokenizer splits added tokens out before anything
        else, so the text is encoded on its own, as ``count`` encodes it. Llama 3's template, which trims the message
        and puts a blank line after its header, is counted per prompt."""
        if api not in self._overhead:
            self._overhead[api] = self._find_overhead(api)
        return self._overhead[api]

    def _find_overhead(self, api: str) -> int | None:
        if self.tokenizer is None:
            return None
        if api != "chat":
            return int(self.tokenizer.num_special_tokens_to_add(pair=False))
        from jinja2 import TemplateError

        probes = (" \n\tflagperf probe one\t ", "\n flagperf two \n")
        try:
            rendered = [str(self.tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                               add_generation_prompt=True)) for p in probes]
        except (ValueError, TypeError, KeyError, TemplateError):
            return None
        if rendered[0].count(probes[0]) != 1:
            return None
        head, tail = rendered[0].split(probes[0])
        if rendered[1] != head + probes[1] + tail:
            return None
        added = {str(t.content): t for t in getattr(self.tokenizer, "added_tokens_decoder", {}).values()}
        ends = next((t for c, t in added.items() if head.endswith(c)), None) if head else None
        starts = next((t for c, t in added.items() if tail.startswith(c)), None) if tail else None
        if (head and (ends is None or ends.rstrip)) or (tail and (starts is None or starts.lstrip)):
            return None
        return sum(len(self.tokenizer(part, add_special_tokens=False)["input_ids"]) for part in (head, tail) if part)

    def text(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return " ".join(f"{WORD_PREFIX}{i}" for i in ids)
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def texts(self, rows: list[list[int]]) -> list[str]:
        """``text`` of each row of ids, in one call."""
        if self.tokenizer is None or not rows:
            return [self.text(ids) for ids in rows]
        return [str(text) for text in self.tokenizer.batch_decode(rows, skip_special_tokens=True)]


# The files a tokenizer reads beside its own (the class's vocab_files_names: tokenizer.json, tokenizer.model, ...).
TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def tokenizer_digest(folder: Path, tokenizer: Any) -> str:
    """"sha256:..." over the tokenizer's files in ``folder`` that are there (TOKENIZER_FILES and its class's
    vocab_files_names), by name and content. A JSON file counts by its content, not its layout (keys sorted, no
    whitespace), and without a chat template (tokenizer_config.json's ``chat_template``): the template decides what
    is sent around a prompt, never the prompt's text. Weights and the model's config are not read."""
    names = set(TOKENIZER_FILES) | {name for name in (getattr(tokenizer, "vocab_files_names", None) or {}).values()
                                    if isinstance(name, str)}
    digest = hashlib.sha256()
    for name in sorted(names):
        path = folder / name
        if "/" in name or not path.is_file():
            continue
        data = path.read_bytes()
        if name.endswith(".json"):
            with contextlib.suppress(ValueError, RecursionError):
                parsed = json.loads(data)
                if isinstance(parsed, dict):
                    parsed.pop("chat_template", None)
                data = json.dumps(parsed, sort_keys=True, separators=(",", ":")).encode("utf-8")
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return "sha256:" + digest.hexdigest()


CHECKED_PROMPTS = 256  # prompts counted through the template in full before its constant overhead is trusted
SYNTHETIC_CHUNK = 256  # rows of random ids drawn at a time, and prompts made at a time ahead of the load
# Positions an endpoint round reserves at a time past the last one reserved, where a request reaches one the phase's
# own reservation (its count, or a duration_s phase's estimate) did not cover: one small write per this many.
RESERVE_AHEAD = 64


class PositionLedger:
    """An endpoint round's prompt_positions.json (flagperf.results.prompt_positions): the positions of the endpoint's
    prompt stream it takes, reserved before they are sent (a round killed meanwhile leaves a bound for the next
    attempt), and its end once it ends."""

    def __init__(self, path: Path, stream: str, first: int, bound: int | None = None,
                 attempt_bound: int | None = None) -> None:
        self.path, self.stream, self.first, self.bound = path, stream, first, bound
        self.attempt_bound = attempt_bound
        self.reserved = first
        write_positions(path, stream, first, first, None, bound, attempt_bound)

    def reserve(self, upto: int) -> None:
        """Positions below ``upto`` may be sent from now on."""
        if upto > self.reserved:
            self.reserved = upto
            write_positions(self.path, self.stream, self.first, upto, None, self.bound, self.attempt_bound)

    def end(self, upto: int) -> None:
        """The round sent no position from ``upto`` on."""
        write_positions(self.path, self.stream, self.first, max(self.reserved, upto), upto, self.bound,
                        self.attempt_bound)


class PromptSequence(Sequence[ServingPrompt]):
    """A round's prompts by position (from 0, or from the end when negative, or a slice), as both kinds of set give
    them; ``_at`` gives the prompt at a position within the set. An endpoint round's set has a ``ledger``: a request
    that reaches a position past what it reserved reserves RESERVE_AHEAD more before its prompt is given."""

    ledger: PositionLedger | None = None

    @overload
    def __getitem__(self, position: int) -> ServingPrompt: ...

    @overload
    def __getitem__(self, position: slice) -> list[ServingPrompt]: ...

    def __getitem__(self, position: int | slice) -> ServingPrompt | list[ServingPrompt]:
        if isinstance(position, slice):
            return [self[p] for p in range(*position.indices(len(self)))]
        if position < 0:
            position += len(self)
        if not 0 <= position < len(self):
            raise IndexError(position)
        if self.ledger is not None and self.taken(position + 1) > self.ledger.reserved:
            self.ledger.reserve(self.taken(position + 1 + RESERVE_AHEAD))
        return self._at(position)

    def _at(self, position: int) -> ServingPrompt:
        raise NotImplementedError

    @property
    def first_position(self) -> int:
        """The position of the set's first prompt in its stream (prompt_positions.json's ``first``)."""
        raise NotImplementedError

    def taken(self, count: int) -> int:
        """The position after those of the stream that the set's positions below ``count`` send."""
        raise NotImplementedError

    def reserve(self, count: int) -> None:
        """The set's positions below ``count`` may be sent from now on: reserved in the ledger, if any."""
        if self.ledger is not None:
            self.ledger.reserve(self.taken(count))

    def sent_before(self) -> set[int]:
        """Prompt indexes of this set that earlier rounds at the endpoint may have sent (their positions lie before
        the set's first, and may be the same prompt)."""
        return set()


class SyntheticPrompts(PromptSequence):
    """A round's synthetic prompts, made as the load reaches them. Prompt i of the seed's sequence is ``input_len``
    random ids (special ones left out) decoded to text, re-encoded and cut to ``input_len`` (a real tokenizer may
    merge across the cut), with the client's count of it as it is: it depends on the seed, ``input_len``, the
    vocabulary and the tokenizer, never on how many are made, since the ids are drawn from one seeded generator in
    rows of 2 x input_len, in order. Position p of the round's set is prompt ``start + p``, for p below ``size``.

    ``ensure(n)`` makes positions below n, in batches of SYNTHETIC_CHUNK (the round makes each phase's before it
    starts); a duration_s phase, whose count is an estimate, has the rest made as it runs by a PromptMaker in a
    worker thread (``make_in_thread``); the time spent making is counted in ``seconds``."""

    def __init__(self, config: GenerateConfig, tokens: Tokens, vocab_size: int, size: int, start: int = 0) -> None:
        if size < 1 or start < 0:
            raise ValueError("a prompt set has at least one prompt, from prompt 0 on")
        self.config, self.tokens, self.vocab_size = config, tokens, vocab_size
        self.size, self.start = size, start
        self.seconds = 0.0  # spent making prompts
        self.made: list[ServingPrompt] = []
        self._generator = torch.Generator().manual_seed(config.seed)
        self._special = set(getattr(tokens.tokenizer, "all_special_ids", []) or [])
        self._block: torch.Tensor | None = None  # drawn rows; those from _taken on are the next prompts'
        self._taken = 0
        self._skip = start  # rows before the round's first prompt, still to be drawn and left
        self.maker_running = False  # a PromptMaker's thread makes the prompts: none is made here meanwhile

    def __len__(self) -> int:
        return self.size

    def _at(self, position: int) -> ServingPrompt:
        if position >= len(self.made):
            self.ensure(position + 1)
        return self.made[position]

    @property
    def first_position(self) -> int:
        return self.start

    def taken(self, count: int) -> int:
        return self.start + min(count, self.size)  # past the set's size it sends its own prompts again

    def index_at(self, position: int) -> int:
        """The prompt's index in the seed's sequence (requests.jsonl's prompt_index) at ``position``."""
        return self.start + position % self.size

    def ensure(self, count: int) -> None:
        """Positions below ``count`` (at most the set's size) made, and reserved."""
        self.reserve(count)
        count = min(count, self.size)
        if len(self.made) >= count:
            return
        if self.maker_running:  # two threads would draw from one generator and use one tokenizer
            raise RuntimeError("a prompt asked for outside the PromptMaker while it runs")
        began = time.perf_counter()
        while len(self.made) < count:
            self._make(min(SYNTHETIC_CHUNK, count - len(self.made)))
        self.seconds += time.perf_counter() - began

    def make_in_thread(self, count: int) -> None:
        """``count`` more prompts (at most to the set's size), in the PromptMaker's worker thread."""
        began = time.perf_counter()
        self._make(min(count, self.size - len(self.made)))
        self.seconds += time.perf_counter() - began

    def _draw(self, rows: int) -> list[list[int]]:
        """The next ``rows`` rows of ids, drawn SYNTHETIC_CHUNK rows at a time and kept as a tensor until taken."""
        width = self.config.input_len * 2
        while self._skip:  # rows before the round's first prompt: drawn (the generator's sequence), then left
            drop = min(self._skip, SYNTHETIC_CHUNK)
            torch.randint(0, self.vocab_size, (drop, width), generator=self._generator)
            self._skip -= drop
        drawn: list[list[int]] = []
        while len(drawn) < rows:
            if self._block is None or self._taken == len(self._block):
                self._block = torch.randint(0, self.vocab_size, (SYNTHETIC_CHUNK, width), generator=self._generator)
                self._taken = 0
            take = min(rows - len(drawn), len(self._block) - self._taken)
            drawn += self._block[self._taken:self._taken + take].tolist()
            self._taken += take
        return drawn

    def _make(self, count: int) -> None:
        length, tokens = self.config.input_len, self.tokens
        texts = tokens.texts([[i for i in row if i not in self._special][:length] for row in self._draw(count)])
        if tokens.tokenizer is not None:
            encoded = tokens.tokenizer(texts, add_special_tokens=False)["input_ids"]
            texts = tokens.texts([ids[:length] for ids in encoded])
        counts = tokens.counts(texts)  # the one encode of the prompt as sent; the template's tokens are added to it
        for text, count, sent in zip(texts, counts, tokens.sent_counts(texts, self.config.api, counts), strict=True):
            self.made.append(ServingPrompt(self.start + len(self.made), text, count, self.config.max_new_tokens,
                                           sent_tokens=sent))


class FilePrompts(PromptSequence):
    """A prompts or ShareGPT file's prompts for a round that starts at position ``start`` of the stream (an endpoint's
    rounds after the first), read round and round. A position of the stream is an entry of the file (its row, its
    conversation) ``p mod entries``, each prompt's ``index``: a conversation the round's length filter leaves out
    (ShareGPT) is skipped, and its position passed, so that the positions stay the file's whatever the filter (a case
    with another ``input_len`` keeps the others' positions). The set's position q is its q-th prompt from the first at
    or after ``start``, read round and round; ``entries`` defaults to the prompts' count (every entry kept)."""

    def __init__(self, prompts: list[ServingPrompt], start: int = 0, entries: int | None = None) -> None:
        self.prompts, self.first = prompts, start
        self.entries = entries if entries is not None else len(prompts)
        indexes = [p.index for p in prompts]
        if not prompts or indexes != sorted(set(indexes)) or not 0 <= indexes[0] <= indexes[-1] < self.entries:
            raise ValueError("a file's prompts are its entries in order, at least one")
        # The first prompt at or after the start's entry; none left in this reading of the file: the next one's first.
        self.base = start - start % self.entries  # the stream position of this reading's entry 0
        self.offset = bisect.bisect_left(indexes, start % self.entries)
        if self.offset == len(prompts):
            self.base, self.offset = self.base + self.entries, 0
        self.made = prompts
        self.seconds = 0.0

    def __len__(self) -> int:
        return len(self.prompts)

    def _at(self, position: int) -> ServingPrompt:
        return self.prompts[(self.offset + position) % len(self.prompts)]

    def index_at(self, position: int) -> int:
        return self._at(position).index

    def stream_position(self, position: int) -> int:
        """The stream position of the set's ``position``."""
        readings, kept = divmod(self.offset + position, len(self.prompts))
        return self.base + readings * self.entries + self.prompts[kept].index

    @property
    def first_position(self) -> int:
        return self.first

    def taken(self, count: int) -> int:
        return self.stream_position(count - 1) + 1 if count > 0 else self.first

    def sent_before(self) -> set[int]:
        """Entries whose stream positions before the start earlier rounds may have sent (each entry sends one prompt,
        whatever the filter of the round that sent it)."""
        return {p.index for p in self.prompts if self.first >= self.entries or p.index < self.first}

    def resends(self, count: int) -> bool:
        """The set's positions below ``count`` resend a prompt earlier rounds may have sent (sent_before)."""
        earlier = self.sent_before()
        if not earlier:
            return False
        return self.first >= self.entries or self.taken(count) > self.entries + min(earlier)

    def ensure(self, count: int) -> None:
        """Every prompt is read before the round: positions below ``count`` are only reserved."""
        self.reserve(count)


ServingPromptSet = SyntheticPrompts | FilePrompts

# Prompts one call of the worker thread makes: 8 of 4096 tokens take about 0.6 s on 2 idle cores; a request that
# reaches a prompt not made yet waits for the call that makes it.
MAKE_CHUNK = 8


class PromptMaker:
    """A duration_s point's synthetic prompts made while its phases run, in a worker thread (asyncio.to_thread),
    MAKE_CHUNK at a time: up to ``goal``, and ``low_water`` past the furthest position a request has reached. The
    event loop never makes one, so no stream in flight pauses for it (made on the loop, a prompt of 4096 tokens
    stopped every stream for about 74 ms). Only the thread uses the set's tokenizer while the maker runs (the set has
    a tokenizer of its own: Tokens.clone). A request whose prompt is not made waits for it before its send is
    stamped (run_phase's ``supply``): its record's prompt_wait_s, and the point says so."""

    def __init__(self, prompts: SyntheticPrompts, low_water: int, goal: int = 0) -> None:
        self.prompts, self.low_water, self.goal = prompts, low_water, goal
        self.reached = 0
        self._busy = False  # a chunk is being made in the thread
        self._stop = False
        self._wake = asyncio.Event()
        self._progress = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def wanted(self) -> int:
        return min(len(self.prompts), max(self.goal, self.reached + self.low_water))

    def set_goal(self, goal: int) -> None:
        self.goal = goal
        self._wake.set()

    async def __aenter__(self) -> PromptMaker:
        self.prompts.maker_running = True
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, kind: object, error: object, trace: object) -> None:
        self._stop = True
        self._wake.set()
        assert self._task is not None
        try:  # a chunk being made is finished first: a thread cannot be stopped, and the set is used after
            await self._task
        except Exception:
            if error is None:
                raise
        finally:
            self.prompts.maker_running = False

    async def _run(self) -> None:
        try:
            while not self._stop:
                short = self.wanted() - len(self.prompts.made)
                if short <= 0:
                    self._wake.clear()
                    if self.wanted() <= len(self.prompts.made) and not self._stop:
                        await self._wake.wait()
                    continue
                self._busy = True
                try:
                    await asyncio.to_thread(self.prompts.make_in_thread, min(MAKE_CHUNK, short))
                finally:
                    self._busy = False
                self._notify()
        finally:
            self._notify()  # waiters see the end (an error) too

    def _notify(self) -> None:
        reached, self._progress = self._progress, asyncio.Event()
        reached.set()

    async def settle(self) -> None:
        """Returns once the chunk being made, if any, is made (one chunk: well below KEEPALIVE_S)."""
        if self._busy:
            await self._progress.wait()

    async def wait_for(self, count: int) -> float:
        """Returns once positions below ``count`` are made: the seconds waited (0.0: made already)."""
        count = min(count, len(self.prompts))
        if count > self.reached:
            self.reached = count
            self._wake.set()
        if len(self.prompts.made) >= count:
            return 0.0
        began = time.perf_counter()
        while len(self.prompts.made) < count:
            assert self._task is not None
            if self._task.done():
                self._task.result()  # the thread's error
                raise RuntimeError("the prompt maker stopped before the prompts were made")
            await self._progress.wait()
        return time.perf_counter() - began


def prompt_maker(config: GenerateConfig, load: Load, prompts: ServingPromptSet
                 ) -> contextlib.AbstractAsyncContextManager[PromptMaker | None]:
    """A duration_s point's PromptMaker (its count is an estimate), else none: a request count's prompts and a file's
    are all made before the phase."""
    if config.duration_s is None or not isinstance(prompts, SyntheticPrompts):
        return contextlib.nullcontext()
    return PromptMaker(prompts, low_water=max(MAKE_CHUNK, load.in_flight_limit or 0))


def synthetic_serving_prompts(config: GenerateConfig, tokens: Tokens, vocab_size: int, count: int
                              ) -> list[ServingPrompt]:
    """The first ``count`` prompts of the seed's sequence (SyntheticPrompts), made at once."""
    prompts = SyntheticPrompts(config, tokens, vocab_size, count)
    prompts.ensure(count)
    return prompts.made


@dataclass(frozen=True)
class PromptFile:
    """A prompts or ShareGPT file as a round reads it: its prompts (each one's ``index``: its entry in the file), how
    many entries the file has (rows, conversations; a ShareGPT conversation out of the length filter is one, but sends
    no prompt), and the SHA-256 of its text (its identity in a stream_key, wherever it lies and however it is named)."""

    prompts: list[ServingPrompt]
    entries: int
    digest: str


def text_digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_serving_prompts(config: GenerateConfig, tokens: Tokens) -> PromptFile:
    assert config.prompts_path is not None
    path = str(config.data_file("prompts_path"))
    text = read_prompt_text(path)
    rows = prompt_rows(path, text)
    if any(reference is not None for _, reference in rows):
        require_rouge()
    texts = [text for text, _ in rows]
    counts = tokens.counts(texts)
    prompts = [ServingPrompt(i, text, length, config.max_new_tokens, reference, sent_tokens=sent)
               for i, ((text, reference), length, sent) in enumerate(zip(rows, counts,
                                                                          tokens.sent_counts(texts, config.api, counts),
                                                                          strict=True))]
    return PromptFile(prompts, len(prompts), text_digest(text))


def sharegpt_prompts(path: str, tokens: Tokens, max_input: int, max_output: int, api: str = "chat"
                     ) -> list[ServingPrompt]:
    """ShareGPT-style JSON (a list of {"conversations": [{"from": "human", "value": ...}, {"from": "gpt",
    ...}]}): the first human turn is the prompt, the length of the reply after it the output length;
    prompts longer than ``max_input`` tokens are left out, outputs capped at ``max_output``."""
    return sharegpt_file(path, tokens, max_input, max_output, api).prompts


def sharegpt_file(path: str, tokens: Tokens, max_input: int, max_output: int, api: str = "chat") -> PromptFile:
    """sharegpt_prompts, each prompt's index its conversation's in the file."""
    text = read_data_text(path, "sharegpt_path")
    data = load_json(text, f"{path}: sharegpt_path")
    if not isinstance(data, list):
        raise CaseUserError(f"{path}: sharegpt_path: expected a JSON list of conversations")
    prompts: list[ServingPrompt] = []
    for number, item in enumerate(data):
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        first, reply = turns[0], turns[1]
        if not (isinstance(first, dict) and isinstance(reply, dict) and first.get("from") == "human"
                and isinstance(first.get("value"), str) and isinstance(reply.get("value"), str)):
            raise CaseUserError(f"{path}: [{number}].conversations: expected a human turn then a reply, each "
                                "with a text 'value'")
        prompt_len, output_len = tokens.count(first["value"]), tokens.count(reply["value"])
        if prompt_len < SHAREGPT_MIN_TOKENS or output_len < SHAREGPT_MIN_TOKENS or prompt_len > max_input:
            continue
        prompts.append(ServingPrompt(number, first["value"], prompt_len, min(output_len, max_output),
                                     sent_tokens=tokens.sent_count(first["value"], api)))
    if not prompts:
        raise CaseUserError(f"{path}: sharegpt_path: no conversation with a prompt of {SHAREGPT_MIN_TOKENS}-"
                            f"{max_input} tokens and a reply of at least {SHAREGPT_MIN_TOKENS}")
    return PromptFile(prompts, len(data), text_digest(text))


def model_folder(config: GenerateConfig, device: torch.device) -> Path:
    """The folder a server loads: the checkpoint, or the preset saved once with random weights."""
    if config.checkpoint_path is not None:
        return Path(config.checkpoint_path).resolve()
    from flagperf.hosts.local import default_work_root

    folder = random_checkpoint(config.model, config.precision, config.seed, default_work_root() / "generate-models",
                               device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return folder


def resolve_env(values: dict[str, str], key: str) -> dict[str, str]:
    resolved = {}
    for name, value in values.items():
        ref = ENV_REFERENCE.match(value)
        if ref and ref[1] not in os.environ:
            raise CaseUserError(f"{key}.{name}: refers to ${{{ref[1]}}}, which is not set on this host")
        resolved[name] = os.environ[ref[1]] if ref else value
    return resolved


def bearer_headers(key: str, name: str) -> dict[str, str]:
    """The Authorization header of every request; a key an HTTP header cannot carry is refused by ``name`` (the
    variable or the key that gave it), never by its value."""
    if not key or not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        raise CaseUserError(f"{name} is empty or holds spaces, line ends or other characters an HTTP header "
                            "cannot carry (not shown)")
    return {"Authorization": f"Bearer {key}"}


def server_key_headers(spec: ServerSpec, server_env: dict[str, str]) -> dict[str, str]:
    """What the client sends to a server the round starts: the key the server reads from its ``api_key_env``
    variable, in the environment it is started with (this process's, the engine's env, the case's server_env),
    given once and used by both sides; no header where the server gets none (an empty value sets none)."""
    if spec.api_key_env is None:
        return {}
    key = {**os.environ, **spec.env, **server_env}.get(spec.api_key_env, "")
    if not key:
        return {}
    return bearer_headers(key, f"the server's key variable {spec.api_key_env}")


def _spread(values: list[int]) -> dict[str, float]:
    return {"min": min(values), "mean": sum(values) / len(values), "max": max(values)}


def describe_prompts(head: str, prompts: Sequence[ServingPrompt], api: str) -> str:
    """The prompt set in words, with its token lengths (the client's counts): what a reader needs to compare a
    result with another's (``synthetic prompts (seed 0) of 16 tokens with the chat template, 16 out``). The lengths
    are of the prompt as the server counts it where the client can tell (the chat template applied; completions:
    with the tokenizer's special tokens), else of its text, said "before the chat template" for chat."""
    def lengths(values: list[int]) -> str:
        low, high = min(values), max(values)
        return f"{low}" if low == high else f"{low}-{high} (mean {sum(values) / len(values):.4g})"

    if not prompts:
        return f"{head}: none made"
    sent = [p.sent_tokens for p in prompts]
    if all(n is not None for n in sent):
        counts = [n for n in sent if n is not None]
        how = " with the chat template" if api == "chat" else " with special tokens"
    else:
        counts = [p.prompt_tokens for p in prompts]
        how = " before the chat template" if api == "chat" else ""
    return f"{head} of {lengths(counts)} tokens{how}, {lengths([p.output_len for p in prompts])} out"


def prompt_set(config: GenerateConfig, prompts: ServingPromptSet, tokens: Tokens, planned: int | None,
               unknown: Sequence[str] = ()) -> dict[str, Any]:
    """serving.json's record of what was sent: where the prompts came from, how many were made (synthetic: as the load
    reached them) or read, their token lengths (the text's own, and as the server counts the prompt where the client
    can tell), the set's size (what the round sends before it resends one), its first prompt and that prompt's
    position in the stream (an endpoint's round starts after every position the run's earlier rounds and attempts took
    there), and how many requests the round plans (None: duration_s points, not counted before). The run adds
    ``input_tokens_server`` (the server's usage), ``repeated_requests`` (requests that resent a prompt sent to the
    server before) and ``positions_taken`` (the positions of the stream the round took). ``unknown``: reservations at
    the endpoint whose round's prompts could not be worked out (stream_start): the round may resend them."""
    source = config.sharegpt_path or config.prompts_path or "synthetic"
    made = prompts.made
    sent = [p.sent_tokens for p in made if p.sent_tokens is not None]
    return {"source": source, "count": len(made), "seed": config.seed,
            "input_tokens": _spread([p.prompt_tokens for p in made]) if made else None,
            "input_tokens_sent": _spread(sent) if made and len(sent) == len(made) else None,
            "input_tokens_sent_means": ("the chat template applied, with its generation prompt" if config.api == "chat"
                                        else "the tokenizer's special tokens added"),
            "output_tokens_asked": _spread([p.output_len for p in made]) if made else None,
            "counted_with": "the model folder's tokenizer" if tokens.tokenizer is not None else
                            "words (no tokenizer: outputs counted as output chunks)",
            "set_size": len(prompts), "first_index": prompts.index_at(0), "first_position": prompts.first_position,
            "making_seconds": round(prompts.seconds, 3),
            "requests_planned": planned,
            # nor, at an endpoint, one its earlier rounds sent (a file read round and round by the run), or may have
            # (a round dispatched there whose prompts could not be worked out)
            "each_sent_once": planned is not None and planned <= len(prompts) and not unknown and not (
                isinstance(prompts, FilePrompts) and prompts.resends(planned))}


def stream_key(config: GenerateConfig, file_digest: str | None = None, tokenizer: str | None = None,
               vocab: int | None = None) -> str:
    """The prompt stream an endpoint round sends (prompt_positions.json's ``stream``): the endpoint, the model and the
    API, and what decides the prompts: a prompts or ShareGPT file by ``file_digest``, the digest of its text
    (PromptFile.digest; a file's positions are its entries, whatever the case's length filter, tokenizer or the path
    that names it); synthetic prompts by the seed, ``input_len``, the vocabulary's size (``vocab``; by default the
    checkpoint's or the preset's) and ``tokenizer``, the digest of the tokenizer's files (Tokens.digest; None: no
    tokenizer, the prompts are words), never the folder's path. Rounds, or cases, with the same stream send the same
    prompt at the same position, so each starts after every position the run took before it; a stream of other prompts
    has positions of its own."""
    assert isinstance(config.endpoint, Endpoint)
    source: dict[str, Any]
    if config.sharegpt_path is not None or config.prompts_path is not None:
        if file_digest is None:
            raise ValueError("a file's stream is keyed by its digest")
        source = {"sharegpt" if config.sharegpt_path is not None else "file": file_digest}
    else:
        if vocab is None:
            vocab = int(model_config(config.model, config.checkpoint_path).vocab_size)
        source = {"synthetic": {"seed": config.seed, "input_len": config.input_len, "vocab": vocab,
                                "tokenizer": tokenizer}}
    return json.dumps({"endpoint": config.endpoint.base_url, "model": config.endpoint.model, "api": config.api,
                       **source}, sort_keys=True)


@dataclass
class PromptSource:
    """What gives a round its prompts: a prompts or ShareGPT file as read (``listed``), or the seed's synthetic
    sequence; the words that describe it (``head``); and at an endpoint, the stream they are positions of."""

    config: GenerateConfig
    tokens: Tokens
    vocab: int
    listed: PromptFile | None
    head: str
    stream: str | None

    def prompt_set(self, start: int, planned: int | None) -> ServingPromptSet:
        """The round's set from stream position ``start``: the file's prompts from there, read round and round; or one
        synthetic prompt per request the round plans (MAX_SYNTHETIC at most, and for duration_s points), made as the
        load reaches them."""
        if self.listed is not None:
            return FilePrompts(self.listed.prompts, start, self.listed.entries)
        size = min(MAX_SYNTHETIC, planned or MAX_SYNTHETIC)
        # duration_s: made in a worker thread as the load runs (PromptMaker), with a tokenizer of its own
        tokens = self.tokens.clone() if self.config.duration_s is not None else self.tokens
        return SyntheticPrompts(self.config, tokens, self.vocab, size, start)


def vocab_size(config: GenerateConfig) -> int:
    """The vocabulary synthetic prompts are drawn from: the checkpoint's or the preset's (0 for neither: an endpoint's
    model named by the endpoint alone, whose prompts then come from a file)."""
    if config.checkpoint_path or config.model in PRESETS:
        return int(model_config(config.model, config.checkpoint_path).vocab_size)
    return 0


def prompt_source(config: GenerateConfig, tokens: Tokens, vocab: int) -> PromptSource:
    """The round's prompt source: its file read (and checked) here, before any server starts."""
    listed: PromptFile | None = None
    if config.sharegpt_path is not None:
        listed = sharegpt_file(str(config.data_file("sharegpt_path")), tokens, config.input_len,
                               config.max_new_tokens, config.api)
        head = f"{config.sharegpt_path}: {len(listed.prompts)} conversations"
    elif config.prompts_path is not None:
        listed = file_serving_prompts(config, tokens)
        head = f"{config.prompts_path}: {len(listed.prompts)} prompts"
    else:
        head = f"synthetic prompts (seed {config.seed})"
    stream = None
    if isinstance(config.endpoint, Endpoint):
        stream = stream_key(config, listed.digest if listed is not None else None, tokens.digest(), vocab)
    return PromptSource(config, tokens, vocab, listed, head, stream)


def reserved_end(source: PromptSource, config: GenerateConfig, start: int, attempts: int) -> int:
    """The position after the most a round of ``config`` (a reservation's) may have taken of ``source``'s stream from
    ``start``, in ``attempts`` attempts, each starting after what the one before reserved: per attempt, synthetic, its
    set's size; a file, the positions its planned requests reach (a ShareGPT conversation the filter leaves out is
    passed over) and the RESERVE_AHEAD a request may reserve past them; a file's duration_s round, whose count is not
    known, at least a whole reading of the file (every entry may have been sent)."""
    planned = requests_planned(config, 1)  # an endpoint's check sends the first prompt
    end = start
    for _ in range(attempts):
        if source.listed is None:
            end += min(MAX_SYNTHETIC, planned or MAX_SYNTHETIC)
            continue
        taken = FilePrompts(source.listed.prompts, end, source.listed.entries)
        end = (taken.taken(planned + RESERVE_AHEAD) if planned is not None
               else max(taken.taken(len(taken) + RESERVE_AHEAD), end + source.listed.entries))
    return end


def source_identity(config: GenerateConfig) -> tuple[Any, ...]:
    """What makes two configurations' prompt sources one (the same stream and the same length filter) without reading
    a file: the endpoint, the API, the tokenizer's folder, the file (resolved), the seed, input_len, the preset."""
    assert isinstance(config.endpoint, Endpoint)
    files = tuple(str(config.data_file(key)) if getattr(config, key) is not None else None
                  for key in ("prompts_path", "sharegpt_path"))
    checkpoint = str(Path(config.checkpoint_path).resolve()) if config.checkpoint_path else None
    return (config.endpoint.base_url, config.endpoint.model, config.api, checkpoint, files, config.seed,
            config.input_len, None if checkpoint else config.model)


@dataclass
class StreamStart:
    """Where an endpoint round starts in its stream (stream_start), and what decided it."""

    start: int
    passed: list[str] = field(default_factory=list)  # the open reservations it starts after (their files)
    # Open reservations at its endpoint, model and API whose round's prompts cannot be worked out here (their files)
    unknown: list[str] = field(default_factory=list)
    # Every open reservation's reach worked out, by id: (its stream, where a later round starts after it: what it took
    # where known, else the position after the most it may have taken)
    reaches: dict[str, tuple[str, int]] = field(default_factory=dict)


def stream_start(source: PromptSource, positions: dict[str, int], reserved: Sequence[Reservation]) -> StreamStart:
    """Where an endpoint round starts in its stream: after every position the run folder's records say was taken
    (``positions``, the Job's), and after the most each open reservation of the same stream may have taken (a round the
    controller dispatched whose records it never got: Job.prompt_reservations). That is its reach where the controller
    kept it (the round's own records: their stream, and what its attempts took where they had all ended when read,
    else their bound); else it is worked out from the reservation: its round
    started where its own job said (its ``positions``, and the reservations it started after, closed ones too), worked
    out the same way, and may have taken what its planned requests reach from there, in each of its attempts
    (reserved_end). One at this endpoint, model and API whose round's prompts cannot be worked out here (its case or
    its files missing on this host) is said in ``unknown``: its prompts may be resent."""
    stream = source.stream
    assert stream is not None
    by_id = {r.id: r for r in reserved}
    mine = source_identity(source.config)
    sources: dict[str, PromptSource] = {}
    # By id: (stream, bound, upto): the bound (where a reservation that started after it started: its round was
    # dispatched before this one's taken may have been known) and upto (where this round starts: taken where known).
    # None: at another endpoint, model or API; or not known.
    reaches: dict[str, tuple[str, int, int] | None] = {}
    configured: dict[str, tuple[str, int, int] | None] = {}  # the same, worked out from configurations alone
    unknown: set[str] = set()  # ids at this endpoint, model and API (or where that cannot be told) not known here

    def elsewhere(reservation: Reservation) -> bool:
        """At another endpoint, model or API, by its configuration as written (one that cannot be read may be here)."""
        endpoint, api = reservation.config.get("endpoint"), reservation.config.get("api")
        if not isinstance(endpoint, dict) or not all(isinstance(v, str) for v in (endpoint.get("base_url"),
                                                                                 endpoint.get("model"), api)):
            return False
        return (endpoint["base_url"].rstrip("/"), endpoint["model"], api) != mine[:3]

    def source_of(reservation: Reservation) -> tuple[PromptSource, GenerateConfig] | None:
        """Its round's prompt source, or None at another endpoint, model or API; raises where it cannot be read."""
        from flagperf.config.cases import load_case

        config = GenerateConfig.model_validate(reservation.config,
                                               context={CASE_FOLDER: load_case(reservation.case).folder})
        if not isinstance(config.endpoint, Endpoint) or (config.endpoint.base_url, config.endpoint.model,
                                                         config.api) != mine[:3]:
            return None  # another endpoint, or another API there: another stream
        identity = source_identity(config)
        if identity == mine:
            return source, config
        key = json.dumps(identity, default=str)
        if key not in sources:
            folder = Path(config.checkpoint_path).resolve() if config.checkpoint_path else None
            sources[key] = prompt_source(config, Tokens(folder), vocab_size(config))
        return sources[key], config

    def reach_of(reservation: Reservation) -> tuple[str, int, int] | None:
        if reservation.id in reaches:
            return reaches[reservation.id]
        if reservation.reach is not None:  # its round's own records say: its bound, and what it took where known
            reach = reservation.reach
            reaches[reservation.id] = (reach.stream, reach.end, reach.upto)
            return reaches[reservation.id]
        return worked_out(reservation)

    def worked_out(reservation: Reservation) -> tuple[str, int, int] | None:
        """Its reach from its configuration, from where its round started (what its job saw of the reservations it
        started after; of one it worked out, that worked out again, and no lower than its kept bound)."""
        if reservation.id in configured:
            return configured[reservation.id]
        configured[reservation.id] = None  # while worked out (ids only point back in time: no loop in a run's own)
        if elsewhere(reservation):
            return None
        try:
            found = source_of(reservation)
        except (FlagperfError, ValidationError, OSError, ValueError) as exc:
            passed_over(reservation.where, "its round's prompts cannot be worked out here: "
                                           f"{' '.join(str(exc).split())[:300]}")
            unknown.add(reservation.id)
            return None
        if found is None:
            return None
        own = found[0].stream
        assert own is not None
        begin = reservation.positions.get(own, 0)
        for earlier in reservation.after:
            seen = reservation.seen.get(earlier)
            if isinstance(seen, SeenReach):  # its job read that one's kept reach: its round started after it
                if seen.stream == own:
                    begin = max(begin, seen.upto)
                continue
            if earlier not in by_id:  # unreadable (warned): what the run folder's records say instead
                begin = max(begin, positions.get(own, 0))
                continue
            # Its job worked it out from its configuration (or a reservation from before ``seen`` was written): worked
            # out again, and no lower than its bound kept since (not what it took: that became known only later)
            end = worked_out(by_id[earlier])
            if earlier in unknown:  # where it started is not known either
                unknown.add(reservation.id)
                return None
            kept = by_id[earlier].reach
            for reach in (end, (kept.stream, kept.end) if kept is not None else None):
                if reach is not None and reach[0] == own:
                    begin = max(begin, reach[1])
        bound = reserved_end(found[0], found[1], begin, reservation.attempts)
        configured[reservation.id] = (own, bound, bound)
        return configured[reservation.id]

    begun = StreamStart(positions.get(stream, 0))
    for reservation in reserved:
        if not reservation.open:
            continue
        reach = reach_of(reservation)
        if reach is None:
            if reservation.id in unknown:
                begun.unknown.append(reservation.where)
            continue
        begun.reaches[reservation.id] = (reach[0], reach[2])
        if reach[0] == stream and reach[2] > begun.start:
            begun.start = reach[2]
            begun.passed.append(reservation.where)
    return begun


def timed_ahead(config: GenerateConfig, load: Load, warm: PhaseRun | None) -> int:
    """Prompts made before a point's timed phase: its ``requests``; for duration_s an estimate of what it sends,
    generous so that none is made while requests are in flight: an open loop's expected arrivals (R x duration) with
    a margin for the draw, a closed loop twice the rate its warm-up completed requests at (0 before the warm-up, or
    without one: then its prompts are made as it reaches them, and its warning says so)."""
    if config.requests is not None:
        return config.requests
    assert config.duration_s is not None
    if load.rate is not None:
        expected = load.rate * config.duration_s
        return math.ceil(1.25 * expected + 4 * math.sqrt(expected / min(1.0, load.burstiness))) + 1
    if warm is None or not warm.records or warm.seconds <= 0:
        return 0
    return math.ceil(2 * len(warm.records) / warm.seconds * config.duration_s) + (load.concurrency or 0)


def requests_planned(config: GenerateConfig, first_prompt: int) -> int | None:
    """Every request the round sends with a prompt of the set: ``first_prompt`` (the readiness or endpoint check),
    then each point's warm-up and timed requests; None where a point runs for duration_s (not counted before)."""
    if config.requests is None:
        return None
    return first_prompt + sum(warmup_count(config, load) + config.requests for load in points(config))


def client_settings(config: GenerateConfig, spec: ServerSpec) -> dict[str, Any]:
    """What every request carried and how the load was run (flagperf.generate.loadgen's client)."""
    return {"client": "flagperf.generate.loadgen (httpx, streamed)", "api": config.api, "stream": True,
            "include_usage": True, "temperature": 0.0, "max_tokens": config.max_new_tokens,
            "exact_output_fields": (spec.exact_output_fields(config.max_new_tokens) if config.exact_output
                                    else None),
            "requests": config.requests, "duration_s": config.duration_s, "warmup_requests": config.warmup_requests,
            "burstiness": config.burstiness, "max_concurrency": config.max_concurrency,
            "request_timeout_s": config.request_timeout_s, "seed": config.seed,
            "prompts_per_phase": "each phase of each point its own prompts, in order from where the last phase's "
                                 "ended (none resent while the prompt set lasts); at an endpoint, a round after every "
                                 "prompt the run's earlier rounds and attempts sent there (prompt_positions.json), "
                                 "and after the most rounds never collected may have sent (their reservations)",
            "connections": "one client per point, its connections kept open from the warm-up to the timed requests; "
                           f"one idle for {KEEPALIVE_S:g} s closed (below uvicorn's 5 s) and opened again; a response "
                           f"read to its end after its [DONE] (at most {DRAIN_S:g} s, outside the request's time and "
                           "its place in the load) so that its connection serves the next; a request whose kept-alive "
                           "connection the server closed before any response sent once more on a fresh connection, "
                           "timed from its first send, the failed try included"}


def model_record(config: GenerateConfig, folder: Path | None) -> dict[str, Any]:
    """The model measured: the preset or checkpoint the round's server loads; at an endpoint, the name the requests
    carry (what it loaded and in which precision is the endpoint's; ``checkpoint_path`` is then the tokenizer's)."""
    at_endpoint = isinstance(config.endpoint, Endpoint)
    return {"model": config.endpoint.model if isinstance(config.endpoint, Endpoint) else config.model,
            "checkpoint_path": config.checkpoint_path, "precision": None if at_endpoint else config.precision,
            "seed": config.seed, "folder": str(folder) if folder is not None else None,
            "revision": snapshot_revision(folder), "served_by": "the endpoint" if at_endpoint else "the round"}


def snapshot_revision(folder: Path | None) -> str | None:
    """The commit of a Hugging Face cache snapshot (``.../snapshots/<commit>/``), the model's revision; None for
    any other folder."""
    if folder is None:
        return None
    parts = folder.parts
    return parts[-1] if len(parts) > 1 and parts[-2] == "snapshots" and re.fullmatch(r"[0-9a-f]{40}",
                                                                                       parts[-1]) else None


def package_versions(engine: EngineDef) -> dict[str, str | None]:
    """The installed versions of the packages the engine's server needs (its engine.yaml ``requires``)."""
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for requirement in engine.manifest.requires:
        try:
            found[requirement.pip] = version(requirement.pip)
        except (PackageNotFoundError, ValueError):
            found[requirement.pip] = None
    return found


def check_requirements(engine: EngineDef) -> None:
    """The packages the engine's server needs, as a one-line error naming the extra or the package."""
    missing = missing_requirements(engine.manifest)
    for requirement in missing:
        found = extra_for(requirement.import_name, "generate")
        if found:
            raise MissingExtra(*found, f"engine {engine.manifest.name} ({engine.source})")
    if missing:
        raise CaseUserError(f"engine {engine.manifest.name} ({engine.source}) needs the Python package(s) "
                            f"{', '.join(r.pip for r in missing)}: not installed on this host")


def points(config: GenerateConfig) -> list[Load]:
    loads = [Load(point_label(concurrency=c), concurrency=c, seed=config.seed) for c in config.concurrency]
    loads += [Load(point_label(rate=r), rate=r, burstiness=config.burstiness, max_concurrency=config.max_concurrency,
                   seed=config.seed) for r in config.request_rates]
    return loads


def warmup_count(config: GenerateConfig, load: Load) -> int:
    """InferenceX's 2 x C warm-up requests; a rate point: 2 x its in-flight limit, else 2 x ceil(rate)."""
    if config.warmup_requests is not None:
        return config.warmup_requests
    level = load.in_flight_limit or math.ceil(load.rate or 1.0)
    return 2 * level


def write_json(path: Path, data: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def run_serving(config: GenerateConfig, engine: EngineDef, device: torch.device, out_dir: Path,
                round_number: int = 1, attempt: int = 1, positions: dict[str, int] | None = None,
                earlier_attempts: int = 0, reservations: Sequence[Reservation] = ()) -> ServingOutcome:
    """The round (its ``attempt``; ``earlier_attempts`` of it by earlier flow runs of the run, which a retry of the run
    runs again). At an endpoint its prompts start at ``positions``' entry for its stream (stream_key): after every
    prompt the run's earlier rounds and attempts sent there (flagperf.results.prompt_positions), and after the most each
    of the ``reservations`` of its stream may have sent (rounds dispatched whose records the run folder lacks)."""
    spec = engine.server
    assert spec is not None
    if isinstance(config.endpoint, str):  # the plan puts the inventory's entry in its place; a job without it
        raise CaseUserError(f"endpoint {config.endpoint!r}: no inventory named it (run with the inventory that "
                            "lists it under endpoints)")
    if config.endpoint is None:
        check_requirements(engine)
    folder = model_folder(config, device) if config.endpoint is None or config.checkpoint_path else None
    tokens = Tokens(folder)
    # The readiness request (a server that loads its model at the first one) or the endpoint's check sends the
    # first prompt: the points start after it, so that no timed request resends it.
    first_prompt = 1 if config.endpoint is not None or spec.ready_request else 0
    planned = requests_planned(config, first_prompt)
    source = prompt_source(config, tokens, vocab_size(config))
    # A server the round starts is new each round: every round sends the same prompts (a repeat of the measurement).
    stream, head = source.stream, source.head
    begun = stream_start(source, positions or {}, reservations) if stream is not None else StreamStart(0)
    start, passed = begun.start, begun.passed
    prompts = source.prompt_set(start, planned)
    # The most this attempt and the round's later ones may take (max_retries + 1 in all), in its records before any
    # request: the controller keeps it beside the round's reservation, so that no later round has to work it out.
    bound = reserved_end(source, config, start, max(1, config.max_retries + 2 - attempt)) if stream else None
    # This attempt's own share of it: a retry starts after it where this attempt's end was not seen (it may still send)
    attempt_bound = reserved_end(source, config, start, 1) if stream else None
    prompts.ensure(max(first_prompt, 1))  # a tokenizer that cannot make them fails before the server starts
    if planned is not None and planned > len(prompts):
        log.warning("the round sends %d requests and the prompt set has %d prompts: past the end, prompts are sent "
                    "again (a server's prefix cache may serve them; each point's warning counts its resent ones)",
                    planned, len(prompts))
    if passed:
        log.warning("round %d at an endpoint, attempt %d: its prompts start at position %d of its prompt stream "
                    "(prompt %d), after the most that %d round(s) the controller dispatched there, and whose records "
                    "the run folder does not hold (interrupted before they were collected), may have sent: their "
                    "reservations %s", round_number, attempt, start, prompts.index_at(0), len(passed),
                    ", ".join(passed))
    elif stream is not None and (attempt > 1 or earlier_attempts):
        log.warning("round %d at an endpoint, attempt %d%s: its prompts start at position %d of its prompt stream "
                    "(prompt %d), after every prompt the run's earlier rounds and attempts sent there (the endpoint's "
                    "prefix cache may hold those)", round_number, attempt,
                    f" (a retry of the run: {earlier_attempts} earlier attempt(s) of this round)" if earlier_attempts
                    else "", start, prompts.index_at(0))
    elif start:
        log.info("round %d at an endpoint: its prompts start at position %d of its prompt stream (prompt %d), after "
                 "those the run's earlier rounds sent there", round_number, start, prompts.index_at(0))
    if begun.unknown:
        log.warning("round %d at an endpoint: %d round(s) the controller dispatched to the same endpoint, model and "
                    "API, whose records the run folder does not hold, cannot be worked out here (their reservations "
                    "%s): this round may resend prompts they sent (serving.json: prompt_set.each_sent_once false, "
                    "unknown_reservations)", round_number, len(begun.unknown), ", ".join(begun.unknown))
    if isinstance(prompts, FilePrompts) and prompts.resends(planned or 0):
        log.warning("the run's earlier rounds and attempts sent the endpoint positions up to %d of this file of %d "
                    "entries, read round and round: this round resends prompts they sent (the endpoint's prefix cache "
                    "may serve them; each point's warning counts its resent ones)", start, prompts.entries)
    references = {p.index: p.reference for p in prompts.made if p.reference is not None}
    server: ServerProcess | None = None
    summary: dict[str, Any] = {
        "engine": engine.manifest.name, "api": config.api, "devices": config.devices, "slo": config.slo.model_dump(),
        "prompts": describe_prompts(head, prompts.made, config.api),
        "prompt_set": {**prompt_set(config, prompts, tokens, planned, begun.unknown), "stream": stream,
                       "after_reservations": passed, "unknown_reservations": begun.unknown,
                       "reservation_reaches": [{"id": rid, "stream": reach[0], "upto": reach[1]}
                                               for rid, reach in begun.reaches.items()]},
        "model": model_record(config, folder),
        "client": client_settings(config, spec), "points": []}
    try:
        if config.endpoint is None:
            assert folder is not None
            fields = {"model_dir": str(folder), "dtype": spec.dtypes.get(config.precision, config.precision),
                      "tensor_parallel": config.tensor_parallel}
            server_env = resolve_env(config.server_env, "server_env")
            headers = server_key_headers(spec, server_env)  # checked before the server starts
            log.info("starting the %s server for %s (%s)", engine.manifest.name, folder, DTYPE[config.precision])
            try:
                server = start_server(spec, fields, config.server_args, server_env, out_dir / SERVER_LOG,
                                      config.ready_timeout_s)
            except ServerFailed as exc:
                if exc.user:
                    raise CaseUserError(str(exc)) from None
                return ServingOutcome([], 0.0, summary["prompts"], Failure(kind="infrastructure", message=str(exc)))
            log.info("server ready at %s: %s", server.base_url, " ".join(server.argv))
            summary["server"] = {"argv": server.argv, "base_url": server.base_url,
                                 "packages": package_versions(engine), "prefix_cache": spec.prefix_cache}
            base_url, model = server.base_url, _render_model(spec, fields)
        else:
            base_url, model = config.endpoint.base_url, config.endpoint.model
            headers = {}
            if config.endpoint.api_key is not None:
                key = resolve_env({"api_key": config.endpoint.api_key}, "endpoint")["api_key"]
                headers = bearer_headers(key, f"endpoint.api_key: {config.endpoint.api_key}")
            summary["endpoint"] = {"base_url": base_url, "model": model}
        target = Target(base_url=base_url, model=model, api=config.api, headers=headers,
                        exact_fields=spec.exact_output_fields if config.exact_output else None,
                        request_timeout_s=config.request_timeout_s)
        if server is not None and spec.ready_request:
            error = first_answer(target, prompts[0], config.ready_timeout_s)
            if error is not None:
                if server.exited() is not None:
                    raise CaseUserError(server.failure("before its first answer", name_error=True))
                raise CaseUserError(f"the server answered no request within {config.ready_timeout_s:g} s "
                                    f"(ready_timeout_s; server.ready_request): {error}")
        return _run_points(config, spec, target, server, prompts, references, tokens, out_dir, head, summary,
                           first_prompt, planned, stream, bound, attempt_bound)
    finally:
        if server is not None:
            server.stop()
            log.info("server stopped (exit %s); its log: %s", server.process.returncode, SERVER_LOG)


def _render_model(spec: ServerSpec, fields: dict[str, Any]) -> str:
    from flagperf.generate.server import render

    return str(render(spec.request_model, {**fields, "host": "", "port": 0, "python": ""}))


LATE_RATE_SHARE = 0.95  # an open loop that sent below this share of its drawn arrival rate is flagged


def send_rate(load: Load, records: list[RequestRecord]) -> dict[str, Any] | None:
    """An open-loop point's rates: asked (R), drawn (the arrival times the gamma process drew for these requests,
    which vary around R by chance: about 1/sqrt(n) for n Poisson arrivals), and achieved (the sends as they
    happened), each (n - 1) / (last - first); and the queue waits (a max_concurrency slot, or a client running
    late). None for a closed loop."""
    if load.rate is None:
        return None
    sends = sorted(r.send_offset_s for r in records if r.send_offset_s is not None)
    drawn = sorted(r.scheduled_offset_s for r in records if r.scheduled_offset_s is not None)
    waits = [r.queue_wait_s for r in records if r.queue_wait_s is not None]

    def rate(times: list[float]) -> float | None:
        return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else None

    return {"asked": load.rate, "drawn": rate(drawn), "achieved": rate(sends),
            "queue_wait_s": {"mean": sum(waits) / len(waits), "max": max(waits)} if waits else None}


def late_sends(rates: dict[str, Any] | None) -> str | None:
    """The caution of an open loop that sent slower than its own draw of arrivals: the load offered was not the
    one asked (compared with the draw, not with R, which a short draw misses by chance)."""
    if rates is None or rates["drawn"] is None or rates["achieved"] is None:
        return None
    if rates["achieved"] >= LATE_RATE_SHARE * rates["drawn"]:
        return None
    return (f"sent at {rates['achieved']:.4g} requests/s, under {LATE_RATE_SHARE:.0%} of the {rates['drawn']:.4g} "
            f"requests/s its arrivals were drawn at (asked {rates['asked']:g}): requests waited for a max_concurrency "
            f"slot or the client fell behind (queue_wait_s in {REQUESTS_FILE})")


def resent(records: list[RequestRecord], sent: set[int]) -> int:
    """Requests (in sending order) whose prompt was sent before in the round; their prompts join ``sent``."""
    count = 0
    for record in sorted(records, key=lambda r: r.seq):
        count += record.prompt_index in sent
        sent.add(record.prompt_index)
    return count


@dataclass
class PointRun:
    warm: PhaseRun | None
    run: PhaseRun
    made_ahead: int  # prompts made before the timed phase began (its requests, or a duration_s estimate)
    made_during: int  # prompts made (in the PromptMaker's thread) while the timed phase ran
    making_seconds: float  # the client's time making those


async def _measure_point(config: GenerateConfig, spec: ServerSpec, target: Target, load: Load,
                         prompts: ServingPromptSet, first_prompt: int, writer: RecordWriter, tokens: Tokens,
                         alive: Callable[[], bool], scraper: httpx.Client, scrape_dir: Path) -> PointRun:
    """A point's warm-up and timed phases on one client (the warm-up's connections serve the timed requests where
    they were not idle past the client's keep-alive), each with prompts of its own from ``first_prompt`` on, made
    before the phase (a duration_s phase's estimate, the rest in a worker thread as it runs); the server's metrics
    scraped between them."""
    warmups = warmup_count(config, load)
    ahead = timed_ahead(config, load, None)
    closed_for_duration = config.duration_s is not None and load.rate is None
    # Before the client opens a connection: a closed loop's duration_s has no estimate yet, its first few are made.
    prompts.ensure(first_prompt + warmups + (max(MAKE_CHUNK, load.concurrency or 0) if closed_for_duration
                                             else ahead))
    async with load_client(load, target) as client, prompt_maker(config, load, prompts) as maker:
        warm = None
        if maker is not None and closed_for_duration:
            # Its estimate needs the warm-up's rate: made while the warm-up runs, as many as it gives time for, and
            # the rest while the timed requests run, never in a pause between them (one past KEEPALIVE_S would close
            # the warm-up's connections, and the first timed requests' TTFT would hold their set-up).
            maker.set_goal(len(prompts))
        if warmups:
            warm = await run_phase(target, load, prompts, "warmup", requests=warmups, duration_s=None, writer=writer,
                                   count_tokens=tokens.counter(), keep_going=alive, first_prompt=first_prompt,
                                   client=client, supply=maker)
        timed_first = first_prompt + (len(warm.records) if warm else 0)
        # Reserved before the timed requests (its count, or a duration_s phase's estimate), not while they run.
        prompts.reserve(timed_first + timed_ahead(config, load, warm))
        if maker is not None:
            maker.set_goal(timed_first + timed_ahead(config, load, warm))
            await maker.settle()  # the warm-up's last chunk: made before the timed requests, not beside them
        made, seconds = len(prompts.made), prompts.seconds
        _save_scrape(scraper, target.base_url, spec.metrics_path, scrape_dir, f"{load.label}.before.prom")
        run = await run_phase(target, load, prompts, "timed", requests=config.requests, duration_s=config.duration_s,
                              writer=writer, count_tokens=tokens.counter(), keep_going=alive,
                              first_prompt=timed_first, client=client, supply=maker)
    return PointRun(warm, run, made - timed_first, len(prompts.made) - made, prompts.seconds - seconds)


def made_late(point: PointRun) -> str | None:
    """The caution of a duration_s point whose prompts were still being made while its timed requests ran."""
    if not point.made_during:
        return None
    return (f"{point.made_during} prompts were made while the timed requests ran, past the {point.made_ahead} made "
            f"before them (duration_s: an estimate), {point.making_seconds:.3g} s of making in a worker thread: the "
            "client's host did that work beside the load")


def waited_for_prompts(records: list[RequestRecord]) -> str | None:
    """The caution of a point whose requests waited for their prompts to be made: meanwhile fewer were in flight (or
    sent) than the load asks, so its latencies are of a lighter load than the point's label says."""
    waits = [r.prompt_wait_s for r in records if r.prompt_wait_s]
    if not waits:
        return None
    return (f"{len(waits)} of {len(records)} timed requests waited for their prompt to be made ({sum(waits):.3g} s "
            f"in all, at most {max(waits):.3g} s; prompt_wait_s in {REQUESTS_FILE}), before their send: meanwhile "
            "fewer requests were in flight than the load asks, so the latencies are of a lighter load")


def _run_points(config: GenerateConfig, spec: ServerSpec, target: Target, server: ServerProcess | None,
                prompts: ServingPromptSet, references: dict[int, str], tokens: Tokens, out_dir: Path, head: str,
                summary: dict[str, Any], first_prompt: int, planned: int | None, stream: str | None,
                bound: int | None = None, attempt_bound: int | None = None) -> ServingOutcome:
    metrics: list[Metric] = []
    failed_points: list[str] = []  # one line each: the point and its first error
    measured = 0.0
    writer = RecordWriter(out_dir / REQUESTS_FILE)
    scrape_dir = out_dir / SERVER_METRICS
    alive = (lambda: server.exited() is None) if server is not None else (lambda: True)
    cursor = first_prompt  # the position of the next prompt to send: each phase takes its own, in order
    if stream is not None:  # an endpoint: the positions it takes are recorded before they are sent
        prompts.ledger = PositionLedger(out_dir / PROMPT_POSITIONS, stream, prompts.first_position, bound,
                                        attempt_bound)
        prompts.reserve(first_prompt)
    # Prompts sent so far: those earlier rounds at the endpoint may have sent, then the check's, then the points'.
    sent = prompts.sent_before() | {prompts.index_at(p) for p in range(first_prompt)}
    repeated_total = 0
    reconnects = 0  # requests sent again on a fresh connection (RequestRecord.reconnected_after), all phases
    server_prompt_tokens: list[int] = []  # the server's usage.prompt_tokens of the timed requests

    def save() -> None:  # serving.json, with the prompts made so far; the positions the round took, to the cursor
        summary["prompts"] = describe_prompts(head, prompts.made, config.api)
        summary["prompt_set"] = {**summary["prompt_set"],
                                 **prompt_set(config, prompts, tokens, planned,
                                              summary["prompt_set"].get("unknown_reservations", [])),
                                 "repeated_requests": repeated_total,
                                 "positions_taken": prompts.taken(cursor) - prompts.first_position,
                                 "input_tokens_server": _spread(server_prompt_tokens) if server_prompt_tokens else None}
        summary["reconnects"] = reconnects
        write_json(out_dir / SERVING_FILE, summary)
        if prompts.ledger is not None:
            prompts.ledger.end(prompts.taken(cursor))

    try:
        if server is None:
            try:
                check_endpoint(config, target, prompts[0], writer, tokens.counter())
            except CaseUserError:
                summary["failed_point"] = CHECK_POINT
                save()
                raise
            summary["endpoint"].update(version=small_json(target, "/version"), models=served_models(target))
        with httpx.Client() as scraper:
            for load in points(config):
                point = asyncio.run(_measure_point(config, spec, target, load, prompts, cursor, writer, tokens,
                                                   alive, scraper, scrape_dir))
                warm, run = point.warm, point.run
                warm_records = warm.records if warm is not None else []
                warm_first, timed_first = cursor, cursor + len(warm_records)
                cursor = timed_first + len(run.records)
                repeated_total += resent(warm_records, sent)
                repeated = resent(run.records, sent)
                repeated_total += repeated
                point_reconnects = sum(1 for r in run.records if r.reconnected_after)
                reconnects += point_reconnects + sum(1 for r in warm_records if r.reconnected_after)
                if server is not None and server.exited() is not None:
                    message = f"point {load.label}: {server.failure('during the load')}"
                    log.error("%s", message)
                    summary["failed_point"] = load.label
                    save()
                    return ServingOutcome(metrics, measured, summary["prompts"], Failure(kind="infrastructure",
                                                                                         message=message))
                _save_scrape(scraper, target.base_url, spec.metrics_path, scrape_dir, f"{load.label}.after.prom")
                measured += run.seconds
                stats = point_stats(load.label, run.records, run.seconds, config.slo)
                note = (f"closed loop, {load.concurrency} in flight" if load.concurrency is not None else
                        f"open loop, {load.rate:g} requests/s, burstiness {load.burstiness:g}"
                        + (f", at most {load.max_concurrency} in flight" if load.max_concurrency else ""))
                rates = send_rate(load, run.records)
                latency_cautions = [c for c in (waited_for_prompts(run.records),) if c is not None]
                cautions = [c for c in (
                    (f"{repeated} of {stats.requests} timed requests resent a prompt already sent to this server (the "
                     f"prompt set has {len(prompts)}): a server's prefix cache may have served their prefill, so "
                     "their TTFT is optimistic") if repeated else None,
                    late_sends(rates), made_late(point), *latency_cautions) if c is not None]
                for caution in cautions:
                    log.warning("point %s: %s", load.label, caution)
                if (bundled := bundled_chunks(stats)) is not None:
                    log.info("point %s: %s (%s)", load.label, bundled, chunks_note(stats))
                if point_reconnects:
                    log.warning("point %s: %d timed requests found their kept-alive connection closed by the server "
                                "before any response and were sent once more on a fresh connection, each timed from "
                                "its first send, the failed try included (reconnected_after and failed_try_s in %s)",
                                load.label, point_reconnects, REQUESTS_FILE)
                unended = run.unended + (warm.unended if warm is not None else 0)
                if unended:
                    log.warning("point %s: %d responses did not end within %g s of their [DONE] (the server kept "
                                "them open): their connections were closed, so the requests after them opened new "
                                "ones, whose set-up is in their TTFT", load.label, unended, DRAIN_S)
                if stats.failed_point:  # nothing measured: kept as failed, never as a point of the curve
                    metrics += failed_point_metrics(stats)
                    failed_points.append(failed_point_message(stats))
                    log.error("%s (every one in %s)", failed_points[-1], REQUESTS_FILE)
                else:
                    metrics += point_metrics(stats, (run.started_at, run.ended_at), config.devices, config.slo,
                                             note, cautions, latency_cautions)
                    metrics += quality_metrics(load.label, run.records, references)
                server_prompt_tokens += [r.prompt_tokens_usage for r in run.records
                                         if r.ok and r.prompt_tokens_usage is not None]
                summary["points"].append({
                    "label": load.label, "kind": "concurrency" if load.concurrency is not None else "rate",
                    "level": load.concurrency if load.concurrency is not None else load.rate,
                    "burstiness": load.burstiness if load.rate is not None else None,
                    "max_concurrency": load.max_concurrency, "warmup_requests": len(warm_records),
                    "window": [run.started_at, run.ended_at], "seconds": run.seconds, "requests": stats.requests,
                    "status": "failed" if stats.failed_point else "measured", "first_error": stats.first_error,
                    "failed": stats.failed, "truncated": stats.truncated, "empty": stats.empty,
                    "input_tokens": stats.input_tokens,
                    "output_tokens": stats.output_tokens, "good": stats.good,
                    "prompt_mismatches": stats.prompt_mismatched, "output_mismatches": stats.output_mismatched,
                    "warmup_first_prompt": prompts.index_at(warm_first) if warm_records else None,
                    "first_prompt": prompts.index_at(timed_first), "repeated_prompts": repeated,
                    "prompts_made_during": point.made_during,
                    "prompt_waits": sum(1 for r in run.records if r.prompt_wait_s), "reconnects": point_reconnects,
                    "unended_responses": unended,
                    "output_chunks": stats.output_chunks, "outputs_counted_in_chunks": stats.chunk_counted,
                    "tokens_per_chunk": (round(stats.tokens_per_chunk, 4) if stats.tokens_per_chunk is not None
                                         else None),
                    "early_stopping": {what: e.as_json() for what, e in (stats.early_stopping or {}).items()},
                    "mean_concurrency": (round(stats.mean_concurrency, 4) if stats.mean_concurrency is not None
                                         else None),
                    "peak_concurrency": stats.peak_concurrency,
                    "send_rate": rates})
                ttft = f"{stats.ttft.p50 * 1e3:.1f} ms" if stats.ttft else "-"
                tpot = f"{stats.tpot.p50 * 1e3:.2f} ms" if stats.tpot else "-"
                log.info("point %s: %d requests (%d failed, %d truncated) in %.2f s, %.1f output tokens/s, TTFT p50 "
                         "%s, TPOT p50 %s, goodput %d/%d", load.label, stats.requests, stats.failed, stats.truncated,
                         run.seconds, stats.output_tokens / run.seconds, ttft, tpot, stats.good, stats.requests)
                if stats.first_error is not None and not stats.failed_point:
                    log.warning("point %s: %d of %d requests failed; the first: %s (every one in %s)", load.label,
                                stats.failed, stats.requests, stats.first_error, REQUESTS_FILE)
    finally:
        writer.close()
    save()
    if isinstance(prompts, SyntheticPrompts):
        log.info("made %d synthetic prompts in %.1f s, each phase's before it (the set holds %d, from prompt %d)",
                 len(prompts.made), prompts.seconds, len(prompts), prompts.first_position)
    failure = None
    if failed_points:  # the other points are measured and kept; the round says which point failed, and why
        more = f" (and {len(failed_points) - 1} more failed point(s): see {SERVING_FILE})" if len(failed_points) > 1 \
            else ""
        failure = Failure(kind="user", message=failed_points[0] + more)
    return ServingOutcome(metrics, measured, summary["prompts"], failure=failure, points=summary["points"])


CHECK_POINT = "check"  # requests.jsonl's point and phase of an endpoint's first request
MODELS_PAGE_BYTES = 64 * 1024  # of /v1/models: what the refusal of a model name lists, read no further


def check_endpoint(config: GenerateConfig, target: Target, prompt: ServingPrompt, writer: RecordWriter,
                   count_tokens: TokenCounter | None) -> None:
    """One 1-token request before the points, as vLLM's benchmark sends one first: an endpoint that is down, a
    model name it does not serve or a key it refuses is one line naming the endpoint's key, instead of points
    whose every request failed. The request is kept in requests.jsonl (point and phase ``check``)."""
    one = ServingPrompt(prompt.index, prompt.text, prompt.prompt_tokens, 1)
    run = asyncio.run(run_phase(target, Load(CHECK_POINT, concurrency=1), [one], CHECK_POINT, requests=1,
                                duration_s=None, writer=writer, count_tokens=count_tokens))
    error = run.records[0].error if run.records else "no request was sent"
    if error is None:
        return
    assert isinstance(config.endpoint, Endpoint)
    status = re.match(r"HTTP (\d+):", error)
    if status is None:
        key, value = "endpoint.base_url", target.base_url
    elif status[1] in ("401", "403"):
        key, value = "endpoint.api_key", str(config.endpoint.api_key)
    else:
        key, value = "endpoint.model", repr(target.model)
        served = served_models(target)
        if served and target.model not in served:  # (a server may load models it does not list)
            error += f"; its /v1/models lists {', '.join(served[:8])}" + (" ..." if len(served) > 8 else "")
    raise CaseUserError(f"{key} {value}: the endpoint's first request ({target.url}) failed, so no point was "
                        f"measured: {error} (kept in {REQUESTS_FILE}, point {CHECK_POINT})")


def small_json(target: Target, path: str) -> Any:
    """The endpoint's JSON answer to GET ``path`` (its /version, /v1/models), or None where it has none; read
    no further than MODELS_PAGE_BYTES, and with the key masked wherever the answer quotes it."""
    try:
        with httpx.Client(timeout=10.0) as client, client.stream("GET", f"{target.base_url}{path}",
                                                                  headers=target.headers) as response:
            if response.status_code != 200:
                return None
            page = b""
            for part in response.iter_bytes():
                page += part
                if len(page) > MODELS_PAGE_BYTES:
                    return None
        return json.loads(target.redact(page.decode("utf-8", "replace")))
    except (httpx.HTTPError, ValueError, RecursionError):
        return None


def served_models(target: Target) -> list[str] | None:
    """The model ids of the endpoint's GET /v1/models, or None where it has no such list."""
    page = small_json(target, "/v1/models")
    data = page.get("data") if isinstance(page, dict) else None
    if not isinstance(data, list):
        return None
    return [str(m["id"])[:200] for m in data if isinstance(m, dict) and "id" in m][:64]


def _save_scrape(client: httpx.Client, base_url: str, path: str | None, folder: Path, name: str) -> None:
    text = scrape_metrics(client, base_url, path)
    if text is not None:
        folder.mkdir(exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")
