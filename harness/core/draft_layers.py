"""Decoder layers of the target's own architecture, for drafters that carry attention layers
(Hydra's prefix layer, EAGLE's and Gumiho's serial layers).

Built from the target's config class with `num_hidden_layers = n`, so any Llama/Qwen2/Gemma-style
target works; the vocab embedding is dropped (drafters feed `inputs_embeds` and reuse the
target's frozen embedding), and they run on our own preallocated KV cache.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from harness.core.kvcache import KVCache
from harness.core.layer_math import FusedWeights, fuse_weights, fused_tensors, layer_step, stack_supported
from harness.core.packed_linear import tensors_key


class DecoderStack(nn.Module):
    """`layers` decoder layers + rotary embedding (+ optional final norm) of the target's architecture."""

    def __init__(self, target_config, num_layers: int, first_input_norm: bool = True, final_norm: bool = True,
                 overrides: dict | None = None) -> None:
        super().__init__()
        from transformers import AutoModel

        cfg = copy.deepcopy(target_config)
        cfg.num_hidden_layers = num_layers
        for key, value in (overrides or {}).items():
            # A released draft may differ from its target (EAGLE's Vicuna-33B draft declares 13 kv heads):
            # official loaders take these sizes from the draft's own config.json.
            if key == "rope_theta" and isinstance(getattr(cfg, "rope_parameters", None), dict):
                cfg.rope_parameters = {**cfg.rope_parameters, "rope_theta": value}
            else:
                setattr(cfg, key, value)
        if overrides and "num_attention_heads" in overrides and hasattr(cfg, "head_dim"):
            cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
        if hasattr(cfg, "layer_types") and cfg.layer_types is not None:
            cfg.layer_types = list(cfg.layer_types)[:num_layers]
        base = AutoModel.from_config(cfg)
        self.layers = base.layers
        self.rotary_emb = base.rotary_emb
        self.norm = base.norm if final_norm else nn.Identity()
        if not first_input_norm:
            # EAGLE: the fc output enters attention directly.
            self.layers[0].input_layernorm = nn.Identity()
        self.num_layers = num_layers
        self.config = cfg
        self.fast_decode_supported = stack_supported(self.layers, cfg)
        self.fast_decode = self.fast_decode_supported  # off: always transformers' layers
        self._fused: dict[int, tuple] = {}
        self.runtime = None  # a compiled StackRuntime once `enable_compile` ran

    def enable_compile(self, mode: str | None = None) -> None:
        """Run decoding steps (not prefills, not training) as compiled graphs (harness/core/runtime.py);
        the weights are frozen into the graphs, so call it once they are loaded."""
        from harness.core.runtime import DEFAULT_MODE, StackRuntime, configure_inductor

        configure_inductor()
        param = next(self.parameters())
        self.runtime = StackRuntime(self.layers, self.rotary_emb, self.config, self.norm, param.dtype,
                                     param.device, mode or DEFAULT_MODE)

    def new_cache(self, capacity: int = 1024) -> KVCache:
        if self.runtime is not None:
            return self.runtime.new_cache(capacity)
        return KVCache(self.num_layers, capacity)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, cache: KVCache | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: [B, T, H]; position_ids: [B, T]; mask: None (causal over cache + x) or a boolean
        [B, 1, T, S] mask, True where attention is allowed (boolean: dtype-agnostic under autocast)."""
        decoding = cache is not None and not torch.is_grad_enabled() and x.shape[0] == 1
        if decoding and self.runtime is not None and self.runtime.handles(cache, x.shape[1]):
            m = None if mask is None else mask[0, 0]
            return self.runtime.run(x[0], cache, position_ids[0], m)[None]
        pos_emb = self.rotary_emb(x, position_ids=position_ids)
        if mask is None and x.shape[1] > 1:
            past = cache.length if cache is not None else 0
            t = x.shape[1]
            allowed = torch.ones(t, past + t, dtype=torch.bool, device=x.device)
            allowed[:, past:] = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            mask = allowed[None, None]
        if decoding and self.fast_decode:
            return self.norm(self._decode(x, pos_emb, cache, mask))
        for layer in self.layers:
            x = layer(x, attention_mask=mask, position_ids=position_ids, cache=cache,
                      use_cache=cache is not None, position_embeddings=pos_emb)
            if isinstance(x, tuple):
                x = x[0]
        return self.norm(x)

    # ---- decoding fast path ---------------------------------------------------------------
    def _fused_weights(self, i: int, layer: nn.Module) -> FusedWeights:
        """Layer i's fused (and, on bf16 CPUs, packed) projections (harness/core/layer_math.py),
        rebuilt when a weight or bias is replaced or changed in place (load, cast, a training step)."""
        key = tensors_key(fused_tensors(layer))
        hit = self._fused.get(i)
        if hit is None or hit[0] != key:
            hit = (key, fuse_weights(layer))
            self._fused[i] = hit
        return hit[1]

    def _decode(self, x: torch.Tensor, pos_emb: tuple[torch.Tensor, torch.Tensor], cache: KVCache,
                mask: torch.Tensor | None) -> torch.Tensor:
        """The layers of `forward` for decoding (no autograd, batch 1, our cache), by the shared
        layer arithmetic. Drafting calls these layers a few times per step on a handful of rows,
        so their fixed costs, not their arithmetic, are what a step pays (scripts/profile_drafting.py)."""
        cos, sin = pos_emb
        for i, layer in enumerate(self.layers):
            x = layer_step(layer, self._fused_weights(i, layer), x, cos, sin, cache.layers[i].update, mask)
        return x
