"""probe 3: ResNet-50 (transformers ResNetForImageClassification(ResNetConfig())) fp16 inference, batch 256."""
import time, statistics
import torch
from common import rec, err, attempt, left, TINY, Timer, sync, wall, mem_gib
from transformers import ResNetConfig, ResNetForImageClassification

dev = "cuda" if torch.cuda.is_available() else "cpu"
dt = torch.float16 if dev == "cuda" else torch.float32
B = 4 if TINY else 256
R = 64 if TINY else 224
WARM, ITERS = (1, 2) if TINY else (5, 40)
t0 = time.time()
model = ResNetForImageClassification(ResNetConfig()).to(dev, dt).eval()
nparam = sum(p.numel() for p in model.parameters())
rec(f"- model built in {time.time()-t0:.1f}s, params={nparam/1e6:.2f}M, dtype={dt}, batch {B}, {R}x{R}; timing: {WARM} warm-up + {ITERS} timed forward passes under torch.inference_mode(), CUDA events")
x = torch.randn(B, 3, R, R, device=dev, dtype=dt)


def run(label, m, inp):
    with torch.inference_mode():
        for _ in range(WARM):
            m(pixel_values=inp)
        sync()
        t = Timer(); t.start()
        for _ in range(ITERS):
            m(pixel_values=inp)
        ms = t.stop() / ITERS
    rec(f"| {label} | {ms:.2f} | {B/(ms/1e3):.0f} |")


def compiled(label, mode):
    torch._dynamo.reset()
    m = model.to(memory_format=torch.channels_last)
    xc = x.contiguous(memory_format=torch.channels_last)
    cm = torch.compile(m) if mode is None else torch.compile(m, mode=mode)
    with torch.inference_mode():
        ct, _ = wall(lambda: cm(pixel_values=xc))
    rec(f"- compile {label}: first call {ct:.1f}s")
    run(label + f" (compile {ct:.0f}s)", cm, xc)


rec("\n| variant | ms/batch | images/s |\n|---|---|---|")
attempt("eager", lambda: run("eager NCHW", model, x))
def cl():
    model.to(memory_format=torch.channels_last)
    run("eager channels_last", model, x.contiguous(memory_format=torch.channels_last))
attempt("eager channels_last", cl)
def cl_bench():
    torch.backends.cudnn.benchmark = True
    run("eager channels_last + cudnn.benchmark=True", model, x.contiguous(memory_format=torch.channels_last))
attempt("eager channels_last cudnn.benchmark", cl_bench)
rec(f"- time left before compile: {left():.0f}s")
if left() > 45:
    attempt("torch.compile default", lambda: compiled("torch.compile(default) channels_last", None))
else:
    rec("- torch.compile default: SKIPPED (time)")
rec(f"- time left: {left():.0f}s")
if left() > 100:
    attempt("torch.compile max-autotune-no-cudagraphs", lambda: compiled('torch.compile(mode="max-autotune-no-cudagraphs") channels_last', "max-autotune-no-cudagraphs"))
else:
    rec(f"- torch.compile max-autotune-no-cudagraphs: SKIPPED (only {left():.0f}s left; needs >100s)")
rec(f"- peak allocated {mem_gib():.1f} GiB")

# ---- H2D copy pinned vs pageable ----
def h2d():
    n = 10
    src_pin = torch.randn(B, 3, R, R, dtype=torch.float16).pin_memory()
    src_pag = torch.randn(B, 3, R, R, dtype=torch.float16)
    dst = torch.empty(B, 3, R, R, dtype=torch.float16, device=dev)
    nbytes = src_pin.numel() * 2
    for label, src, nb in (("pinned, non_blocking=True", src_pin, True), ("pageable", src_pag, False)):
        for _ in range(2):
            dst.copy_(src, non_blocking=nb)
        sync()
        ts = []
        for _ in range(n):
            t = Timer(); t.start(); dst.copy_(src, non_blocking=nb); ts.append(t.stop())
        ms = statistics.median(ts)
        rec(f"| H2D {B}x3x{R}x{R} fp16 ({nbytes/1e6:.1f} MB) {label} | {ms:.2f} ms | {nbytes/ms/1e6:.1f} GB/s |")
rec("\n| copy | median of 10 | bandwidth |\n|---|---|---|")
if dev == "cuda":
    attempt("H2D copy", h2d)
