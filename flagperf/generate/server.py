"""A serving engine's server process: its engine.yaml ``server:`` section, the command it renders, and the
round's handling of the process (own process group, a port from the OS, readiness, stop, log).

engine.yaml of a server engine (vendor_images/<vendor>/generate/<engine>/engine.yaml):

  name: vllm-serve
  description: ...
  server:
    command: [vllm, serve, "{model_dir}", --host, "{host}", --port, "{port}", --dtype, "{dtype}",
              --tensor-parallel-size, "{tensor_parallel}"]
    dtypes: {bf16: bfloat16, fp16: float16, fp32: float32}   # the case's precision -> {dtype}
    ready_path: /health          # GET answers 200 once the server takes requests
    ready_request: false         # true: then one 1-token request must succeed too (a server that loads
                                 # the model at its first request, and cannot take several then)
    metrics_path: /metrics       # Prometheus text, scraped before and after each point (optional)
    apis: [chat, completions]    # which OpenAI endpoints it serves
    request_model: "{model_dir}" # the `model` field of each request
    exact_output: {ignore_eos: true, min_tokens: "{output_len}"}  # fields that make it emit exactly max_tokens
    json_fields: []              # exact_output fields the server wants as a JSON-encoded string
    env: {}                      # added to the server's environment
    api_key_env: VLLM_API_KEY    # the variable the server reads its API key from (optional): where the server's
                                 # environment has it, every request carries it (Authorization: Bearer)
    prefix_cache: "on (vLLM's default) ..."  # whether the server reuses a prompt prefix's KV cache across
                                 # requests, in words (recorded in serving.json; optional)
  requires: [{import: vllm, pip: vllm}]

Placeholders: {model_dir} {dtype} {tensor_parallel} {host} {port} {python} in ``command`` and
``request_model``; {output_len} in ``exact_output``. A string that is exactly one placeholder of a number
becomes that number. In ``command`` a placeholder is a whole word, or the value of an ``--option={...}`` word:
the command runs without a shell, and a value from the config (the model folder is the case's checkpoint_path)
must never become part of code a shell or an interpreter reads (``[sh, -c, "serve {model_dir}"]`` is refused).
The case's ``server_args`` are appended to the command. The first word of the command
is looked up beside the running Python first (its virtual environment), then on PATH.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import Field, field_validator

from flagperf.config.models import StrictModel
from flagperf.errors import CaseUserError
from flagperf.results.bounded import read_end

SERVER_LOG = "server.log"
EXIT_SERVER_FAILED = 71  # the server died under load: an infrastructure failure (the round is retried)
COMMAND_FIELDS = {"model_dir", "dtype", "tensor_parallel", "host", "port", "python"}
EXACT_FIELDS = {"output_len"}
# How a server that could not bind its port says so (uvicorn, Python, Go, Rust servers): then another port.
ADDRESS_IN_USE = re.compile(r"address already in use|errno 98|eaddrinuse", re.IGNORECASE)
PORT_ATTEMPTS = 5
STOP_GRACE_S = 15.0
LOG_TAIL_LINES = 20
LOG_LINE_CHARS = 300  # of the error line put first
LOG_END_BYTES = 1024 * 1024  # of a server's log read for its last lines: the start of a huge log is not read
WHOLE_WORD = re.compile(r"(--?[A-Za-z0-9][A-Za-z0-9_.-]*=)?\{\w+\}")  # {x} or --option={x}


def placeholders(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}


def render(value: Any, fields: Mapping[str, Any]) -> Any:
    """Fill placeholders in a string, or in the strings of a list or mapping; "{n}" alone keeps n's type."""
    if isinstance(value, str):
        single = re.fullmatch(r"\{(\w+)\}", value)
        if single and isinstance(fields.get(single[1]), int | float):
            return fields[single[1]]
        return value.format_map(fields)
    if isinstance(value, list):
        return [render(v, fields) for v in value]
    if isinstance(value, dict):
        return {k: render(v, fields) for k, v in value.items()}
    return value


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    return []


