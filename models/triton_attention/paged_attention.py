"""Paged attention of a mixed step in one Triton launch, K/V read in place through the block tables.

Contract: `triton_paged_attention(q [T, H, D], k_cache, v_cache, plan, scale) -> [T, H, D]`
in q's dtype, for the flat rows of a step (decodes and prefill chunks, `AttentionMetadata`
layout) whose K/V are already in the cache (`[num_blocks, block_size, kv_heads, D]`).
`plan` is the step's `TilePlan` (models/triton_attention/tile_plan.py), built once per step
and shared by every layer; a plan with `decode_splits` goes to split_decode.py instead. Works
on CUDA tensors, and on CPU tensors under `TRITON_INTERPRET=1` (how CI runs it); nothing is
gathered: each key's block id is read from the block table.

One program serves one query tile and one KV head: `TILE_ROWS // group_pad` consecutive new
tokens of ONE sequence times the `group` query heads sharing that KV head (GQA: K/V are loaded
once for the whole group). Padding rows (past the sequence's new tokens, or heads past
`group` when it is not a power of two) are computed on zeros and never stored.

The order each row's reductions follow, whatever else is in the step (issue #14):
- Keys are cut into tiles of `KEY_TILE` positions aligned at absolute position 0 of the
  sequence; the program visits tiles in ascending order from the first tile any of its rows
  can see (its window's start) to the last tile its last row sees. `TILE_ROWS` and
  `KEY_TILE` are constants, the same for decode rows and prefill rows, so every row's dot
  products have one shape whatever the step holds.
- In a tile: scores = q . k^T (float32 accumulation), masked (causal, window) to -inf;
  m_j = row max, p = 2^(s - m), l_j = sum of p over the tile's keys (one reduction of fixed
  length), acc += p . V; p is rounded to the cache dtype for that product, as flash
  attention does. Keys past the sequence's length load as zeros, so a stale slot never
  reaches a row.
- Tiles are merged by the online-softmax rule; a tile where a row sees no key leaves that
  row's (m, l, acc) untouched (tl.where), so whether a program visits a tile for a row's
  tile-mates or not changes nothing of the row.
Where it cannot be promised: on a GPU, a row's bits also depend on the compiled dot
instruction accumulating each output element in an order set by the shape alone (true of
the MMA instructions Triton emits, checked here only in the interpreter). This kernel never
splits one row's keys across programs; split_decode.py does (flash-decoding), for decode-only
steps of a few rows where batch invariance is not promised (not under --batch-invariant): its
splits are set by the row's own length, so a row's bits still do not depend on the other rows,
but they differ from this kernel's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from models.kv_fp8 import is_fp8
from models.triton_attention.split_decode import triton_split_decode
from models.triton_attention.tile_plan import TILE_ROWS, TilePlan, group_pad
from models.triton_attention.tile_step import LOG2E, attend_tile, cache_operands, tile_constants


@triton.jit
def _paged_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,  # FP8: the caches as float32 words (the rows' scales); else unused
    vs_ptr,
    out_ptr,
    tables_ptr,
    seq_lens_ptr,
    query_start_ptr,
    tile_seq_ptr,
    tile_first_ptr,
    scale_log2,  # softmax scale * log2(e): scores live in base 2
    window,  # sliding window in tokens (read when SLIDING)
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_table,
    BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    ROWS: tl.constexpr,
    KEYS: tl.constexpr,
    SLIDING: tl.constexpr,
    PRECISION: tl.constexpr,
    INTERPRETED: tl.constexpr,  # Triton's CPU interpreter (see ordered_dot)
    FP8: tl.constexpr,  # e4m3 rows with their scales (models/kv_fp8.py)
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.load(tile_seq_ptr + tile)
    first = tl.load(tile_first_ptr + tile)  # the tile's first row among the seq's new tokens
    q_start = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - q_len  # the new token i sits at position context + i

    # [ROWS] rows of the tile: (token, head of the group), token-major
    rows = tl.arange(0, ROWS)
    token = first + rows // GROUP_PAD
    head = kv_head * GROUP + rows % GROUP_PAD
    row_ok = (token < q_len) & (rows % GROUP_PAD < GROUP)
    pos = context + token  # [ROWS] absolute position of each row's token
    dims = tl.arange(0, HEAD_PAD)
    dim_ok = dims < HEAD_DIM
    q_rows = (q_start + token).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :],
        mask=row_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )  # [ROWS, HEAD_PAD]

    m = tl.full([ROWS], float("-inf"), tl.float32)  # running max (base 2)
    denom = tl.zeros([ROWS], tl.float32)  # running sum of 2^(s - m)
    acc = tl.zeros([ROWS, HEAD_PAD], tl.float32)  # running sum of 2^(s - m) * v
    last = context + tl.minimum(first + ROWS // GROUP_PAD, q_len) - 1  # last row's position
    lo = 0
    if SLIDING:
        lo = tl.maximum(context + first - window + 1, 0) // KEYS * KEYS
    keys = tl.arange(0, KEYS)
    for start in range(lo, last + 1, KEYS):
        m, denom, acc = attend_tile(
            q,
            m,
            denom,
            acc,
            k_ptr,
            v_ptr,
            ks_ptr,
            vs_ptr,
            tables_ptr + seq * stride_table,
            start + keys,
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
            BLOCK_SIZE,
            HEAD_DIM,
            SLIDING,
            PRECISION,
            INTERPRETED,
            FP8,
        )

    out = acc / denom[:, None]
    tl.store(
        out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & dim_ok[None, :],
    )


def kernel_constants(
    dtype: torch.dtype, interpreted: bool, group: int, head_dim: int, block_size: int, sliding: bool
) -> dict[str, object]:
    """The compile-time constants of one launch (also what tests compile for the GPU)."""
    pad = group_pad(group)
    shared = tile_constants(dtype, interpreted, head_dim, block_size, sliding)
    return {"GROUP": group, "GROUP_PAD": pad, "ROWS": max(TILE_ROWS, pad), **shared}


def triton_paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: TilePlan, scale: float
) -> torch.Tensor:
    """q [T, H, D] -> [T, H, D]; see the module doc for the order it fixes."""
    num_tokens, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    group = num_heads // kv_heads
    if q.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("paged attention needs the head dimension of q and the cache contiguous")
    if plan.group != group:
        raise ValueError(
            f"the plan was built for {plan.group} query heads per KV head, not {group}"
        )
    if plan.decode_splits:  # a decode-only step of a few rows: each row's keys split
        return triton_split_decode(q, k_cache, v_cache, plan, scale)
    out = torch.empty_like(q)
    if num_tokens == 0:
        return out
    fp8 = is_fp8(k_cache)
    constants = kernel_constants(
        q.dtype,
        q.device.type == "cpu",  # CPU tensors only run under TRITON_INTERPRET=1
        group,
        head_dim,
        plan.block_size,
        plan.sliding_window is not None,
    ) | {"FP8": fp8}
    _paged_attention_kernel[(plan.num_tiles, kv_heads)](
        q,
        *cache_operands(k_cache, v_cache, fp8),
        out,
        plan.block_tables,
        plan.seq_lens,
        plan.query_start,
        plan.tile_seq,
        plan.tile_first,
        scale * LOG2E,
        plan.sliding_window or 0,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        plan.block_tables.stride(0),
        **constants,
    )
    return out
