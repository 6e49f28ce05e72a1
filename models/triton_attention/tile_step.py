"""One key tile of the online softmax, shared by the one-pass paged attention
(paged_attention.py) and the split decode (split_decode.py), so both round the same way.

Contract: `tile_constants(...)` are the compile-time constants the kernels share (the key tile,
the padded head dim, the dots' precision, FP8); `cache_operands(k_cache, v_cache, fp8)` are
what the kernels pass as `k_ptr, v_ptr, ks_ptr, vs_ptr`; `attend_tile(q, m, denom, acc, ...) ->
(m, denom, acc)` folds the keys at `key_pos`
([KEYS], one tile aligned at a multiple of KEY_TILE) of one KV head into a query tile's running
state: q [ROWS, HEAD_PAD], m [ROWS] the running max of the
scores in base 2, denom [ROWS] the running sum of 2^(s - m), acc [ROWS, HEAD_PAD] the running
sum of 2^(s - m) v. K/V are read in place in the paged cache, each key's block id from
`table_ptr` (the sequence's block-table row); keys past `seq_len` load as zeros. A row sees the
keys at or before its position `pos` [ROWS] (and after pos - window when SLIDING). The steps:
s = q . k^T (float32 accumulation) x scale, masked to -inf; m_j = the tile's row max; p =
2^(s - m_new); p is rounded to the cache dtype for p . V, as flash attention does; a row that
sees no key of the tile keeps its state untouched (tl.where), so visiting a tile for a row's
tile-mates changes nothing of the row. FP8 (an e4m3 cache, models/kv_fp8.py; `ks_ptr` /
`vs_ptr` the caches' storage as float32 words, where each row's scale sits after its HEAD_DIM
values): K and V tiles are widened to q's dtype (exact), s = (q . k_q^T) x k_scale (per key)
x scale, and p x v_scale (per key) is what is rounded to q's dtype for (p v_scale) . V_q;
l sums p itself. Without FP8 the code and bits are those of the float cache. Both products
go through `ordered_dot` (models/triton_kernels/ordered_dot.py): `tl.dot` compiled; interpreted, a sum over the head
dim (scores) and over the tile's keys (p . V) in one order for every row of the tile, on any
host ISA (the interpreter's `tl.dot` is the host BLAS, whose AVX2 sgemm orders a row's sum by
its place in the tile).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from models.kv_fp8 import kernel_views
from models.triton_kernels.ordered_dot import ordered_dot

KEY_TILE = 64  # keys per tile, aligned at absolute positions
LOG2E = 1.4426950408889634


def tile_constants(
    dtype: torch.dtype, interpreted: bool, head_dim: int, block_size: int, sliding: bool
) -> dict[str, object]:
    """The compile-time constants `attend_tile` takes, as both kernels launch it (FP8 False:
    a launch over an e4m3 cache, models/kv_fp8.py, sets it)."""
    return {
        "BLOCK_SIZE": block_size,
        "HEAD_DIM": head_dim,
        "HEAD_PAD": max(16, triton.next_power_of_2(head_dim)),  # tl.dot wants 16 or more
        "KEYS": KEY_TILE,
        "SLIDING": sliding,
        # float32 stays IEEE float32 in the dots, not TF32: the GPU agrees with the CPU paths
        "PRECISION": "ieee" if interpreted or dtype == torch.float32 else "tf32",
        # Triton's CPU interpreter: the dots go through ordered_dot's numpy sums
        "INTERPRETED": interpreted,
        "FP8": False,
    }


def cache_operands(k_cache: torch.Tensor, v_cache: torch.Tensor, fp8: bool) -> tuple:
    """The kernels' `k_ptr, v_ptr, ks_ptr, vs_ptr`: an fp8 cache's bytes as e4m3 values and as
    float32 words (its rows' scales, models/kv_fp8.py), else the caches (ks / vs never read)."""
    if fp8:
        (k, ks), (v, vs) = kernel_views(k_cache), kernel_views(v_cache)
        return k, v, ks, vs
    return k_cache, v_cache, k_cache, v_cache


@triton.jit
def attend_tile(
    q,
    m,
    denom,
    acc,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    table_ptr,
    key_pos,
    seq_len,
    pos,
    window,
    kv_head,
    dims,
    dim_ok,
    scale_log2,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    SLIDING: tl.constexpr,
    PRECISION: tl.constexpr,
    INTERPRETED: tl.constexpr,
    FP8: tl.constexpr,
):
    key_ok = key_pos < seq_len
    block = tl.load(table_ptr + key_pos // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)
    offset = key_pos % BLOCK_SIZE
    mask = key_ok[:, None] & dim_ok[None, :]
    k_rows = k_ptr + block[:, None] * stride_kb + offset[:, None] * stride_ks
    v_rows = v_ptr + block[:, None] * stride_vb + offset[:, None] * stride_vs
    k = tl.load(k_rows + kv_head * stride_kh + dims[None, :], mask=mask, other=0.0)
    v = tl.load(v_rows + kv_head * stride_vh + dims[None, :], mask=mask, other=0.0)
    if FP8:  # each row's float32 scale: the word after its HEAD_DIM e4m3 values
        k_word = block * stride_kb + offset * stride_ks + kv_head * stride_kh + HEAD_DIM
        v_word = block * stride_vb + offset * stride_vs + kv_head * stride_vh + HEAD_DIM
        k_scale = tl.load(ks_ptr + k_word // 4, mask=key_ok, other=0.0)  # [KEYS]
        v_scale = tl.load(vs_ptr + v_word // 4, mask=key_ok, other=0.0)
        k = k.to(q.dtype)  # e4m3 -> q's dtype: exact
        v = v.to(q.dtype)
    s = ordered_dot(q, tl.trans(k), PRECISION, INTERPRETED)  # [ROWS, KEYS]
    if FP8:
        s = s * k_scale[None, :]
    s = s * scale_log2
    visible = key_pos[None, :] <= pos[:, None]  # causal; implies key_pos < seq_len
    if SLIDING:
        visible &= key_pos[None, :] > pos[:, None] - window
    s = tl.where(visible, s, float("-inf"))
    m_j = tl.max(s, 1)
    seen = m_j > float("-inf")  # the row sees a key of this tile
    m_new = tl.where(seen, tl.maximum(m, m_j), 0.0)
    p = tl.exp2(s - m_new[:, None])  # 0 where masked
    alpha = tl.exp2(tl.where(seen, m - m_new, 0.0))  # old part's weight (0 before any key)
    p_v = p
    if FP8:  # V's scale joins the key's weight
        p_v = p * v_scale[None, :]
    p_v = p_v.to(v.dtype)  # rounded to the cache dtype, as flash attention does
    acc_j = ordered_dot(p_v, v, PRECISION, INTERPRETED)  # [ROWS, HEAD_PAD]
    denom = tl.where(seen, denom * alpha + tl.sum(p, 1), denom)
    acc = tl.where(seen[:, None], acc * alpha[:, None] + acc_j, acc)
    m = tl.where(seen, m_new, m)
    return m, denom, acc
