"""Rotary embedding of a step's queries and keys, both in one Triton launch.

Contract: `rotary(q [T, Hq, D], k [T, Hk, D], cos [T, 1, D], sin [T, 1, D], inplace=False)
-> (q_rot, k_rot)`. The layout is HF's rotate-half (neox) one, as models/layers.py
`apply_rotary` (`reference`): for i < D/2, out[i] = x[i] cos[i] - x[i + D/2] sin[i] and
out[i + D/2] = x[i + D/2] cos[i + D/2] + x[i] sin[i + D/2]; the tables hold each frequency
twice (cat(freqs, freqs)), so any scaling (llama3, linear) lives in them alone. q and k may be
views into the fused qkv projection (any token and head stride, unit stride along D). With
`inplace=True` the rotated values are written back into q and k (and those are returned);
otherwise into new contiguous tensors. Math in float32, rounded once to the dtype (torch's
reference rounds each product: equal up to the dtype's rounding).

Nothing is reduced: one program per token rotates every head of q and k; a row's values
depend on its own position and data only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(
    src_ptr, dst_ptr, token, stride_st, stride_sh, stride_dt, stride_dh, c, s, heads, HALF, HP, DP
):
    h = tl.arange(0, HP)[:, None]  # [HP, 1]
    i = tl.arange(0, DP)[None, :]  # [1, DP]
    mask = (h < heads) & (i < HALF)
    src = src_ptr + token * stride_st + h * stride_sh + i
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = dst_ptr + token * stride_dt + h * stride_dh + i
    out_dtype = dst_ptr.dtype.element_ty
    tl.store(dst, (x1 * c - x2 * s).to(out_dtype), mask=mask)
    tl.store(dst + HALF, (x2 * c + x1 * s).to(out_dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    q_out_ptr,
    k_out_ptr,
    cos_ptr,
    sin_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_qot,
    stride_qoh,
    stride_kot,
    stride_koh,
    stride_ct,
    stride_st,
    HQ: tl.constexpr,
    HK: tl.constexpr,
    HALF: tl.constexpr,
    HQ_P: tl.constexpr,
    HK_P: tl.constexpr,
    HALF_P: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, HALF_P)[None, :]
    # The first half of each table is enough: the second repeats it (cat(freqs, freqs)).
    c = tl.load(cos_ptr + token * stride_ct + i, mask=i < HALF, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + token * stride_st + i, mask=i < HALF, other=0.0).to(tl.float32)
    _rotate_heads(
        q_ptr,
        q_out_ptr,
        token,
        stride_qt,
        stride_qh,
        stride_qot,
        stride_qoh,
        c,
        s,
        HQ,
        HALF,
        HQ_P,
        HALF_P,
    )
    _rotate_heads(
        k_ptr,
        k_out_ptr,
        token,
        stride_kt,
        stride_kh,
        stride_kot,
        stride_koh,
        c,
        s,
        HK,
        HALF,
        HK_P,
        HALF_P,
    )


def reference(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The PyTorch definition (models/layers.py apply_rotary on q and on k)."""

    def rotate(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    return rotate(q), rotate(k)


def rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    tokens, q_heads, head_dim = q.shape
    k_heads = k.shape[1]
    if head_dim % 2 or k.shape[2] != head_dim or q.stride(2) != 1 or k.stride(2) != 1:
        raise ValueError("rotary needs an even head_dim and unit stride along it in q and k")
    cos, sin = cos.reshape(tokens, head_dim), sin.reshape(tokens, head_dim)
    if cos.stride(1) != 1 or sin.stride(1) != 1:
        cos, sin = cos.contiguous(), sin.contiguous()
    q_out = q if inplace else torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = k if inplace else torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if tokens:
        half = head_dim // 2
        _rotary_kernel[(tokens,)](
            q, k, q_out, k_out, cos, sin,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
            cos.stride(0), sin.stride(0),
            HQ=q_heads, HK=k_heads, HALF=half,
            HQ_P=triton.next_power_of_2(q_heads), HK_P=triton.next_power_of_2(k_heads),
            HALF_P=triton.next_power_of_2(half),
        )  # fmt: skip
    return q_out, k_out
