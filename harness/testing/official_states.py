"""Synthetic drafter checkpoints in the released layouts (key names and shapes of the official
Medusa, Hydra, EAGLE and EAGLE-3 files, checkpoints.md), random N(0, 1) tensors at toy sizes: what
the layout tests load and harness/testing/hub_layouts.py writes into hub-format folders.
"""
from __future__ import annotations

import torch


def medusa_official_state(h: int, v: int, heads: int = 5) -> dict[str, torch.Tensor]:
    """A Medusa head file (`medusa_lm_head.pt`): per head a residual block and its own LM head."""
    st = {}
    for i in range(heads):
        st[f"{i}.0.linear.weight"] = torch.randn(h, h)
        st[f"{i}.0.linear.bias"] = torch.randn(h)
        st[f"{i}.1.weight"] = torch.randn(v, h)
    return st


def hydra_official_state(h: int, v: int, i_size: int, nh: int, nkv: int, heads: int = 4,
                         layers: int = 4) -> dict[str, torch.Tensor]:
    """A Hydra head file (`hydra_lm_head.pt`): the prefix layer, each head's MLP (its deeper blocks one
    shared module, repeated) and LM head, and the unused input embedding the release carries."""
    hd = h // nh
    p = "prefix_embeding_layer."
    st = {p + "embed_tokens.weight": torch.randn(v, h),
          p + "layers.0.self_attn.q_proj.weight": torch.randn(nh * hd, h),
          p + "layers.0.self_attn.k_proj.weight": torch.randn(nkv * hd, h),
          p + "layers.0.self_attn.v_proj.weight": torch.randn(nkv * hd, h),
          p + "layers.0.self_attn.o_proj.weight": torch.randn(h, nh * hd),
          p + "layers.0.self_attn.rotary_emb.inv_freq": torch.randn(hd // 2),
          p + "layers.0.mlp.gate_proj.weight": torch.randn(i_size, h),
          p + "layers.0.mlp.up_proj.weight": torch.randn(i_size, h),
          p + "layers.0.mlp.down_proj.weight": torch.randn(h, i_size),
          p + "layers.0.input_layernorm.weight": torch.randn(h),
          p + "layers.0.post_attention_layernorm.weight": torch.randn(h),
          p + "norm.weight": torch.randn(h),
          "input_embed_fn.weight": torch.randn(v, h)}
    for i in range(heads):
        st[f"hydra_mlp.{i}.1.linear.weight"] = torch.randn(h, (i + 2) * h)
        st[f"hydra_mlp.{i}.1.linear.bias"] = torch.randn(h)
        st[f"hydra_mlp.{i}.1.res_connection.weight"] = torch.randn(h, (i + 2) * h)
        st[f"hydra_mlp.{i}.1.res_connection.bias"] = torch.randn(h)
        shared_w, shared_b = torch.randn(h, h), torch.randn(h)  # one module object, repeated
        for j in range(3, 2 * layers, 2):
            st[f"hydra_mlp.{i}.{j}.linear.weight"] = shared_w
            st[f"hydra_mlp.{i}.{j}.linear.bias"] = shared_b
        st[f"hydra_lm_head.{i}.1.weight"] = torch.randn(v, h)
        st[f"hydra_lm_head.{i}.1.bias"] = torch.randn(v)
    return st


def eagle_official_state(h=64, v=96, i=128, nh=4, nkv=2, bias=True, emb=True) -> dict[str, torch.Tensor]:
    """An EAGLE (EAGLE-2) checkpoint as the official trainer writes it: fc, one decoder layer
    without its input norm, `bias` on fc and the Vicuna-era `emb`edding."""
    hd = h // nh
    st = {"fc.weight": torch.randn(h, 2 * h),
          "layers.0.self_attn.q_proj.weight": torch.randn(nh * hd, h),
          "layers.0.self_attn.k_proj.weight": torch.randn(nkv * hd, h),
          "layers.0.self_attn.v_proj.weight": torch.randn(nkv * hd, h),
          "layers.0.self_attn.o_proj.weight": torch.randn(h, nh * hd),
          "layers.0.mlp.gate_proj.weight": torch.randn(i, h),
          "layers.0.mlp.up_proj.weight": torch.randn(i, h),
          "layers.0.mlp.down_proj.weight": torch.randn(h, i),
          "layers.0.post_attention_layernorm.weight": torch.randn(h)}
    if bias:
        st["fc.bias"] = torch.randn(h)
    if emb:
        st["embed_tokens.weight"] = torch.randn(v, h)
    return st


def eagle3_official_state(h=64, v=96, vd=32, i=128, nh=4, nkv=2) -> dict[str, torch.Tensor]:
    """The 15 keys of an EAGLE-3 checkpoint written by the official trainer (checkpoints.md §4.4)."""
    hd = h // nh
    st = {"midlayer.self_attn.q_proj.weight": torch.randn(nh * hd, 2 * h),
          "midlayer.self_attn.k_proj.weight": torch.randn(nkv * hd, 2 * h),
          "midlayer.self_attn.v_proj.weight": torch.randn(nkv * hd, 2 * h),
          "midlayer.self_attn.o_proj.weight": torch.randn(h, nh * hd),
          "midlayer.mlp.gate_proj.weight": torch.randn(i, h),
          "midlayer.mlp.up_proj.weight": torch.randn(i, h),
          "midlayer.mlp.down_proj.weight": torch.randn(h, i),
          "midlayer.hidden_norm.weight": torch.randn(h),
          "midlayer.input_layernorm.weight": torch.randn(h),
          "midlayer.post_attention_layernorm.weight": torch.randn(h),
          "fc.weight": torch.randn(h, 3 * h),
          "norm.weight": torch.randn(h),
          "lm_head.weight": torch.randn(vd, h)}
    used = torch.randperm(v, generator=torch.Generator().manual_seed(1))[:vd].sort().values
    st["d2t"] = used - torch.arange(vd)
    st["t2d"] = torch.zeros(v, dtype=torch.bool)
    st["t2d"][used] = True
    return {k: (t.half() if t.is_floating_point() else t) for k, t in st.items()}
