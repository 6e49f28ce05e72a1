"""Which kernel a linear layer runs for a batch of M rows: decided here and nowhere else.

The C++ step (`models/cpu_kernels/fused_decoder.py` for its layers and its LM head) and the
PyTorch forward on CPU both ask `linear_kernel(num_rows, dtype, cpp_step=...)`:

- PACKED (C++ step only, every M): tgserve's kernel over weights packed in 16-column panels
  (`cpu_kernels/linear.cpp`). One kernel family for every batch size, so a row's values do not
  depend on the batch (its accumulation order is fixed by K alone); it streams the weights at
  memory speed at M = 1 and runs like a GEMM at large M.
- GEMV (PyTorch path only): torch's own matrix-vector kernel (`torch.mv`, never oneDNN) for a
  single row of bfloat16 / float16. There oneDNN's GEMM streams the weights at about half the
  speed (6.5 vs 11.5 GB/s measured on an AVX512-BF16 host), while for M >= 4 it is 3-30x
  faster than torch's own GEMM. float32 never goes through oneDNN, so it has nothing to gain.
- GEMM: everything else (oneDNN over the packed copy or at::mm in the C++ step, `F.linear` in
  the PyTorch path).

Contract: `route_single_rows(model)` makes every plain `nn.Linear` of a model follow that
choice (switched on once, by `models.forward_path` for models on a CPU). Numerics are those of
`F.linear`: `torch.mv` runs the very kernel a one-row bfloat16 matmul runs without oneDNN,
and layers with a bias stay on `F.linear` (adding it after `mv` would round twice).
"""

from __future__ import annotations

import enum
import functools

import torch
import torch.nn.functional as F
from torch import nn

# Dtypes whose matmuls torch hands to oneDNN on CPU (float32 goes to MKL's sgemm).
_ONEDNN_DTYPES = (torch.bfloat16, torch.float16)


class LinearKernel(enum.Enum):
    PACKED = "packed"
    GEMV = "gemv"
    GEMM = "gemm"


def linear_kernel(num_rows: int, dtype: torch.dtype, *, cpp_step: bool) -> LinearKernel:
    """The kernel for x [num_rows, K] @ W^T in `dtype`; `cpp_step` when the C++ step (with its
    packed kernel) runs the layer, else the PyTorch forward."""
    if cpp_step:
        return LinearKernel.PACKED
    # dtype first: under torch.compile a float32 layer then never guards on its row count.
    if dtype in _ONEDNN_DTYPES and num_rows == 1:
        return LinearKernel.GEMV
    return LinearKernel.GEMM


def row_routed_linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`layer(x)` for x [M, K], through the kernel `linear_kernel` picks for M rows."""
    if (
        layer.bias is None
        and x.dim() == 2
        and linear_kernel(x.shape[0], x.dtype, cpp_step=False) is LinearKernel.GEMV
    ):
        return torch.mv(layer.weight, x[0]).unsqueeze(0)  # [1, N]
    return F.linear(x, layer.weight, layer.bias)


def route_single_rows(model: nn.Module) -> int:
    """Points every plain nn.Linear's forward at `row_routed_linear`; returns how many.
    Instance attributes shadow the method, so the class keeps the plain forward."""
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    for layer in linears:
        layer.forward = functools.partial(row_routed_linear, layer)
    return len(linears)
