"""The compiled target runtime (`--compile`): the decode step and the tree verify of every method
(AR included: the baseline is never handicapped) as one `torch.compile`d graph per query-row
bucket, on a preallocated KV cache.

Why it is fast: a small target's eager step is mostly fixed costs (hundreds of op launches, and on
a CPU small-M bf16 matmuls that re-pack their weights on every call); inductor fuses the
elementwise work, and with `max-autotune` generates GEMMs for the exact shapes with weights packed
once (`freezing`). What keeps it to few compiles:
  * query rows are padded to a bucket (1, 2, 4, ..., 128): AR compiles once, a method's trees once
    or twice; the padded rows attend to position 0 only and their cache rows are never kept;
  * the context length is a dynamic dimension (marked on the mask and the K/V buffers), so a
    growing cache never recompiles.
The prefill (long, once per answer) and forwards asking for extra layers run transformers' eager
path on the same cache. The arithmetic is `harness/core/layer_math.py`'s, shared with the draft
layers; tests/test_compiled.py holds it to transformers' within float32 rounding and checks that
greedy speculative decoding still reproduces (compiled) AR token for token.
"""
from __future__ import annotations

import torch

from harness.core.errors import SpecbenchError
from harness.core.kvcache import KVCache
from harness.core.layer_math import fuse_weights, layer_step, layer_supported

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
# Inductor modes by device: max-autotune measured 1.9x eager AR on an AMD EPYC CPU (default
# mode with freezing: 1.1x); on CUDA it also captures CUDA graphs.
DEFAULT_MODE = "max-autotune"


def bucket(n: int) -> int | None:
    """The padded row count for an n-row step, None if n is beyond the largest bucket."""
    return next((b for b in BUCKETS if b >= n), None)


class RuntimeCache(KVCache):
    """A KVCache whose layers hold K/V buffers `[kv_heads, capacity, head_dim]` that the compiled
    step writes in place (one tensor per layer and per K/V: inputs that share storage would make
    inductor copy whole buffers). Each layer's `[1, ...]` view keeps the eager path (prefill),
    `commit` and `crop_to` working as on any KVCache. It never grows: capacity is fixed at creation."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        super().__init__(len(keys), keys[0].shape[1])
        self.keys, self.values = keys, values
        for i, layer in enumerate(self.layers):
            layer.keys, layer.values = keys[i][None], values[i][None]
            layer.device = keys[i].device
            layer.is_initialized = True
            layer._grow = _never_grow  # type: ignore[method-assign]


def _never_grow(needed: int) -> None:
    raise SpecbenchError(f"compiled runtime: the KV cache needs {needed} rows, more than it was made with; "
                         "this is a bug (the decode loop sizes it), please report it")


class CompiledRuntime:
    """The compiled forward of one Target (`Target.enable_compile`)."""

    def __init__(self, target, mode: str = DEFAULT_MODE) -> None:
        layers = target.backbone.layers
        if not all(layer_supported(layer, target.config) for layer in layers):
            raise SpecbenchError(f"--compile supports Llama/Qwen2/Mistral-style targets; "
                                 f"{type(layers[0]).__name__} is not one: run without --compile")
        if target.input_device != target.device:
            raise SpecbenchError("--compile with a sharded target (--device-map) is not supported; drop one of them")
        self.target = target
        self.mode = mode
        self.fused = [fuse_weights(layer, pack=False) for layer in layers]  # inductor packs its own
        attn = layers[0].self_attn
        self.kv_heads = target.config.num_key_value_heads
        self.head_dim = attn.head_dim
        self._compiled = torch.compile(self._step, mode=mode, fullgraph=True)
        self.compiled_buckets: set[int] = set()

    def new_cache(self, capacity: int) -> RuntimeCache:
        # Room for the padding of the largest bucket past the last real row.
        rows = -(-(capacity + BUCKETS[-1]) // 256) * 256
        shape = (self.kv_heads, rows, self.head_dim)
        dev, dt = self.target.device, self.target.dtype
        keys, values = ([torch.zeros(shape, dtype=dt, device=dev) for _ in range(self.target.num_layers)]
                        for _ in range(2))
        for buf in (*keys, *values):  # their capacity varies per answer: one graph serves every size
            torch._dynamo.mark_dynamic(buf, 1)
        return RuntimeCache(keys, values)

    def handles(self, cache: KVCache, n: int) -> bool:
        return isinstance(cache, RuntimeCache) and bucket(n) is not None

    def forward(self, ids: torch.Tensor, cache: RuntimeCache, position_ids: torch.Tensor,
                tree_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [n], position_ids [n], tree_mask [n, n] bool or None (causal) -> (hidden [n, H], logits [n, V]),
        the n rows appended to the cache like the eager forward does."""
        n = ids.shape[0]
        nb = bucket(n)
        start = cache.length
        dev = self.target.device
        pad = nb - n
        ids_b = torch.cat([ids, ids.new_zeros(pad)]) if pad else ids
        pos_b = torch.cat([position_ids, position_ids.new_zeros(pad)]) if pad else position_ids
        mask = torch.zeros(nb, start + nb, dtype=torch.bool, device=dev)
        mask[:n, :start] = True
        mask[:n, start : start + n] = (tree_mask.to(dev) if tree_mask is not None
                                       else torch.ones(n, n, dtype=torch.bool, device=dev).tril())
        mask[n:, 0] = True  # padded rows: one visible key, so their softmax stays finite
        write = torch.arange(start, start + nb, device=dev)
        mask = mask[None, None]
        torch._dynamo.mark_dynamic(mask, 3)
        self.compiled_buckets.add(nb)
        hidden, logits = self._compiled(ids_b.reshape(1, nb).to(dev), pos_b.reshape(1, nb).to(dev), write, mask,
                                        cache.keys, cache.values)
        for layer in cache.layers:
            layer.length = start + n
        return hidden[:n], logits[:n]

    def warm_up(self, rows: list[int], capacity: int = 512) -> None:
        """Compile the buckets of these row counts now, so that no timed answer pays for it."""
        with torch.inference_mode():
            for n in sorted({bucket(r) for r in rows if bucket(r)}):
                cache = self.new_cache(capacity)
                for _ in range(2):  # the second call checks the cached graph is reused, at another length
                    self.forward(torch.zeros(n, dtype=torch.long), cache, torch.arange(cache.length, cache.length + n),
                                 None)

    def _step(self, ids: torch.Tensor, pos: torch.Tensor, write: torch.Tensor, mask: torch.Tensor,
              keys: list[torch.Tensor], values: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """ids, pos [1, nb]; write [nb] cache rows of this step; mask [1, 1, nb, S] bool with
        S = write[-1] + 1; keys, values: per layer [kv_heads, capacity, head_dim], written in place.
        Returns (hidden [nb, H] after the final norm, logits [nb, V])."""
        backbone = self.target.backbone
        x = backbone.embed_tokens(ids)
        cos, sin = backbone.rotary_emb(x, position_ids=pos)
        seen = mask.shape[-1]
        for i, layer in enumerate(backbone.layers):
            def store(k: torch.Tensor, v: torch.Tensor, i: int = i) -> tuple[torch.Tensor, torch.Tensor]:
                keys[i].index_copy_(1, write, k[0])
                values[i].index_copy_(1, write, v[0])
                return keys[i][None, :, :seen], values[i][None, :, :seen]

            x = layer_step(layer, self.fused[i], x, cos, sin, store, mask)
        hidden = backbone.norm(x)[0]
        return hidden, self.target.lm_head(hidden)
