"""The decode-time arithmetic of one pre-norm Llama/Qwen2/Mistral decoder layer, shared by the
draft layers' fast path (harness/core/draft_layers.py) and the compiled target runtime
(harness/core/runtime.py), so both compute exactly what transformers' layers compute.

Differences from transformers' layer code, all of them about cost, none about the result: the
q/k/v and gate/up projections are one matmul each (weights concatenated once), every projection
can take a weight packed once for oneDNN (harness/core/packed_linear.py; the compiled runtime
leaves that to inductor), and grouped-query attention is done by SDPA on the K/V rows as stored
(transformers copies K/V once per query head whenever a mask is given, and a draft tree always
has one). tests/test_draft_layers.py and tests/test_compiled.py hold both users to transformers'
layers within float32 rounding.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from harness.core.packed_linear import PackedLinear

# Layers whose arithmetic `layer_step` reproduces: pre-norm attention (q/k/v/o, optional q/k/v
# bias, RoPE) then a pre-norm SiLU-gated MLP. Others always take transformers' own path.
FAST_LAYERS = ("LlamaDecoderLayer", "Qwen2DecoderLayer", "MistralDecoderLayer")


@dataclass
class FusedWeights:
    """A layer's four projections: q/k/v and gate/up each one matmul, then o and down."""

    qkv: PackedLinear
    o: PackedLinear
    gate_up: PackedLinear
    down: PackedLinear


def layer_supported(layer: nn.Module, config) -> bool:
    """Whether `layer_step` computes what this transformers layer computes."""
    return (getattr(config, "hidden_act", "silu") == "silu" and type(layer).__name__ in FAST_LAYERS
            and getattr(layer.self_attn, "sliding_window", None) is None)


def stack_supported(layers: nn.ModuleList, config) -> bool:
    """Whether `layer_step` computes what every one of these layers computes."""
    return all(layer_supported(layer, config) for layer in layers)


def fused_tensors(layer: nn.Module) -> list[torch.Tensor]:
    """The weights and biases `fuse_weights` uses (to key a cache of fused copies on)."""
    return [t for group in _groups(layer) for m in group for t in (m.weight, m.bias) if t is not None]


def fuse_weights(layer: nn.Module, pack: bool = True) -> FusedWeights:
    """The layer's projections, q/k/v and gate/up each concatenated along the output dimension so
    it is one matmul; `pack`: weights packed for oneDNN where that applies (not under compile)."""
    maps = []
    for group in _groups(layer):
        weight = torch.cat([m.weight for m in group]) if len(group) > 1 else group[0].weight
        bias = None if group[0].bias is None else torch.cat([m.bias for m in group])
        maps.append(PackedLinear(weight, bias, pack))
    return FusedWeights(*maps)


def _groups(layer: nn.Module) -> tuple[tuple[nn.Module, ...], ...]:
    attn, mlp = layer.self_attn, layer.mlp
    return (attn.q_proj, attn.k_proj, attn.v_proj), (attn.o_proj,), (mlp.gate_proj, mlp.up_proj), (mlp.down_proj,)


KVStore = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def layer_step(layer: nn.Module, fused: FusedWeights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               store: KVStore, mask: torch.Tensor | None, attn_in: torch.Tensor | None = None) -> torch.Tensor:
    """x [B, T, H] -> x [B, T, H] through one decoder layer.

    cos, sin: rotary embeddings of x's positions [B, T, head_dim]; store(k, v) keeps this step's
    keys and values ([B, kv_heads, T, head_dim]) and returns the K/V rows attention sees
    ([B, kv_heads, S, head_dim]); mask: bool [B, 1, T, S], True where attention is allowed, or
    None (every row sees every stored row: one query row). attn_in [B, T, D]: what q/k/v read
    when it is not input_layernorm(x) (EAGLE-3's [norm(embedding) ; norm(x)], D = 2H); x stays
    the residual."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    b, t, _ = x.shape
    attn = layer.self_attn
    h = layer.input_layernorm(x) if attn_in is None else attn_in
    q, k, v = fused.qkv(h).split(
        [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features], dim=-1)
    q = q.view(b, t, -1, attn.head_dim).transpose(1, 2)
    k = k.view(b, t, -1, attn.head_dim).transpose(1, 2)
    v = v.view(b, t, -1, attn.head_dim).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    keys, values = store(k, v)
    o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling,
                                       enable_gqa=keys.shape[1] != q.shape[1])
    x = x + fused.o(o.transpose(1, 2).reshape(b, t, -1))
    h = layer.post_attention_layernorm(x)
    gate, up = fused.gate_up(h).chunk(2, dim=-1)
    return x + fused.down(F.silu(gate) * up)
