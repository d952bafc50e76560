"""probe 4: BERT-large (BertModel) fp16 inference, batch 32 seq 512, SDPA attention, eager vs torch.compile."""
import time
import torch
from common import rec, err, attempt, left, TINY, Timer, sync, wall, mem_gib
from transformers import BertConfig, BertModel

dev = "cuda" if torch.cuda.is_available() else "cpu"
dt = torch.float16 if dev == "cuda" else torch.float32
B, L = (2, 64) if TINY else (32, 512)
WARM, ITERS = (1, 2) if TINY else (5, 30)
cfg = BertConfig(hidden_size=256 if TINY else 1024, num_hidden_layers=2 if TINY else 24, num_attention_heads=16,
                 intermediate_size=1024 if TINY else 4096, attn_implementation="sdpa")
t0 = time.time()
model = BertModel(cfg).to(dev, dt).eval()
nparam = sum(p.numel() for p in model.parameters())
rec(f"- BertModel built in {time.time()-t0:.1f}s params={nparam/1e6:.1f}M config._attn_implementation={model.config._attn_implementation!r} "
    f"(set via BertConfig(..., attn_implementation='sdpa')); batch {B} seq {L}, no attention_mask passed, {WARM} warm-up + {ITERS} timed, inference_mode")
ids = torch.randint(0, cfg.vocab_size, (B, L), device=dev)
flops = 2 * (nparam - cfg.vocab_size * cfg.hidden_size) * B * L + 4 * cfg.num_hidden_layers * B * L * L * cfg.hidden_size


def run(label, m):
    with torch.inference_mode():
        for _ in range(WARM):
            m(input_ids=ids)
        sync()
        t = Timer(); t.start()
        for _ in range(ITERS):
            m(input_ids=ids)
        ms = t.stop() / ITERS
    rec(f"| {label} | {ms:.2f} | {B/(ms/1e3):.0f} | {flops/(ms*1e-3)/1e12:.0f} |")


rec("\n| variant | ms/batch | sequences/s | ~TFLOPS (2*non-emb params*tok + attn) |\n|---|---|---|---|")
attempt("eager", lambda: run("eager (sdpa)", model))
def comp():
    cm = torch.compile(model)
    with torch.inference_mode():
        ct, _ = wall(lambda: cm(input_ids=ids))
    rec(f"- torch.compile(model) default mode: first call (compile) {ct:.1f}s")
    run(f"torch.compile default (compile {ct:.0f}s)", cm)
if left() > 35:
    attempt("torch.compile", comp)
else:
    rec(f"- compile SKIPPED ({left():.0f}s left)")
rec(f"- peak allocated {mem_gib():.1f} GiB")