class ServerSpec(StrictModel):
    command: list[str] = Field(min_length=1, description="argv template of the server")
    dtypes: dict[Literal["bf16", "fp16", "fp32"], str] = Field(
        default_factory=lambda: {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"})
    ready_path: str = "/health"
    ready_request: bool = False
    metrics_path: str | None = None
    apis: list[Literal["chat", "completions"]] = Field(default_factory=lambda: ["chat", "completions"],
                                                       min_length=1)
    request_model: str = "{model_dir}"
    exact_output: dict[str, Any] = Field(default_factory=dict)
    json_fields: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                                    description="the environment variable the server reads its API key from")
    prefix_cache: str | None = Field(default=None, max_length=500,
                                     description="whether the server reuses a prompt prefix's KV cache across "
                                                 "requests, and how to switch it, in words (serving.json keeps it)")

    @field_validator("command", "request_model")
    @classmethod
    def _command_fields(cls, value: Any) -> Any:
        unknown = {p for s in _strings(value) for p in placeholders(s)} - COMMAND_FIELDS
        if unknown:
            raise ValueError(f"unknown placeholder(s) {', '.join(sorted(unknown))} "
                             f"(known: {', '.join(sorted(COMMAND_FIELDS))})")
        return value

    @field_validator("command")
    @classmethod
    def _whole_words(cls, value: list[str]) -> list[str]:
        for index, word in enumerate(value):
            if placeholders(word) and not WHOLE_WORD.fullmatch(word):
                raise ValueError(f"word {index} ({word[:80]!r}): a placeholder must be the whole word or the value "
                                 "of an --option={...} word, never inside text a shell or an interpreter reads")
        return value

    @field_validator("exact_output")
    @classmethod
    def _exact_fields(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = {p for s in _strings(value) for p in placeholders(s)} - EXACT_FIELDS
        if unknown:
            raise ValueError(f"unknown placeholder(s) {', '.join(sorted(unknown))} (known: output_len)")
        return value

    @field_validator("ready_path", "metrics_path")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("must start with /")
        return value

    def argv(self, fields: Mapping[str, Any], extra_args: list[str]) -> list[str]:
        return [str(word) for word in render(self.command, fields)] + list(extra_args)

    def exact_output_fields(self, output_len: int) -> dict[str, Any]:
        """The request fields that ask for exactly ``output_len`` tokens (ignore end of sequence)."""
        import json

        fields = render(self.exact_output, {"output_len": output_len})
        return {k: json.dumps(v) if k in self.json_fields else v for k, v in fields.items()}


def find_executable(name: str) -> str:
    """The server's program: beside this Python (its venv's scripts) first, then on PATH."""
    if os.sep in name:
        return name
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise CaseUserError(f"server command {name!r}: not found beside {sys.executable} nor on PATH")
    return found


def free_port(host: str) -> int:
    """A port the OS has free now; the server may still lose it to another process (then it is retried)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the server's child before exec: its own session (one group to stop), and SIGKILL when the case
    process dies, so a killed round never leaves a server holding the accelerator."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class ServerFailed(Exception):
    """The server exited or never became ready; ``user`` when its start is at fault (not retried)."""

    def __init__(self, message: str, user: bool) -> None:
        super().__init__(message)
        self.user = user


# A line of a server's log that says why it stopped: an exception (ValueError: ..., torch.OutOfMemoryError: ...),
# click's or argparse's refusal of an argument (Error: No such option ..., vllm serve: error: unrecognized ...),
# a logger's ERROR line. A usage text printed after it would push it out of the tail.
ERROR_LINE = re.compile(r"^(?:[\w.]*(?:Error|Exception)\b|.*\berror:)", re.IGNORECASE)


def error_line(path: Path) -> str | None:
    """The last line of the latest start attempt's log that says what went wrong, or None."""
    try:
        text = _attempt_log(path)
    except OSError:
        return None
    found = [line.strip() for line in text.splitlines()[1:] if ERROR_LINE.match(line.strip())]
    return found[-1][:LOG_LINE_CHARS] if found else None


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    text = read_end(path, LOG_END_BYTES)  # bounded: a server's log may have grown to any size
    if text is None:
        return "(no log)"
    tail = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(tail) or "(empty log)"


@dataclass
class ServerProcess:
    """One started server: ``base_url`` while it runs; ``stop`` ends its whole process group."""

    process: subprocess.Popen[bytes]
    base_url: str
    log_path: Path
    argv: list[str]

    def exited(self) -> int | None:
        return self.process.poll()

    def failure(self, doing: str, name_error: bool = False) -> str:
        """Why it stopped in one line: with ``name_error`` (it never got ready: nothing it served could have
        logged an error before), its error line first where its log has one (a usage text after it would fill
        the tail); then the log's last lines."""
        error = error_line(self.log_path) if name_error else None
        return (f"the server exited {self.process.returncode} {doing}" + (f": {error}" if error else "")
                + f"; last lines of {self.log_path.name}: {log_tail(self.log_path)}")

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """TERM to the group, then KILL to what is left of it after ``grace_s``."""
        pgid = self.process.pid
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline:
                if self.process.poll() is not None and not _group_alive(pgid):
                    return
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=0.05)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_server(spec: ServerSpec, fields: dict[str, Any], extra_args: list[str], env: dict[str, str],
                 log_path: Path, ready_timeout_s: float, host: str = "127.0.0.1") -> ServerProcess:
    """Start the server on a port from the OS and wait until ``ready_path`` answers 200; a server that
    could not bind its port is started again on another. Fails with the log's tail when the server exits
    or is not ready within ``ready_timeout_s`` (it is stopped then)."""
    deadline = time.monotonic() + ready_timeout_s
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port = free_port(host)
        argv = spec.argv({**fields, "host": host, "port": port, "python": sys.executable}, extra_args)
        argv[0] = find_executable(argv[0])
        with log_path.open("ab") as log:
            log.write(f"# flagperf: attempt {attempt}: {' '.join(argv)}\n".encode())
            log.flush()
            try:
                process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                           env={**os.environ, **spec.env, **env}, preexec_fn=_die_with_parent)
            except OSError as exc:
                raise ServerFailed(f"cannot start the server ({argv[0]}): {exc}", user=True) from None
        server = ServerProcess(process, f"http://{host}:{port}", log_path, argv)
        try:
            if wait_ready(server, spec.ready_path, deadline):
                return server
        except BaseException:
            server.stop()
            raise
        if server.exited() is None:
            server.stop()
            raise ServerFailed(f"the server was not ready within {ready_timeout_s:g} s (ready_timeout_s: GET "
                               f"{spec.ready_path} never answered 200); last lines of {log_path.name}: "
                               f"{log_tail(log_path)}", user=True)
        server.stop()  # its children, if any
        if not ADDRESS_IN_USE.search(_attempt_log(log_path)):
            raise ServerFailed(server.failure("before it was ready", name_error=True), user=True)
    raise ServerFailed(f"the server could not bind a port in {PORT_ATTEMPTS} attempts; last lines of "
                       f"{log_path.name}: {log_tail(log_path)}", user=False)


def _attempt_log(log_path: Path) -> str:
    """The log of the latest attempt only."""
    text = read_end(log_path, LOG_END_BYTES) or ""  # bounded: its end holds the latest attempt
    return text.rsplit("# flagperf: attempt ", 1)[-1]


def wait_ready(server: ServerProcess, path: str, deadline: float) -> bool:
    """Poll GET path until it answers 200 (True), the server exits or the deadline passes (False)."""
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline:
            if server.exited() is not None:
                return False
            try:
                if client.get(server.base_url + path).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            with contextlib.suppress(subprocess.TimeoutExpired):  # wakes at once when the server exits
                server.process.wait(timeout=min(0.25, max(0.0, deadline - time.monotonic())))
    return False


def scrape_metrics(client: httpx.Client, base_url: str, path: str | None) -> str | None:
    """The server's Prometheus text, or None where it has none (kept beside the client's figures)."""
    if path is None:
        return None
    try:
        response = client.get(base_url + path, timeout=10.0)
    except httpx.HTTPError:
        return None
    return response.text if response.status_code == 200 else None
