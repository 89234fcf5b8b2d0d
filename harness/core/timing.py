"""The one clock every timer in harness/ reads: host seconds, CUDA-correct.

CUDA kernels run asynchronously: a host clock read right after a forward measures how long the
kernels took to *launch*, and the work itself lands in whichever timer happens to wait for it
next. So on a CUDA device `Clock.now()` first synchronises every CUDA device the timed work runs
on (the target's; several when it is sharded), then reads `time.perf_counter()`; on a CPU it is
`perf_counter()` alone. Synchronising rather than CUDA events: events time the GPU's stream only,
and leave out the host-side work between launches (a drafter's Python, the acceptance rule) that
a small model on a fast GPU is mostly made of, and which the user waits for all the same. A
synchronise on an idle device costs a few microseconds, and the loop already waits at each step's
acceptance rule (it must read the target's tokens), so the extra waits cost close to nothing.

`PhaseTimer` times named phases on a Clock: the decoding loop hands one to its step
(harness/core/decode.py), which marks its phases with it and reads no clock itself.
"""
from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch

Devices = torch.device | str | Iterable[torch.device | str] | None
# A hook that marks one named phase of a step: `with phase("verify"): ...`.
Phase = Callable[[str], AbstractContextManager[None]]


def cuda_devices(devices: Devices) -> tuple[torch.device, ...]:
    """The distinct CUDA devices among `devices` (one device, several, or None for none)."""
    if devices is None:
        return ()
    if isinstance(devices, (torch.device, str)):
        devices = [devices]
    out: dict[torch.device, None] = {}
    for d in devices:
        d = torch.device(d)
        if d.type == "cuda":
            out[d] = None
    return tuple(out)


class Clock:
    """Seconds on the host clock once the work queued on `devices` has finished (see the module)."""

    def __init__(self, devices: Devices = None) -> None:
        self.cuda = cuda_devices(devices)

    def synchronize(self) -> None:
        """Wait for every kernel queued on this clock's CUDA devices (nothing on a CPU)."""
        for device in self.cuda:
            torch.cuda.synchronize(device)

    def now(self) -> float:
        """`time.perf_counter()` after `synchronize()`."""
        self.synchronize()
        return time.perf_counter()

    def median_ms(self, fn: Callable[[], object], repeats: int) -> float:
        """Median wall milliseconds of `repeats` calls of `fn`, each from an idle device to an idle device."""
        times = []
        for _ in range(repeats):
            t0 = self.now()
            fn()
            times.append((self.now() - t0) * 1e3)
        return statistics.median(times)


def now(devices: Devices = None) -> float:
    """`Clock(devices).now()`: for a one-off reading (a loop holds a Clock)."""
    return Clock(devices).now()


class PhaseTimer:
    """A `Phase` hook that adds each block's seconds on `clock` to `seconds[phase]`, until `take()`."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.seconds: defaultdict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        started = self.clock.now()
        yield
        self.seconds[phase] += self.clock.now() - started

    def take(self) -> defaultdict[str, float]:
        """The seconds per phase so far (0.0 for a phase never run); the timer starts again from zero."""
        seconds, self.seconds = self.seconds, defaultdict(float)
        return seconds


def untimed(phase: str) -> AbstractContextManager[None]:
    """The `Phase` hook that reads no clock: a step run outside the loop (a sampling-law check)."""
    return nullcontext()
