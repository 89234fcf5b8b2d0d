"""Every built-in method on the test device (`pytest --device cuda`, tests/conftest.py): greedy output
token-exact with AR in float32 (random-initialised drafters: verification must return AR's tokens
whatever is proposed), and in bfloat16 / float16 every divergence from AR a near tie (AR's top-2
logit gap within 2 bf16 ulps at the first differing position), for the loop's own drafters."""
from __future__ import annotations

import pytest
import torch

from harness.core.decode import GenerationConfig, generate
from harness.runs.metrics import first_divergence
from harness.testing.oracle import OracleDrafter
from harness.testing.random_drafters import builtin_methods, layers_needed, random_drafter
from methods.pld import PromptLookupDrafter
from tests.conftest import make_tiny_target
from tests.test_exactness import prompts


@pytest.mark.parametrize("method", builtin_methods())
def test_every_method_is_greedy_exact_in_float32(device_target, test_device, method):
    target = device_target
    if target.num_layers < layers_needed(method):
        target = make_tiny_target(layers=layers_needed(method), device=test_device)
    drafter = random_drafter(target, method, budget=15)
    cfg = GenerationConfig(max_new_tokens=24)
    drafted = 0
    for i, p in enumerate(prompts(target.vocab_size, n=4)):
        ar = generate(target, p, cfg)
        sp = generate(target, p, cfg, drafter)
        assert sp.output_ids == ar.output_ids, f"prompt {i}: {method} diverged from AR on {target.device}"
        drafted += sum(sp.tree_size)
    if method != "pld":  # pld proposes only where an n-gram repeats
        assert drafted > 0, f"{method} never proposed a draft: the check would be vacuous"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_half_precision_divergences_are_near_ties(test_device, dtype):
    target = make_tiny_target(device=test_device, dtype=dtype)
    cfg = GenerationConfig(max_new_tokens=32)
    compared = 0
    for i, p in enumerate(prompts(target.vocab_size, n=8)):
        ar = generate(target, p, GenerationConfig(max_new_tokens=32, record_logit_gaps=True))
        oracle = OracleDrafter(target, {"continuation": ar.output_ids, "prompt_len": len(p), "seed": i})
        for name, drafter in (("pld", PromptLookupDrafter(target)), ("oracle", oracle)):
            sp = generate(target, p, cfg, drafter)
            div = first_divergence(sp.output_ids, ar.output_ids, ar.top1, ar.gap, False)
            assert div is None or div["near_tie"], f"{dtype} prompt {i} {name}: not a near tie: {div}"
            compared += len(sp.output_ids) if div is None else div["position"]
    assert compared >= 8 * 2 * 16, "too few tokens agreed with AR for the check to mean anything"
