#!/usr/bin/env bash
# On a GPU host (Python 3.12 with its own torch, no internet), from the repository root, with the wheels of
# bench/gpu_wheels.sh in .whl/: install the project as a user would, offline, keeping the host's torch,
# then run the base suite on the nvidia vendor (one round, short measuring windows: this proves the installed
# path end to end inside a device command; bench/base_specs_gpu.py is where the figures are compared) and
# the GPU tests. Output under $OUT/gpu_install if set, else bench/results/gpu_install; exits nonzero, with
# the reason on the last line, if a step fails. Each step has a time limit so that one hang costs only itself.
#   bash bench/gpu_install.sh [--quick]   (--quick: this CPU, vendor cpu, one smoke case, no tests/gpu)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench/results}/gpu_install
mkdir -p "$out"
log() { echo "$*" | tee -a "$out/summary.md"; }
fail() { log "FAILED: $*"; exit 1; }
: > "$out/summary.md"
[ -d .whl ] || [ "${1:-}" = --quick ] || fail "no .whl/ folder of wheels (bench/gpu_wheels.sh makes it)"
py=${PYTHON:-python3}
quick=0; [ "${1:-}" = --quick ] && quick=1
run_limit=${GPU_INSTALL_RUN_S:-200} test_limit=${GPU_INSTALL_TEST_S:-150}
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
torch_before=$("$py" -c "import torch; print(torch.__version__)") || fail "no torch in $py"
log "# GPU install and run ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
log ""
log "- python: $("$py" --version 2>&1), torch $torch_before, $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"

# As a user would: an editable install of the project, its dependencies from the carried wheels, whatever
# the host has and the ranges admit (torch, numpy, pandas...) kept. Where site-packages cannot be written,
# the carried wheels go to a folder on PYTHONPATH instead (never torch: it is not among them).
start=$(date +%s)
unset PYTHONPATH  # as a user would: nothing of gpu_session.sh's own wheel folder
if [ $quick = 1 ]; then  # a dry run of this script: the checkout as installed here (the cp312 wheels do not fit)
  how="none (--quick: the checkout with this machine's packages)"
  run=("$py" -m flows.cli)
elif "$py" -m pip install --no-index --find-links .whl -e . > "$out/pip.log" 2>&1; then
  how="pip install --no-index --find-links .whl -e ."
  run=("$py" -m flows.cli)
  command -v flagperf > /dev/null && run=(flagperf)
else
  tail -5 "$out/pip.log" | sed 's/^/    /' >> "$out/summary.md"
  how="pip install --no-index --no-deps --target .pydeps .whl/*.whl (the editable install failed: pip.log)"
  "$py" -m pip install --no-index --no-deps --target .pydeps \
    $(ls .whl/*.whl | grep -Ev '/(setuptools|wheel)-[0-9]') >> "$out/pip.log" 2>&1 \
    || fail "installing the wheels into .pydeps (pip.log)"
  export PYTHONPATH="$PWD/.pydeps:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  run=("$py" -m flows.cli)
fi
log "- install: \`$how\`, $(( $(date +%s) - start )) s"
torch_after=$("$py" -c "import torch; print(torch.__version__)")
[ "$torch_after" = "$torch_before" ] || fail "the install replaced torch $torch_before with $torch_after"
"$py" -m pip check > "$out/pip_check.log" 2>&1 || log "- pip check: $(head -3 "$out/pip_check.log" | tr '\n' ';')"

start=$(date +%s)
if [ $quick = 1 ]; then
  # One round proves the installed command's path; the smoke suite's cases are each proven through the flow by
  # tests/integration/test_evaluate_flow.py, and each more round here is a fresh process (seconds on a CPU).
  args=(run --vendor cpu --cases computation-FP32 --rounds 1 --set min_duration_s=0.5 --set min_iters=2)
else
  args=(run --vendor nvidia --suite base --rounds 1 --set min_duration_s=2 --set computation-BF16.sweep_budget_s=10)
fi
timeout --kill-after=10 "$run_limit" "${run[@]}" "${args[@]}" --results "$out/results" > "$out/flagperf_run.log" 2>&1
run_code=$?
log "- \`flagperf ${args[*]}\`: exit $run_code (0 all succeeded, 3 some unsupported, 124 over ${run_limit} s), $(( $(date +%s) - start )) s"
log ""
log '```'
grep -v -E "^[0-9:.]+ \| (INFO|DEBUG)" "$out/flagperf_run.log" | tail -40 | tee -a "$out/summary.md"
log '```'

start=$(date +%s)
if [ $quick = 1 ]; then
  "$py" -m pytest tests/gpu -q -p no:cacheprovider --co > "$out/pytest_gpu.log" 2>&1  # collected, skipped here
else
  timeout --kill-after=10 "$test_limit" "$py" -m pytest tests/gpu -q -p no:cacheprovider -rs > "$out/pytest_gpu.log" 2>&1
fi
test_code=$?
log ""
log "- \`python -m pytest tests/gpu -q\`: exit $test_code, $(( $(date +%s) - start )) s: $(tail -1 "$out/pytest_gpu.log")"
[ "$run_code" = 0 ] || [ "$run_code" = 3 ] || fail "flagperf run exited $run_code (flagperf_run.log)"
[ "$test_code" = 0 ] || fail "tests/gpu exited $test_code (pytest_gpu.log)"
log "OK"
