"""RMSNorm of each row, optionally after adding the residual, in one Triton launch.

Contract: `rms_norm(x [T, H], weight [H], eps, residual=None) -> (normed, residual_out)`, both
[T, H] in x's dtype, x and residual left intact. Without `residual`, residual_out is x itself;
with it, residual_out = x + residual (rounded to the dtype) and the norm is taken of that: the
pre-norm block's `h = h + sublayer(...)` followed by the next norm. Same math as
models/layers.py `RMSNorm` (`reference`): statistics in float32, the normalised row rounded to
the dtype, then times the weight; any leading shape is flattened to rows.

Reduction order (batch invariance): one program per row; the row's squares are summed by one
`tl.sum` over a block of next_power_of_2(H) lanes (padding lanes are 0), a reduction tree
whose shape depends on H alone, never on T or on the other rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    stride_x,
    stride_res,
    stride_out,
    stride_res_out,
    eps,
    H: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded as torch's add
        tl.store(res_out_ptr + row * stride_res_out + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    mean_square = tl.sum(x32 * x32, axis=0) / H
    normed = (x32 * (1.0 / tl.sqrt(mean_square + eps))).to(x.dtype)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    out = (normed.to(tl.float32) * w.to(tl.float32)).to(x.dtype)
    tl.store(out_ptr + row * stride_out + cols, out, mask=mask)


def reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The PyTorch definition (models/layers.py RMSNorm, after the residual add)."""
    if residual is not None:
        x = x + residual
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype), x


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    hidden = x.shape[-1]
    if weight.dtype != x.dtype:
        raise ValueError(f"weight dtype {weight.dtype} differs from the input's {x.dtype}")
    rows = x.reshape(-1, hidden)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    res_in = rows if residual is None else residual.reshape(-1, hidden).contiguous()
    res_out = rows if residual is None else torch.empty_like(out)
    if rows.shape[0]:
        _rms_norm_kernel[(rows.shape[0],)](
            rows,
            res_in,
            weight,
            out,
            res_out,
            rows.stride(0),
            res_in.stride(0),
            out.stride(0),
            res_out.stride(0),
            eps,
            H=hidden,
            BLOCK=triton.next_power_of_2(hidden),
            HAS_RESIDUAL=residual is not None,
            num_warps=_warps(hidden),
        )
    new_residual = x if residual is None else res_out.view(x.shape)
    return out.view(x.shape), new_residual


def _warps(width: int) -> int:
    """More warps for wider rows; a function of the width alone, so the reduction tree of a
    row (which the warp count shapes on a GPU) still depends on H only."""
    return 4 if width <= 2048 else 8 if width <= 8192 else 16
