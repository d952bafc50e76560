"""The job file: everything a host needs to run one case round, written by the controller."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

JOB_FILE = "job.json"


class Job(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str
    case: str
    round: int = Field(ge=1)
    host: str
    node_rank: int = Field(ge=0, default=0)
    vendor: str
    attempt: int = Field(ge=1, default=1)
    config: dict[str, Any]
    config_origins: dict[str, str]
    run_overrides: dict[str, dict[str, Any]]
    command: str | None = None
    image: dict[str, Any]
    controller_libraries: dict[str, str] = Field(default_factory=dict)
