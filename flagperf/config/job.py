"""The job file: everything a host needs to run one case round, written by the controller."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from flagperf.config.vendors import HostSpecSettings, Vendor, load_vendor
from flagperf.results.prompt_positions import MAX_POSITION, Reservation
from flagperf.results.provenance import engine_info, library_versions
from flagperf.results.schema import Failure, Provenance, RoundResult

JOB_FILE = "job.json"


class Job(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str
    case: str
    family: str
    round: int = Field(ge=1)
    host: str
    node_rank: int = Field(ge=0, default=0)
    nnodes: int = Field(ge=1, default=1)
    master_addr: str = "127.0.0.1"
    master_port: int | None = Field(default=None, ge=1, le=65535,
                                    description="the inventory's MASTER_PORT for multi-node rounds")
    vendor: str
    attempt: int = Field(ge=1, default=1)
    earlier_attempts: int = Field(ge=0, default=0, description="attempts of this round that earlier flow runs of the "
                                                               "run made (a retry of the run runs it again)")
    prompt_positions: dict[str, Annotated[int, Field(ge=0, le=MAX_POSITION)]] = Field(
        default_factory=dict, description="for each prompt stream at an endpoint, the position after every prompt "
                                          "the run's earlier rounds and attempts took there (their "
                                          "prompt_positions.json): a round at that endpoint starts there")
    prompt_reservations: list[Reservation] = Field(
        default_factory=list, description="rounds at endpoints the controller dispatched whose records the run folder "
                                          "does not hold (prompt_positions/reserved-*.json): a round at an endpoint "
                                          "also starts after the most each one of its own stream may have taken")
    monitor_interval_s: float | None = Field(
        default=None, gt=0, description="seconds between the samples of the monitors watching this round (flagperf "
                                        "run's --monitor-interval); None: no monitors, or not known to the round")
    config: dict[str, Any]
    config_origins: dict[str, str]
    run_overrides: dict[str, dict[str, Any]]
    command: str | None = None
    image: dict[str, Any]
    controller_libraries: dict[str, str] = Field(default_factory=dict)
    prefect_context: dict[str, Any] | None = Field(
        default=None, description="the run_case task's Prefect context (JSON form): inference steps nest under it")
    spec_settings: HostSpecSettings | None = Field(
        default=None, description="the inventory's spec_settings for this host (its clock, its memory), laid over the "
                                  "vendor's when the host builds its spec table")
    run_cases: list[str] = Field(
        default_factory=list, description="the run's case folders, <family>/<case> (RunPlan.case_folders): the source "
                                          "digest a round records covers them, as the plan's does")

    def digest_cases(self) -> list[str]:
        """The case folders the round's source digest covers: the run's (its own among them)."""
        own = f"{self.family}/{self.case}"
        return self.run_cases if own in self.run_cases else [*self.run_cases, own]

    def host_vendor(self) -> Vendor:
        """The job's vendor as this host sees it: the host's vendor folder, with the inventory's spec_settings for
        this host over the vendor's."""
        return load_vendor(self.vendor).with_host_settings(self.spec_settings)

    def failed_result(self, failure: Failure, host_probe: dict[str, Any] | None) -> RoundResult:
        """The result of a round that left none of its own (a crash, a timeout, a lost host)."""
        now = datetime.now(timezone.utc)
        probe = host_probe or {}
        return RoundResult(
            run_id=self.run_id, case=self.case, family=self.family, round=self.round, host=self.host,
            node_rank=self.node_rank, vendor=self.vendor, status="failed", failure=failure, started_at=now,
            finished_at=now, duration_s=0.0, measured_seconds=0.0, device=probe.get("device"), config=self.config,
            provenance=Provenance(
                **engine_info(self.vendor, self.digest_cases()), command=self.command,
                python=probe.get("python", sys.version.split()[0]),
                libraries={**self.controller_libraries, **probe.get("libraries", library_versions())},
                host=probe.get("host", {}), image=self.image, config_origins=self.config_origins,
                run_overrides=self.run_overrides, attempt=self.attempt,
            ),
        )
