"""The generate case config (cases/generate/<model>/case.yaml ``configurations``, vendor/<vendor>.yaml overrides)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from flagperf.config.models import CaseConfig
from flagperf.generate.models import PRESETS
from flagperf.training.data import LocalPath


class GenerateConfig(CaseConfig):
    family: ClassVar[str] = "generate"

    model: str = Field(description="shape preset (flagperf.generate.models.PRESETS)")
    checkpoint_path: LocalPath = Field(default=None, description="a local save_pretrained folder; null: random "
                                                                 "weights in the preset's shape")
    precision: Literal["bf16", "fp16", "fp32"]
    engine: str = Field(description="an engine folder of the vendor: vendor_images/<vendor>/generate/<engine>/")
    compile: bool = Field(default=False, description="hf: let generate torch.compile the decoding step")
    prompts_path: LocalPath = Field(default=None, description="jsonl or csv with prompt and optional reference; "
                                                              "null: synthetic prompts of input_len tokens")
    input_len: int = Field(ge=1, description="synthetic prompt length; a file's prompts are cut to it")
    max_new_tokens: int = Field(ge=1, description="output tokens per request (no early stop: counts are exact)")
    concurrency: list[int] = Field(min_length=1, description="simultaneous requests per level")
    requests: int | None = Field(default=None, ge=1, description="requests per level (rounded up to whole "
                                                                  "batches of the level's concurrency)")
    duration_s: float | None = Field(default=None, gt=0, description="or: issue batches for this long per level")
    warmup_batches: int = Field(default=1, ge=0, description="untimed batches per level (cache, compile)")
    seed: int = 0

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, value: list[int]) -> list[int]:
        if any(c < 1 for c in value):
            raise ValueError("every concurrency level must be >= 1")
        if len(set(value)) != len(value):
            raise ValueError("a concurrency level is listed twice")
        return value

    @model_validator(mode="after")
    def _requests_or_duration(self) -> GenerateConfig:
        if self.checkpoint_path is None and self.model not in PRESETS:
            raise ValueError(f"model {self.model!r} is not a preset ({', '.join(PRESETS)}) and no checkpoint_path "
                             "is given")
        if (self.requests is None) == (self.duration_s is None):
            raise ValueError("give exactly one of requests and duration_s")
        if self.duration_s is not None and self.duration_s >= self.timeout_s:
            raise ValueError(f"duration_s ({self.duration_s:g}) must be well below timeout_s ({self.timeout_s:g})")
        return self

    def check_for_vendor(self, origins: dict[str, str], source: str, vendor: str | None,
                         files_are_local: bool) -> None:
        """The engine names a folder of the vendor (its Python package is checked on the host, in the round)."""
        if vendor:
            from flagperf.generate.engines import load_engine

            load_engine(vendor, self.engine, origins.get("engine", source))
