"""Fused Triton kernels of the GPU path: RMSNorm (+ residual add), rotary, SiLU x mul, and the
sampler's row softmax; and the fixed-tile GEMM of a batch-invariant mode (invariant_matmul.py,
switched on by no option yet: `models.linear_backend.use_invariant_linears(model, kernel)`).
One kernel per module, each wrapping the readable PyTorch reference it is tested against
(tests/models/triton_kernels, under TRITON_INTERPRET=1 on CPU in CI; compiled for sm_90 there).

`enabled(x)` is the one place that decides whether a tensor's op takes the Triton kernel: only
CUDA tensors, and only where triton can be imported. Everything else (the CPU path: PyTorch
ops and the C++ kernels) keeps the reference, bit for bit. Importing this package does not
import triton; callers import a kernel module only after `enabled` said yes.

Every kernel computes a row from that row alone (one program per row or per row block, a
fixed block reduction order): a row's result never depends on the other rows of the batch.
Tile products go through `ordered_dot.ordered_dot`, whose order does not depend on a row's
place in its tile in the interpreter either (there `tl.dot` is the host BLAS, AVX2 or not).
"""

from __future__ import annotations

import importlib.util
from functools import cache

import torch


@cache
def is_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def enabled(x: torch.Tensor) -> bool:
    """Whether ops on `x` run as Triton kernels (tests force it to reach the interpreter).
    Not while torch.compile traces (`--compile`): Inductor fuses the reference itself."""
    return x.is_cuda and not torch.compiler.is_compiling() and is_available()
