"""The target's runtimes (harness/core/runtime.py), eager (the default: packed weights) and compiled
(`--compile`), compute what transformers' layers compute: logits within float32 rounding for a
decode step, a (padded) tree verify and a growing context, and greedy speculative decoding still
reproduces AR token for token on each (and agrees with AR on transformers' layers).

Inductor's default mode keeps these compiles short; `--compile` uses max-autotune, which changes
how the GEMMs are generated, not the graph."""
from __future__ import annotations

import pytest
import torch

from harness.core.runtime import BUCKETS, RuntimeCache, bucket
from harness.core.decode import GenerationConfig, generate
from harness.testing.oracle import OracleDrafter
from methods.pld import PromptLookupDrafter
from tests.conftest import make_tiny_target
from tests.test_exactness import prompts

TOL = dict(atol=1e-4, rtol=1e-4)  # float32: two GEMM codegens of the same sums


RUNTIMES = ["eager", "compiled"]


@pytest.fixture(scope="module")
def targets():
    """Copies of the same tiny Llama: on transformers' layers, the eager runtime, the compiled one."""
    out = {kind: make_tiny_target() for kind in ("transformers", "eager", "compiled")}
    out["transformers"].set_runtime("transformers")
    out["compiled"].enable_compile("default")
    assert [out[k].runtime_name for k in out] == ["transformers", "eager", "compiled:default"]
    return out


@pytest.fixture(params=RUNTIMES)
def pair(request, targets):
    """(reference on transformers' layers, target on one of our runtimes)."""
    return targets["transformers"], targets[request.param]


def test_buckets():
    assert [bucket(n) for n in (1, 2, 3, 5, 31, 32, 33, 128)] == [1, 2, 4, 8, 32, 32, 64, 128]
    assert bucket(BUCKETS[-1] + 1) is None


@torch.inference_mode()
def test_steps_and_trees_match_transformers_layers(pair):
    eager, compiled = pair
    prompt = torch.arange(5, 25)
    ce, cc = eager.new_cache(256), compiled.new_cache(256)
    assert isinstance(cc, RuntimeCache) and not isinstance(ce, RuntimeCache)
    for target, cache in ((eager, ce), (compiled, cc)):
        target.forward(prompt, cache, logits="last")
    assert compiled.runtime.compiled_buckets == set()  # the prefill (an empty cache) runs on transformers' path
    for step in range(3):  # the context grows: one compiled graph serves every length
        tok = torch.tensor([7 + step])
        a, b = eager.forward(tok, ce), compiled.forward(tok, cc)
        torch.testing.assert_close(b.logits, a.logits, **TOL)
        torch.testing.assert_close(b.hidden, a.hidden, **TOL)
    # A 3-node tree (root -> two children, one grandchild): padded to a 4-row bucket.
    tokens = torch.tensor([3, 9, 11, 4])
    depths = torch.tensor([0, 1, 1, 2])
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    start = ce.length
    a = eager.forward(tokens, ce, position_ids=start + depths, tree_mask=mask)
    b = compiled.forward(tokens, cc, position_ids=start + depths, tree_mask=mask)
    assert b.logits.shape == a.logits.shape == (4, eager.vocab_size)
    torch.testing.assert_close(b.logits, a.logits, **TOL)
    assert cc.length == ce.length == start + 4
    # Keep root + second branch (nodes 0, 2), then step on: the committed rows must be the right ones.
    for cache in (ce, cc):
        cache.commit(start, torch.tensor([0, 2]))
    a, b = eager.forward(torch.tensor([5]), ce), compiled.forward(torch.tensor([5]), cc)
    torch.testing.assert_close(b.logits, a.logits, **TOL)
    if compiled.runtime.mode is not None:
        assert {1, 4} <= compiled.runtime.compiled_buckets


@pytest.mark.parametrize("method", ["oracle", "pld"])
def test_greedy_speculative_equals_ar_on_each_runtime(pair, method):
    eager, compiled = pair
    cfg = GenerationConfig(max_new_tokens=40)
    accepted = 0
    for i, p in enumerate(prompts(compiled.vocab_size, 8)):
        ar = generate(compiled, p, cfg)
        assert ar.output_ids == generate(eager, p, cfg).output_ids
        if method == "oracle":
            d = OracleDrafter(compiled, {"continuation": ar.output_ids, "prompt_len": len(p), "seed": i})
        else:
            d = PromptLookupDrafter(compiled)
        spec = generate(compiled, p, cfg, d)
        assert spec.output_ids == ar.output_ids
        accepted += sum(spec.accepted)
    assert accepted > 0  # drafts were accepted, so trees of several rows went through the runtime


@torch.inference_mode()
def test_a_small_cache_grows_under_the_runtime(pair):
    """A cache made too small grows (larger buffers, dynamic in their length: no recompile) and
    decoding goes on matching the eager target."""
    eager, compiled = pair
    ce, cc = eager.new_cache(8), compiled.new_cache(8)
    prompt = torch.arange(3, 40)
    for target, cache in ((eager, ce), (compiled, cc)):
        target.forward(prompt, cache, logits="last")
    cap = cc.layers[0].capacity
    for step in range(cap - cc.length + 2):  # past the first capacity
        tok = torch.tensor([5 + step % 7])
        a, b = eager.forward(tok, ce), compiled.forward(tok, cc)
    assert cc.layers[0].capacity > cap
    torch.testing.assert_close(b.logits, a.logits, **TOL)
