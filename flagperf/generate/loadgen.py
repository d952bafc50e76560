"""The load generator of serving engines: a small asyncio client on httpx that sends streamed OpenAI
requests (chat or completions, server-sent events) and records every request as it ends.

Load shapes, one per point:
  closed loop at concurrency C   C requests in flight; a new one the moment one ends
  open loop at rate R            arrivals R per second, inter-arrival times drawn from a gamma distribution
                                 of shape ``burstiness`` and mean 1/R (1: Poisson); optionally at most
                                 ``max_concurrency`` in flight (the rest wait for a slot, late)
A point sends ``requests`` requests, or keeps sending for ``duration_s`` (then waits for those in flight).

Per request (a line of requests.jsonl, written and flushed as the request ends, so a killed round keeps what
it did): see ``RequestRecord``. Every time is taken with time.perf_counter(): a request's chunks relative to its
send, its send relative to the phase's start (``send_offset_s``, what a phase's duration is made of); ``sent_at``
is the wall clock (epoch seconds) at the send, only for lining requests up with the monitors' samples (the wall
clock may be stepped while a point runs, so no duration mixes it with perf_counter times).

An output chunk is an event whose text is not empty: ``delta.content`` or a reasoning model's
``delta.reasoning_content`` / ``delta.reasoning`` (chat), ``text`` (completions). A request fails on an HTTP
status other than 200, a transport error or timeout, an ``error`` event, an event with none of ``choices``,
``usage`` and ``error`` (``{"object": "error", ...}``), or a stream that ends without a ``finish_reason`` (it broke
off) or with ``abort`` or ``error`` as its finish reason. A send on a kept-alive connection that fails before any
response arrived (the server closed that connection as the request went out on it) is sent once more on a fresh
connection (``reconnected_after``); the request is timed from its first send, the failed try included. After ``[DONE]``
the response is read to its end (Drains), so that its connection serves another request: outside the request's time
limit and, past DRAIN_WAIT_S, without holding its place in the load. The client's count of an output is made in a
worker thread once the request ended, never on the event loop that times the streams in flight, and the request's
place in the load is free meanwhile.

Why our own client and not a maintained one: docs/serving.md (AIPerf does not install beside prefect 3.8.8;
GuideLLM does only at 0.2.1 with 15 more packages, and neither writes each chunk's arrival with the server's
usage in our records, nor sends an engine's own exact-output fields). bench/serving_client_check.py holds it
against GuideLLM on the same server.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import random
import re
import ssl
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import httpx

REQUESTS_FILE = "requests.jsonl"
ERROR_TEXT_LIMIT = 300
# RequestRecord.output_counted_by: the model folder's tokenizer counted the output, or (none) its chunks did
OUTPUT_COUNTED_BY_TOKENIZER = "tokenizer"
OUTPUT_COUNTED_IN_CHUNKS = "chunks"
ERROR_PAGE_BYTES = 64 * 1024  # of a refused request's page: what the error quotes, with room to mask the key in
# One line of the event stream: a streamed chunk is a few hundred bytes (a usage event, a long chunk of text, a
# few KiB); far above any real one, and a bound on what an endpoint that never sends a line end makes us hold.
MAX_LINE_BYTES = 4 * 1024 * 1024
# Text pieces a stream may carry per token asked (max_tokens), plus a few: a server sends at most one piece per
# token it makes; one sending more ignores max_tokens, and its pieces would grow the client's memory.
PIECES_PER_TOKEN, PIECES_SLACK = 2, 16
LINE_END = re.compile(rb"\r\n|\r|\n")  # the server-sent events line ends


@dataclass(frozen=True)
class ServingPrompt:
    """One prompt of the point's stream: its text, the client's count of its tokens, the output tokens it
    asks for, and a reference answer where the prompts file has one."""

    index: int
    text: str
    prompt_tokens: int
    output_len: int
    reference: str | None = None
    # The client's count of the prompt as the server tokenizes it (with the chat template for chat, with the
    # tokenizer's special tokens for completions); None where the client cannot tell (no tokenizer or template).
    sent_tokens: int | None = None


@dataclass(frozen=True)
class Target:
    """Where requests go and what every request carries."""

    base_url: str
    model: str
    api: Literal["chat", "completions"]
    headers: dict[str, str] = field(default_factory=dict)
    exact_fields: Callable[[int], dict[str, Any]] | None = None  # output_len -> fields (None: not exact)
    request_timeout_s: float = 600.0

    def redact(self, text: str) -> str:
        """``text`` with the headers' values (the endpoint's key) masked: an error that quotes what was sent (a
        proxy's 401 page, a protocol error) must not carry the key into requests.jsonl or a log."""
        for value in self.headers.values():
            for secret in (value, value.split(" ", 1)[-1]):  # the whole value first, then the key after "Bearer"
                if len(secret) >= 4:
                    text = text.replace(secret, "***")
        return text

    @property
    def url(self) -> str:
        return f"{self.base_url}/v1/{'chat/completions' if self.api == 'chat' else 'completions'}"

    def body(self, prompt: ServingPrompt) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "stream": True, "stream_options": {"include_usage": True},
                                "max_tokens": prompt.output_len, "temperature": 0.0}
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt.text}]
        else:
            body["prompt"] = prompt.text
        if self.exact_fields is not None:
            body.update(self.exact_fields(prompt.output_len))
        return body


