"""The one clock (harness/core/timing.py) waits for queued CUDA work before it reads, and every timer
in harness/ reads it. No GPU is needed: `torch.cuda.synchronize` is replaced by a fake device whose
queued work only lands on the host clock when something synchronises, as on a real GPU."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from harness.core import timing
from harness.core.decode import GenerationConfig, generate
from harness.core.target import Target
from harness.core.timing import Clock, cuda_devices

CUDA0, CUDA1 = torch.device("cuda:0"), torch.device("cuda:1")


class FakeGpu:
    """A host clock that moves only when asked, and a queue of GPU seconds that a synchronise drains."""

    def __init__(self) -> None:
        self.t = 0.0
        self.pending = 0.0
        self.events: list[str] = []

    def enqueue(self, seconds: float) -> None:
        self.pending += seconds

    def synchronize(self, device=None) -> None:
        self.events.append(f"sync {torch.device(device)}")
        self.t += self.pending
        self.pending = 0.0

    def perf_counter(self) -> float:
        self.events.append("read")
        return self.t


@pytest.fixture
def gpu(monkeypatch) -> FakeGpu:
    fake = FakeGpu()
    monkeypatch.setattr(torch.cuda, "synchronize", fake.synchronize)
    monkeypatch.setattr(timing.time, "perf_counter", fake.perf_counter)
    return fake


def test_cpu_clock_never_touches_cuda(gpu):
    Clock(torch.device("cpu")).now()
    Clock(None).now()
    assert gpu.events == ["read", "read"]


def test_cuda_clock_synchronises_each_device_once_before_reading(gpu):
    assert cuda_devices([CUDA0, "cpu", "cuda:1", CUDA0]) == (CUDA0, CUDA1)
    gpu.enqueue(2.0)
    assert Clock([CUDA0, torch.device("cpu"), CUDA1, CUDA0]).now() == 2.0
    assert gpu.events == ["sync cuda:0", "sync cuda:1", "read"]


def test_median_ms_charges_each_call_its_queued_work(gpu):
    ms = Clock(CUDA0).median_ms(lambda: gpu.enqueue(0.5), repeats=3)
    assert ms == 500.0
    assert gpu.events[:4] == ["sync cuda:0", "read", "sync cuda:0", "read"]


class _Drafter:
    """pld's proposals with fake GPU seconds queued by propose (0.25) and observe (0.125)."""

    def __init__(self, target, gpu: FakeGpu) -> None:
        from methods.pld import PromptLookupDrafter

        self.inner, self.gpu = PromptLookupDrafter(target), gpu
        self.config = self.inner.config

    def begin(self, *a) -> None:
        self.inner.begin(*a)

    def propose(self, ctx):
        self.gpu.enqueue(0.25)
        return self.inner.propose(ctx)

    def observe(self, step) -> None:
        self.gpu.enqueue(0.125)
        self.inner.observe(step)


def test_decode_loop_charges_queued_work_to_the_timer_that_queued_it(tiny_target, gpu, monkeypatch):
    """Each target forward queues 1 s of fake GPU work. With a clock that read the host time without
    waiting, verify_ms would be ~0 and the forward's second would land in the next draft timer."""
    monkeypatch.setattr(Target, "devices", property(lambda self: (CUDA0,)))
    real_forward = Target.forward

    def forward(self, *a, **k):
        gpu.enqueue(1.0)
        return real_forward(self, *a, **k)

    monkeypatch.setattr(Target, "forward", forward)
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    g = generate(tiny_target, prompt, GenerationConfig(max_new_tokens=12), _Drafter(tiny_target, gpu))
    assert g.prefill_s == 1.0
    assert g.verify_ms == [1000.0] * len(g.verify_ms)
    assert g.draft_ms[:-1] == [375.0] * (len(g.draft_ms) - 1)  # propose + observe
    assert g.draft_ms[-1] in (250.0, 375.0)                     # the last step observes only if not finished
    assert g.wall_s == pytest.approx(1.0 + (sum(g.verify_ms) + sum(g.draft_ms)) / 1e3)
    reads = [i for i, e in enumerate(gpu.events) if e == "read"]
    assert all(gpu.events[i - 1] == "sync cuda:0" for i in reads), "a clock read without a synchronise before it"


def test_cost_curve_times_the_forwards_work(tiny_target, gpu, monkeypatch):
    from harness.core.cost_model import forward_cost_ms

    monkeypatch.setattr(Target, "devices", property(lambda self: (CUDA0,)))
    real_forward = Target.forward
    monkeypatch.setattr(Target, "forward", lambda self, *a, **k: gpu.enqueue(0.01 * a[0].numel()) or
                        real_forward(self, *a, **k))
    ms = forward_cost_ms(tiny_target, [16], [1, 4, 8], repeats=2)[16]
    assert ms == pytest.approx({1: 10.0, 4: 40.0, 8: 80.0})


TIMER = re.compile(r"\b(perf_counter|monotonic|process_time)\s*\(|\btime\.time\s*\(")


def test_every_timer_in_harness_reads_the_one_clock():
    root = Path(__file__).resolve().parents[1] / "harness"
    stray = [f"{p.relative_to(root.parent)}:{i}" for p in sorted(root.rglob("*.py")) if p.name != "timing.py"
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if TIMER.search(line.split("#")[0])]
    assert not stray, f"timers that bypass harness/core/timing.py: {stray}"
