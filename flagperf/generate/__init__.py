"""The generate family: LLM serving as labs measure it (TTFT, TPOT and inter-token latency, output tokens/s in
total and per user) at each concurrency level, with KV-cache engines as plug-in folders
(vendor_images/<vendor>/generate/<engine>/engine.yaml).

  config.py    the case config (model shape preset, prompts, lengths, concurrency levels)
  models.py    shape presets built with transformers' configs, random init unless a checkpoint is given
  prompts.py   synthetic fixed-length prompts or a local jsonl/csv file (prompt, optional reference)
  engines.py   the engine contract (a batch of token-id prompts in, per-token timestamps out) and discovery
  hf.py        the `hf` engine: transformers generate with a static KV cache
  vllm_engine.py  the `vllm` engine: vLLM's offline engine, stepped for per-token timestamps
  metrics.py   the serving metrics, defined once
  driver.py    one round: every level, its warm-up and its timed requests -> metrics
"""
