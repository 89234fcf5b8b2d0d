"""Keep freed large blocks in the process heap (glibc malloc), so big tensors are not re-mapped.

glibc serves every allocation above its mmap threshold (at most 32 MB by default) with a fresh
mmap and unmaps it on free, so each new tensor of that size is page-faulted in anew. A [512, 49k]
float32 logits chunk, a training batch's activations or a dropout mask then cost 3-7x their
arithmetic: on Sapphire Rapids a log_softmax over [1024, 8192] took 9.8 ms instead of 2.6 ms. PyTorch's
CPU allocator has no cache of its own; raising the thresholds makes glibc reuse the memory.
"""
from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
KEEP_BYTES = 1 << 29  # blocks up to 512 MiB come from the heap; up to 1 GiB of free heap is kept


def keep_freed_memory(threshold: int = KEEP_BYTES) -> bool:
    """Raise glibc's mmap and trim thresholds to `threshold` (and 2x); False where the C library
    has no mallopt (musl, macOS) or the value does not fit."""
    if not 0 < 2 * threshold < 2**31:  # mallopt takes a C int (ctypes would silently wrap it)
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, threshold)) and bool(mallopt(M_TRIM_THRESHOLD, 2 * threshold))
