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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_int8_weights_only_inside_weight_format(dtype):
    """weight_format("int8"): x @ W.T with W rounded to int8 per row, within the rounding's bound
    (each weight off by at most its row's max / 254); outside the block, the native weights again."""
    from harness.core.packed_linear import weight_format

    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=g).to(dtype)
    b = torch.randn(96, generator=g).to(dtype)
    x = torch.randn(2, 3, 64, generator=g).to(dtype)
    lin = PackedLinear(w, b)
    with torch.inference_mode():
        native = lin(x)
        with weight_format("int8"):
            got = lin(x)
        again = lin(x)
    assert lin.int8 is not None and lin.int8[0].dtype == torch.int8 and lin.int8[1].dtype == dtype
    want = F.linear(x.double(), w.double(), b.double())
    bound = x.double().abs().sum(-1, keepdim=True) * w.double().abs().amax(1) / 254
    slack = 0.25 + 2e-2 * want.abs() if dtype == torch.bfloat16 else 1e-4  # bf16: one output rounding
    assert ((got.double() - want).abs() <= bound + slack).all()
    assert not torch.equal(got, native)  # the int8 path really ran
    assert torch.equal(again, native)


def test_int8_keeps_native_weights_where_the_kernel_does_not_apply():
    """The CPU kernel's bf16 path needs in-features in multiples of 16; elsewhere the native map runs."""
    from harness.core.packed_linear import weight_format

    w = torch.randn(8, 40, dtype=torch.bfloat16)
    lin = PackedLinear(w)
    x = torch.randn(3, 40, dtype=torch.bfloat16)
    with torch.inference_mode():
        native = lin(x)
        with weight_format("int8"):
            got = lin(x)
    assert lin.int8 is None and torch.equal(got, native)