@dataclass
class RequestRecord:
    """One request, as requests.jsonl keeps it (a line written by older code lacks the later fields: their
    defaults).

    point, phase         the point's label (c4, r2.5) and "warmup" or "timed"
    seq, prompt_index    order within the point's phase; which prompt it sent
    sent_at              epoch seconds at the send (to line up with the monitors only)
    ttft_s               first output chunk (content or reasoning text) - send (None: no output arrived)
    chunk_times_s        each output chunk's arrival - send, in order (reasoning chunks included)
    e2el_s               end of the response stream - send (also for a failed request: when it failed)
    prompt_tokens_client / output_tokens_client   the client's counts (the model folder's tokenizer on the
                         prompt's text and on the output, answer and reasoning; without a tokenizer, output =
                         output chunks)
    prompt_tokens_usage / output_tokens_usage     the server's usage (stream_options.include_usage), if sent
    requested_output     max_tokens asked (and the exact length when ``exact``)
    finish_reason        the server's last finish_reason
    error                None when the request succeeded, else what went wrong (HTTP status, stream error)
    output_text          the answer (content or text), concatenated
    send_offset_s        send - the phase's start (perf_counter): a phase's duration is made of these and E2EL
    scheduled_offset_s   open loop: when the arrival process scheduled it, from the phase's start; None: closed loop
    queue_wait_s         send - scheduled: waiting for a max_concurrency slot, or the client running late
    prompt_wait_s        the wait for its prompt to be made, before the send (synthetic prompts of a duration_s
                         phase, made ahead in a worker thread); None where every prompt was made before the phase
    prompt_tokens_sent   the client's count of the prompt as the server tokenizes it (chat template, special
                         tokens); None where the client cannot tell
    reasoning_chunks     output chunks of reasoning text (part of chunk_times_s)
    reasoning_tokens_client  the client's count of the reasoning text (part of output_tokens_client)
    reasoning_text       the reasoning, concatenated
    reconnected_after    the error of its first send, where the server closed the kept-alive connection it went
                         out on before any response arrived and the request was sent once more on a fresh
                         connection; None where it was sent once. Its times, sent_at and send_offset_s are of its
                         first send: the failed try is part of its TTFT and E2EL
    failed_try_s         that first send to its failure (where reconnected_after); None where it was sent once
    """

    point: str
    phase: str
    seq: int
    prompt_index: int
    sent_at: float
    requested_output: int
    exact: bool
    ttft_s: float | None = None
    chunk_times_s: list[float] = field(default_factory=list)
    e2el_s: float | None = None
    prompt_tokens_client: int | None = None
    output_tokens_client: int | None = None
    prompt_tokens_usage: int | None = None
    output_tokens_usage: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    output_text: str = ""
    send_offset_s: float | None = None
    scheduled_offset_s: float | None = None
    queue_wait_s: float | None = None
    prompt_tokens_sent: int | None = None
    reasoning_chunks: int = 0
    reasoning_tokens_client: int | None = None
    reasoning_text: str = ""
    prompt_wait_s: float | None = None
    reconnected_after: str | None = None
    failed_try_s: float | None = None
    output_counted_by: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def output_tokens(self) -> int:
        """The server's count where it sent usage, else the client's."""
        if self.output_tokens_usage is not None:
            return self.output_tokens_usage
        return self.output_tokens_client or 0

    @property
    def prompt_tokens(self) -> int:
        """The server's usage where it sent one, else the client's count as sent (chat template), else of the
        text."""
        for count in (self.prompt_tokens_usage, self.prompt_tokens_sent, self.prompt_tokens_client):
            if count is not None:
                return count
        return 0

    @classmethod
    def from_json(cls, line: str) -> RequestRecord:
        return cls(**json.loads(line))


