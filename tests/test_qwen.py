"""The optional Qwen2.5-Coder pair (`bash scripts/setup.sh --qwen`): the 1.5B target with the 0.5B
as sps draft reproduces the target's greedy output in float32. Skipped, with the reason, where the
chunk wheels are not installed (CI and the SmolLM2 demo never need their 1.6 GB)."""
from __future__ import annotations

import importlib.util

import pytest

from harness.core.model_wheels import WHEEL_MODELS

PAIR = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
missing = [a for a in PAIR if any(importlib.util.find_spec(m) is None for m in WHEEL_MODELS[a].modules)]
pytestmark = [pytest.mark.qwen,
              pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} not installed (bash scripts/setup.sh --qwen)")]


def test_sps_with_the_0_5b_draft_equals_1_5b_greedy():
    from harness.core.decode import GenerationConfig, generate
    from harness.core.target import Target
    from methods.sps import SpeculativeSampling

    target = Target.load(PAIR[0], "cpu", "float32")
    drafter = SpeculativeSampling(target, {"draft": PAIR[1]})
    prompt = target.encode_chat([{"role": "user", "content": "Write a Python function that reverses a string."}])
    cfg = GenerationConfig(max_new_tokens=32)
    ar = generate(target, prompt, cfg)
    sp = generate(target, prompt, cfg, drafter)
    assert sp.output_ids == ar.output_ids
    assert sp.tau > 1.0, f"the 0.5B draft should be accepted on code (tau {sp.tau:.2f})"
