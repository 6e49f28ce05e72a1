"""The PyTorch path's padded-row linear (models/linear_backend.py) against the plain F.linear it
replaces."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from models.linear_backend import (
    ROW_QUANTUM,
    invariant_layer_forward,
    use_invariant_linears,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 16])
def test_routed_linears_equal_f_linear(dtype: torch.dtype, bias: bool, rows: int) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(96, 200, bias=bias).to(dtype)
    x = torch.randn(rows, 96).to(dtype)
    with torch.inference_mode():
        got, want = invariant_layer_forward(layer, x), F.linear(x, layer.weight, layer.bias)
    assert got.shape == want.shape and got.dtype == want.dtype
    if rows % ROW_QUANTUM == 0:
        assert torch.equal(got, want)  # the very F.linear call, nothing padded
    else:  # the padded GEMM vs whichever kernel F.linear picks for so few rows
        torch.testing.assert_close(got, want, atol=1e-2, rtol=2**-7)


def test_routing_touches_plain_linears_only_and_leaves_the_class_alone() -> None:
    class Custom(nn.Linear):
        pass

    model = nn.Sequential(nn.Linear(8, 8), Custom(8, 8), nn.Linear(8, 4))
    assert use_invariant_linears(model) == 2
    assert "forward" in vars(model[0]) and "forward" not in vars(model[1])
    assert nn.Linear.forward is not None and "forward" not in vars(nn.Linear(2, 2))
