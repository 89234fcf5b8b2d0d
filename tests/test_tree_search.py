"""Static trees fitted to a drafter's heads: the search, the rank semantics, the stored default."""
from __future__ import annotations

import itertools
import warnings

import pytest
import torch

from harness.core.decode import GenerationConfig, generate
from harness.core.tree import StaticTree
from harness.train.calibrate import calibrate_tree, save_tree
from harness.train.data import DistillBatch
from harness.train.tree_search import accepted_drafts, expected_tau, ranked_candidates, truth_ranks
from methods.common.draft_vocab import UNREACHABLE
from methods.hydra import Hydra
from methods.medusa import Medusa
from tests.train_helpers import tiny_dataset, tiny_prompts, train_quickly

X = UNREACHABLE


def _valid_trees(candidates: list[tuple[int, ...]], size: int):
    for combo in itertools.combinations(candidates, size):
        chosen = set(combo)
        if all(len(c) == 1 or c[:-1] in chosen for c in combo):
            yield [list(c) for c in combo]


def test_best_tree_is_the_optimum_over_every_valid_tree():
    ranks = torch.tensor([[0, 0, 1], [0, 0, 1], [0, 1, X], [1, 0, 0], [2, X, X], [0, 0, 0],
                          [X, 0, 0], [1, 0, X], [0, 2, 0], [3, 0, 0]])
    # by hand: prefix counts [0]:5 [0,0]:3 [1]:2 [1,0]:2 [0,0,1]:2 ...
    assert ranked_candidates(ranks, 2, topk=4) == [[[0], 0.5], [[0, 0], 0.3]]  # with their frequencies
    assert expected_tau(ranks, [[0], [0, 0]]) == pytest.approx(1 + (5 + 3) / 10)
    assert accepted_drafts(ranks, [[0], [0, 0], [1]]).tolist() == [2, 2, 1, 1, 0, 2, 0, 1, 1, 0]
    candidates = sorted({tuple(r[:d]) for r in ranks.tolist() for d in range(1, 4) if max(r[:d]) < 4})
    for size in (1, 3, 4, 5):
        best = [path for path, _ in ranked_candidates(ranks, size, topk=4)]
        StaticTree(best)  # a valid tree: every node's parent is in it
        optimum = max(expected_tau(ranks, t) for t in _valid_trees(candidates, size))
        assert expected_tau(ranks, best) == pytest.approx(optimum)


def _trained(cls, tiny_target, tmp_path, config):
    d = cls(tiny_target, config)
    train_quickly(d, tiny_dataset(tiny_target), tmp_path / cls.name, steps=150)
    return d.eval()


# Ranks below come from a full-sequence forward, decoding's from an incremental cached forward:
# float32 hidden states that differ by ~1e-6 relative, so head logits (magnitude ~10 here) by
# ~1e-5. Only a step whose truth logit sits within NEAR_TIE of a competitor can rank differently.
NEAR_TIE = 1e-3


def _truth_gaps(d, batch) -> torch.Tensor:
    """[T, heads]: |true token's logit - its nearest competitor's| per position and head (inf past the end)."""
    b, t = batch.input_ids.shape
    out = torch.full((t, d.config["heads"]), float("inf"))
    for k, off, hidden in d.teacher_forced_heads(batch):
        proj = d.own_proj(k)
        z = (proj(hidden) if proj is not None else d.vocab.draft_logits(hidden)).float()[0]
        labels = batch.input_ids[0, off:]
        at = z.gather(-1, labels[:, None])
        gap = (z - at).abs().scatter(-1, labels[:, None], float("inf"))
        out[: t - off, k] = gap.min(-1).values
    return out


@pytest.mark.parametrize("cls, config", [(Medusa, {"heads": 3}), (Hydra, {"heads": 3, "layers": 1})])
def test_truth_ranks_predict_every_decoding_step(tiny_target, tmp_path, cls, config):
    """On the target's own greedy output, the rank rows say exactly how many drafts each step of
    the real decoding loop accepts: the offsets of every head are the ones decoding uses. A step
    may differ only at a float32 near tie between two head logits, which is reported with its gap."""
    d = _trained(cls, tiny_target, tmp_path, {**config, "tree": "cpu_15"})
    choices = d.tree.choices
    checked = accepted = 0
    ties = []
    for p in tiny_prompts(tiny_target.vocab_size, 6, seed=41):
        gen = generate(tiny_target, p, GenerationConfig(40), d)
        seq = torch.tensor(p + gen.output_ids)
        hidden = tiny_target.forward(seq, tiny_target.new_cache()).hidden.float()
        ones = torch.ones(1, len(seq))
        batch = DistillBatch(seq[None], hidden[None], hidden[None], ones, ones)
        with torch.no_grad():
            rows = truth_ranks(d, batch)[0]
            gaps = _truth_gaps(d, batch)
        t = len(p) - 1  # state: feature of the last accepted token; the root is x_{t+1}
        for got in gen.accepted:
            if t + 2 + d.tree.max_depth >= len(seq):
                break  # the truth past the generated end is unknown
            predicted = accepted_drafts(rows[t : t + 1], choices).item()
            if predicted != got:
                gap = float(gaps[t].min())
                assert gap < NEAR_TIE, f"step at t={t}: ranks predict {predicted} drafts, decoding accepted {got} (gap {gap:.2e})"
                ties.append(gap)
            checked, accepted = checked + 1, accepted + (got > 0)
            t += got + 1
    if ties:
        warnings.warn(f"{len(ties)} decoding step(s) differed from the rank rows at float32 near ties "
                      f"(logit gaps {', '.join(f'{g:.1e}' for g in ties)})")
    assert len(ties) <= 2 and checked >= 20 and accepted >= 5, (ties, checked, accepted)


