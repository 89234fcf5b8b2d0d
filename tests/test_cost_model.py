"""Cost-aware tree sizes: the measured verify cost curve (cached per machine, target and dtype),
the per-step budget that maximises expected tokens per unit of cost, and EAGLE-2 / Gumiho with
total_tokens "auto" still exact."""
from __future__ import annotations

import math

import pytest

from harness.core import cost_model
from harness.core.cost_model import TreeSizer, interpolate, verify_cost_curve

FLAT = [[1, 1.0], [64, 1.0]]           # a verify costs a step whatever its size (a big GPU)
STEEP = [[1, 1.0], [2, 2.0], [64, 64.0]]  # cost grows with every token (no parallelism at all)


def test_interpolate_between_and_beyond_points():
    curve = [[1, 1.0], [4, 1.3], [8, 2.1]]
    assert interpolate(curve, 1) == 1.0 and interpolate(curve, 4) == pytest.approx(1.3)
    assert interpolate(curve, 6) == pytest.approx(1.7)
    assert interpolate(curve, 12) == pytest.approx(2.9)  # linear extrapolation past the last point


def test_budget_keeps_everything_when_verify_is_free_and_little_when_it_is_not():
    scores = [math.log(p) for p in (0.9, 0.8, 0.5, 0.2, 0.05, 0.01)]
    assert TreeSizer(FLAT, max_keep=63).budget(scores) == 6
    assert TreeSizer(FLAT, max_keep=4).budget(scores) == 4
    # Each extra token costs a full step: a draft pays only if it is accepted with p > ~0.5 given
    # the tokens before it; here only the first does (1.9 / 2 beats 1 / 1? no: 0.95 < 1 -> keep 1, the floor).
    assert TreeSizer(STEEP, max_keep=63).budget(scores) == 1


def test_budget_maximises_expected_tokens_per_cost():
    curve = [[1, 1.0], [2, 1.0], [4, 1.1], [8, 1.2], [16, 1.6], [32, 2.4], [64, 4.0]]
    scores = sorted((math.log(0.9 ** (1 + i / 4)) for i in range(40)), reverse=True)
    sizer = TreeSizer(curve, max_keep=63)
    n = sizer.budget(scores)
    value = [(1 + sum(math.exp(s) for s in scores[:m])) / interpolate(curve, m + 1) for m in range(1, 41)]
    assert n == 1 + max(range(40), key=lambda m: value[m])
    assert sizer.pending == pytest.approx(sum(math.exp(s) for s in scores[:n]))


def test_best_size_by_hand():
    probs = [0.6, 0.3, 0.1]
    # tokens per cost: N=1 1.6/1.0, N=2 1.9/1.2 = 1.58, N=3 2.0/2.0
    assert cost_model.best_size(probs, [[1, 1.0], [2, 1.0], [3, 1.2], [4, 2.0]]) == 1
    # a cheaper 3-token verify: N=2 1.9/1.1 = 1.73 wins
    assert cost_model.best_size(probs, [[1, 1.0], [2, 1.0], [3, 1.1], [4, 2.0]]) == 2
    assert cost_model.best_size(probs, FLAT) == 3 and cost_model.best_size([], FLAT) == 0
    assert cost_model.best_size(probs, STEEP, calibration=0.5) == 1  # the floor: min_keep


def test_calibration_follows_the_answer_and_resets():
    sizer = TreeSizer(FLAT, max_keep=8, prior_weight=4.0)
    sizer.budget([0.0] * 8)          # predicts 8 accepted drafts
    sizer.observe(0)                 # none was
    assert sizer.calibration == pytest.approx(4 / 12)
    sizer.reset()
    assert sizer.calibration == 1.0


def _others_use(monkeypatch, cores):
    """Pretend other processes used `cores` cores' worth of CPU during any measured block."""
    from harness.core import machine_meta

    monkeypatch.setattr(machine_meta.OtherCpuUse, "__exit__", lambda self, *exc: setattr(self, "cores", cores))


