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
     in vLLM and SGLang, would serve a resent prompt's prefill from the cache, as MLPerf forbids): the prompt set
     is made as large as the round's requests (synthetic), and where a file has fewer prompts than that, the
     resent ones are counted per point and said in the point's warning
  5. the server stopped (its whole process group), also on failure

Files in the round folder: requests.jsonl, server.log, server_metrics/, serving.json (the points: label,
kind, level, window, counts, the SLO, the server's command). A server that dies during the load fails the
round as an infrastructure failure (retried) with the metrics of the points it finished; a server that
exits before it is ready, or is not ready within ``ready_timeout_s``, is a user error with its log's tail. A
point whose every timed request failed is a failed point (flagperf.generate.points): the other points are
measured, then the round fails (not retried) in one line naming it and its first error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch

from flagperf.config.endpoints import Endpoint
from flagperf.config.engines import missing_requirements
from flagperf.errors import CaseUserError, MissingExtra, extra_for
from flagperf.generate.config import GenerateConfig
from flagperf.generate.engines import EngineDef
from flagperf.generate.loadgen import (
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
    failed_point_message,
    failed_point_metrics,
    point_label,
    point_metrics,
    point_stats,
    quality_metrics,
)
from flagperf.generate.prompts import load_json, read_data_text, read_prompt_file, require_rouge
from flagperf.generate.server import (
    SERVER_LOG,
    ServerFailed,
    ServerProcess,
    ServerSpec,
    scrape_metrics,
    start_server,
)
from flagperf.results.schema import Failure, Metric, atomic_path

SERVING_FILE = "serving.json"
SERVER_METRICS = "server_metrics"
# Synthetic prompts made at most: a round of counted requests gets one per request (the check or readiness request,
# every warm-up and timed request); a round of duration_s points, whose count is not known before, gets this many.
# Beyond it prompts are sent again, counted and warned. Making them costs about 1-3 ms each at 1024 tokens (three
# batched encodes with a fast tokenizer), before the server starts.
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
        if folder is not None and any((folder / name).is_file() for name in
                                      ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)

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

    def sent_count(self, text: str, api: str) -> int | None:
        """The prompt's tokens as a server with this tokenizer counts them: chat, the user message through the chat
        template with the generation prompt (as vLLM, SGLang and transformers serve apply it); completions, the text
        with the tokenizer's special tokens (a BOS). None where the client cannot tell (no tokenizer, no template)."""
        return self.sent_counts([text], api)[0]

    def sent_counts(self, texts: list[str], api: str) -> list[int | None]:
        """``sent_count`` of each text, in one call."""
        if self.tokenizer is None or not texts:
            return [None] * len(texts)
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

    def text(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return " ".join(f"{WORD_PREFIX}{i}" for i in ids)
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def texts(self, rows: list[list[int]]) -> list[str]:
        """``text`` of each row of ids, in one call."""
        if self.tokenizer is None or not rows:
            return [self.text(ids) for ids in rows]
        return [str(text) for text in self.tokenizer.batch_decode(rows, skip_special_tokens=True)]


SYNTHETIC_CHUNK = 256  # prompts drawn, decoded and counted at a time: bounded memory, batched tokenizer calls


def synthetic_serving_prompts(config: GenerateConfig, tokens: Tokens, vocab_size: int, count: int
                              ) -> list[ServingPrompt]:
    """Random ids decoded to text, re-encoded and cut to ``input_len`` (a real tokenizer may merge across
    the cut); the client's count of each prompt is recorded as it is. Drawn in chunks from one seeded generator,
    which fills them in order: prompt i is the same whatever ``count`` is."""
    g = torch.Generator().manual_seed(config.seed)
    special = set(getattr(tokens.tokenizer, "all_special_ids", []) or [])
    prompts: list[ServingPrompt] = []
    while len(prompts) < count:
        size = min(SYNTHETIC_CHUNK, count - len(prompts))
        drawn = torch.randint(0, vocab_size, (size, config.input_len * 2), generator=g).tolist()
        texts = tokens.texts([[i for i in row if i not in special][:config.input_len] for row in drawn])
        if tokens.tokenizer is not None:
            encoded = tokens.tokenizer(texts, add_special_tokens=False)["input_ids"]
            texts = tokens.texts([ids[:config.input_len] for ids in encoded])
        for text, length, sent in zip(texts, tokens.counts(texts), tokens.sent_counts(texts, config.api),
                                      strict=True):
            prompts.append(ServingPrompt(len(prompts), text, length, config.max_new_tokens, sent_tokens=sent))
    return prompts


def file_serving_prompts(config: GenerateConfig, tokens: Tokens) -> list[ServingPrompt]:
    assert config.prompts_path is not None
    rows = read_prompt_file(str(config.data_file("prompts_path")))
    if any(reference is not None for _, reference in rows):
        require_rouge()
    texts = [text for text, _ in rows]
    return [ServingPrompt(i, text, length, config.max_new_tokens, reference, sent_tokens=sent)
            for i, ((text, reference), length, sent) in enumerate(zip(rows, tokens.counts(texts),
                                                                       tokens.sent_counts(texts, config.api),
                                                                       strict=True))]


def sharegpt_prompts(path: str, tokens: Tokens, max_input: int, max_output: int, api: str = "chat"
                     ) -> list[ServingPrompt]:
    """ShareGPT-style JSON (a list of {"conversations": [{"from": "human", "value": ...}, {"from": "gpt",
    ...}]}): the first human turn is the prompt, the length of the reply after it the output length;
    prompts longer than ``max_input`` tokens are left out, outputs capped at ``max_output``."""
    data = load_json(read_data_text(path, "sharegpt_path"), f"{path}: sharegpt_path")
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
        prompts.append(ServingPrompt(len(prompts), first["value"], prompt_len, min(output_len, max_output),
                                     sent_tokens=tokens.sent_count(first["value"], api)))
    if not prompts:
        raise CaseUserError(f"{path}: sharegpt_path: no conversation with a prompt of {SHAREGPT_MIN_TOKENS}-"
                            f"{max_input} tokens and a reply of at least {SHAREGPT_MIN_TOKENS}")
    return prompts


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


def describe_prompts(head: str, prompts: list[ServingPrompt], api: str) -> str:
    """The prompt set in words, with its token lengths (the client's counts): what a reader needs to compare a
    result with another's (``synthetic prompts (seed 0) of 16 tokens with the chat template, 16 out``). The lengths
    are of the prompt as the server counts it where the client can tell (the chat template applied; completions:
    with the tokenizer's special tokens), else of its text, said "before the chat template" for chat."""
    def lengths(values: list[int]) -> str:
        low, high = min(values), max(values)
        return f"{low}" if low == high else f"{low}-{high} (mean {sum(values) / len(values):.4g})"

    sent = [p.sent_tokens for p in prompts]
    if all(n is not None for n in sent):
        counts = [n for n in sent if n is not None]
        how = " with the chat template" if api == "chat" else " with special tokens"
    else:
        counts = [p.prompt_tokens for p in prompts]
        how = " before the chat template" if api == "chat" else ""
    return f"{head} of {lengths(counts)} tokens{how}, {lengths([p.output_len for p in prompts])} out"


def prompt_set(config: GenerateConfig, prompts: list[ServingPrompt], tokens: Tokens, planned: int | None
               ) -> dict[str, Any]:
    """serving.json's record of what was sent: where the prompts came from, how many, their token lengths (the text's
    own, and as the server counts the prompt where the client can tell), and how many requests the round plans
    (None: duration_s points, not counted before). The run adds ``input_tokens_server`` (the server's usage) and
    ``repeated_requests`` (requests that resent a prompt sent before in the round)."""
    source = config.sharegpt_path or config.prompts_path or "synthetic"
    sent = [p.sent_tokens for p in prompts if p.sent_tokens is not None]
    return {"source": source, "count": len(prompts), "seed": config.seed,
            "input_tokens": _spread([p.prompt_tokens for p in prompts]),
            "input_tokens_sent": _spread(sent) if len(sent) == len(prompts) else None,
            "input_tokens_sent_means": ("the chat template applied, with its generation prompt" if config.api == "chat"
                                        else "the tokenizer's special tokens added"),
            "output_tokens_asked": _spread([p.output_len for p in prompts]),
            "counted_with": "the model folder's tokenizer" if tokens.tokenizer is not None else
                            "words (no tokenizer: outputs counted as output chunks)",
            "requests_planned": planned, "each_sent_once": planned is not None and planned <= len(prompts)}


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
                                 "ended (none resent while the prompt set lasts)",
            "connections": "one client per point, its connections kept open from the warm-up to the timed requests"}


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


def run_serving(config: GenerateConfig, engine: EngineDef, device: torch.device, out_dir: Path) -> ServingOutcome:
    spec = engine.server
    assert spec is not None
    if isinstance(config.endpoint, str):  # the plan puts the inventory's entry in its place; a job without it
        raise CaseUserError(f"endpoint {config.endpoint!r}: no inventory named it (run with the inventory that "
                            "lists it under endpoints)")
    if config.endpoint is None:
        check_requirements(engine)
    folder = model_folder(config, device) if config.endpoint is None or config.checkpoint_path else None
    tokens = Tokens(folder)
    vocab = int(model_config(config.model, config.checkpoint_path).vocab_size) if (
        config.checkpoint_path or config.model in PRESETS) else 0
    # The readiness request (a server that loads its model at the first one) or the endpoint's check sends the
    # first prompt: the points start after it, so that no timed request resends it.
    first_prompt = 1 if config.endpoint is not None or spec.ready_request else 0
    planned = requests_planned(config, first_prompt)
    if config.sharegpt_path is not None:
        prompts = sharegpt_prompts(str(config.data_file("sharegpt_path")), tokens, config.input_len,
                                   config.max_new_tokens, config.api)
        described = describe_prompts(f"{config.sharegpt_path}: {len(prompts)} conversations", prompts, config.api)
    elif config.prompts_path is not None:
        prompts = file_serving_prompts(config, tokens)
        described = describe_prompts(f"{config.prompts_path}: {len(prompts)} prompts", prompts, config.api)
    else:
        # One prompt per request the round sends (the seed's generator makes them in order, so prompt i is the same
        # whatever the count); the count is no part of the description, which compares workloads across runs.
        made = time.perf_counter()
        prompts = synthetic_serving_prompts(config, tokens, vocab, min(MAX_SYNTHETIC, planned or MAX_SYNTHETIC))
        described = describe_prompts(f"synthetic prompts (seed {config.seed})", prompts, config.api)
        log.info("made %d synthetic prompts in %.1f s (one per request the round sends, at most %d)", len(prompts),
                 time.perf_counter() - made, MAX_SYNTHETIC)
    if planned is not None and planned > len(prompts):
        log.warning("the round sends %d requests and the prompt set has %d prompts: past the end, prompts are sent "
                    "again (a server's prefix cache may serve them; each point's warning counts its resent ones)",
                    planned, len(prompts))
    references = {p.index: p.reference for p in prompts if p.reference is not None}
    server: ServerProcess | None = None
    summary: dict[str, Any] = {
        "engine": engine.manifest.name, "api": config.api, "devices": config.devices, "slo": config.slo.model_dump(),
        "prompts": described, "prompt_set": prompt_set(config, prompts, tokens, planned),
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
                return ServingOutcome([], 0.0, described, Failure(kind="infrastructure", message=str(exc)))
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
        return _run_points(config, spec, target, server, prompts, references, tokens, out_dir, described, summary,
                           first_prompt)
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


async def _measure_point(config: GenerateConfig, spec: ServerSpec, target: Target, load: Load,
                         prompts: list[ServingPrompt], first_prompt: int, writer: RecordWriter, tokens: Tokens,
                         alive: Callable[[], bool], scraper: httpx.Client, scrape_dir: Path
                         ) -> tuple[PhaseRun | None, PhaseRun]:
    """A point's warm-up and timed phases on one client (the warm-up's connections serve the timed requests), each
    with prompts of its own from ``first_prompt`` on; the server's metrics scraped between them."""
    warmups = warmup_count(config, load)
    async with load_client(load, target) as client:
        warm = None
        if warmups:
            warm = await run_phase(target, load, prompts, "warmup", requests=warmups, duration_s=None, writer=writer,
                                   count_tokens=tokens.counter(), keep_going=alive, first_prompt=first_prompt,
                                   client=client)
        _save_scrape(scraper, target.base_url, spec.metrics_path, scrape_dir, f"{load.label}.before.prom")
        run = await run_phase(target, load, prompts, "timed", requests=config.requests, duration_s=config.duration_s,
                              writer=writer, count_tokens=tokens.counter(), keep_going=alive,
                              first_prompt=first_prompt + (len(warm.records) if warm else 0), client=client)
    return warm, run


def _run_points(config: GenerateConfig, spec: ServerSpec, target: Target, server: ServerProcess | None,
                prompts: list[ServingPrompt], references: dict[int, str], tokens: Tokens, out_dir: Path,
                described: str, summary: dict[str, Any], first_prompt: int) -> ServingOutcome:
    metrics: list[Metric] = []
    failed_points: list[str] = []  # one line each: the point and its first error
    measured = 0.0
    writer = RecordWriter(out_dir / REQUESTS_FILE)
    scrape_dir = out_dir / SERVER_METRICS
    alive = (lambda: server.exited() is None) if server is not None else (lambda: True)
    cursor = first_prompt  # the next prompt to send: each phase takes its own, in order
    sent: set[int] = set(range(min(first_prompt, len(prompts))))  # prompts sent so far (the check's, the points')
    repeated_total = 0
    server_prompt_tokens: list[int] = []  # the server's usage.prompt_tokens of the timed requests
    try:
        if server is None:
            try:
                check_endpoint(config, target, prompts[0], writer, tokens.counter())
            except CaseUserError:
                summary["failed_point"] = CHECK_POINT
                write_json(out_dir / SERVING_FILE, summary)
                raise
            summary["endpoint"].update(version=small_json(target, "/version"), models=served_models(target))
        with httpx.Client() as scraper:
            for load in points(config):
                warm, run = asyncio.run(_measure_point(config, spec, target, load, prompts, cursor, writer, tokens,
                                                       alive, scraper, scrape_dir))
                warm_records = warm.records if warm is not None else []
                warm_first, timed_first = cursor, cursor + len(warm_records)
                cursor = timed_first + len(run.records)
                repeated_total += resent(warm_records, sent)
                repeated = resent(run.records, sent)
                repeated_total += repeated
                if server is not None and server.exited() is not None:
                    message = f"point {load.label}: {server.failure('during the load')}"
                    log.error("%s", message)
                    summary["failed_point"] = load.label
                    summary["prompt_set"]["repeated_requests"] = repeated_total
                    write_json(out_dir / SERVING_FILE, summary)
                    return ServingOutcome(metrics, measured, described, Failure(kind="infrastructure",
                                                                                message=message))
                _save_scrape(scraper, target.base_url, spec.metrics_path, scrape_dir, f"{load.label}.after.prom")
                measured += run.seconds
                stats = point_stats(load.label, run.records, run.seconds, config.slo)
                note = (f"closed loop, {load.concurrency} in flight" if load.concurrency is not None else
                        f"open loop, {load.rate:g} requests/s, burstiness {load.burstiness:g}"
                        + (f", at most {load.max_concurrency} in flight" if load.max_concurrency else ""))
                rates = send_rate(load, run.records)
                cautions = [c for c in (
                    (f"{repeated} of {stats.requests} timed requests resent a prompt already sent in this round (the "
                     f"prompt set has {len(prompts)}): a server's prefix cache may have served their prefill, so "
                     "their TTFT is optimistic") if repeated else None,
                    late_sends(rates)) if c is not None]
                for caution in cautions:
                    log.warning("point %s: %s", load.label, caution)
                if stats.failed_point:  # nothing measured: kept as failed, never as a point of the curve
                    metrics += failed_point_metrics(stats)
                    failed_points.append(failed_point_message(stats))
                    log.error("%s (every one in %s)", failed_points[-1], REQUESTS_FILE)
                else:
                    metrics += point_metrics(stats, (run.started_at, run.ended_at), config.devices, config.slo,
                                             note, cautions)
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
                    "input_tokens": sum(_prompt_tokens(r) for r in run.records if r.ok),
                    "output_tokens": stats.output_tokens, "good": stats.good,
                    "prompt_mismatches": stats.prompt_mismatched, "output_mismatches": stats.output_mismatched,
                    "warmup_first_prompt": warm_first if warm_records else None, "first_prompt": timed_first,
                    "repeated_prompts": repeated, "send_rate": rates})
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
    summary["prompt_set"]["repeated_requests"] = repeated_total
    summary["prompt_set"]["input_tokens_server"] = _spread(server_prompt_tokens) if server_prompt_tokens else None
    write_json(out_dir / SERVING_FILE, summary)
    failure = None
    if failed_points:  # the other points are measured and kept; the round says which point failed, and why
        more = f" (and {len(failed_points) - 1} more failed point(s): see {SERVING_FILE})" if len(failed_points) > 1 \
            else ""
        failure = Failure(kind="user", message=failed_points[0] + more)
    return ServingOutcome(metrics, measured, described, failure=failure, points=summary["points"])


def _prompt_tokens(record: RequestRecord) -> int:
    """A request's prompt tokens: the server's usage, else the client's count as sent, else of the text."""
    for count in (record.prompt_tokens_usage, record.prompt_tokens_sent, record.prompt_tokens_client):
        if count is not None:
            return count
    return 0


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
