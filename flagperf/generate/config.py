"""The generate case config (cases/generate/<model>/case.yaml ``configurations``, vendor/<vendor>.yaml overrides).

Batch engines (``hf``, ``vllm``: a ``module``/``file`` engine folder) read the first block of keys; serving
engines (a ``server:`` engine folder, or an ``endpoint``) read them too, plus the serving block (points,
load, SLOs, the server's arguments). docs/serving.md explains every key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from flagperf.config.endpoints import REFERENCE, Endpoint
from flagperf.config.files import LocalPath, inside, regular_file_problem, resolved
from flagperf.config.models import CASE_FOLDER, HIDDEN_INPUT, KEY_OF_MODEL_ERROR, CaseConfig
from flagperf.errors import CaseUserError, ConfigError
from flagperf.generate.presets import PRESETS
from flagperf.hosts.container_policy import DATA_ROOTS, PolicyError, clean_path, credentials_in, is_under

# A prompts or ShareGPT file is read whole: ShareGPT V3 (the usual serving set) is 642 MiB; far beyond that is
# not a data set but a mistake that would fill the host's memory.
MAX_DATA_FILE_BYTES = 1 << 30
# One connection per request in flight: beyond this a single client process runs out of descriptors and ports.
MAX_IN_FLIGHT = 65536
# Requests per point (and warm-up requests): far beyond any benchmark's; a longer soak is a duration_s.
MAX_REQUESTS = 1_000_000
MAX_RATE = 1e6  # requests/s: far beyond what one client process sends
MAX_TOKENS = 1 << 20  # tokens in a prompt or an output: beyond every model's context window
# server_env names that hold secrets by convention (HF_TOKEN, VLLM_API_KEY, AWS_SECRET_ACCESS_KEY, ...).
SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


def data_path(value: str, case_folder: Path | None) -> Path | None:
    """Where a prompts or ShareGPT file named ``value`` is, kept inside its root as the other files a config names
    are: a relative path inside the case's folder (a prompt set shipped with the case), an absolute one under a
    data root (DATA_ROOTS, the roots container mounts use: /data, /datasets, ...) and in no credentials folder;
    links are followed and the resolved path must stay there too. None: relative, with no case folder given
    (checked where it is). Any other path is a ValueError: a config must not make the round read, and send to
    an endpoint, whatever file of the host it names."""
    if not value or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError("must be a file name or path without control characters")
    if not value.startswith("/"):
        if case_folder is None:
            return None
        try:
            return inside(case_folder, value, "", None, "the case's folder")
        except ConfigError as exc:
            raise ValueError(f"{exc.message}; {DATA_FILE_PLACES}") from None
    try:  # the rules of a container's host paths (container_policy): one for every file a config names
        written = clean_path(value, "the file")
    except PolicyError as exc:
        raise ValueError(f"{exc}; {DATA_FILE_PLACES}") from None
    try:
        resolved_path = resolved(Path(written))
        roots = [str(Path(root).resolve()) for root in DATA_ROOTS]
    except OSError:  # a link loop (files.resolved: every Python), or a name too long to look up
        raise ValueError(f"{value!r}: a link that leads back to itself (a loop)") from None
    for path, allowed in ((written, DATA_ROOTS), (str(resolved_path), roots)):
        via = f" (it resolves to {resolved_path})" if path != written else ""
        credentials = credentials_in(path)
        if credentials is not None:
            raise ValueError(f"{value!r}{via} is in a credentials folder ({credentials}); not read")
        if not any(is_under(path, root) for root in allowed):
            raise ValueError(f"{value!r}{via} is outside the data roots ({', '.join(DATA_ROOTS)}); "
                             f"{DATA_FILE_PLACES}")
    return resolved_path


DATA_FILE_PLACES = ("a prompts or ShareGPT file is a path inside the case's folder, or an absolute path under a "
                    "data root")


def _data_file(value: str | None, info: ValidationInfo) -> str | None:
    """A prompts or ShareGPT file: inside its root (data_path), and a regular file (a FIFO would block the round, a
    device never ends, a folder is no file) of at most MAX_DATA_FILE_BYTES; only its metadata is read here, the
    round reads it again so. The value is kept as written (the plan's hosts resolve it in their own folders)."""
    if value is None:
        return None
    try:  # the message names the path already: not quoted again (HIDDEN_INPUT)
        path = data_path(value, (info.context or {}).get(CASE_FOLDER))
    except ValueError as exc:
        raise PydanticCustomError(HIDDEN_INPUT, str(exc)) from None
    if path is not None:
        problem = regular_file_problem(path, MAX_DATA_FILE_BYTES, "a prompts or ShareGPT file")
        if problem == "file not found":
            raise ValueError(f"{value} does not exist (only local files are read)")
        if problem:
            raise ValueError(f"{value}: {problem}")
    return value


DataFile = Annotated[str | None, AfterValidator(_data_file)]


def _about(key: str, message: str) -> PydanticCustomError:
    """A rule between keys, broken: its one line names ``key`` (and the file it came from), not the whole input."""
    return PydanticCustomError(HIDDEN_INPUT, message, {KEY_OF_MODEL_ERROR: key})


class _Keys(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class Slo(_Keys):
    """Service-level objectives per request (vLLM's goodput): a request is good when it succeeded and its
    TTFT, TPOT (and E2EL, when given) are within these bounds. Default: MLPerf Inference's Server bounds of
    Llama-3.1-8B (p99 TTFT <= 2 s, p99 TPOT <= 100 ms; other models' differ: loadgen/mlperf.conf), also used for
    the point's p99 check."""

    ttft_s: float = Field(default=2.0, gt=0)
    tpot_s: float = Field(default=0.1, gt=0)
    e2el_s: float | None = Field(default=None, gt=0)


class GenerateConfig(CaseConfig):
    family: ClassVar[str] = "generate"

    model: str = Field(description="shape preset (flagperf.generate.presets.PRESETS)")
    checkpoint_path: LocalPath = Field(default=None, description="a local save_pretrained folder; null: random "
                                                                 "weights in the preset's shape")
    precision: Literal["bf16", "fp16", "fp32"]
    engine: str = Field(description="an engine folder of the vendor: vendor_images/<vendor>/generate/<engine>/")
    compile: bool = Field(default=False, description="hf: let generate torch.compile the decoding step")
    prompts_path: DataFile = Field(default=None, description="jsonl or csv with prompt and optional reference; "
                                                             "null: synthetic prompts of input_len tokens")
    input_len: int = Field(ge=1, le=MAX_TOKENS, description="synthetic prompt length; a file's prompts are cut to "
                                                            "it")
    max_new_tokens: int = Field(ge=1, le=MAX_TOKENS, description="output tokens per request (no early stop: counts "
                                                                 "are exact)")
    concurrency: list[int] = Field(default_factory=list, description="closed-loop points: requests in flight "
                                                                     "(batch engines: the batch size)")
    requests: int | None = Field(default=None, ge=1, le=MAX_REQUESTS,
                                 description="requests per point (batch engines: rounded up to whole batches of "
                                             "the level's concurrency)")
    duration_s: float | None = Field(default=None, gt=0, description="or: send requests for this long per point")
    warmup_batches: int = Field(default=1, ge=0, description="batch engines: untimed batches per level")
    seed: int = Field(default=0, ge=-(2 ** 63), le=2 ** 64 - 1, description="torch's seed range")
    # Serving engines (engine folder with `server:`, or `endpoint`): see flagperf.generate.serve.
    request_rates: list[float] = Field(default_factory=list, description="open-loop points: requests/s")
    burstiness: float = Field(default=1.0, gt=0, le=1000, description="gamma shape of the inter-arrival times "
                                                                      "(1: Poisson; below 1 burstier)")
    max_concurrency: int | None = Field(default=None, ge=1, le=MAX_IN_FLIGHT,
                                        description="open loop: at most this many in flight")
    warmup_requests: int | None = Field(default=None, ge=0, le=MAX_REQUESTS,
                                        description="untimed requests before each point; null: 2 x its concurrency")
    api: Literal["chat", "completions"] = Field(default="chat", description="/v1/chat/completions or "
                                                                              "/v1/completions")
    exact_output: bool = Field(default=True, description="ask for exactly max_new_tokens (ignore end of "
                                                          "sequence) where the engine can")
    sharegpt_path: DataFile = Field(default=None, description="ShareGPT-style JSON: first human turn the "
                                                              "prompt, first reply's length the output length")
    slo: Slo = Field(default_factory=Slo)
    tensor_parallel: int = Field(default=1, ge=1, description="{tensor_parallel} of the server command")
    nodes: int = Field(default=1, ge=1, description="hosts the server spans (devices = tensor_parallel x nodes)")
    server_args: list[str] = Field(default_factory=list, description="appended to the engine's command")
    server_env: dict[str, str] = Field(default_factory=dict, description="added to the server's environment; "
                                                                          "a value may be ${NAME}")
    ready_timeout_s: float = Field(default=600.0, gt=0, description="the server must answer its ready path "
                                                                     "within this long")
    request_timeout_s: float = Field(default=600.0, gt=0, description="one request's limit, from the send to the "
                                                                       "stream's end")
    # A name (str) is allowed too, by _endpoint_name: kept out of the annotation so that an error in the settings
    # is reported at endpoint.<key>, not under a union member's tag.
    endpoint: Endpoint | None = Field(default=None, description="a running server instead of starting one: its "
                                      "settings, or the name of one the inventory's endpoints list")

    _case_folder: Path | None = PrivateAttr(default=None)  # from the validation context: where relative data
                                                           # files are

    @model_validator(mode="after")
    def _remember_case_folder(self, info: ValidationInfo) -> GenerateConfig:
        folder = (info.context or {}).get(CASE_FOLDER)
        self._case_folder = Path(folder) if folder is not None else None
        return self

    def data_file(self, key: Literal["prompts_path", "sharegpt_path"]) -> Path:
        """The file ``key`` names, as the round reads it: resolved inside its root again (a link may have changed
        since the plan), or one line naming the key."""
        value = getattr(self, key)
        assert value is not None
        try:
            path = data_path(value, self._case_folder)
        except ValueError as exc:
            raise CaseUserError(f"{key}: {exc}") from None
        if path is None:
            raise CaseUserError(f"{key}: {value!r} is relative to the case's folder, and this round was given none")
        return path

    @field_validator("endpoint", mode="wrap")
    @classmethod
    def _endpoint_name(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Endpoint | str | None:
        """The name of an endpoint the inventory lists (the plan puts its settings here), or the settings."""
        if isinstance(value, str):
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", value):
                raise ValueError("must be the settings of an endpoint, or the name of one the inventory lists")
            return value
        if value is not None and not isinstance(value, dict | Endpoint):  # not quoted: it may hold a secret
            raise PydanticCustomError(HIDDEN_INPUT, "must be the settings of an endpoint (base_url, model, api_key, "
                                      "devices, client_host), or the name of one the inventory lists")
        return handler(value)

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, value: list[int]) -> list[int]:
        if any(c < 1 or c > MAX_IN_FLIGHT for c in value):
            raise ValueError(f"every concurrency level must be 1 to {MAX_IN_FLIGHT}")
        if len(set(value)) != len(value):
            raise ValueError("a concurrency level is listed twice")
        return value

    @field_serializer("endpoint")
    def _endpoint_out(self, value: Endpoint | str | None) -> dict[str, Any] | str | None:
        """An inventory's name (before the plan puts its settings here) is written as it is."""
        return value.model_dump() if isinstance(value, Endpoint) else value

    @field_validator("request_rates")
    @classmethod
    def _rates(cls, value: list[float]) -> list[float]:
        if any(r <= 0 or r > MAX_RATE for r in value):
            raise ValueError(f"every request rate must be > 0 and at most {MAX_RATE:g} requests/s")
        if len({f"{r:g}" for r in value}) != len(value):
            raise ValueError("a request rate is listed twice")
        return value

    @field_validator("server_args")
    @classmethod
    def _args(cls, value: list[str]) -> list[str]:
        """No key on the command line: it would be in plan.json, serving.json, server.log and the host's process
        list. The server gets its key from its environment (the engine's api_key_env), which the client reads."""
        if any(re.match(r"--api[-_]key(=|\Z)", word) for word in value):
            raise PydanticCustomError(HIDDEN_INPUT, "--api-key: a key on the server's command line would be written "
                                      "to plan.json, serving.json and server.log (not shown); give it as ${NAME} "
                                      "in server_env under the engine's key variable (its api_key_env)")
        return value

    @field_validator("server_env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        """Names of variables; a variable named like a secret (HF_TOKEN, VLLM_API_KEY) takes a ${NAME} only. Its
        errors never quote the values (any may be a secret)."""
        for name, text in value.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise PydanticCustomError(HIDDEN_INPUT, f"{name[:64]!r} is not an environment variable name")
            if SECRET_NAME.search(name) and not REFERENCE.match(text):
                raise PydanticCustomError(HIDDEN_INPUT, f"{name}: a secret's variable takes a ${{NAME}} reference "
                                          "(set where the server runs), never the value itself; not shown")
        return value

    @property
    def devices(self) -> int:
        """Accelerators serving the model: per-device figures divide by this."""
        return self.endpoint.devices if isinstance(self.endpoint, Endpoint) else self.tensor_parallel * self.nodes

    @model_validator(mode="after")
    def _requests_or_duration(self) -> GenerateConfig:
        """Rules between keys; each error names the key it is about (its line names that key's file, not the
        whole configuration)."""
        if self.checkpoint_path is None and self.model not in PRESETS:
            raise _about("model", f"{self.model!r} is not a preset ({', '.join(PRESETS)}) and no checkpoint_path "
                         "is given")
        if not self.concurrency and not self.request_rates:
            raise _about("concurrency", "give at least one point: concurrency levels or request_rates (both are "
                         "empty)")
        if not self.request_rates and self.max_concurrency is not None:  # vLLM's --max-concurrency caps its rate
            raise _about("max_concurrency", "caps the open-loop points (request_rates), and there are none; a "
                         "closed-loop point is a concurrency level (concurrency: [8])")
        if not self.request_rates and self.burstiness != 1.0:
            raise _about("burstiness", "shapes the open-loop points' arrivals (request_rates), and there are none")
        if self.prompts_path is not None and self.sharegpt_path is not None:
            raise _about("sharegpt_path", "give at most one of prompts_path and sharegpt_path (set the other to "
                         "null)")
        if self.prompts_path is not None and Path(self.prompts_path).suffix not in (".jsonl", ".csv"):
            raise _about("prompts_path", f"{self.prompts_path!r} must be a .jsonl or .csv file")
        if self.requests is None and self.duration_s is None:
            raise _about("requests", "give exactly one of requests and duration_s (both are null)")
        if self.requests is not None and self.duration_s is not None:
            raise _about("duration_s", f"give exactly one of requests and duration_s (requests is {self.requests} "
                         "too; set it to null to run for a duration)")
        if self.duration_s is not None and self.duration_s >= self.timeout_s:
            raise _about("duration_s", f"{self.duration_s:g} must be well below timeout_s ({self.timeout_s:g})")
        return self

    def check_for_vendor(self, origins: dict[str, str], source: str, vendor: str | None,
                         files_are_local: bool, engine_roots: list[Path] | None = None) -> None:
        """The engine names a folder of the vendor (its Python package is checked on the host, in the round);
        the serving keys need a serving engine, and its API."""
        slowest = min(self.request_rates, default=None)
        if self.requests is not None and slowest is not None and self.requests / slowest >= self.timeout_s:
            raise ConfigError(origins.get("request_rates", source), "request_rates",
                              f"{self.requests} requests at {slowest:g} requests/s take about "
                              f"{self.requests / slowest:g} s, beyond timeout_s ({self.timeout_s:g})")
        if vendor:
            from flagperf.generate.engines import load_engine

            engine = load_engine(vendor, self.engine, origins.get("engine", source))
            self.check_engine(engine.manifest, origins, source)

    def check_engine(self, manifest: object, origins: dict[str, str], source: str) -> None:
        """Keys that only a serving engine reads are refused for a batch engine, and the other way round."""
        server = getattr(manifest, "server", None)
        name = getattr(manifest, "name", self.engine)
        if server is None:
            serving_only = {"request_rates": self.request_rates, "endpoint": self.endpoint,
                            "sharegpt_path": self.sharegpt_path, "server_args": self.server_args,
                            "server_env": self.server_env, "max_concurrency": self.max_concurrency,
                            "warmup_requests": self.warmup_requests}
            for key, value in serving_only.items():
                if value not in (None, [], {}):
                    raise ConfigError(origins.get(key, source), key, f"engine {name} runs batches in the case "
                                      "process; this key needs a serving engine (an engine folder with `server:`)")
            if not self.concurrency:
                raise ConfigError(origins.get("concurrency", source), "concurrency",
                                  f"engine {name} runs batches: give at least one concurrency level")
            return
        if self.api not in server.apis:
            raise ConfigError(origins.get("api", source), "api", f"engine {name} serves {', '.join(server.apis)} "
                              f"only (its engine.yaml server.apis)")
        if self.compile:
            raise ConfigError(origins.get("compile", source), "compile", f"engine {name} is a server: its own "
                              "arguments (server_args) choose compilation")
