"""Decoder-layer runtimes for decoding: the target's steps and tree verifies (AR included: the
baseline is never handicapped) and the draft layers of EAGLE, EAGLE-2, Gumiho and Hydra.

`StackRuntime` runs a stack of Llama/Qwen2/Mistral layers by `harness/core/layer_math.py` on a
`RuntimeCache` (per-layer K/V buffers written in place), in one of two ways:
  * eager (mode None, the default for the target): q/k/v and gate/up fused, and on CPUs with bf16
    every weight packed once for oneDNN; transformers' layers re-lay-out each bf16 weight on every
    call, which is most of a small model's step on a CPU. Measured on an AMD EPYC (AVX512-BF16,
    no AMX), SmolLM2 bf16, 2 threads: a 1-token step 28.6 ms vs 42.1 with transformers' layers, a
    32-token verify 52.3 vs 69.8 ms, and faster than inductor at every size below;
  * compiled (`--compile`, mode an inductor mode): one `torch.compile`d graph per query-row bucket
    (1, 2, 4, ..., 128; padded rows attend to row 0 only and are never kept), the context length a
    dynamic dimension so a growing cache never recompiles. On that EPYC max-autotune's GEMMs are
    unpacked `aten::mm`: 31.3 ms for one token and 77.9 ms for 32, so it stays opt-in (it may pay
    on other machines: measure with `cli.py bench --compile`).
A prefill (an empty cache: long, once per answer) runs transformers' path on the same cache; a
step may also hand back the inputs of chosen layers (`capture`: EAGLE-3's features).
tests/test_compiled.py and tests/test_draft_layers.py hold both ways to transformers' layers
within float32 rounding, and greedy speculative decoding to AR.
"""
from __future__ import annotations

import torch

from harness.core.errors import SpecbenchError
from harness.core.kvcache import KVCache, PreallocLayer
from harness.core.layer_math import fuse_weights, layer_step, stack_supported
from harness.core.packed_linear import apply_linear

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
# The inductor mode of --compile: on an AMD EPYC CPU, 1 thread, max-autotune measured 1.9x
# transformers' layers for AR (default mode with freezing: 1.1x), though not the eager runtime's
# packed GEMMs (module docstring); on CUDA it also captures CUDA graphs.
DEFAULT_MODE = "max-autotune"


def configure_inductor() -> None:
    """Inductor settings every compiled stack runs with."""
    import torch._dynamo
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True  # weights are constants: packed once for the GEMMs
    inductor_config.autotune_num_choices_displayed = 0  # no per-GEMM autotune tables on stderr
    # each stack compiles one graph per row bucket (a run may hold the target's and a drafter's)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 32)


def bucket(n: int) -> int | None:
    """The padded row count for an n-row step, None if n is beyond the largest bucket."""
    return next((b for b in BUCKETS if b >= n), None)


