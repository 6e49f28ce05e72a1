"""The Triton RMSNorm (+ residual) equals models/layers.py's RMSNorm after the add, within a
float32 / bfloat16 tolerance, at odd widths and several row counts; a row's result does not
depend on the batch."""

from __future__ import annotations

import pytest
import torch

from models import layers
from models.layers import RMSNorm
from tests.models.triton_kernels.row_checks import TOLERANCE, assert_rows_batch_invariant


def _inputs(rows: int, hidden: int, dtype: torch.dtype, device: torch.device):
    gen = torch.Generator().manual_seed(rows * 1000 + hidden)
    x = (torch.randn(rows, hidden, generator=gen) * 3).to(dtype).to(device)
    residual = torch.randn(rows, hidden, generator=gen).to(dtype).to(device)
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype).to(device)
    return x, residual, weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,hidden", [(1, 64), (3, 96), (7, 130)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_equals_the_layer(triton_kernels, dtype, rows, hidden, with_residual, monkeypatch) -> None:
    from models.triton_kernels.rms_norm import reference, rms_norm

    # the layer's own PyTorch ops: on a GPU the layer would call the kernel under test
    monkeypatch.setattr(layers, "_fused", lambda x, weight: False)
    x, residual, weight = _inputs(rows, hidden, dtype, triton_kernels)
    x_before = x.clone()
    layer = RMSNorm(hidden, 1e-6).to(dtype).to(triton_kernels)
    layer.weight.data.copy_(weight)
    with torch.no_grad():
        want_residual = x + residual if with_residual else x
        want = layer(want_residual)
    got, got_residual = rms_norm(x, weight, 1e-6, residual if with_residual else None)
    assert torch.equal(reference(x, weight, 1e-6, residual if with_residual else None)[0], want)
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    # float32: the add is torch's. bfloat16: Triton's interpreter truncates a downcast where
    # torch (and a GPU) rounds to nearest even, so only closeness holds on CPU.
    torch.testing.assert_close(got_residual, want_residual, rtol=rtol, atol=atol)
    assert dtype != torch.float32 or torch.equal(got_residual, want_residual)
    assert torch.equal(x, x_before)


@pytest.mark.parametrize("with_residual", [False, True])
def test_a_row_does_not_depend_on_the_batch(triton_kernels, with_residual) -> None:
    from models.triton_kernels.rms_norm import rms_norm

    x, residual, weight = _inputs(5, 200, torch.bfloat16, triton_kernels)
    assert_rows_batch_invariant(
        lambda a, r: rms_norm(a, weight, 1e-5, r)[0], x, residual if with_residual else None
    )
