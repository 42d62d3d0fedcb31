"""Keep freed memory in the process during CPU training.

glibc's allocator serves large blocks (above a threshold that adapts up to 32 MB) by mapping
fresh pages and returns them to the kernel when they are freed, and trims the top of its heap
when more than a threshold is free there. A training step allocates and frees its activations
and gradients every time, so every step faults the same memory back in, page by page: each
fault is a trip into the kernel and a freshly zeroed page, paid again for every page of every
large buffer on every step, and it grows with the model and the batch. Raising both thresholds
keeps those pages mapped; the peak memory is the same, only no longer handed back between steps.
jemalloc or tcmalloc (``LD_PRELOAD``) do the same on their own. The fault counts and the time
they cost are in ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import ctypes
import os
import sys

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_applied: bool | None = None


def keep_freed_memory(mmap_threshold_mb: int = 32, trim_threshold_mb: int = 1024) -> bool:
    """Ask glibc to serve blocks up to ``mmap_threshold_mb`` from its heap and to keep up to
    ``trim_threshold_mb`` of freed memory mapped, for the whole process (once; later calls return
    the first answer). Left alone where the user chose an allocator or its settings
    (``LD_PRELOAD``, ``GLIBC_TUNABLES``, ``MALLOC_*``), off Linux or glibc, and when
    ``VITKIT_KEEP_FREED_MEMORY=0``.

    Args:
        mmap_threshold_mb: blocks up to this size come from the heap.
        trim_threshold_mb: freed memory kept mapped at the heap's top.

    Returns:
        Whether the setting took effect.
    """
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    env = os.environ
    if env.get("VITKIT_KEEP_FREED_MEMORY", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    if env.get("LD_PRELOAD") or "GLIBC_TUNABLES" in env or any(k.startswith("MALLOC_") for k in env):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = mallopt(_M_MMAP_THRESHOLD, mmap_threshold_mb << 20) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, trim_threshold_mb << 20) == 1 and ok
    _applied = ok
    return ok
