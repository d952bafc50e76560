#!/usr/bin/env bash
# One lent GPU session in few, full commands (each start of a machine costs minutes): the project installed
# as a user would (bench/gpu_install.sh, wheels from bench/gpu_wheels.sh in .whl/), then the engine against
# a bare loop of the same work, per issue. Each bench has its own time limit so that one hang does not cost
# the others; everything lands in bench/results/ and, packed, in $OUT (the device tool's return folder).
#   bash bench/gpu_session.sh base       base specs (issue 12): the engine's 12 cases, then a bare loop of each
#   bash bench/gpu_session.sh models     inference (13), training (15)
#   bash bench/gpu_session.sh serving    LLM serving (14); the project installed as a user would, the base
#                                        suite and tests/gpu (11)
# Each part fits one device command (10 minutes); .whl/ (bench/gpu_wheels.sh) is carried.
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:?usage: gpu_session.sh base|models|serving}
out=${OUT:-bench/results/gpu_session}
mkdir -p "$out" bench/results
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
status=0

step() {  # step NAME SECONDS COMMAND...: runs it with a limit, output to bench/results/gpu_<NAME>.log
  local name=$1 limit=$2; shift 2
  local started=$SECONDS code
  echo "=== $name (limit ${limit} s): $*"
  timeout --kill-after=10 "$limit" "$@" > "bench/results/gpu_$name.log" 2>&1
  code=$?
  tail -25 "bench/results/gpu_$name.log"
  echo "=== $name: exit $code after $(( SECONDS - started )) s"
  [ "$code" = 0 ] || status=1
}

nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
deps=$(mktemp -d /tmp/pydeps.XXXX)  # fresh each time: a warm machine keeps ignored folders between commands
if ! "$py" -c "import prefect" 2>/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --target "$deps" .whl/*.whl || exit 1
fi
export PYTHONPATH="$deps:$PWD${PYTHONPATH:+:$PYTHONPATH}"

case $part in
  base)
    step base_specs 540 "$py" bench/base_specs_gpu.py --seconds 2 --sweep-seconds 20
    ;;
  models)
    step inference 300 "$py" bench/inference_gpu.py
    step training 230 "$py" bench/training_gpu.py
    ;;
  serving)
    step generate 200 "$py" bench/generate_gpu.py
    step install 330 bash bench/gpu_install.sh
    ;;
  *) echo "unknown part $part"; exit 2 ;;
esac
tar czf "$out/gpu_$part.tgz" bench/results 2>/dev/null
exit $status
