"""Linear maps whose weight is packed once for oneDNN: the drafting fast path on CPUs with bf16.

A draft step multiplies a handful of rows by the same weights again and again (a draft layer, the
LM head over the draft vocabulary). `F.linear` in bf16 on a CPU re-lays-out the weight for oneDNN
on every call; packing it once (what inductor's freezing does for the compiled target) measured
1.3-2.4x faster for 1-32 rows on an AMD EPYC with AVX512-BF16 (576 -> 1536: 97 -> 52 us at one
row; 576 -> 8,192 ids: 587 -> 243 us). Elsewhere (float32, GPU, autograd) it is plain F.linear.

Drafting reads its weights from memory once per call, and on a CPU that is what it costs
(scripts/draft_bytes_bound.py), so a drafter may also run on int8 copies of its weights (per-row
scales, weight-only: the activations stay in the run's dtype). Only inside `weight_format("int8")`,
which the decoding loop enters around the drafter's calls alone: the target is never quantized, so
verification, and with it exactness, is unchanged; only the drafts (and τ) may move.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


_enabled = True
WEIGHT_FORMATS = ("native", "int8")
_format = "native"


def set_packing(enabled: bool) -> None:
    """Switch the packed path on or off at call time (scripts/profile_drafting.py times both in one run)."""
    global _enabled
    _enabled = enabled


class weight_format:
    """`with weight_format("int8"):` linear maps built here run on int8 copies of their weights
    (made on first use and kept); "native" (or None) leaves them as they are."""

    def __init__(self, fmt: str | None) -> None:
        self.fmt = fmt or "native"

    def __enter__(self) -> None:
        global _format
        self.outer, _format = _format, self.fmt

    def __exit__(self, *exc) -> None:
        global _format
        _format = self.outer


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] -> (int8 [out, in], scales [out] in the weight's dtype): symmetric, per row."""
    scales = weight.float().abs().amax(dim=1).clamp(min=1e-12) / 127
    q = torch.round(weight.float() / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scales.to(weight.dtype)


def tensors_key(tensors) -> tuple:
    """What identifies tensors as they are now: replaced (pointer), changed in place (version) or
    cast (dtype) gives another key; the caches of packed or fused copies are keyed on it."""
    return tuple((t.data_ptr(), t._version, t.dtype) for t in tensors if t is not None)


def packable(weight: torch.Tensor) -> bool:
    """bf16 weights on a CPU whose oneDNN has bf16 kernels."""
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16
            and torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear:
    """x [..., in] -> [..., out] = x @ weight.T + bias, with the weight [out, in] packed at creation
    when `pack` and `packable`; inside autograd it is always F.linear (the packed op has no backward)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, pack: bool = True) -> None:
        self.weight, self.bias = weight.detach(), None if bias is None else bias.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, 1) if pack and packable(weight) else None
        self.int8: tuple[torch.Tensor, torch.Tensor] | None = None  # made on the first call under int8

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if (_format == "int8" and not torch.is_grad_enabled() and x.dtype == self.weight.dtype
                and self.weight.shape[1] % 16 == 0):  # the CPU kernel's bf16 path reads 16 columns at a time
            if self.int8 is None:
                self.int8 = quantize_int8(self.weight)
            rows = x.reshape(-1, x.shape[-1])
            out = torch.ops.aten._weight_int8pack_mm(rows, *self.int8)
            if self.bias is not None:
                out += self.bias
            return out.reshape(*x.shape[:-1], out.shape[-1])
        if self.packed is None or not _enabled or torch.is_grad_enabled() or x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, x.shape[-1])
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], out.shape[-1])


def apply_linear(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`module(x)`, through a packed copy of its weight where that applies: kept on the module and
    rebuilt when the weight or bias is replaced or changed in place (a load, a cast, a training step)."""
    if torch.is_grad_enabled() or not (_format == "int8" or _enabled and packable(module.weight)):
        return module(x)
    key = tensors_key((module.weight, module.bias))
    hit = module.__dict__.get("_packed_linear")
    if hit is None or hit[0] != key:
        hit = (key, PackedLinear(module.weight, module.bias))
        module.__dict__["_packed_linear"] = hit  # beside the module's state, never in its state_dict
    return hit[1](x)
