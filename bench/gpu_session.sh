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
#   bash bench/gpu_session.sh PART... --budget-s N   several parts in one command, sharing N seconds (each
#                                        part's limits scaled down to its share, never below its minimum)
#   bash bench/gpu_session.sh plan [SECONDS]  the commands to run with SECONDS of device time left (default
#                                        1800): the most pending parts first, each command within 10 minutes
#   bash bench/gpu_session.sh PART --quick   a dry run of the same part on this CPU (tested in CI)
# .whl/ (bench/gpu_wheels.sh) is carried to the device machine: `run` with carry [".whl"].
set -uo pipefail
cd "$(dirname "$0")/.."
usage="usage: gpu_session.sh PART... [--budget-s N] [--quick] | plan [SECONDS]; PART: base models generate serving install operators"
# Each part's worst case (the sum of its benches' limits, seconds) and the least it can be given: a share
# below that would measure too little to be worth its device time.
declare -A NOMINAL=([base]=470 [models]=465 [generate]=440 [serving]=420 [install]=540 [operators]=480)
declare -A MINIMUM=([base]=300 [models]=300 [generate]=400 [serving]=240 [install]=540 [operators]=240)
COMMAND_OVERHEAD_S=40   # per device command: the wheels installed to a fresh folder, each step's kill grace, the listing
COMMAND_LIMIT_S=570     # a device command may run 600 s; what is left is the transfer's margin
START_UP_S=180          # a machine's start, paid once when the commands follow each other at once
# The 30-minute session, most pending first (bench/README.md says what each still owes): the FP8/INT8 shape
# search and BF16 against MAMF; tests/gpu and the whole-harness generate bench; serving and operators, never
# run on a GPU, sharing a command; then what an H200 already measured once (models, install).
SESSION_PLAN=("base --budget-s 480" "generate --budget-s 480" "serving operators --budget-s 570"
              "models --budget-s 480" "install --budget-s 540")

command_seconds() {  # the most one line of SESSION_PLAN can take: its --budget-s, else its parts' nominals
  local words=($1) total=$COMMAND_OVERHEAD_S w i
  for ((i = 0; i < ${#words[@]}; i++)); do
    w=${words[i]}
    if [ "$w" = --budget-s ]; then echo "${words[i + 1]}"; return; fi
    total=$(( total + NOMINAL[$w] ))
  done
  echo "$total"
}

if [ "${1:-}" = plan ]; then
  left=${2:-1800}
  [[ $left =~ ^[0-9]+$ ]] || { echo "plan: SECONDS must be a whole number, not '$left'" >&2; exit 2; }
  left=$(( left - START_UP_S ))
  echo "# device time: ${2:-1800} s, of which ${START_UP_S} s the machine's start; run these at once, one after the other"
  echo "# (the machine goes back after a short idle), each as \`run\` with carry [\".whl\"] after bash bench/gpu_wheels.sh"
  planned=0
  for line in "${SESSION_PLAN[@]}"; do
    need=$(command_seconds "$line")
    if [ "$need" -le "$left" ]; then
      echo "bash bench/gpu_session.sh $line    # at most $need s"
      left=$(( left - need )); planned=$(( planned + 1 ))
    else
      echo "# not this session (needs $need s, $(( left > 0 ? left : 0 )) left): bash bench/gpu_session.sh $line"
    fi
  done
  [ $planned -gt 0 ] || { echo "plan: ${2:-1800} s of device time is too little for any part" >&2; exit 2; }
  exit 0
fi

parts=(); quick=0; budget=""
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --budget-s) budget=${2:-}; shift ;;
    -*) echo "$usage" >&2; exit 2 ;;
    *) [ -n "${NOMINAL[$1]:-}" ] || { echo "unknown part '$1'; $usage" >&2; exit 2; }; parts+=("$1") ;;
  esac
  shift
