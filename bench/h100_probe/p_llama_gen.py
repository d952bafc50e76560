"""probe 5: Llama-3-8B-shaped LlamaForCausalLM (random init, bf16, on cuda): generate() with static cache, manual DynamicCache loop."""
import time, inspect
import torch
from common import rec, err, attempt, left, TINY, Timer, sync, wall, mem_gib
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, DynamicCache

dev = "cuda" if torch.cuda.is_available() else "cpu"
P, NEW = (16, 8) if TINY else (128, 128)
torch.set_default_dtype(torch.bfloat16)
cfg = LlamaConfig(hidden_size=256 if TINY else 4096, num_hidden_layers=2 if TINY else 32, num_attention_heads=32 if not TINY else 8,
                  num_key_value_heads=8 if not TINY else 2, intermediate_size=512 if TINY else 14336, vocab_size=128256,
                  rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, max_position_embeddings=8192,
                  tie_word_embeddings=False, attn_implementation="sdpa")
t0 = time.time()
with torch.device(dev):
    model = LlamaForCausalLM(cfg)
model.eval()
sync()
nparam = sum(p.numel() for p in model.parameters())
rec(f"- transformers {transformers.__version__}; `torch.set_default_dtype(torch.bfloat16); with torch.device('cuda'): LlamaForCausalLM(LlamaConfig(..., rope_parameters={{'rope_type':'default','rope_theta':500000.0}}, attn_implementation='sdpa'))` "
    f"built in {time.time()-t0:.1f}s; params={nparam/1e9:.3f}B dtype={next(model.parameters()).dtype} rope={model.config.rope_parameters} attn={model.config._attn_implementation}; mem {mem_gib():.1f} GiB")
# random weights: make sure generation never stops early on an EOS
model.generation_config.eos_token_id = None
model.generation_config.pad_token_id = 0
rec(f"- prompt {P} tokens, {NEW} new tokens, greedy (do_sample=False), generation_config.eos_token_id=None so all {NEW} tokens are produced")
ids = {b: torch.randint(100, 120000, (b, P), device=dev) for b in (1, 32)}

GEN = dict(do_sample=False)


def gen(b, n, **kw):
    return model.generate(input_ids=ids[b], attention_mask=torch.ones_like(ids[b]), max_new_tokens=n, min_new_tokens=n, **GEN, **kw)


def measure(label, b, **kw):
    """TTFT = wall time of generate(max_new_tokens=1); total = generate(max_new_tokens=NEW)."""
    with torch.inference_mode():
        ttft, _ = wall(lambda: gen(b, 1, **kw))
        ttft2, _ = wall(lambda: gen(b, 1, **kw))
        ttft = min(ttft, ttft2)
        tot, out = wall(lambda: gen(b, NEW, **kw))
    assert out.shape[1] == P + NEW, out.shape
    rec(f"| {label} | {b} | {ttft*1e3:.1f} | {tot:.2f} | {b*NEW/tot:.0f} | {b*(NEW-1)/(tot-ttft):.0f} | {(tot-ttft)/(NEW-1)*1e3:.1f} |")


def prefill_fwd(b):
    with torch.inference_mode():
        f = lambda: model(input_ids=ids[b], logits_to_keep=1, use_cache=False)
        f(); f()
        t = Timer(); t.start()
        for _ in range(3):
            f()
        ms = t.stop() / 3
    rec(f"- plain prefill forward model(input_ids[{b},{P}], logits_to_keep=1, use_cache=False): {ms:.1f} ms "
        f"(~{2*nparam*b*P/(ms*1e-3)/1e12:.0f} TFLOPS)")


attempt("prefill b1", lambda: prefill_fwd(1))
attempt("prefill b32", lambda: prefill_fwd(32))

rec("\n| generate variant | batch | TTFT ms | total s | output tok/s (b*new/total) | decode tok/s (b*(new-1)/(total-TTFT)) | ms/decode step |\n|---|---|---|---|---|---|---|")
# warm-up (kernels, allocator)
attempt("warm-up generate", lambda: wall(lambda: gen(1, 4, cache_implementation="static", disable_compile=True)))
for b in (1, 32):
    attempt(f"generate static eager b{b}",
            lambda: measure('generate(cache_implementation="static", disable_compile=True)', b, cache_implementation="static", disable_compile=True))
for b in (1, 32):
    attempt(f"generate dynamic b{b}", lambda: measure("generate() default (DynamicCache)", b))


def manual(b):
    with torch.inference_mode():
        def loop():
            cache = DynamicCache(config=model.config)
            out = model(input_ids=ids[b], past_key_values=cache, use_cache=True, logits_to_keep=1)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            sync(); tp = time.perf_counter()
            for _ in range(NEW - 1):
                out = model(input_ids=tok, past_key_values=cache, use_cache=True)
                tok = out.logits[:, -1].argmax(-1, keepdim=True)
            sync()
            return time.perf_counter() - tp, cache.get_seq_length()
        loop()  # warm-up
        tot, (dec, L) = wall(loop)
    rec(f"| manual loop: DynamicCache(config=model.config); model(input_ids, past_key_values=cache, use_cache=True) + argmax | {b} | {(tot-dec)*1e3:.1f} | {tot:.2f} | {b*NEW/tot:.0f} | {b*(NEW-1)/dec:.0f} | {dec/(NEW-1)*1e3:.1f} |")
    assert L == P + NEW - 1, L
attempt("manual loop b32", lambda: manual(32))
attempt("manual loop b1", lambda: manual(1))
rec(f"- peak allocated so far {mem_gib():.1f} GiB; time left {left():.0f}s")


def auto_compiled(b):
    with torch.inference_mode():
        t1, _ = wall(lambda: gen(b, NEW, cache_implementation="static"))
        rec(f"- generate(cache_implementation='static') (auto-compile, default CompileConfig: mode='reduce-overhead') batch {b}: first call {t1:.1f}s (includes compile)")
    measure(f'generate(cache_implementation="static") auto-compiled (first call {t1:.0f}s)', b, cache_implementation="static")


compiled_once = False
for b in (1, 32):
    need = 60 if compiled_once else 75   # the first compile costs the most
    if left() > need:
        compiled_once = True
        attempt(f"generate static auto-compiled b{b}", lambda: auto_compiled(b))
    else:
        rec(f"- generate(cache_implementation='static') auto-compiled batch {b}: SKIPPED ({left():.0f}s left, wanted >{need}s)")
rec(f"- peak allocated {mem_gib():.1f} GiB")
