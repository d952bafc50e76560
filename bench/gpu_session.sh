#!/usr/bin/env bash
# One lent GPU session in few, full commands (a machine's start costs time; a command may run 10 minutes,
# a session 30). Each part is about 7 minutes of work, every bench under its own time limit so that one hang
# costs only itself, and every bench writes its records into the output folder as it makes them ($OUT on
# the device machine, whose files come back even when the command is stopped; at most 8 files a part), so
# a part stopped at its limit keeps what it finished. Each log starts with the code (git revision, source
# digest) and the machine.
#   bash bench/gpu_session.sh base       base specs, interleaved with bare loops, and the MAMF-style reference
#   bash bench/gpu_session.sh models     inference (resnet50-infer, bert-large-infer), training
#   bash bench/gpu_session.sh generate   tests/gpu, then the generate family against a bare generate loop
#   bash bench/gpu_session.sh serving    `transformers serve` swept over concurrency 1-64, its Pareto plot, and
#                                        the same server through GuideLLM where it is installed
#   bash bench/gpu_session.sh install    the project installed as a user would, a short base run, tests/gpu
#   bash bench/gpu_session.sh operators  native torch against FlagGems (carried in .whl/) on every operator
#   bash bench/gpu_session.sh PART --quick   a dry run of the same part on this CPU (tested in CI)
# .whl/ (bench/gpu_wheels.sh) is carried to the device machine: `run` with carry [".whl"].
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:?usage: gpu_session.sh base|models|generate|serving|install|operators [--quick]}
quick=0; [ "${2:-}" = --quick ] && quick=1
out=${OUT:-bench/results/gpu_session}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
status=0
q=(); [ $quick = 1 ] && q=(--quick)
# A dry run takes one pair of each model whatever this machine's speed (a budget would make that depend on it).
short() { [ $quick = 1 ] && echo 600 || echo "$1"; }
qm=(); [ $quick = 1 ] && qm=(--quick --pairs 1)

step() {  # step NAME SECONDS COMMAND...: runs it with a limit, its output straight into $out/NAME.log
  local name=$1 limit=$2; shift 2
  [ $quick = 1 ] && limit=$(( limit * 3 ))  # a dry run's limits only catch a hang, on any machine's speed
  local started=$SECONDS code
  echo "=== $name (limit ${limit} s): $*"
  timeout --kill-after=10 "$limit" "$@" > "$out/$name.log" 2>&1
  code=$?
  tail -15 "$out/$name.log"
  echo "=== $name: exit $code after $(( SECONDS - started )) s$([ "$code" = 124 ] && echo ' (time limit)')"
  [ "$code" = 0 ] || status=1
}

if [ $quick = 0 ]; then
  nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
  deps=$(mktemp -d /tmp/pydeps.XXXX)  # fresh each time: a warm machine keeps ignored folders between commands
  if ! "$py" -c "import pydantic, yaml, psutil, orjson, typer" 2>/dev/null || [ -d .whl ]; then
    "$py" -m pip install -q --no-index --no-deps --target "$deps" .whl/*.whl || exit 1
  fi
  export PYTHONPATH="$deps:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
"$py" -c "from flagperf.results.provenance import code_identity; print('code:', code_identity())"

case $part in
  base)
    if [ $quick = 1 ]; then
      step base_specs 300 "$py" bench/base_specs_gpu.py --quick --pairs 2 --out "$out" --results /tmp/gpu_session_runs \
        --cases computation-BF16,main_memory-capacity,interconnect-h2d
    else
      budget=${BASE_BUDGET_S:-380}  # a session with less device time left asks for less
      step base_specs $(( budget + 90 )) "$py" bench/base_specs_gpu.py --pairs 3 --budget-s "$budget" --out "$out" \
        --results /tmp/gpu_session_runs
    fi
    ;;
  models)
    # Three pairs each: ~195 s and ~190 s on an H200 (a training harness round is a fresh process of 15-37 s).
    step inference 235 "$py" bench/inference_gpu.py "${qm[@]}" --budget-s "$(short 200)" --out "$out"
    step training 230 "$py" bench/training_gpu.py "${qm[@]}" --budget-s "$(short 200)" --out "$out"
    ;;
  generate)
    if [ $quick = 1 ]; then
      step tests_gpu 120 "$py" -m pytest tests/gpu -q -p no:cacheprovider --co
    else  # -v: each test's verdict is in the log as it ends, also when the limit stops the run
      step tests_gpu 250 "$py" -m pytest tests/gpu -v -p no:cacheprovider -rfs --tb=short --durations=10
    fi
    # generate runs 3 pairs whatever its budget; the budget only bounds extra pairs (up to 9)
    step generate 190 "$py" bench/generate_gpu.py "${q[@]}" --budget-s "$([ $quick = 1 ] && echo 20 || echo 160)" --out "$out"
    ;;
  serving)
    # The sweep stops starting points at its budget (360 s on a GPU); the limit leaves room for the last one,
    # the server's start (saving the random weights first) and its stop.
    step serving 420 "$py" bench/serving_gpu.py "${q[@]}" --out "$out"
    ;;
  install)
    step install 540 bash bench/gpu_install.sh "${q[@]}"
    ;;
  operators)
    # Operator by operator until the budget (a dry run takes every operator, whatever this machine's speed);
    # Triton compiles each FlagGems kernel on its first call (the correctness check, untimed).
    step operators 480 "$py" bench/operation_gpu.py "${q[@]}" --budget-s "$([ $quick = 1 ] && echo 1200 || echo 420)" \
      --out "$out"
    ;;
  *) echo "unknown part $part"; exit 2 ;;
esac
ls -la "$out"
exit $status
