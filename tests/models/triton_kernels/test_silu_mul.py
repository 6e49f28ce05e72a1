"""The Triton SiLU(gate) * up equals GatedMLP's activation (models/pointwise.silu times up)
at odd widths, one block and several per row; a row's result does not depend on the batch."""

from __future__ import annotations

import pytest
import torch

from models import pointwise
from tests.models.triton_kernels.row_checks import TOLERANCE, assert_rows_batch_invariant


def _gate_up(rows: int, inner: int, dtype, device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(rows + inner)
    return (torch.randn(rows, 2 * inner, generator=gen) * 4).to(dtype).to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,inner", [(1, 8), (3, 77), (4, 1030)])
def test_equals_the_mlp_activation(triton_kernels, dtype, rows, inner) -> None:
    from models.triton_kernels.silu_mul import reference, silu_mul

    gate_up = _gate_up(rows, inner, dtype, triton_kernels)
    want = pointwise.silu(gate_up[:, :inner]) * gate_up[:, inner:]
    assert torch.equal(reference(gate_up), want)
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(silu_mul(gate_up), want, rtol=rtol, atol=atol)


def test_a_row_does_not_depend_on_the_batch(triton_kernels) -> None:
    from models.triton_kernels.silu_mul import silu_mul

    assert_rows_batch_invariant(silu_mul, _gate_up(5, 300, torch.bfloat16, triton_kernels))