done
[ ${#parts[@]} -gt 0 ] || { echo "$usage" >&2; exit 2; }
[ -z "$budget" ] || [[ $budget =~ ^[0-9]+$ && $budget -le $COMMAND_LIMIT_S ]] \
  || { echo "--budget-s must be a whole number of seconds up to $COMMAND_LIMIT_S, not '$budget'" >&2; exit 2; }

# Each part's share of the command: its nominal, or, under --budget-s, the budget (less the command's
# overhead) split in proportion to the nominals and never above them; a share under a part's minimum is refused.
declare -A SHARE=()
nominal_sum=0
for p in "${parts[@]}"; do nominal_sum=$(( nominal_sum + NOMINAL[$p] )); done
for p in "${parts[@]}"; do
  share=${NOMINAL[$p]}
  if [ -n "$budget" ]; then
    share=$(( (budget - COMMAND_OVERHEAD_S) * NOMINAL[$p] / nominal_sum ))
    [ "$share" -le "${NOMINAL[$p]}" ] || share=${NOMINAL[$p]}
    if [ "$share" -lt "${MINIMUM[$p]}" ] && [ $quick = 0 ]; then
      echo "--budget-s $budget leaves $p ${share} s; it needs at least ${MINIMUM[$p]} s" >&2; exit 2
    fi
  fi
  SHARE[$p]=$share
done

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
    # Not the build tools (setuptools, wheel): on PYTHONPATH a newer setuptools (no pkg_resources from 81)
    # would shadow the image's for everything it runs; the project's build takes them from .whl itself.
    "$py" -m pip install -q --no-index --no-deps --target "$deps" \
      $(ls .whl/*.whl | grep -Ev '/(setuptools|wheel)-[0-9]') || exit 1
  fi
  export PYTHONPATH="$deps:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
"$py" -c "from flagperf.results.provenance import code_identity; print('code:', code_identity())"

run_part() {  # run_part PART SECONDS: the part's benches, their limits summing to at most SECONDS
  local part=$1 s=$2 half
  echo "=== part $part: ${s} s"
  case $part in
    base)
      if [ $quick = 1 ]; then  # a GEMM with its max search, a copy, the capacity, a transfer (unsupported on a CPU)
        step base_specs 300 "$py" bench/base_specs_gpu.py --quick --pairs 2 --out "$out" --results /tmp/gpu_session_runs \
          --cases computation-BF16,main_memory-bandwidth,main_memory-capacity,interconnect-h2d
      else  # the bench starts no new pair past its budget; the limit leaves room for the last pair
        step base_specs "$s" "$py" bench/base_specs_gpu.py --pairs 3 --budget-s $(( s - 90 )) --out "$out" \
          --results /tmp/gpu_session_runs
      fi
      ;;
    models)
      # Three pairs each: ~195 s and ~190 s on an H200 (a training harness round is a fresh process of 15-37 s).
      half=$(( s / 2 ))
      step inference "$half" "$py" bench/inference_gpu.py "${qm[@]}" --budget-s "$(short $(( half - 35 )))" --out "$out"
      step training "$half" "$py" bench/training_gpu.py "${qm[@]}" --budget-s "$(short $(( half - 30 )))" --out "$out"
      ;;
    generate)
      if [ $quick = 1 ]; then
        step tests_gpu 120 "$py" -m pytest tests/gpu -q -p no:cacheprovider --co
      else  # -v: each test's verdict is in the log as it ends, also when the limit stops the run
        step tests_gpu 250 "$py" -m pytest tests/gpu -v -p no:cacheprovider -rfs --tb=short --durations=10
      fi
      # generate runs 3 pairs whatever its budget; the budget only bounds extra pairs (up to 9)
      step generate $(( s - 250 )) "$py" bench/generate_gpu.py "${q[@]}" \
        --budget-s "$([ $quick = 1 ] && echo 20 || echo $(( s - 280 )))" --out "$out"
      ;;
    serving)
      # The sweep starts no point past its budget; the limit leaves room for the last one, the server's start
      # (saving the random weights first) and its stop.
      # Sharing a command, it copies no plots: the device tool returns 8 files a command, and the record holds
      # the points to draw them from here (serving_gpu.py --plot).
      local plots=(); [ ${#parts[@]} -gt 1 ] && plots=(--no-plots)
      step serving "$s" "$py" bench/serving_gpu.py "${q[@]}" "${plots[@]}" \
        $([ $quick = 1 ] || echo --budget-s $(( s - 60 ))) --out "$out"
      ;;
    install)
      step install "$s" bash bench/gpu_install.sh "${q[@]}"
      ;;
    operators)
      # Operator by operator until the budget (a dry run takes every operator, whatever this machine's speed);
      # Triton compiles each FlagGems kernel on its first call (the correctness check, untimed). Each passed
      # point's energy loop (3 x 0.1 s, the monitors around the bench) gives its energy per work.
      step operators "$s" "$py" bench/operation_gpu.py "${q[@]}" --budget-s "$([ $quick = 1 ] && echo 1200 || echo $(( s - 60 )))" \
        --energy-intervals 3 --monitor-interval 0.1 --out "$out"
      ;;
  esac
}

for p in "${parts[@]}"; do run_part "$p" "${SHARE[$p]}"; done
ls -la "$out"
exit $status