class BufferLayer(PreallocLayer):
    """A PreallocLayer over K/V buffers `[kv_heads, capacity, head_dim]` of its own (kept as `[1, ...]`
    views too, so the eager path, `commit` and `crop_to` work as on any layer). The compiled step
    takes the 3-d buffers as inputs; growing replaces them by larger ones (dynamic in their length)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, dynamic: bool) -> None:
        super().__init__(keys.shape[1])
        self.dynamic = dynamic  # compiled steps take the buffers: their length is a dynamic dimension
        self._use(keys, values)
        self.device = keys.device
        self.is_initialized = True

    def _use(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        if self.dynamic:  # their capacity varies: one graph serves every size
            for buf in (keys, values):
                torch._dynamo.mark_dynamic(buf, 1)
        self.key_buffer, self.value_buffer = keys, values
        self.keys, self.values = keys[None], values[None]
        self.capacity = keys.shape[1]

    def _grow(self, needed: int) -> None:
        super()._grow(needed)  # larger [1, ...] buffers with the kept rows copied
        self._use(self.keys[0], self.values[0])


class RuntimeCache(KVCache):
    """A KVCache of `BufferLayer`s: one K and one V tensor per layer, written in place by the
    compiled step (inputs that share storage would make inductor copy whole buffers)."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype,
                 device: torch.device, dynamic: bool = False) -> None:
        rows = -(-(capacity + BUCKETS[-1]) // 256) * 256  # room for the largest bucket's padding
        shape = (kv_heads, rows, head_dim)
        super().__init__(num_layers, layers=[
            BufferLayer(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device),
                        dynamic)
            for _ in range(num_layers)])

    def buffers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(keys, values): each layer's 3-d buffer, the compiled step's inputs."""
        return [layer.key_buffer for layer in self.layers], [layer.value_buffer for layer in self.layers]

    def reserve(self, rows: int) -> None:
        """Grow every layer so that `rows` rows fit."""
        for layer in self.layers:
            if rows > layer.capacity:
                layer._grow(rows)


def padded_mask(start: int, n: int, nb: int, mask: torch.Tensor | None, device) -> torch.Tensor:
    """Bool [1, 1, nb, start + nb] for n real rows padded to nb, True where attention is allowed.

    mask: None (causal: every cached row and the new rows up to itself), [n, n] over the new rows
    (every cached row visible: the target's tree mask) or [n, start + n] over all rows (a draft
    tree, whose earlier tree rows are visible to their descendants only). Padded rows see row 0
    only, so their softmax stays finite; no real row sees them."""
    out = torch.zeros(nb, start + nb, dtype=torch.bool, device=device)
    if mask is None:
        out[:n, :start] = True
        out[:n, start : start + n] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    elif mask.shape[-1] == n:
        out[:n, :start] = True
        out[:n, start : start + n] = mask.to(device)
    else:
        out[:n, : start + n] = mask.to(device)
    out[n:, 0] = True
    return out[None, None]


class StackRuntime:
    """Decoder layers run by the shared layer arithmetic on a `RuntimeCache`, eagerly with packed
    weights (`mode` None) or as one compiled graph per row bucket (`mode` an inductor mode).

    `post` maps the last layer's output [n, H] to what a step returns (a tensor or a tuple of
    them: the target's final norm and LM head, a draft stack's optional norm); under compile it is
    part of the same graph."""

    def __init__(self, layers: torch.nn.ModuleList, rotary_emb: torch.nn.Module, config, post,
                 dtype: torch.dtype, device: torch.device, mode: str | None = None) -> None:
        if not stack_supported(layers, config):
            raise SpecbenchError(f"--compile supports Llama/Qwen2/Mistral-style layers; "
                                 f"{type(layers[0]).__name__} is not one: run without --compile")
        self.layers, self.rotary_emb, self.post = layers, rotary_emb, post
        self.dtype, self.device, self.mode = dtype, device, mode
        self.kv_heads, self.hidden_size = config.num_key_value_heads, config.hidden_size
        self.head_dim = layers[0].self_attn.head_dim
        # Under compile inductor packs the weights itself (freezing); eagerly they are packed here.
        self.fused = [fuse_weights(layer, pack=mode is None) for layer in layers]
        self._forward = self._step if mode is None else torch.compile(self._step, mode=mode, fullgraph=True)
        self.compiled_buckets: set[int] = set()
        self.captures: set[tuple[int, ...]] = {()}  # layer sets steps captured (each its own graphs)

    @property
    def name(self) -> str:
        """What records call this runtime: "eager" or "compiled:<mode>"."""
        return "eager" if self.mode is None else f"compiled:{self.mode}"

    def new_cache(self, capacity: int) -> RuntimeCache:
        return RuntimeCache(len(self.layers), self.kv_heads, self.head_dim, capacity, self.dtype, self.device,
                            dynamic=self.mode is not None)

    def handles(self, cache: KVCache, n: int) -> bool:
        """Whether an n-row step on `cache` runs here (an empty cache is a prefill: transformers' path)."""
        return isinstance(cache, RuntimeCache) and cache.length > 0 and (self.mode is None or bucket(n) is not None)

    def run(self, x: torch.Tensor, cache: RuntimeCache, position_ids: torch.Tensor, mask: torch.Tensor | None,
            capture: tuple[int, ...] = ()):
        """x [n, H] layer inputs, position_ids [n], mask as `padded_mask` takes it -> `post`'s output
        for the n rows (each tensor [n, ...]); the n rows are appended to the cache. With `capture`
        (layer indices), returns (that output, [the input of each captured layer, [n, H]])."""
        n = x.shape[0]
        nb = n if self.mode is None else bucket(n)
        start = cache.length
        pad = nb - n
        x_b = torch.cat([x, x.new_zeros(pad, x.shape[1])]) if pad else x
        pos_b = torch.cat([position_ids, position_ids.new_zeros(pad)]) if pad else position_ids
        # One eager query row with no mask sees every cached row: SDPA needs no mask for that.
        full = None if nb == 1 and mask is None and self.mode is None else padded_mask(start, n, nb, mask, self.device)
        if self.mode is not None:
            torch._dynamo.mark_dynamic(full, 3)
            self.compiled_buckets.add(nb)
            self.captures.add(capture)
        cache.reserve(start + nb)
        keys, values = cache.buffers()
        out = self._forward(x_b[None].to(self.device), pos_b[None].to(self.device),
                            torch.arange(start, start + nb, device=self.device), full, keys, values, capture)
        for layer in cache.layers:
            layer.length = start + n
        if capture:
            out, taken = out
        out = tuple(o[:n] for o in out) if isinstance(out, tuple) else out[:n]
        return (out, [t[:n] for t in taken]) if capture else out

    def warm_up(self, rows: list[int], capacity: int = 512) -> None:
        """Compile the buckets of these row counts now, so that no timed answer pays for it (eager: nothing to do)."""
        if self.mode is None:
            return
        with torch.inference_mode():
            for nb in sorted({bucket(r) for r in rows if bucket(r)}):
                cache = self.new_cache(capacity)
                for layer in cache.layers:  # one committed row: a step, not a prefill
                    layer.length = 1
                for capture in sorted(self.captures):
                    for _ in range(2):  # the second call checks the cached graph is reused, at another length
                        x = torch.zeros(nb, self.hidden_size, dtype=self.dtype, device=self.device)
                        self.run(x, cache, torch.arange(cache.length, cache.length + nb, device=self.device), None,
                                 capture)

    def warm_up_to(self, max_rows: int) -> None:
        """Compile every bucket a step of up to `max_rows` rows uses (bench and profiling time them all)."""
        self.warm_up(list(range(1, max_rows + 1)))

    def warm_up_seen(self) -> None:
        """Compile every bucket up to the largest a warm-up answer met (a tree shrinks near the token
        limit), so that no timed answer compiles."""
        if self.compiled_buckets:
            self.warm_up_to(max(self.compiled_buckets))

    def _step(self, x: torch.Tensor, pos: torch.Tensor, write: torch.Tensor, mask: torch.Tensor,
              keys: list[torch.Tensor], values: list[torch.Tensor], capture: tuple[int, ...] = ()):
        """x [1, nb, H], pos [1, nb]; write [nb] cache rows of this step; mask [1, 1, nb, S] bool with
        S = write[-1] + 1 (None: one row that sees every cached row, eager only); keys, values: per layer [kv_heads, capacity, head_dim], written in place.
        Returns `post` of the last layer's output [nb, H]; with `capture`, (that, the inputs [nb, H]
        of the captured layers in `capture`'s order)."""
        cos, sin = self.rotary_emb(x, position_ids=pos)
        seen = int(write[-1]) + 1 if mask is None else mask.shape[-1]
        taken = {}
        for i, layer in enumerate(self.layers):
            if i in capture:
                taken[i] = x[0]
            def store(k: torch.Tensor, v: torch.Tensor, i: int = i) -> tuple[torch.Tensor, torch.Tensor]:
                keys[i].index_copy_(1, write, k[0])
                values[i].index_copy_(1, write, v[0])
                return keys[i][None, :, :seen], values[i][None, :, :seen]

            x = layer_step(layer, self.fused[i], x, cos, sin, store, mask)
        if capture:
            return self.post(x[0]), [taken[i] for i in capture]
        return self.post(x[0])


class TargetRuntime(StackRuntime):
    """The decode forward of one Target: its decoder layers, then the final norm and LM head (in
    the same graph when compiled, packed when eager); the token embedding is looked up eagerly."""

    def __init__(self, target, mode: str | None = None) -> None:
        if target.input_device != target.device:
            raise SpecbenchError("--compile with a sharded target (--device-map) is not supported; drop one of them")
        backbone = target.backbone
        self.target = target
        super().__init__(backbone.layers, backbone.rotary_emb, target.config, self._head, target.dtype,
                         target.device, mode)

    def _head(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.target.backbone.norm(x)
        if self.mode is None:
            return hidden, apply_linear(self.target.lm_head, hidden)
        return hidden, self.target.lm_head(hidden)

    def forward(self, ids: torch.Tensor, cache: RuntimeCache, position_ids: torch.Tensor,
                tree_mask: torch.Tensor | None, layers: tuple[int, ...] = ()
                ) -> tuple[torch.Tensor, torch.Tensor, dict[int, torch.Tensor] | None]:
        """ids [n], position_ids [n], tree_mask [n, n] bool or None (causal) -> (hidden [n, H], logits [n, V],
        {i: input of decoder layer i [n, H]} for i in `layers`, or None), the n rows appended to the
        cache like transformers' forward does."""
        x = self.target.backbone.embed_tokens(ids.to(self.device))
        if not layers:
            return (*self.run(x, cache, position_ids, tree_mask), None)
        (hidden, logits), taken = self.run(x, cache, position_ids, tree_mask, tuple(layers))
        return hidden, logits, dict(zip(layers, taken))
