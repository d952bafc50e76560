"""FlagPerf inference keys that have no meaning here, each with what does its job instead.

FlagPerf lets a vendor file add any key (a warning, then the key is read by that vendor's compiler class).
The keys below are ones FlagPerf's own vendor files set for compilers or file layouts this project does not
have; carried silently they would do nothing, so a vendor file or --set naming one is refused in one line,
naming the file, the key and the replacement.
"""

from __future__ import annotations

from typing import Any

from flagperf.errors import ConfigError

NOT_READ_HERE = {
    "trt_tmp_path": "the engine file goes under the host's work root (inference-artifacts/<run>/<case>/round<N>/); "
                    "keep it with keep_artifacts: true and reuse it with exist_compiler_path",
    "tensorrt_tmp_path": "the engine file goes under the host's work root (inference-artifacts/<run>/<case>/"
                         "round<N>/); keep it with keep_artifacts: true and reuse it with exist_compiler_path",
    "has_dynamic_axis": "every case exports its batch axis as symbolic; the engine is built for batch_size",
    "torchtrt_full_compile": "there is no torch-tensorrt engine; compiler: inductor compiles the PyTorch model "
                             "(inductor_mode chooses how)",
}


def not_read_message(key: str) -> str | None:
    """Why a FlagPerf inference key is not read, and what replaces it; None for any other key."""
    replacement = NOT_READ_HERE.get(key)
    return f"FlagPerf's {key} is not read here: {replacement}" if replacement else None


def refuse_keys_not_read(values: dict[str, Any], origins: dict[str, str], default_source: str) -> None:
    """A merged inference config holding one of FlagPerf's keys that do nothing here: a one-line error."""
    for key in sorted(values):
        message = not_read_message(key)
        if message:
            raise ConfigError(origins.get(key, default_source), key, message)
