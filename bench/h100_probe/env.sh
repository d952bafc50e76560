#!/bin/bash
# probe 1: environment
RES=$OUT/results.md
{
echo '```'
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,power.default_limit,power.max_limit,enforced.power.limit,clocks.max.sm,clocks.max.mem,clocks.sm,clocks.mem,pstate,temperature.gpu,persistence_mode,mig.mode.current,ecc.mode.current,compute_cap --format=csv 2>&1 \
  || nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,clocks.max.mem --format=csv 2>&1
nvidia-smi -q -d CLOCK 2>&1 | sed -n '/Max Clocks/,/Video/p' | sed 's/^ *//' | paste -sd';' -
echo '```'
} >> $RES 2>&1
nvidia-smi -q > $OUT/nvidia-smi-q.txt 2>&1
echo "- nvcc: \`$(nvcc --version 2>&1 | tail -2 | paste -sd' ' -)\`" >> $RES
echo "- which python3: $(which python3); uname -r: $(uname -r); nproc: $(nproc); mem: $(free -g | awk '/Mem/{print $2}') GiB" >> $RES
timeout 25 python3 - <<'PY'
import sys, os, importlib, time
from common import rec, err
rec(f"- python {sys.version.split()[0]}")
def ver(mod):
    t = time.time()
    try:
        m = importlib.import_module(mod)
        rec(f"- import {mod}: OK version={getattr(m, '__version__', '?')} ({time.time()-t:.1f}s)")
        return m
    except Exception as e:
        rec(f"- import {mod}: FAIL `{err(e, 300)}`")
torch = ver("torch")
if torch:
    rec(f"- torch.version.cuda={torch.version.cuda} cudnn={torch.backends.cudnn.version()} cuda_available={torch.cuda.is_available()}")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        rec(f"- device: {p.name} cc={p.major}.{p.minor} SMs={p.multi_processor_count} mem={p.total_memory/2**30:.1f} GiB L2={getattr(p,'L2_cache_size',0)/2**20:.0f} MiB")
ver("triton"); ver("transformers")
ort = ver("onnxruntime")
if ort:
    rec(f"- onnxruntime providers: {ort.get_available_providers()}")
try:
    from torch.distributed.fsdp import fully_shard
    rec(f"- `from torch.distributed.fsdp import fully_shard`: OK ({fully_shard})")
except Exception as e:
    rec(f"- `from torch.distributed.fsdp import fully_shard`: FAIL `{err(e)}`")
ver("pynvml")
ver("tensorrt")
ver("vllm")
PY
