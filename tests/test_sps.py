"""SpS (a draft model's chain): greedy output equals AR in float32, the draft cache always holds a
prefix of the committed context, and a draft of another tokenizer is refused in one line.
(Lossless sampling: tests/test_sampling.py::test_sps_chain_sampling_matches_exact_ar_law.)"""
from __future__ import annotations

import pytest
import torch

from harness.core.decode import GenerationConfig, generate
from harness.core.errors import SpecbenchError
from harness.core.target import Target
from harness.core.tiny_target import tiny_llama
from methods.sps import SpeculativeSampling
from tests.conftest import make_tiny_target
from tests.test_exactness import prompts


def perturbed_draft(target: Target, scale: float = 0.02, seed: int = 5) -> Target:
    """A draft that mostly agrees with the target: its weights plus small noise (so chains are
    often, not always, accepted: both the commit and the re-sync after a rejection are exercised)."""
    model = tiny_llama(target.vocab_size, target.hidden_size, target.num_layers, seed=0)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * p.std().clamp_min(1e-3))
    return Target(model, None, "tiny-draft", torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("schedule", ["constant", "heuristic"])
def test_greedy_sps_equals_ar_and_keeps_the_draft_cache_a_prefix(tiny_target, schedule):
    draft = perturbed_draft(tiny_target)
    drafter = SpeculativeSampling(tiny_target, {"draft": "tiny", "gamma": 4, "schedule": schedule}, draft=draft)
    checked = 0
    real_propose = drafter.propose

    def propose(ctx):
        tree = real_propose(ctx)
        drafts = tree.tokens[1:].tolist()
        if drafts:  # (no room left: nothing proposed, nothing fed)
            # After proposing: the committed context (root included), then every draft but the last.
            assert drafter._cached == list(ctx.tokens) + drafts[:-1]
            assert drafter._cache.length == len(drafter._cached)
            nonlocal checked
            checked += 1
        return tree

    drafter.propose = propose
    cfg = GenerationConfig(max_new_tokens=40)
    accepted, rejected = 0, 0
    for i, p in enumerate(prompts(tiny_target.vocab_size, n=8)):
        ar = generate(tiny_target, p, cfg)
        sp = generate(tiny_target, p, cfg, drafter)
        assert sp.output_ids == ar.output_ids, f"prompt {i}: sps diverged from AR ({schedule})"
        accepted += sum(sp.accepted)
        rejected += sum(a < s for a, s in zip(sp.accepted, sp.tree_size))
    assert checked > 0 and accepted > 0 and rejected > 0, (accepted, rejected)
    if schedule == "heuristic":
        assert drafter._gamma != 4 or rejected == 0  # the schedule moved


def test_a_draft_of_another_vocabulary_is_refused(tiny_target):
    other = make_tiny_target(vocab=tiny_target.vocab_size + 1, seed=1)
    with pytest.raises(SpecbenchError, match="another tokenizer"):
        SpeculativeSampling(tiny_target, {"draft": "x"}, draft=other)


def test_sps_without_a_draft_names_the_setting(tiny_target):
    with pytest.raises(SpecbenchError, match=r"--set sps.draft="):
        SpeculativeSampling(tiny_target, {})
