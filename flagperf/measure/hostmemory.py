"""The host allocator of a measuring process: freed memory is kept for reuse (glibc's malloc).

glibc serves a block above M_MMAP_THRESHOLD with a fresh mapping and gives freed memory at the top of its heap
back to the kernel once more than M_TRIM_THRESHOLD is free. Both thresholds move as the process runs, so
whether a forward's activations reuse pages or fault in new ones each time depends on what the process did
before: the tiny ResNet of bench's CPU smoke run took 6,240 page faults per forward in a fresh process
(79 images/s) and about none with the settings below (104 images/s), and an engine round that had allocated
its batches first ran 0.72 of a bare loop that had not. A case process fixes both once, at its start: blocks
up to 32 MiB (the top of glibc's own moving threshold) come from the heap, and up to 1 GiB of freed heap is
kept. Larger blocks are still mapped afresh each time, as in a bare loop. Settings the environment makes
(MALLOC_*_ variables, glibc.malloc tunables, a preloaded allocator) are left as they are.

Only processes that exist to measure call it (the case entry, training and collective ranks, bench scripts):
the setting cannot be undone, and a long-lived host process (a test session) should keep glibc's own.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20
TRIM_THRESHOLD = 2**30
MALLOC_ENVIRONMENT = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")

_set_here: str | None = None  # what keep_freed_host_memory did in this process


def environment_allocator() -> str | None:
    """What the environment chose for the allocator, if anything."""
    chosen = [f"{name}={os.environ[name]}" for name in MALLOC_ENVIRONMENT if os.environ.get(name)]
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc." in tunables:  # other tunables (rtld, pthread) are not the allocator's
        chosen.append(f"GLIBC_TUNABLES={tunables}")
    preload = os.environ.get("LD_PRELOAD", "")
    if "malloc" in preload:  # jemalloc, tcmalloc, mimalloc
        chosen.append(f"LD_PRELOAD={preload}")
    return ", ".join(chosen) or None


def keep_freed_host_memory() -> str:
    """Fix glibc's thresholds for this process (once); returns what the allocator does, for the record."""
    global _set_here
    if _set_here is None:
        _set_here = _set_thresholds()
    return _set_here


def host_allocator() -> str:
    """What this process's allocator does: as keep_freed_host_memory set it, or the C library's own."""
    if _set_here is not None:
        return _set_here
    chosen = environment_allocator()
    libc, version = platform.libc_ver()
    if chosen:
        return f"as the environment sets it ({chosen})"
    return f"{libc} {version}: its own moving thresholds" if libc else "the C library's own"


def _set_thresholds() -> str:
    chosen = environment_allocator()
    if chosen:
        return f"as the environment sets it ({chosen})"
    libc, version = platform.libc_ver()
    if libc != "glibc":
        return f"{libc or 'an unknown C library'}'s allocator, unchanged"
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return f"glibc {version}: mallopt not found, thresholds unchanged"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # The mmap threshold first: setting either one stops glibc moving both, and the trim threshold alone would
    # leave every block above 128 KiB on a fresh mapping.
    if not mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD):
        return f"glibc {version}: mallopt refused M_MMAP_THRESHOLD, thresholds unchanged"
    if not mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD):
        return f"glibc {version}: M_MMAP_THRESHOLD {MMAP_THRESHOLD >> 20} MiB; mallopt refused M_TRIM_THRESHOLD"
    return (f"glibc {version}: freed memory kept for reuse (M_MMAP_THRESHOLD {MMAP_THRESHOLD >> 20} MiB, "
            f"M_TRIM_THRESHOLD {TRIM_THRESHOLD >> 30} GiB)")
