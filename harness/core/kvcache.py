"""The target's KV cache: append a tree, keep the accepted path, crop.

We use a cache of our own (a transformers `Cache` made of `PreallocLayer`s) rather than
`DynamicCache`, because:
  * `DynamicCache.update` concatenates the whole cache on every forward (O(L) copies per step),
    and a tree step would then also need a gather + concatenation to keep the accepted path;
  * a preallocated buffer (as in the EAGLE/Medusa code) writes new rows in place and hands
    attention a narrowed view, so committing the accepted path is an in-place copy of A+1 rows
    per layer and dropping the rejected rows is just resetting a length counter.
It still plugs into the HF model through the public `Cache`/`CacheLayerMixin` interface, so any
HF decoder that takes `cache=` works unchanged.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class PreallocLayer(CacheLayerMixin):
    """One layer's K/V in a growable buffer `[1, kv_heads, capacity, head_dim]` with a length counter."""

    is_sliding = False
    is_compileable = False
    is_croppable = True

    def __init__(self, capacity: int = 1024) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        self.device = key_states.device
        self.keys = key_states.new_empty((b, h, self.capacity, d))
        self.values = value_states.new_empty((b, h, self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def _grow(self, needed: int) -> None:
        # Doubling keeps the amortised cost of growth O(1) per token.
        cap = self.capacity
        while cap < needed:
            cap *= 2
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_empty((*old.shape[:2], cap, old.shape[-1]))
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)
        self.capacity = cap

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        end = self.length + n
        if end > self.capacity:
            self._grow(end)
        self.keys[:, :, self.length : end] = key_states
        self.values[:, :, self.length : end] = value_states
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def crop(self, tokens_to_remove: int) -> None:
        # transformers' convention: a negative count of tokens to remove.
        self.length = max(0, self.length - abs(tokens_to_remove))

    def keep(self, start: int, rows: torch.Tensor) -> None:
        """Keep rows `start + rows` (ascending) as the contiguous rows `start .. start+len(rows)-1`."""
        n = rows.numel()
        if self.is_initialized and n:
            src = rows + start
            # index_select copies first, so overlapping source/destination ranges are safe.
            self.keys[:, :, start : start + n] = self.keys.index_select(2, src)
            self.values[:, :, start : start + n] = self.values.index_select(2, src)
        self.length = start + n

    def reset(self) -> None:
        self.length = 0


class KVCache(Cache):
    """The target's cache: one `PreallocLayer` per decoder layer."""

    def __init__(self, num_layers: int, capacity: int = 1024, layers: list[PreallocLayer] | None = None) -> None:
        """`num_layers` fresh `PreallocLayer(capacity)`s, or the given `layers` (a runtime's own kind)."""
        super().__init__(layers=layers if layers is not None else [PreallocLayer(capacity) for _ in range(num_layers)])

    @property
    def length(self) -> int:
        return self.layers[0].length

    def crop_to(self, length: int) -> None:
        """Drop every row at or after `length`."""
        for layer in self.layers:
            layer.length = min(layer.length, length)

    @torch.inference_mode()
    def commit(self, start: int, accepted: torch.Tensor) -> None:
        """After a tree forward written at `start`: keep the rows of `accepted` tree nodes (node indices,
        ascending, root first) in order, drop the rest. The indices go to each layer's device
        once (a target sharded with --device-map keeps its layers' rows on several GPUs)."""
        on: dict[torch.device, torch.Tensor] = {accepted.device: accepted}
        for layer in self.layers:
            where = layer.keys.device if layer.is_initialized else accepted.device
            if where not in on:
                on[where] = accepted.to(where)
            layer.keep(start, on[where])
