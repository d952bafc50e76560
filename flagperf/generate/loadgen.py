"""The load generator of serving engines: a small asyncio client on httpx that sends streamed OpenAI
requests (chat or completions, server-sent events) and records every request as it ends.

Load shapes, one per point:
  closed loop at concurrency C   C requests in flight; a new one the moment one ends
  open loop at rate R            arrivals R per second, inter-arrival times drawn from a gamma distribution
                                 of shape ``burstiness`` and mean 1/R (1: Poisson); optionally at most
                                 ``max_concurrency`` in flight (the rest wait for a slot, late)
A point sends ``requests`` requests, or keeps sending for ``duration_s`` (then waits for those in flight).

Per request (a line of requests.jsonl, written and flushed as the request ends, so a killed round keeps what
it did): see ``RequestRecord``. Times are taken with time.perf_counter() relative to the send; ``sent_at``
is the wall clock (epoch seconds) at the send, for lining requests up with the monitors' samples.

Why our own client and not a maintained one: docs/serving.md (AIPerf does not install beside prefect 3.8.8;
GuideLLM does only at 0.2.1 with 15 more packages, and neither writes each chunk's arrival with the server's
usage in our records, nor sends an engine's own exact-output fields). bench/serving_client_check.py holds it
against GuideLLM on the same server.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

REQUESTS_FILE = "requests.jsonl"
ERROR_TEXT_LIMIT = 300
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
    """One request, as requests.jsonl keeps it.

    point, phase         the point's label (c4, r2.5) and "warmup" or "timed"
    seq, prompt_index    order within the point's phase; which prompt it sent
    sent_at              epoch seconds at the send
    ttft_s               first non-empty content chunk - send (None: no content arrived)
    chunk_times_s        each non-empty content chunk's arrival - send, in order
    e2el_s               end of the response stream - send (also for a failed request: when it failed)
    prompt_tokens_client / output_tokens_client   the client's counts (the model folder's tokenizer on the
                         prompt and on the output text; without a tokenizer, output = content chunks)
    prompt_tokens_usage / output_tokens_usage     the server's usage (stream_options.include_usage), if sent
    requested_output     max_tokens asked (and the exact length when ``exact``)
    finish_reason        the server's last finish_reason
    error                None when the request succeeded, else what went wrong (HTTP status, stream error)
    output_text          the output, concatenated
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

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def output_tokens(self) -> int:
        """The server's count where it sent usage, else the client's."""
        if self.output_tokens_usage is not None:
            return self.output_tokens_usage
        return self.output_tokens_client or 0

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


async def _stream_lines(response: httpx.Response) -> AsyncIterator[str]:
    splitter = LineSplitter()
    async for part in response.aiter_bytes():
        for line in splitter.feed(part):
            yield line
    for line in splitter.end():
        yield line


async def _exchange(client: httpx.AsyncClient, target: Target, prompt: ServingPrompt, record: RequestRecord,
                    parts: list[str], start: float) -> None:
    """The request and its stream into ``record`` and ``parts``; leaving (the end, an error, a cancel) closes the
    response, and with it a connection whose stream was not read to its end."""
    async with client.stream("POST", target.url, json=target.body(prompt), headers=target.headers,
                             timeout=target.request_timeout_s) as response:
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
        lines = _stream_lines(response)
        try:
            async for line in lines:
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                _read_event(target.redact(data) if target.headers else data, time.perf_counter() - start, record,
                            parts, target.api)
                if record.error is None and len(record.chunk_times_s) > pieces_allowed:
                    record.error = (f"the server streamed more than {pieces_allowed} text pieces for "
                                    f"max_tokens {prompt.output_len}; the request was stopped")
                if record.error is not None:
                    break
        finally:
            await lines.aclose()  # now, not when the collector finds it: its read of the response ends here


async def send_request(client: httpx.AsyncClient, target: Target, prompt: ServingPrompt, point: str, phase: str,
                       seq: int, count_tokens: TokenCounter | None) -> RequestRecord:
    """One streamed request, timed chunk by chunk; every failure is recorded, never raised."""
    record = RequestRecord(point=point, phase=phase, seq=seq, prompt_index=prompt.index, sent_at=time.time(),
                           requested_output=prompt.output_len, exact=target.exact_fields is not None,
                           prompt_tokens_client=prompt.prompt_tokens)
    parts: list[str] = []
    start = time.perf_counter()
    try:
        # httpx's timeout is per read: a server that keeps sending (events, or bytes without a line end) would hold
        # the request, and the round, without end; the whole exchange is bounded here, from the send.
        await asyncio.wait_for(_exchange(client, target, prompt, record, parts, start), target.request_timeout_s)
    except (asyncio.TimeoutError, httpx.TimeoutException) as exc:
        # Either limit: httpx's per-read (connect, pool) limits are request_timeout_s too, each started after the
        # send, so one that fires first also means the request ran past its limit (one verdict, whichever fires).
        waited = f": {type(exc).__name__}" if isinstance(exc, httpx.TimeoutException) else ""
        record.error = (f"the request ran past request_timeout_s ({target.request_timeout_s:g} s){waited}; it was "
                        "stopped")
    except (httpx.HTTPError, OSError) as exc:
        record.error = f"{type(exc).__name__}: {target.redact(str(exc)) or 'no detail'}"[:ERROR_TEXT_LIMIT]
    except LineTooLong as exc:
        record.error = str(exc)
    record.e2el_s = time.perf_counter() - start
    record.output_text = "".join(parts)
    if record.ok:
        record.output_tokens_client = (count_tokens(record.output_text) if count_tokens is not None
                                       else len(record.chunk_times_s))
        if not record.chunk_times_s and record.output_tokens_usage is None and record.finish_reason is None:
            record.error = "the stream ended without an event"
    return record


