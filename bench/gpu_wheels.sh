#!/usr/bin/env bash
# Downloads into .whl/ the wheels a GPU host (Python 3.12, Linux x86_64, no internet) needs to install this
# project as a user would (bench/gpu_install.sh), at the lock's versions: the default install plus the
# nvidia extra and pytest (for tests/gpu), without what a GPU image carries (torch and its CUDA libraries, numpy,
# pandas, transformers with huggingface-hub, tokenizers and safetensors, onnx, onnxruntime, triton) and without
# what only those need. matplotlib, Pillow, scikit-learn and scipy are left out too, to stay inside the 64 MiB a
# device command carries (with them it is 64 MB): a host without matplotlib measures and reports without plots
# (the report says so), Pillow is read by image cases only, scikit-learn by digits-mlp only; gpu_install.sh's
# pip check names what is absent.
# Run here, where the package index is reachable; carry .whl/ to the GPU host.
#   bash bench/gpu_wheels.sh [DIR]   (default .whl)
#   bash bench/gpu_wheels.sh --resolve-only   prints the pins it would download, downloads nothing (tested in CI)
set -euo pipefail
cd "$(dirname "$0")/.."
resolve_only=0; [ "${1:-}" = --resolve-only ] && { resolve_only=1; shift; }
dest=${1:-.whl}
python=3.12
command -v uv >/dev/null || python3 -m pip install -q uv
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The resolution for the GPU host's Python and platform, inside the lock.
# pytest to run tests/gpu there; openai and accelerate for `transformers serve` (the serving bench's server)
printf 'pytest\nopenai\naccelerate\n' > "$work/tests.in"
# --no-python-downloads: resolving for 3.12 needs no 3.12 interpreter (the target comes from --python-version);
# without it uv fetches one to build nothing with (10-15 s a resolve, or retries where that host is unreachable).
uv pip compile --no-python-downloads pyproject.toml "$work/tests.in" --extra nvidia -c constraints.txt --python-version "$python" \
  --python-platform x86_64-manylinux_2_28 --annotation-style line --no-header -q -o "$work/resolved.txt"

# Keep a package when something kept needs it (the project itself first); the image's own are dropped
# together with whatever only they need.
python3 - "$work/resolved.txt" > "$work/wanted.txt" <<'EOF'
import re
import sys

# transformers' own libraries go with the image's transformers: it checks their versions at import, so a carried
# huggingface-hub of the lock's (2.x) put ahead of the image's would break the image's transformers (5.17 wants <2).
IN_IMAGE = re.compile(r"^(torch|numpy|pandas|transformers|huggingface-hub|tokenizers|safetensors|hf-xet|onnx"
                      r"|onnxruntime|matplotlib|pillow|scikit-learn|scipy|triton|nvidia-(?!ml-py).*)$")
pins: dict[str, str] = {}
parents: dict[str, set[str]] = {}
for line in open(sys.argv[1]):
    requirement, _, via = line.partition("# via ")
    requirement = requirement.split(";")[0].strip()
    if "==" not in requirement:
        continue
    name, version = requirement.split("==")
    name = name.lower()
    pins[name] = version
    # "via prefect, -r tests.in, flagperf-prefect (pyproject.toml)": the project and tests.in are roots.
    parents[name] = {"<root>" if "pyproject.toml" in p or "tests.in" in p else p.strip().split(" ")[0].lower()
                     for p in via.split(",") if p.strip()}
kept: set[str] = set()
changed = True
while changed:
    changed = False
    for name, via in parents.items():
        if name in kept or IN_IMAGE.match(name):
            continue
        if "<root>" in via or via & kept:
            kept.add(name)
            changed = True
for name in sorted(kept):
    print(f"{name}=={pins[name]}")
# To build the project offline (the image's own setuptools may be older than pyproject's build-system asks).
print("setuptools>=68")
print("wheel")
EOF

# The carried folder goes ahead of the image's packages (gpu_session.sh's PYTHONPATH), so every carried pin must
# also accept the image's own transformers, huggingface-hub and torch, not only the lock's: a carried package
# needing hub 2 or a newer transformers would break the image's at import. GPU_IMAGE_PINS: another image's.
image_pins=${GPU_IMAGE_PINS:-"transformers==5.17.* huggingface-hub==1.33.* torch==2.11.*"}
printf '%s\n' $image_pins > "$work/image.in"
if ! uv pip compile --no-python-downloads "$work/wanted.txt" "$work/image.in" --python-version "$python" \
    --python-platform x86_64-manylinux_2_28 --no-header -q -o "$work/with_image.txt" 2> "$work/with_image.err"; then
  grep -v '^\s*$' "$work/with_image.err" | tail -15 >&2
  echo "gpu_wheels.sh: the carried wheels conflict with the GPU image's $image_pins (above)" >&2
  exit 1
fi
echo "gpu_wheels.sh: the carried wheels resolve with the GPU image's $image_pins" >&2

# FlagGems for the operators part (bench/operation_gpu.py), without its dependencies (installed --no-deps like
# every carried wheel): it pins numpy and SQLAlchemy exactly where the image and the lock have their own, and
# its Triton comes with the image's torch. 2.2 MB: with it .whl/ is about 44 MB of the 64 MiB a command carries.
echo "flag-gems==5.0.2" >> "$work/wanted.txt"

if [ $resolve_only = 1 ]; then cat "$work/wanted.txt"; exit 0; fi
mkdir -p "$dest"
# Binary wheels for the host's Python and platform; a package published only as a source archive is built
# here into a wheel (those are pure Python), so nothing is compiled on the host.
if ! python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python" --implementation cp \
    --abi "cp${python/./}" --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$dest" -r "$work/wanted.txt" 2> "$work/download.err"; then
  echo "some packages have no binary wheel; building those here" >&2
  while read -r requirement; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python" --implementation cp \
      --abi "cp${python/./}" --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d "$dest" "$requirement" 2>/dev/null \
      || python3 -m pip wheel -q --no-deps -w "$dest" "$requirement"
  done < "$work/wanted.txt"
fi
count=$(ls "$dest"/*.whl | wc -l)
size=$(du -sh "$dest" | cut -f1)
echo "$count wheels, $size in $dest (Python $python, x86_64); not carried: the GPU image's own packages"
