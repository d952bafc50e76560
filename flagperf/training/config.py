"""What a training case's configuration is made of, without torch: the keys every training case has
(TrainingConfig) and its data paths' type (LocalPath). `flagperf validate` reads a case's Config by its base, so a
case that imports them from here is checked without importing torch, which the driver (flagperf.training.driver,
where they are importable too) needs to run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from flagperf.config.files import LocalPath as LocalPath  # a local file or none (checked where the config is read)
from flagperf.config.models import CaseConfig
from flagperf.results.schema import MAX_NNODES


class TrainingConfig(CaseConfig):
    """Keys of every training case (values in case.yaml)."""

    nnodes: int = Field(ge=1, le=MAX_NNODES)
    nproc_per_node: int = Field(ge=1, le=64)
    max_epochs: int = Field(ge=1)
    log_freq: int = Field(ge=1, description="a STEP_END event every log_freq steps (and at step 1); the loss "
                                            "is read back to the host only then")
    master_port: int = Field(ge=1024, le=65535)
    seed: int
    target_metric: str = Field(description="the evaluation metric convergence is judged on")
    target: float
    target_mode: Literal["max", "min"] = "max"
    target_unit: str = Field(default="", max_length=40, description="the target metric's unit, as its figure "
                             "final_<target_metric> states it: fraction for an accuracy (0 to 1); '' for none")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        default="fp32", description="autocast dtype (fp32 weights and optimizer state stay, fp16 adds a grad "
                                    "scaler); also the peak MFU is taken against")
    parallel: Literal["ddp", "fsdp"] = Field(
        default="ddp", description="several processes: DDP (a replica each) or FSDP2 fully_shard (parameters, "
                                   "gradients and optimizer state sharded; per block, then the root)")
    compile: bool = Field(default=False, description="torch.compile the wrapped model")
    activation_checkpointing: bool = Field(default=False, description="recompute activations in backward")
    warmup_steps: int = Field(default=0, ge=0, description="steps before the timed region (compilation, "
                                                           "autotuning); 0 = every step is timed, as FlagPerf")
    max_steps: int | None = Field(default=None, ge=1, description="stop training after this many steps")
    cpu_threads: int | None = Field(default=None, ge=1, le=1024, description=(
        "torch threads per process on the cpu vendor; null = this process's share of the usable cores"))