def _read_event(data: str, elapsed: float, record: RequestRecord, parts: list[str], api: str) -> None:
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
        text = (choice.get("delta") or {}).get("content") if api == "chat" else choice.get("text")
        if text is not None and not isinstance(text, str):
            record.error = f"unexpected content: {data[:ERROR_TEXT_LIMIT]}"
            return
        if text:
            if record.ttft_s is None:
                record.ttft_s = elapsed
            record.chunk_times_s.append(elapsed)
            parts.append(text)
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
    ended_at: float  # epoch when the last request ended
    seconds: float  # the first send to the latest request's end, from the records (send + E2EL)


async def run_phase(target: Target, load: Load, prompts: Sequence[ServingPrompt], phase: str, *,
                    requests: int | None, duration_s: float | None, writer: RecordWriter | None,
                    count_tokens: TokenCounter | None, keep_going: Callable[[], bool] = lambda: True,
                    first_prompt: int = 0) -> PhaseRun:
    """Send the phase's requests (a count, or for a duration) in the load's shape; prompts are taken in
    order from ``first_prompt``, round and round. ``keep_going`` false stops sending (a dead server)."""
    if (requests is None) == (duration_s is None):
        raise ValueError("a phase has a request count or a duration")
    records: list[RequestRecord] = []
    sent = 0
    limit = load.in_flight_limit
    connections = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
    # The point's span is its first send to its last request's end (docs/serving.md), as vLLM's benchmark
    # duration: not the client's set-up (httpx builds an SSL context, tens of ms) nor its closing.
    start = time.perf_counter()
    deadline = start + duration_s if duration_s is not None else None

    def take() -> tuple[int, ServingPrompt] | None:
        nonlocal sent
        if not keep_going():
            return None
        if requests is not None and sent >= requests:
            return None
        if deadline is not None and time.perf_counter() >= deadline:
            return None
        seq, sent = sent, sent + 1
        return seq, prompts[(first_prompt + seq) % len(prompts)]

    async with httpx.AsyncClient(limits=connections, timeout=target.request_timeout_s) as client:
        async def one(seq: int, prompt: ServingPrompt) -> None:
            record = await send_request(client, target, prompt, load.label, phase, seq, count_tokens)
            records.append(record)
            if writer is not None:
                writer.write(record)

        if load.concurrency is not None:
            async def worker() -> None:
                while (job := take()) is not None:
                    await one(*job)

            await asyncio.gather(*(worker() for _ in range(load.concurrency)))
        else:
            assert load.rate is not None
            rng = random.Random(load.seed)
            slots = asyncio.Semaphore(load.max_concurrency) if load.max_concurrency else None

            async def guarded(seq: int, prompt: ServingPrompt) -> None:
                if slots is None:
                    await one(seq, prompt)
                    return
                async with slots:
                    await one(seq, prompt)

            tasks: list[asyncio.Task[None]] = []
            arrival = start
            while True:
                wait = arrival - time.perf_counter()
                if wait > 0:
                    if deadline is not None and arrival >= deadline:
                        break
                    await asyncio.sleep(wait)
                job = take()
                if job is None:
                    break
                tasks.append(asyncio.create_task(guarded(*job)))
                arrival += rng.gammavariate(load.burstiness, 1.0 / (load.rate * load.burstiness))
            await asyncio.gather(*tasks)
    if not records:  # nothing was sent (a dead server before the first request)
        now = time.time()
        return PhaseRun(records=records, started_at=now, ended_at=now, seconds=0.0)
    # From the records themselves, so requests.jsonl gives the same figure by hand: the first send's wall clock to
    # the latest end (each request's own end is its send plus its perf_counter E2EL); the client's set-up and the
    # scheduling around each request are outside it.
    epoch0 = min(r.sent_at for r in records)
    seconds = max(r.sent_at + (r.e2el_s or 0.0) for r in records) - epoch0
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
