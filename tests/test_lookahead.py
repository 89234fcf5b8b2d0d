"""Lookahead decoding (methods/lookahead.py): its window's mask, greedy = AR with drafts accepted, each
step as Spec-Bench's official loop takes it, the exact AR law at T > 0, its budget and its config.
(`target`, `ar_logits` and `one_thread` are tests/test_sampling.py's fixtures: the 6-token target.)"""
from __future__ import annotations

import random

import pytest
import torch

import harness.core.verify
from harness.core.decode import GenerationConfig, generate
from harness.core.errors import SpecbenchError
from harness.core.verify import Sampling
from harness.runs.law_sampling import ForwardReplay, RootMemo, sample_counts
from methods.lookahead import Lookahead, window_layout
from tests.test_exactness import prompts
from tests.test_sampling import (ALPHA_BIASED, ALPHA_FAIR, N_SAMPLES, ar_law, ar_logits, one_thread,  # noqa: F401
                                 pooled_chi2, target, verify_biased)
from tests.test_sampling import sample_counts as law_samples

PAPER_GRID = {"level": 5, "window": 7, "guess": 7}  # Spec-Bench's eval.sh setting


def test_window_layout_is_the_official_two_dimensional_mask():
    # level 0 holds 2 tokens, levels 1 and 2 hold 3 (N = 4, W = 3); rows in that order
    offsets, mask = window_layout((2, 3, 3))
    assert offsets.tolist() == [1, 2, 1, 2, 3, 2, 3, 4]
    expected = torch.tensor([
        # l0: 0 1  l1: 0 1 2  l2: 0 1 2
        [1, 0, 0, 0, 0, 0, 0, 0],   # level 0, column 0
        [1, 1, 0, 0, 0, 0, 0, 0],   # level 0, column 1
        [0, 0, 1, 0, 0, 0, 0, 0],   # level 1, column 0: root + itself
        [1, 0, 0, 1, 0, 0, 0, 0],   # level 1, column 1: level 0 before it + itself
        [1, 1, 0, 0, 1, 0, 0, 0],
        [0, 0, 1, 0, 0, 1, 0, 0],   # level 2, column 0: level 1's column 0 + itself
        [1, 0, 0, 1, 0, 0, 1, 0],
        [1, 1, 0, 0, 1, 0, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(mask, expected)


@pytest.mark.parametrize("config", [{}, {"full_ngram": True}, PAPER_GRID])
def test_greedy_equals_ar_and_drafts_are_accepted(tiny_target, config):
    cfg = GenerationConfig(max_new_tokens=48)
    accepted = 0
    for i, p in enumerate(prompts(tiny_target.vocab_size, 6)):
        ar = generate(tiny_target, p, cfg)
        sp = generate(tiny_target, p, cfg, Lookahead(tiny_target, config))
        assert sp.output_ids == ar.output_ids, f"prompt {i}: lookahead {config} diverged from AR"
        accepted += sum(sp.accepted)
    assert accepted > 0, "no n-gram was ever accepted: the test exercises nothing"


def official_greedy(target, prompt: list[int], window: int, level: int, guess: int,
                    max_new: int) -> tuple[list[int], list[int]]:
    """Spec-Bench's greedy lookahead loop (model/lade/decoding.py with the block mask of
    models/llama.py), written out plainly: every step is one forward from an empty cache over the
    sequence, the window and the n-grams of the last token, with that code's mask, positions, hit
    rule (a match counts at most N-2 tokens), pool rule and window moves. Returns the new tokens
    and the tokens each step added, the prefill's one first."""
    rng = random.Random(10)
    size = level - 1
    past = [[rng.choice(prompt) for _ in range(window + level - 3)]] + [None] * (level - 2)
    fill, pool, seq, added, last = 0, {}, list(prompt), [], None
    while len(seq) - len(prompt) < max_new:
        guesses = [t for g in pool.get(last, []) for t in g] if past[level - 2] is not None else []
        levels = past[: fill + 1]
        window_ids = [t for lv in levels for t in lv]
        if past[1] is None:  # the prefill: the prompt and level 0, all causal
            ids = seq + window_ids
            mask = torch.ones(len(ids), len(ids), dtype=torch.bool).tril()
            positions = list(range(len(ids)))
            out_row = len(seq) - 1
        else:
            ctx, root = len(seq) - 1, len(seq) - 1
            block = 1 + len(window_ids) + len(guesses)
            b = torch.zeros(block, block, dtype=torch.bool)
            if guesses:
                b[:, 0] = True
                for e in range(len(guesses) // size):
                    r = block - len(guesses) + e * size
                    b[r:r + size, r:r + size] = torch.ones(size, size, dtype=torch.bool).tril()
            tms = len(levels[0]) + 1
            for ll in range(len(levels)):
                b[tms * ll:tms * (ll + 1), :tms] |= torch.ones(tms, tms, dtype=torch.bool).tril()
                for r in range(1, ll + 1):
                    b[tms * ll:tms * (ll + 1), tms * r:tms * (r + 1)] |= torch.eye(tms, dtype=torch.bool)
            mask = torch.ones(ctx + block, ctx + block, dtype=torch.bool).tril()
            mask[ctx:, ctx:] = b
            ids = seq + window_ids + guesses
            positions = list(range(ctx + 1)) + [root + 1 + i for i in range(len(levels[0]))]
            for ll in range(1, len(levels)):
                positions += [root + ll + j for j in range(len(levels[ll]))]
            positions += [root + 1 + k for k in range(size)] * (len(guesses) // size)
            out_row = ctx
        logits = target.forward(torch.tensor(ids), target.new_cache(), position_ids=torch.tensor(positions),
                                tree_mask=mask).logits
        top = logits.argmax(-1).tolist()
        end = len(seq) + len(window_ids)
        new = top[end - len(levels[-1]):end]
        first, max_hit = top[out_row], 0
        hits = [first]
        if past[1] is None:
            past[0], past[1] = past[0][1:], new
            fill += 1
        elif past[level - 2] is None:
            past[: fill + 1] = [lv[1:] for lv in past[: fill + 1]]
            past[fill + 1] = new[1:]
            fill += 1
        else:
            results = top[len(top) - len(guesses):] if guesses else []
            for e in range(len(guesses) // size):
                correct = [first] + results[e * size:(e + 1) * size]
                mine = guesses[e * size:(e + 1) * size]
                gg = 0
                for gg in range(len(mine)):
                    if mine[gg] != correct[gg]:
                        break
                if gg > max_hit:
                    max_hit, hits = gg, correct[:gg + 1]
            for j in range(window):
                key = last if j == 0 else past[0][j - 1]
                gram = tuple(past[ll][j] for ll in range(1, level - 1)) + (new[j],)
                grams = pool.setdefault(key, [])
                if gram in grams:
                    grams.remove(gram)
                    grams.append(gram)
                elif len(grams) < guess:
                    grams.append(gram)
                else:
                    pool[key] = grams[1:] + [gram]
            past[0] = past[1][1:]
            past[1:level - 2] = [lv[:] for lv in past[2:level - 1]]
            past[level - 2] = new
        last = hits[max_hit]
        seq += hits[:max_hit + 1]
        added.append(max_hit + 1)
    return seq[len(prompt):len(prompt) + max_new], added


@pytest.mark.parametrize("config", [{"level": 3, "window": 10, "guess": 10}, {"level": 3, "window": 4, "guess": 2},
                                    {"level": 4, "window": 5, "guess": 3}, PAPER_GRID])
def test_each_step_is_the_official_loops(tiny_target, config):
    """Same tokens and the same tokens per step as Spec-Bench's loop, from the first step on (small
    pools exercise its eviction, N > 3 its filling of the levels)."""
    max_new, steps_with_drafts = 40, 0
    for i, p in enumerate(prompts(tiny_target.vocab_size, 4)):
        ours = generate(tiny_target, p, GenerationConfig(max_new_tokens=max_new), Lookahead(tiny_target, config))
        tokens, added = official_greedy(tiny_target, p, config["window"], config["level"], config["guess"], max_new)
        assert ours.output_ids == tokens, f"prompt {i}: other tokens than the official loop"
        official = added[1:]  # the prefill's token is no step here
        assert len(ours.tokens) == len(official), f"prompt {i}: {len(ours.tokens)} steps, official {len(official)}"
        assert ours.tokens[:-1] == official[:-1], f"prompt {i}: tokens per step differ from the official loop"
        assert ours.tokens[-1] == min(official[-1], max_new - 1 - sum(ours.tokens[:-1]))  # the last is cut to the limit
        steps_with_drafts += sum(a > 1 for a in official)
    assert steps_with_drafts > 0


class SeededPool(Lookahead):
    """Lookahead whose pool starts with two n-grams under every token, so the first step (where the
    official pool is still empty) verifies drafts too."""

    def begin(self, prompt, prefill, root: int) -> None:
        super().begin(prompt, prefill, root)
        v = self.target.vocab_size
        self.pool = {key: [((key + 1) % v, key), ((key + 3) % v, key)] for key in range(v)}


@pytest.mark.parametrize("temperature,top_p,biased", [(1.0, 1.0, False), (0.7, 0.8, False), (1.0, 1.0, True)],
                         ids=["T1", "T0.7-top-p0.8", "no-residual-control-T1"])
def test_sampling_keeps_the_exact_ar_law(target, ar_logits, monkeypatch, temperature, top_p, biased):
    """The joint law of the first 3 tokens on the 6-token target (tests/test_sampling.py's exact
    check) with n-grams verified beside the window's side rows; the same samples under a rule that
    forgets the residual must be caught, so the check has power over these trees."""
    if biased:
        monkeypatch.setattr(harness.core.verify, "verify_lossless", verify_biased("no-residual"))
    joint, _ = ar_law(ar_logits, temperature, top_p)
    counts, accepted = law_samples(target, SeededPool(target), temperature, top_p)
    stat, df, p = pooled_chi2(counts, joint)
    assert N_SAMPLES // 8 <= accepted <= N_SAMPLES - N_SAMPLES // 8, f"accepted {accepted} of {N_SAMPLES} drafts"
    if biased:
        assert p < ALPHA_BIASED, f"the check missed the no-residual bias: p = {p:.3g}"
        return
    assert int(counts[joint == 0].sum()) == 0, "sampled a sequence outside top-p"
    assert p > ALPHA_FAIR, f"lookahead sampling differs from the AR law: chi2 = {stat:.1f}, df = {df}, p = {p:.3g}"


def test_the_law_sampler_replays_a_prefill_with_side_rows(tiny_target):
    """check-method's law sampler computes the prefill and each first verify once per distinct input
    and replays them; with the window's side rows in the prefill it still does, and every sample
    draws what it draws computed afresh."""
    prompt = prompts(tiny_target.vocab_size, 1)[0]
    sampling = Sampling(1.0, 1.0, "lossless")
    fresh, _ = sample_counts(tiny_target, prompt, RootMemo(SeededPool(tiny_target)), sampling, 40)
    replay = tiny_target.forward = ForwardReplay(tiny_target, prompt)
    try:
        replayed, _ = sample_counts(tiny_target, prompt, RootMemo(SeededPool(tiny_target)), sampling, 40)
    finally:
        del tiny_target.forward
    assert replayed == fresh
    assert replay.computed <= 1 + len({t1 for t1, _ in fresh}) and replay.replayed > 0


def test_a_budget_caps_the_verified_drafts(tiny_target):
    assert Lookahead.budget_overrides(3) == {"max_drafts": 3} and Lookahead.budget_overrides("auto") == {}
    cfg = GenerationConfig(max_new_tokens=40)
    for p in prompts(tiny_target.vocab_size, 3):
        ar = generate(tiny_target, p, cfg)
        sp = generate(tiny_target, p, cfg, Lookahead(tiny_target, {"max_drafts": 2, **PAPER_GRID}))
        assert sp.output_ids == ar.output_ids and max(sp.tree_size) <= 2


@pytest.mark.parametrize("bad", [{"level": 2}, {"window": 0}, {"guess": 0}, {"max_drafts": 0}, {"level": "3"}])
def test_a_bad_setting_is_one_clear_error(tiny_target, bad):
    with pytest.raises(SpecbenchError, match="lookahead"):
        Lookahead(tiny_target, bad)


@pytest.mark.slow
@pytest.mark.smollm2
def test_smollm2_greedy_equals_ar_with_drafts_accepted(smollm2_fp32, shared_data):
    from tests.test_smollm2 import chat_prompts

    t = smollm2_fp32
    cfg = GenerationConfig(max_new_tokens=48)
    accepted = 0
    for i, p in enumerate(chat_prompts(t, shared_data, per_bench=1)):
        ar = generate(t, p, cfg)
        sp = generate(t, p, cfg, Lookahead(t))
        assert sp.output_ids == ar.output_ids, f"prompt {i}: lookahead diverged from AR"
        accepted += sum(sp.accepted)
    assert accepted > 0
