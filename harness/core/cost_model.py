"""What a verify of k tree tokens costs on this machine, and the tree size that pays most.

The cost of one cached forward of k tokens, as a ratio to a 1-token step, depends on the CPU kind
and the dtype (README: a 32-token verify costs 1.3x a step in bf16 on Sapphire Rapids and 1.6x on
an AMD EPYC), so a tree budget chosen on one machine is wrong on another. `verify_cost_curve`
measures the curve on the target in use (a few seconds) and caches it per machine, thread count,
target and dtype under $SPECBENCH_CACHE. `TreeSizer` then picks, every step, how many of a dynamic
tree's ranked candidates to verify: the N maximising expected new tokens per unit of cost,
(1 + c * sum_{i<N} exp(s_i)) / cost(N + 1), where s_i are the candidates' cumulative draft
log-probs in rank order (exp(s_i) estimates the chance that candidate i lies on the accepted path,
so the sum estimates the accepted drafts; EAGLE-2's own argument) and c calibrates that estimate
against the drafts really accepted in this answer (Sequoia's hardware-aware sizing, per step).
Medusa and Hydra size their static tree once per run by the same rule (`best_size`), with each
candidate node's held-out acceptance frequency fitted by `calibrate-tree` as its probability.
"""
from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

import torch

from harness.core.timing import Clock, Devices
from harness.core.tree import DraftTree

CURVE_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
CURVE_CONTEXT = 256


def interpolate(curve: list[list[float]], k: int) -> float:
    """Piecewise-linear cost of a k-token forward; beyond the last point, linear extrapolation."""
    pts = sorted((float(a), float(b)) for a, b in curve)
    if k <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if k <= x1:
            return y0 + (y1 - y0) * (k - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = pts[-2], pts[-1]
    return y1 + (y1 - y0) * (k - x1) / (x1 - x0)


def median_ms(fn, repeats: int, devices: Devices = None) -> float:
    """Median milliseconds of `repeats` calls of `fn` whose work runs on `devices` (harness/core/timing.py)."""
    return Clock(devices).median_ms(fn, repeats)


@torch.inference_mode()
def forward_cost_ms(target, contexts: list[int], sizes: list[int], repeats: int) -> dict[int, dict[int, float]]:
    """{context: {k: ms}}: median time of one forward of a k-token chain tree on top of `context`
    cached tokens (random ids), the cache cropped back after each."""
    g = torch.Generator().manual_seed(0)
    out: dict[int, dict[int, float]] = {}
    for ctx in contexts:
        prefix = torch.randint(0, target.vocab_size, (ctx,), generator=g)
        cache = target.new_cache(capacity=ctx + max(sizes) + 8)
        target.forward(prefix, cache, logits="none")
        out[ctx] = {}
        for k in sizes:
            tree = DraftTree.chain(1, torch.randint(0, target.vocab_size, (k - 1,), generator=g))
            tokens, positions, mask = tree.verify_inputs(target.input_device, ctx)  # on the device, untimed

            def step() -> None:
                if k == 1:
                    target.forward(tokens, cache)
                else:
                    target.forward(tokens, cache, position_ids=positions, tree_mask=mask)
                cache.crop_to(ctx)

            step()  # warm-up: the first call of a shape pays for allocation
            out[ctx][k] = median_ms(step, repeats, target.devices)
    return out


def _cache_file(target) -> Path:
    from harness.core.hardware import cpu_kind
    from harness.core.hashing import config_hash
    from harness.core.target import cache_root

    where = torch.cuda.get_device_name(target.device) if target.device.type == "cuda" else cpu_kind()
    key = {"machine": where, "threads": torch.get_num_threads(), "target": target.name,
           "dtype": str(target.dtype), "torch": torch.__version__, "sizes": CURVE_SIZES, "context": CURVE_CONTEXT}
    # Each runtime has its own curve (transformers' layers, packed eager, compiled with padded buckets).
    key["runtime"] = getattr(target, "runtime_name", "transformers")
    return cache_root() / "cost_curves" / f"{config_hash(key)}.json"


def verify_cost_curve(target, repeats: int = 5) -> list[list[float]]:
    """[[k, cost(k) / cost(1)], ...] on `target` here, measured once per machine, thread count,
    target, dtype and runtime (eager or compiled), then read from $SPECBENCH_CACHE/cost_curves/.
    A curve measured while other processes competed for the CPU is used but not cached."""
    path = _cache_file(target)
    if path.exists():
        try:
            return json.loads(path.read_text())["curve"]
        except (ValueError, KeyError):
            pass  # a torn or foreign file: measure again
    from harness.core.machine_meta import CONTENDED_CORES, OtherCpuUse
    from harness.core.packed_linear import weight_format

    # "native": a drafter asks for the curve from inside its own calls, which may run on int8 weights;
    # the target's verify never does.
    with OtherCpuUse() as others, weight_format("native"):
        ms = forward_cost_ms(target, [CURVE_CONTEXT], list(CURVE_SIZES), repeats)[CURVE_CONTEXT]
    # A cost never falls as k grows: noise below an earlier size is clipped to it.
    curve, floor = [], 0.0
    for k in CURVE_SIZES:
        floor = max(floor, ms[k] / ms[1])
        curve.append([k, round(floor, 4)])
    # A contended curve would size every later run's trees on this machine: used, not cached.
    if others.cores is not None and others.cores > CONTENDED_CORES:
        warnings.warn(f"other processes used {others.cores:.2f} cores while the verify cost curve was measured: "
                      f"it sizes this run's trees but is not cached; rerun with the machine idle", RuntimeWarning,
                      stacklevel=2)
        return curve
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"curve": curve, "ms": ms, "target": target.name, "dtype": str(target.dtype)}) + "\n")
    os.replace(tmp, path)
    return curve


