"""The decoder's row-wise linears on the C++ packed kernel (CPU): the layers a decode step runs.

A decode step puts a few rows (one per sequence) through every decoder linear and the LM head;
at such M the C++ kernel over a prepacked weight (models/cpu_kernels/linear.cpp) runs 1.2-1.4x
faster than the padded `F.linear` in float32 and bfloat16 (32 rows, t5-small's shapes, one
thread), and a row's accumulation order is fixed by K alone, so a row's bits never depend on
the batch. The encoder's layers and the cross K/V projections (hundreds of rows, where
`F.linear` is faster) keep `models.linear_backend`'s path; a layer runs one kernel for every M.

Contract: `pack_decoder_linears(model, ext)` routes each of `model.decoder_row_linears()`
(plain nn.Linear over flat rows [M, K]) through `ext.linear` over a packed copy made here and
returns the packed bytes (the copy sits beside the weight, which loading and tying keep).
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch
from torch import nn


def pack_decoder_linears(model: nn.Module, ext: ModuleType) -> int:
    packed_bytes = 0
    for layer in model.decoder_row_linears():
        weight = layer.weight.detach().contiguous()
        packed = ext.pack_linear(weight)
        packed_bytes += packed.nbytes
        bias = None if layer.bias is None else layer.bias.detach()
        layer.forward = functools.partial(_packed_forward, ext, packed, bias, weight.shape[0])
    return packed_bytes


def _packed_forward(
    ext: ModuleType, packed: torch.Tensor, bias: torch.Tensor | None, out: int, x: torch.Tensor
) -> torch.Tensor:
    return ext.linear(x.contiguous(), packed, bias, out, False, None)  # [M, out] in x's dtype
