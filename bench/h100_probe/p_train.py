"""probe 6: Llama-3.2-1B-shaped training step: bf16 params, fused AdamW, SDPA, seq 2048, batch 8/16, eager vs regional torch.compile."""
import time, gc
import torch
from common import rec, err, attempt, left, TINY, Timer, sync, wall, mem_gib
from transformers import LlamaConfig, LlamaForCausalLM

dev = "cuda" if torch.cuda.is_available() else "cpu"
L = 128 if TINY else 2048
PEAK = 989.4e12
torch.set_default_dtype(torch.bfloat16)
cfg = LlamaConfig(hidden_size=256 if TINY else 2048, num_hidden_layers=2 if TINY else 16, num_attention_heads=8 if TINY else 32,
                  num_key_value_heads=2 if TINY else 8, intermediate_size=512 if TINY else 8192, vocab_size=128256,
                  rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, max_position_embeddings=8192,
                  tie_word_embeddings=True, attn_implementation="sdpa")
t0 = time.time()
with torch.device(dev):
    model = LlamaForCausalLM(cfg)
model.train()
nparam = sum(p.numel() for p in model.parameters())
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
H, NL = cfg.hidden_size, cfg.num_hidden_layers
rec(f"- built in {time.time()-t0:.1f}s; params={nparam/1e9:.4f}B (tied embeddings, counted once) dtype={next(model.parameters()).dtype}; "
    f"opt=torch.optim.AdamW(params, lr=1e-4, fused=True) (states in param dtype bf16); loss = model(input_ids=ids, labels=ids).loss; "
    f"step = loss.backward(); opt.step(); opt.zero_grad(set_to_none=True); no host sync inside the timed loop; "
    f"FLOPs/token = 6*P + 12*layers*hidden*seq = {6*nparam + 12*NL*H*L:.4g}; MFU vs {PEAK/1e12} TFLOPS")
rec("\n| variant | batch | warm-up+timed steps | ms/step | tokens/s | TFLOPS | MFU | peak alloc GiB |\n|---|---|---|---|---|---|---|---|")


def train(label, b, fwd, warm=3, steps=10):
    gc.collect(); torch.cuda.empty_cache() if dev == "cuda" else None
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    if TINY:
        warm, steps = 1, 2
    ids = torch.randint(0, cfg.vocab_size, (b, L), device=dev)
    def step():
        loss = fwd(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss
    t1 = time.perf_counter()
    for _ in range(warm):
        loss = step()
    sync()
    first = time.perf_counter() - t1
    t = Timer(); t.start()
    for _ in range(steps):
        loss = step()
    ms = t.stop() / steps
    tok = b * L
    fl = (6 * nparam + 12 * NL * H * L) * tok
    rec(f"| {label} | {b} | {warm}+{steps} (warm-up {first:.1f}s) | {ms:.0f} | {tok/(ms/1e3):.0f} | {fl/(ms*1e-3)/1e12:.0f} | {100*fl/(ms*1e-3)/PEAK:.1f}% | {mem_gib():.1f} |")
    rec(f"  - final loss {loss.item():.3f}")


attempt("eager b8", lambda: train("eager", 8, model))
attempt("eager b16", lambda: train("eager", 16, model))
rec(f"- time left {left():.0f}s")
if left() > 50:
    def regional():
        t = time.perf_counter()
        for layer in model.model.layers:
            layer.compile()   # regional compile: every decoder layer shares one compiled graph
        rec("- regional compile: `for layer in model.model.layers: layer.compile()` (default mode)")
        train("regional compile (decoder layers)", 8, model)
    attempt("regional compile b8", regional)
    if left() > 20:
        attempt("regional compile b16", lambda: train("regional compile (decoder layers)", 16, model))
else:
    rec("- torch.compile: SKIPPED (time)")