def best_size(probs: list[float], curve: list[list[float]], min_keep: int = 1, calibration: float = 1.0) -> int:
    """How many of the ranked candidates to verify: the N >= min_keep (at most len(probs))
    maximising (1 + calibration * sum(probs[:N])) / cost(N + 1), where probs[i] is the estimated
    chance that candidate i is accepted and cost the verify cost curve (root + N draft tokens)."""
    best_n, best_v, expected = min_keep, -1.0, 1.0
    for n in range(len(probs) + 1):
        if n:
            expected += calibration * probs[n - 1]
        if n < min_keep:
            continue
        v = expected / interpolate(curve, n + 1)
        if v > best_v:
            best_n, best_v = n, v
    return min(best_n, len(probs))


class TreeSizer:
    """Per-step tree budget from a cost curve and the drafter's own acceptance (see the module).

    `calibration` c starts at 1 (draft probabilities taken at face value) and moves to
    accepted / predicted over the answer so far, with `prior_weight` pseudo-steps at 1, so that
    results never depend on question order (reset by `begin` of every answer)."""

    def __init__(self, curve: list[list[float]], max_keep: int, min_keep: int = 1, prior_weight: float = 4.0) -> None:
        self.curve = curve
        self.max_keep = max_keep
        self.min_keep = min_keep
        self.prior_weight = prior_weight
        self.reset()

    def reset(self) -> None:
        self.predicted = self.accepted = self.prior_weight
        self.pending: float | None = None

    @property
    def calibration(self) -> float:
        return self.accepted / self.predicted

    def budget(self, ranked_scores: list[float]) -> int:
        """How many of the candidates (cumulative log-probs, best first) to keep this step."""
        probs = [math.exp(s) for s in ranked_scores[: self.max_keep]]
        best_n = best_size(probs, self.curve, self.min_keep, self.calibration)
        self.pending = sum(probs[:best_n])
        return best_n

    def observe(self, accepted: int) -> None:
        """The drafts accepted from the tree of the last `budget` call; a step whose tree this sizer
        did not size (SAM-Decoding verifies its own chain between its auxiliary's trees) teaches it nothing."""
        if self.pending is None:
            return
        self.predicted += self.pending
        self.accepted += accepted
        self.pending = None
