#!/bin/bash
# The amd image's install script (FlagPerf's <framework>_install.sh): the in-container side's packages on top
# of the ROCm PyTorch image, and a check that amd-smi (the monitor's tool) is there.
set -euo pipefail
requirements="$1"
PIP_NO_CACHE_DIR=1 PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    python3 -m pip install -r "$requirements"
if ! command -v amd-smi >/dev/null; then
    echo "amd-smi is not in the base image: the amdsmi monitor will report itself unavailable" >&2
fi