def test_cost_curve_is_measured_once_and_cached(tiny_target, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    _others_use(monkeypatch, 0.0)
    calls = []
    real = cost_model.forward_cost_ms
    monkeypatch.setattr(cost_model, "forward_cost_ms", lambda *a, **k: calls.append(1) or real(*a, **k))
    curve = verify_cost_curve(tiny_target, repeats=1)
    assert [k for k, _ in curve] == list(cost_model.CURVE_SIZES) and curve[0][1] == 1.0
    assert all(b[1] >= a[1] for a, b in zip(curve, curve[1:]))  # never falls with k
    assert verify_cost_curve(tiny_target, repeats=1) == curve and len(calls) == 1
    assert len(list((tmp_path / "cost_curves").glob("*.json"))) == 1


def test_contended_cost_curve_is_used_but_not_cached(tiny_target, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    _others_use(monkeypatch, 1.0)
    with pytest.warns(RuntimeWarning, match="not cached"):
        curve = verify_cost_curve(tiny_target, repeats=1)
    assert [k for k, _ in curve] == list(cost_model.CURVE_SIZES)
    assert not list(tmp_path.glob("cost_curves/*.json"))
    _others_use(monkeypatch, 0.1)  # idle enough: measured again and cached
    verify_cost_curve(tiny_target, repeats=1)
    assert len(list(tmp_path.glob("cost_curves/*.json"))) == 1


def _other_cpu_use(monkeypatch, busy, own, wall) -> float | None:
    """OtherCpuUse over a block that starts and ends at these readings of the machine's busy
    seconds (None: no /proc/stat), this process's CPU seconds and the wall clock."""
    from harness.core import machine_meta

    monkeypatch.setattr(machine_meta, "_busy_seconds", iter(busy).__next__)
    monkeypatch.setattr(machine_meta, "_own_cpu_seconds", iter(own).__next__)
    monkeypatch.setattr(machine_meta.time, "perf_counter", iter(wall).__next__)
    with machine_meta.OtherCpuUse() as others:
        pass
    return others.cores


def test_other_cpu_use_is_the_machines_busy_time_less_this_process(monkeypatch):
    # 3 busy seconds, 1 of them ours, over 2 s of wall time
    assert _other_cpu_use(monkeypatch, [100.0, 103.0], [5.0, 6.0], [10.0, 12.0]) == pytest.approx(1.0)


def test_other_cpu_use_is_zero_when_this_process_was_the_only_busy_one(monkeypatch):
    """The two counters tick apart (10 ms ticks, read at slightly different moments): our 2 CPU
    seconds can read as more than the machine's 1.5 busy ones. That is no one else, not minus a
    quarter core."""
    assert _other_cpu_use(monkeypatch, [100.0, 101.5], [5.0, 7.0], [10.0, 12.0]) == 0.0
    assert _other_cpu_use(monkeypatch, [None, None], [5.0, 7.0], [10.0, 12.0]) is None  # no /proc/stat: unknown


def test_other_cpu_use_reads_this_machine():
    import os

    from harness.core.machine_meta import OtherCpuUse, _busy_seconds

    if _busy_seconds() is None:
        pytest.skip("no /proc/stat here")
    with OtherCpuUse() as others:
        sum(range(10_000_000))  # ~0.2 s: long against the 10 ms ticks /proc/stat and os.times count in
    # Cores' worth, not ticks or milliseconds: at most every core, give or take a tick per counter.
    assert isinstance(others.cores, float) and 0.0 <= others.cores <= os.cpu_count() + 0.5


@pytest.mark.parametrize("method", ["eagle2", "gumiho"])
def test_auto_tree_size_stays_exact(tiny_target, tmp_path, monkeypatch, method):
    import torch

    from harness.core.decode import GenerationConfig, generate
    from methods.registry import get_method
    from tests.test_exactness import prompts

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(cost_model, "verify_cost_curve", lambda target, repeats=5: [[1, 1.0], [8, 1.1], [64, 3.0]])
    monkeypatch.setattr("methods.common.eagle_core.verify_cost_curve", cost_model.verify_cost_curve)
    torch.manual_seed(3)
    d = get_method(method)(tiny_target, {"total_tokens": "auto", "draft_vocab": 0}).eval()
    cfg = GenerationConfig(max_new_tokens=24)
    sizes = []
    for p in prompts(tiny_target.vocab_size, n=4):
        ar = generate(tiny_target, p, cfg)
        sp = generate(tiny_target, p, cfg, d)
        assert sp.output_ids == ar.output_ids
        sizes += sp.tree_size
    assert len(set(sizes)) > 1, "the budget never moved"
