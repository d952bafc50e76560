#!/bin/bash
# devprobe driver: runs each probe as its own process under `timeout`, sharing a global time budget.
# usage (device):  set -o pipefail; PYTHONUNBUFFERED=1 bash .devprobe/probe.sh 465 2>&1 | tee $OUT/log.txt
set -u
D=$(cd "$(dirname "$0")" && pwd)
export OUT=${OUT:-/tmp/probe_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$D${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
RES=$OUT/results.md
TOTAL=${1:-465}
START=$(date +%s); END=$((START+TOTAL))
echo "# devprobe results ($(date -u +%FT%TZ), total budget ${TOTAL}s)" > "$RES"

run_probe () {  # name nominal_timeout reserve_for_later_probes cmd...
  local name=$1 nominal=$2 reserve=$3; shift 3
  local now t rc s el
  now=$(date +%s); t=$((END-now-reserve)); [ "$t" -gt "$nominal" ] && t=$nominal
  if [ "$t" -lt 8 ]; then printf '\n## %s: SKIPPED (only %ss left)\n' "$name" "$((END-now))" >> "$RES"; return; fi
  printf '\n## %s (timeout %ss)\n' "$name" "$t" >> "$RES"
  echo "===== $name (timeout ${t}s) $(date -u +%T) ====="
  export PROBE_DEADLINE=$((now+t))
  s=$(date +%s.%N)
  timeout -k 5 "$t" "$@"; rc=$?
  el=$(python3 -c "import time;print(f'{time.time()-$s:.1f}')")
  local note=""; [ "$rc" = 124 ] && note=" **TIMEOUT (killed)**"; [ "$rc" = 137 ] && note=" **KILLED**"
  echo "- probe exit=$rc wall=${el}s$note" >> "$RES"
  echo "===== $name done rc=$rc wall=${el}s ====="
}
#          name           nominal  reserve(s) for the probes after it
run_probe "1 env"          20   300  bash "$D/env.sh"
run_probe "2 gemm"         60   260  python3 "$D/p_gemm.py"
run_probe "3 resnet50"    150   190  python3 "$D/p_resnet.py"
run_probe "4 bert-large"   90   140  python3 "$D/p_bert.py"
run_probe "5 llama3-8b generate" 150 60 python3 "$D/p_llama_gen.py"
run_probe "6 llama3.2-1b train" 120 0  python3 "$D/p_train.py"
printf '\n(total wall %ss)\n' "$(( $(date +%s) - START ))" >> "$RES"
echo "ALL DONE"
