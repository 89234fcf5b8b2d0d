"""The training process's resident memory: read it, and give freed heap pages back to the OS.

Training batches vary in shape, so glibc's heap fragments: freed blocks stay resident while new
ones of other sizes are carved elsewhere. A 1,500-step EAGLE-3 training grew ~30 MB per step
(10 GB at step 500 to 20 GB at step 1,335, where the OOM killer ended it on a 24 GB machine).
Serving every block >= 64 KiB by mmap (MALLOC_MMAP_THRESHOLD_=65536) held it flat at 9-10.5 GB
but cost 10-20% per step (fresh pages are zeroed on first touch). Trimming the heap returns the
free pages instead: an EAGLE-3 training on 1.47 M tokens fell back to 11.5-12.0 GiB at each trim
when it trimmed every 10 steps, but rose to 18.6 GiB in between (the first step after a trim
touches ~3 GiB afresh, each later one ~0.3 GiB more). So the trainer trims whenever its resident
set has grown `TRIM_GROWTH_GIB` since the last trim: above one step's working set, so it does not
pay the refill every step, and below what would crowd a second job out. With it the same
training held 13.4-18.3 GiB over steps 101-400 at 6.4 s/step (6.6 with the 10-step trim), but
20.2-20.7 GiB on the step after each evaluation and checkpoint, whose freed blocks stayed resident:
the trainer trims after those too (then: 14.7 GiB on step 701, 13.5-16.7 over steps 601-705). Each
train-log row's `rss_gib` shows whether a run's memory holds.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from functools import lru_cache


@lru_cache(maxsize=1)
def _libc():
    """glibc, or None where there is none (macOS, musl): then trimming is a no-op."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def release_free_heap() -> bool:
    """Return the heap's free pages to the OS (glibc malloc_trim); False where unsupported."""
    libc = _libc()
    return bool(libc and libc.malloc_trim(0) >= 0)


def resident_gib() -> float | None:
    """This process's resident set in GiB (Linux /proc), or None where it cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**30


class HeapTrimmer:
    """Trims the heap when the resident set has grown `growth_gib` since the last trim (call
    `after_step` once per training step); does nothing where resident memory cannot be read."""

    def __init__(self, growth_gib: float) -> None:
        self.growth_gib = growth_gib
        self.floor = resident_gib()

    def after_step(self) -> float | None:
        """The resident GiB this step ended with (before any trim), trimming if it has grown enough."""
        rss = resident_gib()
        if rss is not None and self.floor is not None and rss > self.floor + self.growth_gib:
            self.trim()
        return rss

    def trim(self) -> None:
        """Trim now (after work outside the steps: evaluation, a checkpoint) and start a new floor."""
        release_free_heap()
        self.floor = resident_gib()
