"""The decode-time arithmetic of one pre-norm Llama/Qwen2/Mistral decoder layer, shared by the
draft layers' fast path (harness/core/draft_layers.py) and the compiled target runtime
(harness/core/compiled.py), so both compute exactly what transformers' layers compute.

Differences from transformers' layer code, all of them about cost, none about the result: the
q/k/v and gate/up projections are one matmul each (weights concatenated once), and grouped-query
attention is done by SDPA on the K/V rows as stored (transformers copies K/V once per query head
whenever a mask is given, and a draft tree always has one). tests/test_draft_layers.py and
tests/test_compiled.py hold both users to transformers' layers within float32 rounding.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

# Layers whose arithmetic `layer_step` reproduces: pre-norm attention (q/k/v/o, optional q/k/v
# bias, RoPE) then a pre-norm SiLU-gated MLP. Others always take transformers' own path.
FAST_LAYERS = ("LlamaDecoderLayer", "Qwen2DecoderLayer", "MistralDecoderLayer")

FusedWeights = tuple  # (q/k/v weight, bias | None, gate/up weight, bias | None)


def layer_supported(layer: nn.Module, config) -> bool:
    """Whether `layer_step` computes what this transformers layer computes."""
    return (getattr(config, "hidden_act", "silu") == "silu" and type(layer).__name__ in FAST_LAYERS
            and getattr(layer.self_attn, "sliding_window", None) is None)


def fused_tensors(layer: nn.Module) -> list[torch.Tensor]:
    """The weights and biases `fuse_weights` concatenates (to key a cache of fused copies on)."""
    return [t for group in _groups(layer) for m in group for t in (m.weight, m.bias) if t is not None]


def fuse_weights(layer: nn.Module) -> FusedWeights:
    """The layer's q/k/v and gate/up weights (and biases, None where it has none), each group
    concatenated along the output dimension so it is one matmul."""
    fused = []
    for group in _groups(layer):
        fused.append(torch.cat([m.weight for m in group]).detach())
        fused.append(None if group[0].bias is None else torch.cat([m.bias for m in group]).detach())
    return tuple(fused)


def _groups(layer: nn.Module) -> tuple[tuple[nn.Module, ...], tuple[nn.Module, ...]]:
    attn, mlp = layer.self_attn, layer.mlp
    return (attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj)


KVStore = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def layer_step(layer: nn.Module, fused: FusedWeights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               store: KVStore, mask: torch.Tensor | None) -> torch.Tensor:
    """x [B, T, H] -> x [B, T, H] through one decoder layer.

    cos, sin: rotary embeddings of x's positions [B, T, head_dim]; store(k, v) keeps this step's
    keys and values ([B, kv_heads, T, head_dim]) and returns the K/V rows attention sees
    ([B, kv_heads, S, head_dim]); mask: bool [B, 1, T, S], True where attention is allowed, or
    None (every row sees every stored row: one query row)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    b, t, _ = x.shape
    attn = layer.self_attn
    qkv_w, qkv_b, gate_up_w, gate_up_b = fused
    h = layer.input_layernorm(x)
    q, k, v = F.linear(h, qkv_w, qkv_b).split(
        [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features], dim=-1)
    q = q.view(b, t, -1, attn.head_dim).transpose(1, 2)
    k = k.view(b, t, -1, attn.head_dim).transpose(1, 2)
    v = v.view(b, t, -1, attn.head_dim).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    keys, values = store(k, v)
    o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling,
                                       enable_gqa=keys.shape[1] != q.shape[1])
    x = x + attn.o_proj(o.transpose(1, 2).reshape(b, t, -1))
    h = layer.post_attention_layernorm(x)
    gate, up = F.linear(h, gate_up_w, gate_up_b).chunk(2, dim=-1)
    return x + layer.mlp.down_proj(F.silu(gate) * up)
