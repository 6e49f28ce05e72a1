"""A linear layer whose every output row is the same bits whatever the number of rows: the
GEMM of the `--batch-invariant` mode on CUDA (issue 24, item 4), where cuBLAS picks another
kernel, tiling and split of K by batch size.

Contract: `invariant_linear(x [..., K], weight [N, K], bias [N] | None) -> [..., N]` in x's
dtype, equal to `F.linear` (`reference`) up to the accumulation order; float32 inputs are
multiplied in full float32 (no TF32), other dtypes accumulate in float32.

Reduction order (batch invariance): ONE launch configuration for every M (tiles of
BLOCK_M x BLOCK_N outputs, K walked in BLOCK_K steps from 0 up, one block product per step
(`ordered_dot`: `tl.dot` compiled; interpreted, a numpy sum over the block's K whose order is
the same for every row, where the interpreter's `tl.dot` went to the host BLAS, whose AVX2
sgemm summed a row's K in an order set by its place in the tile) added into a float32
accumulator; no split-K, no choice by shape). An output element's sum is therefore the same
sequence of block products whatever M is, which tile its row falls in, what the other rows
hold and which ISA the host has; the bias is added once, after the sum. The price: no tuning by M (decode
rows fill 1 of BLOCK_M = 16 tile rows), so the mode is opt-in.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from models.triton_kernels.ordered_dot import ordered_dot

BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 64  # fixed for every M: that is the point


@triton.jit
def _invariant_matmul_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    rm = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        x = tl.load(
            x_ptr + rm[:, None] * stride_xm + kk[None, :],
            mask=(rm[:, None] < M) & (kk[None, :] < K),
            other=0.0,
        )  # [BLOCK_M, BLOCK_K]
        w = tl.load(
            w_ptr + rn[None, :] * stride_wn + kk[:, None],
            mask=(rn[None, :] < N) & (kk[:, None] < K),
            other=0.0,
        )  # [BLOCK_K, BLOCK_N]: weight rows are output columns
        acc += ordered_dot(x, w, PRECISION, INTERPRETED)  # in the same order for every row
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rm[:, None] * stride_om + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, weight, bias)


def invariant_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    shape = x.shape
    rows = x.reshape(-1, shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    m, k = rows.shape
    n = weight.shape[0]
    if weight.shape[1] != k:
        raise ValueError(f"x has {k} features, weight expects {weight.shape[1]}")
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m:
        grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
        _invariant_matmul_kernel[grid](
            rows,
            weight,
            weight if bias is None else bias,
            out,
            m,
            n,
            k,
            rows.stride(0),
            weight.stride(0),
            out.stride(0),
            BLOCK_M=BLOCK_M,
            BLOCK_N=BLOCK_N,
            BLOCK_K=BLOCK_K,
            HAS_BIAS=bias is not None,
            # float32 in full (no TF32); bfloat16 products are exact in float32 anyway
            PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
            # CPU tensors run only in Triton's interpreter (see ordered_dot)
            INTERPRETED=not x.is_cuda,
        )
    return out.view(*shape[:-1], n)
