"""Shared helpers for the devprobe probes: result recording, deadlines, timing."""
import os, sys, time, statistics, traceback

OUT = os.environ.get("OUT") or "/tmp/probe_out"
os.makedirs(OUT, exist_ok=True)
RES = os.path.join(OUT, "results.md")
T0 = time.time()
DEADLINE = float(os.environ.get("PROBE_DEADLINE", T0 + 1e9))
TINY = os.environ.get("PROBE_TINY") == "1"   # CPU dry-run mode with small shapes


def left():
    return DEADLINE - time.time()


def rec(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    with open(RES, "a") as f:
        f.write(s + "\n")


def err(e, n=600):
    s = f"{type(e).__name__}: {e}".strip().replace("\n", " | ")
    return s[:n]


def attempt(label, fn):
    """Run fn(); on exception record the exact error and return None."""
    try:
        return fn()
    except Exception as e:  # noqa
        traceback.print_exc()
        rec(f"- {label}: ERROR `{err(e)}`")
        try:
            import torch
            if torch.cuda.is_available():
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        except Exception:
            pass
        return None


def sync():
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Timer:
    """Device-side timer (CUDA events) with a host fallback for CPU dry runs."""
    def __init__(self):
        import torch
        self.cuda = torch.cuda.is_available()
        if self.cuda:
            self.s = torch.cuda.Event(enable_timing=True)
            self.e = torch.cuda.Event(enable_timing=True)

    def start(self):
        if self.cuda:
            self.s.record()
        else:
            self.t = time.perf_counter()

    def stop(self):
        """returns elapsed ms (synchronises on the end event)"""
        if self.cuda:
            self.e.record()
            self.e.synchronize()
            return self.s.elapsed_time(self.e)
        return (time.perf_counter() - self.t) * 1e3


def bench(fn, warmup=5, iters=20, repeats=3):
    """median over `repeats` of (ms per call averaged over `iters` calls)."""
    for _ in range(warmup):
        fn()
    sync()
    ts = []
    t = Timer()
    for _ in range(repeats):
        t.start()
        for _ in range(iters):
            fn()
        ts.append(t.stop() / iters)
    return statistics.median(ts), ts


def wall(fn):
    """host wall time of fn() in seconds, synchronised before and after"""
    sync()
    t = time.perf_counter()
    r = fn()
    sync()
    return time.perf_counter() - t, r


def mem_gib():
    import torch
    if not torch.cuda.is_available():
        return 0.0
    return torch.cuda.max_memory_allocated() / 2**30
