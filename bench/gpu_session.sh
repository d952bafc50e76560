#!/usr/bin/env bash
# One lent GPU session in few, full commands (each start of a machine costs minutes): the project installed
# as a user would (bench/gpu_install.sh, wheels from bench/gpu_wheels.sh in .whl/), then the engine against
# a bare loop of the same work, per issue. Each bench has its own time limit so that one hang does not cost
# the others; everything lands in bench/results/ and, packed, in $OUT (the device tool's return folder).
#   bash bench/gpu_session.sh base       install, base specs (issue 12), generate (14), GPU tests
#   bash bench/gpu_session.sh models     inference (13), training (15)
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:?usage: gpu_session.sh base|models}
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
if [ ! -d .pydeps ] && ! "$py" -c "import prefect" 2>/dev/null; then
  # Dependencies only here (the editable install and the base suite are gpu_install.sh's, in part base).
  "$py" -m pip install -q --no-index --no-deps --target .pydeps .whl/*.whl || exit 1
fi
[ -d .pydeps ] && export PYTHONPATH="$PWD/.pydeps:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

case $part in
  base)
    step base_specs 240 "$py" bench/base_specs_gpu.py --seconds 2 --sweep-seconds 20
    step generate 200 "$py" bench/generate_gpu.py
    step install 150 env GPU_TESTS="${GPU_TESTS:-tests/gpu/test_nvidia_base_specs.py tests/gpu/test_nvidia_tensorcore.py}" \
      bash bench/gpu_install.sh
    ;;
  models)
    step inference 330 "$py" bench/inference_gpu.py
    step training 240 "$py" bench/training_gpu.py
    ;;
  *) echo "unknown part $part"; exit 2 ;;
esac
tar czf "$out/gpu_$part.tgz" bench/results 2>/dev/null
exit $status