class RecordWriter:
    """requests.jsonl, one line per ended request, appended and flushed at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handle = path.open("a", encoding="utf-8")

    def write(self, record: RequestRecord) -> None:
        self.handle.write(json.dumps(asdict(record), separators=(",", ":")) + "\n")
        self.handle.flush()

    def close(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()


def read_records(path: Path) -> list[RequestRecord]:
    return [RequestRecord.from_json(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


TokenCounter = Callable[[str], int]


class PromptSupply(Protocol):
    """Prompts made as a phase runs (flagperf.generate.serve.PromptMaker): ``wait_for(n)`` returns once positions
    below n are made, with the seconds it waited, never blocking the event loop while they are made."""

    async def wait_for(self, count: int) -> float: ...


class LineTooLong(Exception):
    """A line of the event stream passed MAX_LINE_BYTES without a line end."""


class LineSplitter:
    """The event stream's bytes as lines (CR LF, LF or CR ends one), each at most ``limit`` bytes: httpx's
    aiter_lines holds a line until its end comes, so a stream that never sends one would grow without bound."""

    def __init__(self, limit: int = MAX_LINE_BYTES) -> None:
        self.limit = limit
        self.pending = bytearray()
        self.after_cr = False  # the last part ended with CR: a LF that starts the next belongs to it

    def feed(self, data: bytes) -> list[str]:
        if self.after_cr and data.startswith(b"\n"):
            data, self.after_cr = data[1:], False  # that LF is spent: a LF after it ends a line of its own
        if data:
            self.after_cr = data.endswith(b"\r")
        parts = LINE_END.split(data)
        self.pending += parts[0]
        lines = []
        if len(parts) > 1:
            lines = [bytes(self.pending), *parts[1:-1]]
            self.pending = bytearray(parts[-1])
        if len(self.pending) > self.limit or any(len(line) > self.limit for line in lines):
            raise LineTooLong(f"a line of the event stream is longer than {self.limit} bytes (MAX_LINE_BYTES); "
                              "the request was stopped")
        return [line.decode("utf-8", "replace") for line in lines]

    def end(self) -> list[str]:
        """The last line, where the stream ended without a line end."""
        rest, self.pending = bytes(self.pending), bytearray()
        return [rest.decode("utf-8", "replace")] if rest else []


async def _stream_lines(response: httpx.Response) -> AsyncGenerator[str, None]:
    splitter = LineSplitter()
    async for part in response.aiter_bytes():
        for line in splitter.feed(part):
            yield line
    for line in splitter.end():
        yield line


@dataclass
class _Texts:
    """A stream's text pieces: the answer (content, or text) and a reasoning model's reasoning; ``answered`` once the
    response's status line and headers arrived; ``ended`` the perf_counter time of its ``[DONE]``, where it sent one;
    ``opened`` once the send opened a connection of its own (httpcore's trace): else it went out on a kept-alive one."""

    answer: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    answered: bool = False
    ended: float | None = None
    opened: bool = False
    drain: asyncio.Task[None] | None = None  # the read of the response's end after its [DONE] (Drains)

    async def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpx's ``trace`` extension: every step of the send; ``connection.connect_tcp.*`` (or a Unix socket's) is
        the pool opening a connection for it."""
        if event.startswith("connection.connect_"):
            self.opened = True


# A finish reason that says the server gave up on the request (vLLM's and SGLang's "abort", an "error"): its
# output is cut short by the server, not by max_tokens or the end of sequence.
FAILED_FINISH = ("abort", "error")


async def _exchange(client: httpx.AsyncClient, target: Target, prompt: ServingPrompt, record: RequestRecord,
                    texts: _Texts, start: float, drains: Drains) -> None:
    """The request and its stream into ``record`` and ``texts``. A stream that ended with ``[DONE]`` is handed to
    ``drains``, which reads the response's end (its connection then serves another request) outside the request's
    time limit; leaving otherwise (an error, a cancel) closes the response, and with it a connection whose stream was
    not read to its end."""
    request = client.build_request("POST", target.url, json=target.body(prompt), headers=target.headers,
                                   timeout=target.request_timeout_s, extensions={"trace": texts.trace})
    response = await client.send(request, stream=True)
    lines = _stream_lines(response)
    handed = False
    try:
        texts.answered = True
        if response.status_code != 200:
            page, cut = b"", False
            async for part in response.aiter_bytes():  # a hostile endpoint's page may never end
                page += part
                if cut := len(page) > ERROR_PAGE_BYTES:
                    break
            text = target.redact(page.decode("utf-8", "replace"))
            text = text[:-1024] if cut else text  # masked first; a key the cut split lies in the last KiB
            record.error = f"HTTP {response.status_code}: {' '.join(text.split())[:ERROR_TEXT_LIMIT]}"
            return
        pieces_allowed = PIECES_PER_TOKEN * prompt.output_len + PIECES_SLACK
        async for line in lines:
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":  # the stream's last event; the response's end may follow in a read of its own
                texts.ended = time.perf_counter()
                texts.drain = drains.hand(response, lines)
                handed = True
                break
            _read_event(target.redact(data) if target.headers else data, time.perf_counter() - start, record,
                        texts, target.api)
            if record.error is None and len(record.chunk_times_s) > pieces_allowed:
                record.error = (f"the server streamed more than {pieces_allowed} text pieces for "
                                f"max_tokens {prompt.output_len}; the request was stopped")
            if record.error is not None:
                break
    finally:
        if not handed:  # now, not when the collector finds them: the response's read ends here
            await lines.aclose()
            await response.aclose()


# After a stream's [DONE], how long the client reads on for the response's end (chunked: its last, empty chunk, which
# vLLM's and SGLang's uvicorn send in a write of their own): httpx keeps a connection for the next request only where
# the response was read to its end, and closes it otherwise. A server that ends it later has its connection closed.
# The read is no part of the request (its E2EL ends at the [DONE], its time limit is not spent on it) and holds no
# request slot: the request's caller waits DRAIN_WAIT_S at most (an end that follows the [DONE] in a read of its own
# comes within it, so the connection is back in the pool for the caller's next request), then the read goes on in a
# task of its own, and the caller sends its next request (on another connection: load_client bounds no
# connections, only the kept ones). A drain that reaches DRAIN_S is counted (Drains.timed_out) and the point warns.
DRAIN_S = 1.0
DRAIN_WAIT_S = 0.05


class Drains:
    """The responses whose ``[DONE]`` came, read to their end (at most DRAIN_S each) in tasks of their own, and then
    closed; ``timed_out`` counts those whose end did not come within DRAIN_S (their connections were closed)."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()
        self.timed_out = 0

    def hand(self, response: httpx.Response, lines: AsyncGenerator[str, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(self._drain(response, lines))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _drain(self, response: httpx.Response, lines: AsyncGenerator[str, None]) -> None:
        deadline = time.perf_counter() + DRAIN_S
        try:
            while True:
                await asyncio.wait_for(anext(lines), max(0.0, deadline - time.perf_counter()))
        except StopAsyncIteration:
            pass
        except asyncio.TimeoutError:
            self.timed_out += 1
        except (httpx.HTTPError, httpx.StreamError, OSError, LineTooLong):  # broken off: its connection is closed
            pass
        finally:
            with contextlib.suppress(httpx.HTTPError, OSError, RuntimeError):
                await lines.aclose()
                await response.aclose()

    async def settle(self, task: asyncio.Task[None] | None) -> None:
        """Waits for ``task``'s end for DRAIN_WAIT_S at most; the task goes on after."""
        if task is not None:
            await asyncio.wait({task}, timeout=DRAIN_WAIT_S)

    async def wait(self) -> None:
        """Every drain's end (each at most DRAIN_S)."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)

    def cancel(self) -> None:
        for task in list(self.tasks):
            task.cancel()


# A send that failed so on a connection kept alive from an earlier request, before any response arrived, is the server
# (or a proxy) closing that connection as the request went out on it (its idle timeout): sent once more, on a fresh
# connection. Not on a connection the send opened itself (the server refused or dropped this request: a failure), nor
# a ConnectError (no kept connection gives one).
RECONNECT_ERRORS = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The TLS context of every load client of the process (httpx's default: the CA certificates, SSL_CERT_FILE and
    SSL_CERT_DIR where set): making one loads the certificates, 0.1 to 0.3 s on 2 cores, which a client made while a
    request is timed (FreshConnections', for a resend) must not spend; with it, a client is made in under 1 ms."""
    return httpx.create_ssl_context()


class FreshConnections:
    """A client that opens a new connection for every request and keeps none, for the resend of a request whose
    kept-alive connection the server closed before answering; made at its first use, with the process's TLS context
    (tls_context, which the point's client made before the phase)."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._client: httpx.AsyncClient | None = None

    async def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(verify=tls_context(), limits=httpx.Limits(max_keepalive_connections=0),
                                             timeout=self.target.request_timeout_s)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _stamp(record: RequestRecord, phase_start: float | None, scheduled: float | None) -> float:
    """The send's times into the record; returns its perf_counter start."""
    record.sent_at = time.time()
    start = time.perf_counter()
    if phase_start is not None:
        record.send_offset_s = start - phase_start
        if scheduled is not None:
            record.scheduled_offset_s = scheduled
            record.queue_wait_s = max(0.0, record.send_offset_s - scheduled)
    return start


async def _try_send(client: httpx.AsyncClient, target: Target, prompt: ServingPrompt, record: RequestRecord,
                    texts: _Texts, start: float, drains: Drains) -> Exception | None:
    """One send of the request, whose failure is returned (a transport error before the response may be sent again),
    never raised. Its time limit runs from ``start``, the request's first send."""
    try:
        # httpx's timeout is per read: a server that keeps sending (events, or bytes without a line end) would hold
        # the request, and the round, without end; the whole exchange is bounded here, from the send.
        await asyncio.wait_for(_exchange(client, target, prompt, record, texts, start, drains),
                               max(0.0, start + target.request_timeout_s - time.perf_counter()))
    except (asyncio.TimeoutError, httpx.HTTPError, OSError, LineTooLong) as exc:
        return exc
    return None


def _error_text(exc: Exception, target: Target) -> str:
    if isinstance(exc, (asyncio.TimeoutError, httpx.TimeoutException)):
        # Either limit: httpx's per-read (connect, pool) limits are request_timeout_s too, each started after the
        # send, so one that fires first also means the request ran past its limit (one verdict, whichever fires).
        waited = f": {type(exc).__name__}" if isinstance(exc, httpx.TimeoutException) else ""
        return f"the request ran past request_timeout_s ({target.request_timeout_s:g} s){waited}; it was stopped"
    if isinstance(exc, LineTooLong):
        return str(exc)
    return f"{type(exc).__name__}: {target.redact(str(exc)) or 'no detail'}"[:ERROR_TEXT_LIMIT]


def _count_output(record: RequestRecord, count_tokens: TokenCounter) -> None:
    record.reasoning_tokens_client = count_tokens(record.reasoning_text) if record.reasoning_text else 0
    record.output_tokens_client = count_tokens(record.output_text) + record.reasoning_tokens_client
    record.output_counted_by = OUTPUT_COUNTED_BY_TOKENIZER


async def count_output(record: RequestRecord, count_tokens: TokenCounter | None, counting: Executor | None = None
                       ) -> RequestRecord:
    """The client's count of a successful request's output, with ``count_tokens`` in the ``counting`` executor's
    thread (else asyncio's default one), never on the event loop, which meanwhile reads the other streams' chunks: a
    count of a long output takes milliseconds, and on the loop it would delay their chunks (and so their ITL and
    TTFT). Without a tokenizer, output chunks."""
    if record.ok:
        if count_tokens is not None:
            await asyncio.get_running_loop().run_in_executor(counting, _count_output, record, count_tokens)
        else:
            record.reasoning_tokens_client = record.reasoning_chunks
            record.output_tokens_client = len(record.chunk_times_s)
            record.output_counted_by = OUTPUT_COUNTED_IN_CHUNKS
    return record


async def send_request(client: httpx.AsyncClient, target: Target, prompt: ServingPrompt, point: str, phase: str,
                       seq: int, count_tokens: TokenCounter | None, *, phase_start: float | None = None,
                       scheduled: float | None = None, counting: Executor | None = None) -> RequestRecord:
    """One streamed request, timed chunk by chunk, its output counted (count_output); every failure is recorded, never
    raised. ``phase_start``: the phase's perf_counter start (the record's send offset is taken from it); ``scheduled``:
    the arrival the open loop drew for it, from the phase's start. Its response's end is read before it returns,
    outside its time limit (Drains)."""
    drains = Drains()
    fresh = FreshConnections(target)
    try:
        record = await exchange_request(client, target, prompt, point, phase, seq, phase_start=phase_start,
                                        scheduled=scheduled, fresh=fresh, drains=drains)
        await drains.wait()
    finally:
        drains.cancel()
        await fresh.aclose()
    return await count_output(record, count_tokens, counting)


async def exchange_request(client: httpx.AsyncClient, target: Target, prompt: ServingPrompt, point: str, phase: str,
                           seq: int, *, phase_start: float | None, scheduled: float | None, fresh: FreshConnections,
                           drains: Drains) -> RequestRecord:
    """send_request's request, its output not counted yet: returns once its stream ended (its [DONE]: its response's
    end is read by ``drains``, the caller waiting DRAIN_WAIT_S at most). A send on a kept-alive connection that fails
    before any response (RECONNECT_ERRORS: the server closed the connection as the request went out) is sent once
    more, on ``fresh``'s connection, within the same time limit; the request is timed from its first send, the failed
    try included (``failed_try_s``): a server that took the request and dropped it after a while is not flattered."""
    record = RequestRecord(point=point, phase=phase, seq=seq, prompt_index=prompt.index, sent_at=0.0,
                           requested_output=prompt.output_len, exact=target.exact_fields is not None,
                           prompt_tokens_client=prompt.prompt_tokens, prompt_tokens_sent=prompt.sent_tokens)
    texts = _Texts()
    start = _stamp(record, phase_start, scheduled)
    error = await _try_send(client, target, prompt, record, texts, start, drains)
    if isinstance(error, RECONNECT_ERRORS) and not texts.answered and not texts.opened:
        record.failed_try_s = time.perf_counter() - start
        record.reconnected_after = _error_text(error, target)
        texts = _Texts()
        error = await _try_send(await fresh.client(), target, prompt, record, texts, start, drains)
    if error is not None:
        record.error = _error_text(error, target)
    # The end of the stream: its [DONE] where it sent one (the response's end, read after it, is no part of it).
    record.e2el_s = (texts.ended if texts.ended is not None and error is None else time.perf_counter()) - start
    record.output_text = "".join(texts.answer)
    record.reasoning_text = "".join(texts.reasoning)
    if record.ok:
        record.error = stream_end_error(record)
    await drains.settle(texts.drain)  # the end, where it follows at once: the connection then serves the next request
    return record


def stream_end_error(record: RequestRecord) -> str | None:
    """What a stream that ended without an error event still did wrong: it ended before the server said why it
    stopped (no finish_reason: the connection broke off, or the server dropped the request), or the server said it
    gave up (``abort``, ``error``). ``transformers serve`` sends no ``[DONE]``: its last chunk, with the finish
    reason and usage, ends the stream."""
    if record.finish_reason is None:
        if not record.chunk_times_s and record.output_tokens_usage is None:
            return "the stream ended without an event"
        return (f"the stream ended without a finish_reason after {len(record.chunk_times_s)} output chunk(s): it "
                "broke off")
    if record.finish_reason in FAILED_FINISH:
        return (f"the server ended the request with finish_reason {record.finish_reason!r} after "
                f"{len(record.chunk_times_s)} output chunk(s)")
    return None


def _text_field(container: dict[str, Any], key: str, data: str, record: RequestRecord) -> str | None:
    """A text field of a choice or delta: a string or absent; anything else is the request's error."""
    value = container.get(key)
    if value is not None and not isinstance(value, str):
        record.error = f"unexpected content: {data[:ERROR_TEXT_LIMIT]}"
        return None
    return value


def _read_event(data: str, elapsed: float, record: RequestRecord, texts: _Texts, api: str) -> None:
    """One server-sent event into the record; an event of another shape than the API's is the request's error
    (a server's answer is input too: it never raises out of the load)."""
    try:
        event = json.loads(data)
    except (json.JSONDecodeError, RecursionError):
        record.error = f"not JSON in the stream: {data[:ERROR_TEXT_LIMIT]}"
        return
    if not isinstance(event, dict):
        record.error = f"unexpected event: {data[:ERROR_TEXT_LIMIT]}"
        return
    if event.get("error"):
        record.error = f"server error: {json.dumps(event['error'])[:ERROR_TEXT_LIMIT]}"
        return
    if "choices" not in event and "usage" not in event:  # vLLM's {"object": "error", "message": ...}, or worse
        record.error = f"an event with none of choices, usage and error: {data[:ERROR_TEXT_LIMIT]}"
        return
    usage = event.get("usage")
    if isinstance(usage, dict):
        counts = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not all(c is None or (isinstance(c, int) and not isinstance(c, bool) and c >= 0) for c in counts):
            record.error = f"unexpected usage: {data[:ERROR_TEXT_LIMIT]}"
            return
        record.prompt_tokens_usage, record.output_tokens_usage = counts
    choices = event.get("choices") or []
    if not isinstance(choices, list) or not all(isinstance(c, dict) and isinstance(c.get("delta") or {}, dict)
                                                for c in choices):
        record.error = f"unexpected choices: {data[:ERROR_TEXT_LIMIT]}"
        return
    for choice in choices:
        reasoning = None
        if api == "chat":
            delta = choice.get("delta") or {}
            text = _text_field(delta, "content", data, record)
            # A reasoning model's thinking (reasoning_content: SGLang, older vLLM; reasoning: newer vLLM; a server
            # may send both with the same text, read once): output the server generates and the user waits for, so
            # a chunk of it is an output chunk for TTFT and ITL.
            reasoning = (_text_field(delta, "reasoning_content", data, record)
                         or _text_field(delta, "reasoning", data, record))
        else:
            text = _text_field(choice, "text", data, record)
        if record.error is not None:
            return
        if text or reasoning:
            if record.ttft_s is None:
                record.ttft_s = elapsed
            record.chunk_times_s.append(elapsed)
            if text:
                texts.answer.append(text)
            if reasoning:
                texts.reasoning.append(reasoning)
                record.reasoning_chunks += 1
        if choice.get("finish_reason"):
            record.finish_reason = str(choice["finish_reason"])[:ERROR_TEXT_LIMIT]


@dataclass(frozen=True)
class Load:
    """One point's load: closed loop (concurrency) or open loop (rate)."""

    label: str
    concurrency: int | None = None
    rate: float | None = None
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0

    @property
    def in_flight_limit(self) -> int | None:
        return self.concurrency if self.concurrency is not None else self.max_concurrency


@dataclass
class PhaseRun:
    records: list[RequestRecord]
    started_at: float  # epoch of the first send (its record's sent_at)
    ended_at: float  # started_at + seconds: the window the monitors' samples are matched to
    seconds: float  # the first send to the latest request's end (perf_counter: send offsets + E2EL)
    unended: int = 0  # responses whose end did not follow their [DONE] within DRAIN_S (Drains.timed_out)


def phase_span(records: Sequence[RequestRecord]) -> tuple[float, float]:
    """(epoch of the first send, seconds from the first send to the latest end) of a phase's records, as
    requests.jsonl gives them by hand: the largest ``send_offset_s + e2el_s`` minus the smallest ``send_offset_s``,
    all perf_counter, so that a step of the wall clock (NTP) during the point is in no duration; the first send's
    ``sent_at`` only places the window. Records written before send offsets existed: from sent_at, as then."""
    if not records:
        raise ValueError("a phase's span needs records")
    if all(r.send_offset_s is not None for r in records):
        first = min(records, key=lambda r: r.send_offset_s or 0.0)
        last_end = max((r.send_offset_s or 0.0) + (r.e2el_s or 0.0) for r in records)
        return first.sent_at, last_end - (first.send_offset_s or 0.0)
    epoch0 = min(r.sent_at for r in records)
    return epoch0, max(r.sent_at + (r.e2el_s or 0.0) for r in records) - epoch0


# Seconds an idle connection is kept for the next request: below the 5 s after which uvicorn (vLLM's, SGLang's and
# transformers serve's HTTP server) closes an idle connection. At httpx's default, also 5 s, a request could be sent on
# a connection the server was closing at that moment and fail ("Server disconnected without sending a response"):
# httpx retries no POST. A connection idle longer is closed by the client, and the next request opens a new one.
KEEPALIVE_S = 4.0


def load_client(load: Load, target: Target) -> httpx.AsyncClient:
    """The point's HTTP client: at most one idle connection kept per request in flight, kept open between its phases,
    so that the connections the warm-up opened (as many as it had in flight) serve the timed requests, none of whose
    TTFT then holds a connection's set-up; one idle more than KEEPALIVE_S is closed, and reopened by the next request.
    No bound on the connections open: the load bounds the requests in flight, and a response whose end is still being
    read after its [DONE] (Drains) holds its connection meanwhile; under a bound, the next request would wait for it,
    inside its TTFT."""
    limit = load.in_flight_limit
    return httpx.AsyncClient(verify=tls_context(), limits=httpx.Limits(max_connections=None,
                                                                       max_keepalive_connections=limit,
                                                                       keepalive_expiry=KEEPALIVE_S),
                             timeout=target.request_timeout_s)


async def run_phase(target: Target, load: Load, prompts: Sequence[ServingPrompt], phase: str, *,
                    requests: int | None, duration_s: float | None, writer: RecordWriter | None,
                    count_tokens: TokenCounter | None, keep_going: Callable[[], bool] = lambda: True,
                    first_prompt: int = 0, client: httpx.AsyncClient | None = None,
                    supply: PromptSupply | None = None) -> PhaseRun:
    """Send the phase's requests (a count, or for a duration) in the load's shape; prompts are taken in
    order from ``first_prompt`` (round and round past the end: the caller says so where that happens).
    ``keep_going`` false stops sending (a dead server). ``client``: the point's (load_client), else one of its own.
    ``supply``: prompts still being made; a request whose prompt is not made yet waits for it before its send is
    stamped (its record's prompt_wait_s), so that the wait is in no latency and nothing else in flight pauses.
    Outputs are counted in one worker thread of the phase's (a tokenizer is used by one thread at a time), never on
    the event loop that reads the streams, and a request's place in the load is free while its output is counted
    and its response's end read (Drains): the next request goes out meanwhile."""
    if (requests is None) == (duration_s is None):
        raise ValueError("a phase has a request count or a duration")
    if client is None:
        async with load_client(load, target) as own:
            return await run_phase(target, load, prompts, phase, requests=requests, duration_s=duration_s,
                                   writer=writer, count_tokens=count_tokens, keep_going=keep_going,
                                   first_prompt=first_prompt, client=own, supply=supply)
    fresh = FreshConnections(target)
    drains = Drains()
    counting = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flagperf-count")
    try:
        run = await _run_phase(target, load, prompts, phase, requests, duration_s, writer, count_tokens, keep_going,
                               first_prompt, client, supply, counting, fresh, drains)
        await drains.wait()  # each at most DRAIN_S: their connections are back in the pool for the next phase
        run.unended = drains.timed_out
        return run
    finally:
        drains.cancel()
        counting.shutdown(wait=False)  # every count was awaited; a cancelled phase leaves its thread to end alone
        await fresh.aclose()


async def _run_phase(target: Target, load: Load, prompts: Sequence[ServingPrompt], phase: str, requests: int | None,
                     duration_s: float | None, writer: RecordWriter | None, count_tokens: TokenCounter | None,
                     keep_going: Callable[[], bool], first_prompt: int, http: httpx.AsyncClient,
                     supply: PromptSupply | None, counting: Executor, fresh: FreshConnections,
                     drains: Drains) -> PhaseRun:
    records: list[RequestRecord] = []
    counts: list[asyncio.Task[None]] = []  # the outputs being counted, each a task of its own
    sent = 0
    # The point's span is its first send to its last request's end (docs/serving.md), as vLLM's benchmark
    # duration: not the client's set-up (httpx builds an SSL context, tens of ms) nor its closing.
    start = time.perf_counter()
    deadline = start + duration_s if duration_s is not None else None

    def take() -> int | None:
        nonlocal sent
        if not keep_going():
            return None
        if requests is not None and sent >= requests:
            return None
        if deadline is not None and time.perf_counter() >= deadline:
            return None
        seq, sent = sent, sent + 1
        return seq

    async def prompt_for(seq: int) -> tuple[ServingPrompt, float | None]:
        position = (first_prompt + seq) % len(prompts)
        waited = await supply.wait_for(position + 1) if supply is not None else None
        return prompts[position], waited

    async def keep(record: RequestRecord) -> None:
        await count_output(record, count_tokens, counting)
        records.append(record)
        if writer is not None:
            writer.write(record)

    async def one(seq: int, prompt: ServingPrompt, waited: float | None, scheduled: float | None = None) -> None:
        record = await exchange_request(http, target, prompt, load.label, phase, seq, phase_start=start,
                                        scheduled=scheduled, fresh=fresh, drains=drains)
        record.prompt_wait_s = waited
        # Counted in a task of its own: the caller's slot (a closed loop's worker, an open loop's max_concurrency)
        # is free for the next request meanwhile.
        counts.append(asyncio.create_task(keep(record)))

    if load.concurrency is not None:
        async def worker() -> None:
            while (seq := take()) is not None:
                await one(seq, *await prompt_for(seq))

        await asyncio.gather(*(worker() for _ in range(load.concurrency)))
    else:
        assert load.rate is not None
        rng = random.Random(load.seed)
        slots = asyncio.Semaphore(load.max_concurrency) if load.max_concurrency else None

        async def guarded(seq: int, scheduled: float) -> None:
            prompt, waited = await prompt_for(seq)  # before a slot: a slot is not held waiting for a prompt
            if slots is None:
                await one(seq, prompt, waited, scheduled)
                return
            async with slots:  # the wait for a slot is the record's queue_wait_s
                await one(seq, prompt, waited, scheduled)

        tasks: list[asyncio.Task[None]] = []
        arrival = start
        while True:
            wait = arrival - time.perf_counter()
            if wait > 0:
                if deadline is not None and arrival >= deadline:
                    break
                await asyncio.sleep(wait)
            seq = take()
            if seq is None:
                break
            tasks.append(asyncio.create_task(guarded(seq, arrival - start)))
            arrival += rng.gammavariate(load.burstiness, 1.0 / (load.rate * load.burstiness))
        await asyncio.gather(*tasks)
    await asyncio.gather(*counts)
    if not records:  # nothing was sent (a dead server before the first request)
        now = time.time()
        return PhaseRun(records=records, started_at=now, ended_at=now, seconds=0.0)
    epoch0, seconds = phase_span(records)
    return PhaseRun(records=records, started_at=epoch0, ended_at=epoch0 + seconds, seconds=seconds)


def first_answer(target: Target, prompt: ServingPrompt, timeout_s: float) -> str | None:
    """Send one 1-token request at a time until one succeeds (None) or ``timeout_s`` passes (the last error):
    the readiness of a server that loads its model at the first request."""
    one = ServingPrompt(prompt.index, prompt.text, prompt.prompt_tokens, 1)
    deadline = time.monotonic() + timeout_s

    async def attempts() -> str | None:
        error = "no attempt"
        async with httpx.AsyncClient(timeout=max(1.0, timeout_s)) as client:
            while time.monotonic() < deadline:
                record = await send_request(client, target, one, "ready", "ready", 0, None)
                if record.ok:
                    return None
                error = record.error or error
                await asyncio.sleep(0.2)
        return error

    return asyncio.run(attempts())
