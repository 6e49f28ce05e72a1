"""The batch-invariant Triton GEMM equals F.linear within tolerance (odd M, N, K; bias or
not; float32 and bfloat16), and a row's output is bitwise the same alone, in any batch size
and at any place in the batch (the property the --batch-invariant mode needs)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.models.triton_kernels.row_checks import TOLERANCE, assert_rows_batch_invariant


def _case(m: int, n: int, k: int, dtype, device, bias: bool):
    gen = torch.Generator().manual_seed(m * 100 + n + k)
    x = torch.randn(m, k, generator=gen).to(dtype).to(device)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).to(device)
    b = torch.randn(n, generator=gen).to(dtype).to(device) if bias else None
    return x, w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,n,k", [(1, 64, 64), (5, 70, 100), (19, 33, 130)])
@pytest.mark.parametrize("bias", [False, True])
def test_equals_f_linear(triton_kernels, dtype, m, n, k, bias) -> None:
    from models.triton_kernels.invariant_matmul import invariant_linear

    x, w, b = _case(m, n, k, dtype, triton_kernels, bias)
    want = F.linear(x.float(), w.float(), None if b is None else b.float()).to(dtype)
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(invariant_linear(x, w, b), want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_is_the_same_in_any_batch(triton_kernels, dtype) -> None:
    """float32 outputs show every bit of the sum (bfloat16 rounds most order changes away):
    under the interpreter on an AVX2 host this failed while tl.dot went to the host BLAS."""
    from models.triton_kernels.invariant_matmul import invariant_linear

    x, w, b = _case(20, 40, 96, dtype, triton_kernels, bias=True)
    assert_rows_batch_invariant(lambda rows: invariant_linear(rows, w, b), x)
    # and as a middle slice of another batch size (its tile place changes)
    torch.testing.assert_close(invariant_linear(x[3:9], w, b), invariant_linear(x, w, b)[3:9])
    assert torch.equal(invariant_linear(x[3:9], w, b), invariant_linear(x, w, b)[3:9])
