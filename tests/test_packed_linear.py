"""PackedLinear computes F.linear: bf16 on CPUs with oneDNN bf16 kernels (packed), anything else
(plain); inside autograd it is always plain F.linear, so training sees ordinary gradients."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from harness.core.packed_linear import PackedLinear, packable


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 64), (5, 64), (1, 3, 64), (2, 32, 64)])
def test_packed_equals_f_linear(dtype, shape):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=g).to(dtype)
    b = torch.randn(96, generator=g).to(dtype)
    x = torch.randn(*shape, generator=g).to(dtype)
    lin = PackedLinear(w, b)
    assert (lin.packed is not None) == packable(w)
    assert lin.packed is None or dtype == torch.bfloat16
    with torch.inference_mode():
        got, want = lin(x), F.linear(x, w, b)
    assert got.shape == want.shape == (*shape[:-1], 96) and got.dtype == dtype
    # bf16: one rounding of the output (8 mantissa bits) on sums of 64 products of size ~1.
    tol = dict(atol=0.25, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.float(), want.float(), **tol)


def test_autograd_takes_plain_f_linear():
    w = torch.randn(8, 4, dtype=torch.bfloat16, requires_grad=True)
    lin = PackedLinear(w)
    x = torch.randn(3, 4, dtype=torch.bfloat16, requires_grad=True)
    lin(x).float().sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
