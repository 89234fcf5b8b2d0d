"""The decoding fast path of `DecoderStack` (fused projections, GQA attention on the cached rows)
computes what the transformers layers compute: outputs and cached K/V within float32 rounding, for
a causal block, a tree step with its mask and a single row, on Llama and Qwen2 layers (biases)."""
from __future__ import annotations

import pytest
import torch

from harness.core.draft_layers import DecoderStack

TOL = {"rtol": 1e-4, "atol": 1e-5}  # float32: the fused matmuls may sum in another order


def config(kind: str):
    from transformers import LlamaConfig, Qwen2Config

    common = {"vocab_size": 64, "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2,
              "num_attention_heads": 6, "num_key_value_heads": 2, "max_position_embeddings": 512}
    return LlamaConfig(**common) if kind == "llama" else Qwen2Config(**common)


def steps(stack: DecoderStack, fast: bool, seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Prefill 7 rows, a 4-row tree step with a mask, then one row; returns outputs and final K/V."""
    g = torch.Generator().manual_seed(seed)
    h = stack.config.hidden_size
    stack.fast_decode = fast
    cache = stack.new_cache(capacity=8)  # small: the cache grows during the steps
    outs = []
    with torch.inference_mode():
        x = torch.randn(1, 7, h, generator=g)
        outs.append(stack(x, torch.arange(7)[None], cache))
        # a tree of 4 nodes: 0 <- 1, 0 <- 2 <- 3; each sees the 7 cached rows and its ancestors
        tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
        mask = torch.cat([torch.ones(4, 7, dtype=torch.bool), tree], dim=1)[None, None]
        x = torch.randn(1, 4, h, generator=g)
        outs.append(stack(x, torch.tensor([[7, 8, 8, 9]]), cache, mask))
        cache.crop_to(7)
        x = torch.randn(1, 1, h, generator=g)
        outs.append(stack(x, torch.tensor([[7]]), cache))
    kv = [t[:, :, : cache.length].clone() for layer in cache.layers for t in (layer.keys, layer.values)]
    return outs, kv


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_fast_decode_equals_the_transformers_layers(kind):
    torch.manual_seed(0)
    stack = DecoderStack(config(kind), 2).eval()
    for p in stack.parameters():  # non-zero biases, so a dropped bias would show
        torch.nn.init.normal_(p, std=0.1)
    assert stack.fast_decode
    fast, fast_kv = steps(stack, True)
    slow, slow_kv = steps(stack, False)
    for a, b in zip(fast + fast_kv, slow + slow_kv):
        torch.testing.assert_close(a, b, **TOL)


def test_fused_weights_follow_a_weight_update():
    stack = DecoderStack(config("llama"), 1).eval()
    before, _ = steps(stack, True)
    with torch.no_grad():
        stack.layers[0].self_attn.k_proj.weight.mul_(2.0)  # in place: the fused copy must be rebuilt
    after, _ = steps(stack, True)
    reference, _ = steps(stack, False)
    assert not torch.allclose(before[0], after[0])
    torch.testing.assert_close(after[0], reference[0], **TOL)


def test_other_layers_and_training_take_the_transformers_path():
    cfg = config("qwen2")
    cfg.use_sliding_window, cfg.sliding_window, cfg.max_window_layers = True, 4, 0
    cfg.layer_types = ["sliding_attention"] * cfg.num_hidden_layers
    assert not DecoderStack(cfg, 2).fast_decode_supported
    stack = DecoderStack(config("llama"), 1)
    x = torch.randn(1, 3, 48, requires_grad=True)
    stack(x, torch.arange(3)[None], stack.new_cache()).sum().backward()  # autograd: transformers' layers
    assert x.grad is not None


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_compiled_decode_equals_the_eager_one(kind):
    """`enable_compile` (inductor's default mode here; runs use max-autotune, other GEMM codegen of
    the same graph): the tree step and the single row run compiled, the prefill eagerly, and all
    of it matches the eager fast path within float32 rounding, K/V included."""
    torch.manual_seed(0)
    stack = DecoderStack(config(kind), 2).eval()
    for p in stack.parameters():
        torch.nn.init.normal_(p, std=0.1)
    eager, eager_kv = steps(stack, True)
    stack.enable_compile("default")
    compiled, compiled_kv = steps(stack, True)
    assert stack.runtime.compiled_buckets == {1, 4}  # the 4-row tree and the 1-row step; not the prefill
    for a, b in zip(compiled + compiled_kv, eager + eager_kv):
        torch.testing.assert_close(a, b, **TOL)


def test_a_compiled_cache_grows_and_keeps_its_rows():
    stack = DecoderStack(config("llama"), 1).eval()
    stack.enable_compile("default")
    cache = stack.new_cache(capacity=8)
    with torch.inference_mode():
        stack(torch.randn(1, 5, 48), torch.arange(5)[None], cache)
        before = cache.layers[0].keys[:, :, :5].clone()
        cap = cache.layers[0].capacity
        cache.reserve(cap + 1)
        assert cache.layers[0].capacity >= cap + 1
        torch.testing.assert_close(cache.layers[0].keys[:, :, :5], before, rtol=0, atol=0)
        stack(torch.randn(1, 1, 48), torch.tensor([[5]]), cache)  # the grown buffers: no error, same graph
    assert cache.length == 6
