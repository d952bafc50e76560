"""The reference for the harness-cost benchmark: a bare torch loop, no engine code at all.

    python bench/bare_gemm.py --size 2048 --seconds 8 [--dtype float32] [--device cpu]

Prints one JSON line: {"tflops": ..., "iterations": ..., "seconds": ...}.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_float32_matmul_precision("highest")
    dtype = getattr(torch, args.dtype)
    n = args.size
    a = torch.randn(n, n, dtype=dtype, device=args.device)
    b = torch.randn(n, n, dtype=dtype, device=args.device)
    out = torch.empty(n, n, dtype=dtype, device=args.device)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    for _ in range(args.warmup):
        torch.mm(a, b, out=out)
    sync()
    iterations = 0
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        torch.mm(a, b, out=out)
        iterations += 1
        if args.device != "cpu" and iterations % 50 == 0:
            sync()
    sync()
    seconds = time.perf_counter() - start
    print(json.dumps({"tflops": 2 * n**3 * iterations / seconds / 1e12, "iterations": iterations,
                      "seconds": seconds}))


if __name__ == "__main__":
    main()
