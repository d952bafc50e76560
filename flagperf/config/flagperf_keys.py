"""The names FlagPerf's training benchmarks give their settings (a vendor's config_<hw>x<nnodes>x<nproc>.py, the
benchmark's _base.py and mutable_params.py), and what each is called here, so that a vendor's file brought from
FlagPerf is refused with the key to write instead of a bare "unknown key"."""

from __future__ import annotations

# FlagPerf's name -> this project's training key (the same meaning; per process where FlagPerf's is per device).
RENAMED: dict[str, str] = {
    "train_batch_size": "batch_size",
    "learning_rate": "lr",
    "max_epoch": "max_epochs",
    "weight_decay_rate": "weight_decay",
    "init_checkpoint": "checkpoint_path",
    "fp16": "precision",  # fp16 = True is precision: fp16 (bf16 where the hardware has it)
    "amp": "precision",
    "bf16": "precision",
}

# FlagPerf's names with no counterpart in a scale file here, and why.
NOT_HERE: dict[str, str] = {
    "eval_batch_size": "evaluation uses batch_size",
    "dist_backend": "the backend follows the device (nccl on GPUs, gloo on the CPU)",
    "ddp_type": "parallel (ddp or fsdp) says how the model is distributed",
    "gradient_accumulation_steps": "every step is one optimizer step",
    "max_samples_termination": "max_steps and max_epochs bound a run",
    "warmup": "the learning-rate schedule is the case's (warmup_steps here counts untimed steps, not a schedule)",
    "data_dir": "the data dir is CASES's value in test_conf.py",
    "vendor": "the vendor is test_conf.py's VENDOR",
    "local_rank": "the launcher sets each process's rank",
    "distributed": "the launcher sets up the process group",
    "do_train": "a training case always trains",
    "training_event": "a vendor's event hooks go in vendor/<vendor>/extern/ (see the vendor guide)",
}


def flagperf_key_hint(key: str, case_keys: set[str] | frozenset[str]) -> str | None:
    """What to write instead of FlagPerf's setting ``key`` in a case whose keys are ``case_keys``, or None when
    ``key`` is not one of FlagPerf's names."""
    renamed = RENAMED.get(key)
    if renamed is not None and renamed in case_keys:
        return f"FlagPerf's name; this case's key is {renamed}"
    if renamed is not None:
        return f"FlagPerf's name for {renamed}, which this case does not have"
    if key in NOT_HERE:
        return f"FlagPerf's setting has no counterpart here: {NOT_HERE[key]}"
    return None
