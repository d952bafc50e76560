"""probe 2: GEMM throughput (bf16/fp16/tf32/int8/fp8), bf16 shape search, NVML clocks/power/throttle during bf16."""
import threading, time, statistics
import torch
from common import rec, err, bench, attempt, left, TINY, Timer, sync

dev = "cuda" if torch.cuda.is_available() else "cpu"
S = 256 if TINY else 8192
rec(f"- timing: CUDA events, warm-up 5, 20 timed calls, median of 3 repeats; TFLOPS = 2*M*N*K/t. device={torch.cuda.get_device_name(0) if dev=='cuda' else 'cpu'}")
torch.manual_seed(0)


def tflops(M, N, K, ms):
    return 2 * M * N * K / (ms * 1e-3) / 1e12


def mm_case(label, a, b, fn=torch.matmul, unit="TFLOPS"):
    M, K = a.shape; N = b.shape[1]
    ms, all_ = bench(lambda: fn(a, b))
    rec(f"| {label} | {M}x{N}x{K} | {ms:.3f} | {tflops(M, N, K, ms):.1f} {unit} | {' '.join(f'{x:.3f}' for x in all_)} |")
    return tflops(M, N, K, ms)


rec("\n| case | MxNxK | ms (median) | rate | repeats ms |\n|---|---|---|---|---|")

# ---- NVML sampler (started around the bf16 8192 run) ----
samples = []
nv = {}
def nvml_init():
    import pynvml as N
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    getr = getattr(N, "nvmlDeviceGetCurrentClocksEventReasons", None)
    api = "nvmlDeviceGetCurrentClocksEventReasons"
    if getr is None:
        getr = N.nvmlDeviceGetCurrentClocksThrottleReasons; api = "nvmlDeviceGetCurrentClocksThrottleReasons"
    names = {}
    for pref in ("nvmlClocksThrottleReason", "nvmlClocksEventReason"):   # event names override throttle names
        for n in dir(N):
            if n.startswith(pref) and n[len(pref):] not in ("All", "None", "Unknown"):
                v = getattr(N, n)
                if isinstance(v, int) and v:
                    names[v] = n[len(pref):]
    nv.update(N=N, h=h, getr=getr, api=api, names=names,
              maxsm=N.nvmlDeviceGetMaxClockInfo(h, N.NVML_CLOCK_SM),
              limit=N.nvmlDeviceGetEnforcedPowerLimit(h))
    return True

stop = threading.Event()
phase = ["idle"]
def sampler():
    N, h = nv["N"], nv["h"]
    while not stop.is_set():
        try:
            samples.append((phase[0], time.time(), N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM),
                            N.nvmlDeviceGetPowerUsage(h), nv["getr"](h),
                            N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU)))
        except Exception as e:
            samples.append((phase[0], time.time(), -1, -1, -1, -1)); nv["sample_err"] = err(e)
        time.sleep(0.05)

have_nvml = attempt("NVML init", nvml_init) if dev == "cuda" else None
th = None
if have_nvml:
    th = threading.Thread(target=sampler, daemon=True); th.start()
    time.sleep(0.2)

# ---- bf16 / fp16 ----
a = torch.randn(S, S, device=dev, dtype=torch.bfloat16); b = torch.randn(S, S, device=dev, dtype=torch.bfloat16)
phase[0] = "bf16_bench"
attempt("bf16 randn", lambda: mm_case("bf16 randn", a, b))
# sustained bf16 run (~5 s) for clocks / power under load
def sustained():
    phase[0] = "bf16_sustained"
    n = 20 if TINY else 4000
    t = Timer(); t.start()
    for _ in range(n):
        torch.matmul(a, b)
    ms = t.stop()
    rec(f"| bf16 randn sustained ({n} back-to-back, {ms/1e3:.1f}s) | {S}^3 | {ms/n:.3f} | {tflops(S,S,S,ms/n):.1f} TFLOPS | - |")
attempt("bf16 sustained", sustained)
phase[0] = "other"
za = torch.zeros_like(a); zb = torch.zeros_like(b)
attempt("bf16 zeros", lambda: mm_case("bf16 zeros", za, zb))
del za, zb
a16, b16 = a.half(), b.half()
attempt("fp16 randn", lambda: mm_case("fp16 randn", a16, b16))
attempt("fp16 zeros", lambda: mm_case("fp16 zeros", torch.zeros_like(a16), torch.zeros_like(b16)))
del a16, b16
a32, b32 = a.float(), b.float()
def tf32():
    torch.backends.cuda.matmul.allow_tf32 = True
    mm_case("tf32 (allow_tf32=True, fp32 in/out)", a32, b32)
    torch.backends.cuda.matmul.allow_tf32 = False
    mm_case("fp32 (allow_tf32=False)", a32, b32)
attempt("tf32", tf32)
del a32, b32

