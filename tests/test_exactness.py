"""Greedy speculative decoding must reproduce AR greedy token for token (float32)."""
from __future__ import annotations

import pytest
import torch

from harness.core.decode import GenerationConfig, generate
from methods.pld import PromptLookupDrafter
from tests.oracle import OracleDrafter


def prompts(vocab: int, n: int = 20) -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    out = []
    for _ in range(n):
        seg = torch.randint(0, vocab, (int(torch.randint(4, 12, (1,), generator=g)),), generator=g).tolist()
        # A repeated segment gives prompt lookup something to find, as real prompts do.
        out.append(seg + seg[: len(seg) // 2] + seg)
    return out


def accepted_share(gens) -> float:
    steps = [a for g in gens for a in g.accepted]
    return sum(a > 0 for a in steps) / len(steps)


@pytest.mark.parametrize("method", ["oracle", "pld"])
def test_greedy_equals_ar_on_tiny_llama(tiny_target, method):
    cfg = GenerationConfig(max_new_tokens=48)
    gens = []
    for i, p in enumerate(prompts(tiny_target.vocab_size)):
        ar = generate(tiny_target, p, cfg)
        if method == "oracle":
            d = OracleDrafter(tiny_target, {"continuation": ar.output_ids, "prompt_len": len(p), "seed": i})
        else:
            d = PromptLookupDrafter(tiny_target)
        sp = generate(tiny_target, p, cfg, d)
        assert sp.output_ids == ar.output_ids, f"prompt {i}: {method} diverged from AR"
        assert sum(sp.tokens) + 1 == len(sp.output_ids)  # prefill token + step tokens
        gens.append(sp)
    assert accepted_share(gens) >= 0.30, f"{method}: too few steps accepted a draft to exercise the commit"