def test_calibrated_tree_beats_the_preset_and_becomes_the_checkpoint_default(tiny_target, tmp_path):
    d = _trained(Medusa, tiny_target, tmp_path, {"heads": 3, "tree": "cpu_15"})
    data = tiny_dataset(tiny_target, n=40, seed=8)
    result = calibrate_tree(d, data.train + data.valid, nodes=7)
    assert result["nodes"] == 7 and result["conversations"] == 40
    # optimal on the measured ranks, so never worse than the preset's first 7 nodes
    assert result["expected_tau"] >= result["expected_tau_presets"]["cpu_7"] > 1.0
    d.save_pretrained(tmp_path / "ck")
    save_tree(tmp_path / "ck", result, fixed=True)
    loaded = Medusa.from_pretrained(tmp_path / "ck", tiny_target)
    assert loaded.config["tree"] == result["tree"] and len(loaded.tree.nodes) == 7
    assert Medusa.from_pretrained(tmp_path / "ck", tiny_target, {"tree": "cpu_15"}).config["tree"] == "cpu_15"


FLAT = [[1, 1.0], [64, 1.0]]              # a verify costs one step whatever its width
STEEP = [[1, 1.0], [2, 2.0], [64, 64.0]]   # every token costs a step


@pytest.mark.slow
@pytest.mark.parametrize("cls, config", [(Medusa, {"heads": 3}), (Hydra, {"heads": 3, "layers": 1})])
def test_auto_tree_is_sized_from_the_fitted_candidates_and_the_cost_curve(tiny_target, tmp_path, monkeypatch,
                                                                          cls, config):
    """--save stores the fitted candidates and tree=auto; a run verifies the leading N of them that
    maximise (1 + sum of their acceptance frequencies) / cost(N + 1) on this machine's curve, and
    decodes exactly as AR."""
    from harness.core import cost_model
    from harness.core.errors import SpecbenchError
    from tests.test_exactness import prompts

    d = _trained(cls, tiny_target, tmp_path, {**config, "tree": "cpu_15"})
    data = tiny_dataset(tiny_target, n=40, seed=8)
    result = calibrate_tree(d, data.train + data.valid, nodes=7)
    cands = result["candidates"]
    freqs = [p for _, p in cands]
    assert len(cands) > 7 and freqs == sorted(freqs, reverse=True) and 0 < freqs[0] <= 1
    assert [path for path, _ in cands[:7]] == result["tree"]
    d.save_pretrained(tmp_path / "ck")
    save_tree(tmp_path / "ck", result)
    curve = [[1, 1.0], [4, 1.05], [8, 1.2], [16, 1.6], [64, 4.0]]
    for c, expect in ((FLAT, len(cands)), (STEEP, 1), (curve, cost_model.best_size(freqs, curve))):
        monkeypatch.setattr(cost_model, "verify_cost_curve", lambda target, repeats=5, c=c: c)
        loaded = cls.from_pretrained(tmp_path / "ck", tiny_target)
        assert loaded.config["tree"] == "auto"
        assert loaded.tree.choices == [path for path, _ in cands[:expect]]
        StaticTree(loaded.tree.choices)  # every leading run of the candidates is a valid tree
    values = [(1 + sum(freqs[:n])) / cost_model.interpolate(curve, n + 1) for n in range(1, len(freqs) + 1)]
    assert values[cost_model.best_size(freqs, curve) - 1] == max(values)
    for p in prompts(tiny_target.vocab_size, n=3):
        ar = generate(tiny_target, p, GenerationConfig(24))
        assert generate(tiny_target, p, GenerationConfig(24), loaded).output_ids == ar.output_ids
    with pytest.raises(SpecbenchError, match="calibrate-tree"):
        cls(tiny_target, {**config, "tree": "auto"})