# ---- int8 ----
ai = torch.randint(-128, 127, (S, S), device=dev, dtype=torch.int8)
bi_row = torch.randint(-128, 127, (S, S), device=dev, dtype=torch.int8)          # [K,N] row-major
bti = torch.randint(-128, 127, (S, S), device=dev, dtype=torch.int8)             # [N,K] contiguous
bi_col = bti.t()                                                                  # [K,N] column-major
attempt("int8 _int_mm b row-major", lambda: mm_case("int8 torch._int_mm(a, b) b row-major", ai, bi_row, torch._int_mm, "TOPS"))
attempt("int8 _int_mm b col-major", lambda: mm_case("int8 torch._int_mm(a, b) b col-major (bt.t())", ai, bi_col, torch._int_mm, "TOPS"))
del ai, bi_row, bti, bi_col

# ---- fp8 ----
one = torch.tensor(1.0, device=dev)
f8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
def fp8(ta, tb, colmajor=True):
    a8 = (torch.randn(S, S, device=dev) * 0.5).to(f8[ta])
    if colmajor:
        b8 = (torch.randn(S, S, device=dev) * 0.5).to(f8[tb]).t()
    else:
        b8 = (torch.randn(S, S, device=dev) * 0.5).to(f8[tb])
    fn = lambda x, y: torch._scaled_mm(x, y, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    mm_case(f"fp8 _scaled_mm {ta} x {tb}, b {'col' if colmajor else 'row'}-major, out bf16", a8, b8, fn)
for ta, tb in (("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e5m2")):
    attempt(f"fp8 _scaled_mm {ta} x {tb} (b col-major)", lambda: fp8(ta, tb))
attempt("fp8 _scaled_mm e4m3 x e4m3 (b ROW-major)", lambda: fp8("e4m3", "e4m3", colmajor=False))
def fp8_fastacc():
    a8 = torch.randn(S, S, device=dev).to(torch.float8_e4m3fn); b8 = torch.randn(S, S, device=dev).to(torch.float8_e4m3fn).t()
    mm_case("fp8 e4m3 x e4m3 use_fast_accum=True", a8, b8,
            lambda x, y: torch._scaled_mm(x, y, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True))
attempt("fp8 use_fast_accum", fp8_fastacc)

# ---- NVML report ----
if have_nvml:
    stop.set(); th.join()
    N = nv["N"]
    rec(f"\n- NVML: max SM clock {nv['maxsm']} MHz, enforced power limit {nv['limit']} mW, reasons API `{nv['api']}`"
        + (f", sample error: {nv['sample_err']}" if 'sample_err' in nv else ""))
    rec("\n| phase | samples | SM MHz median (min-max) | power W mean / max | temp C max | reason share (bitmask decoded) |\n|---|---|---|---|---|---|")
    for ph in ("bf16_bench", "bf16_sustained", "other"):
        ss = [x for x in samples if x[0] == ph and x[2] >= 0]
        if not ss:
            rec(f"| {ph} | 0 | - | - | - | - |"); continue
        clk = [x[2] for x in ss]; pw = [x[3] / 1e3 for x in ss]
        cnt = {}
        for x in ss:
            m = x[4]
            if m == 0:
                cnt["None"] = cnt.get("None", 0) + 1
            for v, n in nv["names"].items():
                if m & v:
                    cnt[n] = cnt.get(n, 0) + 1
        share = ", ".join(f"{k} {100*v/len(ss):.0f}%" for k, v in sorted(cnt.items(), key=lambda kv: -kv[1]))
        masks = sorted(set(hex(x[4]) for x in ss))
        rec(f"| {ph} | {len(ss)} | {statistics.median(clk):.0f} ({min(clk)}-{max(clk)}) | {statistics.mean(pw):.0f} / {max(pw):.0f} (limit {nv['limit']/1e3:.0f}) | {max(x[5] for x in ss)} | {share} ; masks {masks} |")

# ---- bf16 shape search ----
rec("\n**bf16 shape search** (randn)\n\n| MxNxK | ms | TFLOPS |\n|---|---|---|")
shapes = [(s, s, s) for s in (4096, 6144, 8192, 10240, 12288, 16384)] + \
         [(8192, 8192, 16384), (16384, 16384, 8192), (8192, 16384, 8192), (16384, 8192, 8192), (4096, 4096, 16384), (32768, 4096, 4096)]
if TINY:
    shapes = [(128, 128, 128), (256, 256, 512)]
best = (0, None)
for (M, N, K) in shapes:
    if left() < 6:
        rec(f"| (stopped: {left():.0f}s left) | | |"); break
    def one_shape():
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16); y = torch.randn(K, N, device=dev, dtype=torch.bfloat16)
        ms, _ = bench(lambda: torch.matmul(x, y))
        return ms
    ms = attempt(f"bf16 {M}x{N}x{K}", one_shape)
    if ms:
        tf = tflops(M, N, K, ms)
        rec(f"| {M}x{N}x{K} | {ms:.3f} | {tf:.1f} |")
        if tf > best[0]:
            best = (tf, (M, N, K))
rec(f"\n- best bf16: {best[0]:.1f} TFLOPS at MxNxK={best[1]}")
