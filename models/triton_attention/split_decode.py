"""Decode attention with each row's keys split across programs (flash-decoding), for decode-only
steps of a few rows on a GPU.

Why: the one-pass kernel (paged_attention.py) gives each (row, KV head) one program that walks
all of the row's key tiles in turn. A batch-1 decode of Llama-3-8B is then 8 programs on a GPU
of 132 multiprocessors, each walking 8-9 tiles of a 512-token context one after the other:
latency-bound, however fast the memory. Here program (row, KV head, split) walks only its
split's tiles, and a second launch merges the splits.

Contract: `triton_split_decode(q [B, H, D], k_cache, v_cache, plan, scale) -> [B, H, D]` in q's
dtype, for a decode-only step (row i: sequence i's one new token, at position seq_lens[i] - 1)
whose plan says `decode_splits` (tile_plan.py); K/V already in the cache, read in place.

Order, so that a row's bits depend on its own length alone (not on the rest of the step):
- The keys a row can see, from its window's first key tile to its position, are cut into
  `splits` ranges of whole `KEY_TILE` tiles, ceil(tiles / splits) each, in order; a split past
  the row's tiles is empty. Program (row, KV head, split) runs paged_attention.py's online
  softmax (same tile shape, masking and rounding of p) over its range, ascending, and stores
  its running max m, sum l and unnormalised acc in float32.
- The merge weighs each split by 2^(m_s - max m) and sums splits with one reduction of fixed
  length (`splits`), then divides once.
So the bits differ from the one-pass kernel's (which merges tile by tile): the engine uses this
kernel only where batch invariance is not promised (CUDA without `--batch-invariant`), and only
for decode-only steps of at most `SPLIT_MAX_ROWS` rows (tile_plan.decode_splits: 16 splits, so
a batch-1 step of 8 KV heads is 128 programs), where the one-pass kernel leaves the GPU idle;
the same rule in captured and eager decode steps.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from models.kv_fp8 import is_fp8
from models.triton_attention.tile_plan import DECODE_SPLITS, TilePlan, group_pad
from models.triton_attention.tile_step import LOG2E, attend_tile, cache_operands, tile_constants


@triton.jit
def _split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,  # FP8: the caches as float32 words (the rows' scales); else unused
    vs_ptr,
    acc_ptr,  # [B, H, SPLITS, HEAD_DIM] float32: each split's unnormalised output
    stats_ptr,  # [B, H, SPLITS, 2] float32: each split's (m, l), base 2
    tables_ptr,
    seq_lens_ptr,
    scale_log2,
    window,
    num_heads,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_table,
    BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    ROWS: tl.constexpr,  # the group's query heads, padded for tl.dot
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    KEYS: tl.constexpr,
    SPLITS: tl.constexpr,
    SLIDING: tl.constexpr,
    PRECISION: tl.constexpr,
    INTERPRETED: tl.constexpr,
    FP8: tl.constexpr,
):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + row)
    pos = seq_len - 1  # the row's token
    lo = 0
    if SLIDING:
        lo = tl.maximum(pos - window + 1, 0) // KEYS * KEYS
    per_split = (tl.cdiv(seq_len - lo, KEYS) + SPLITS - 1) // SPLITS * KEYS  # keys per split
    start = lo + split * per_split
    end = tl.minimum(start + per_split, seq_len)

    heads = tl.arange(0, ROWS)
    head = kv_head * GROUP + heads
    head_ok = heads < GROUP
    dims = tl.arange(0, HEAD_PAD)
    dim_ok = dims < HEAD_DIM
    q = tl.load(
        q_ptr + row.to(tl.int64) * stride_qt + head[:, None] * stride_qh + dims[None, :],
        mask=head_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )  # [ROWS, HEAD_PAD]

    m = tl.full([ROWS], float("-inf"), tl.float32)
    denom = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HEAD_PAD], tl.float32)
    keys = tl.arange(0, KEYS)
    rows_pos = tl.zeros([ROWS], tl.int64) + pos  # every row of the tile is the one token
    for tile in range(start, end, KEYS):
        m, denom, acc = attend_tile(
            q,
            m,
            denom,
            acc,
            k_ptr,
            v_ptr,
            ks_ptr,
            vs_ptr,
            tables_ptr + row * stride_table,
            tile + keys,
            seq_len,
            rows_pos,
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

    part = ((row * num_heads + head) * SPLITS + split).to(tl.int64)  # [ROWS]
    tl.store(
        acc_ptr + part[:, None] * HEAD_DIM + dims[None, :],
        acc,
        mask=head_ok[:, None] & dim_ok[None, :],
    )
    tl.store(stats_ptr + part * 2, m, mask=head_ok)
    tl.store(stats_ptr + part * 2 + 1, denom, mask=head_ok)


@triton.jit
def _merge_kernel(
    acc_ptr,
    stats_ptr,
    out_ptr,
    num_heads,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    SPLITS: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS)
    dims = tl.arange(0, HEAD_PAD)
    dim_ok = dims < HEAD_DIM
    part = ((row * num_heads + head) * SPLITS + splits).to(tl.int64)  # [SPLITS]
    m = tl.load(stats_ptr + part * 2)
    denom = tl.load(stats_ptr + part * 2 + 1)
    top = tl.max(m, 0)
    weight = tl.where(m > float("-inf"), tl.exp2(m - top), 0.0)  # empty splits weigh 0
    acc = tl.load(acc_ptr + part[:, None] * HEAD_DIM + dims[None, :], mask=dim_ok[None, :])
    total = tl.sum(denom * weight, 0)
    out = tl.sum(acc * weight[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(
        out_ptr + row.to(tl.int64) * stride_ot + head * stride_oh + dims,
        out.to(out_ptr.dtype.element_ty),
        mask=dim_ok,
    )


def split_constants(
    dtype: torch.dtype, interpreted: bool, group: int, head_dim: int, block_size: int, sliding: bool
) -> dict[str, object]:
    """The split kernel's compile-time constants (also what tests compile for the GPU)."""
    shared = tile_constants(dtype, interpreted, head_dim, block_size, sliding)
    rows = max(16, group_pad(group))  # tl.dot wants 16 rows or more
    return {"GROUP": group, "ROWS": rows, "SPLITS": DECODE_SPLITS, **shared}


def merge_constants(head_dim: int) -> dict[str, object]:
    return {
        "HEAD_DIM": head_dim,
        "HEAD_PAD": max(16, triton.next_power_of_2(head_dim)),
        "SPLITS": DECODE_SPLITS,
    }


def triton_split_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: TilePlan, scale: float
) -> torch.Tensor:
    """q [B, H, D] (one new token per row) -> [B, H, D]; see the module doc for the order."""
    rows, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    out = torch.empty_like(q)
    if rows == 0:
        return out
    if plan.decode_splits != DECODE_SPLITS:
        raise ValueError(
            f"a plan of {plan.decode_splits} splits; this kernel makes {DECODE_SPLITS}"
        )
    acc = torch.empty(
        (rows, num_heads, DECODE_SPLITS, head_dim), dtype=torch.float32, device=q.device
    )
    stats = torch.empty((rows, num_heads, DECODE_SPLITS, 2), dtype=torch.float32, device=q.device)
    interpreted = q.device.type == "cpu"  # CPU tensors only run under TRITON_INTERPRET=1
    sliding = plan.sliding_window is not None
    fp8 = is_fp8(k_cache)
    _split_kernel[(rows, kv_heads, DECODE_SPLITS)](
        q,
        *cache_operands(k_cache, v_cache, fp8),
        acc,
        stats,
        plan.block_tables,
        plan.seq_lens,
        scale * LOG2E,
        plan.sliding_window or 0,
        num_heads,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        plan.block_tables.stride(0),
        **split_constants(
            q.dtype, interpreted, num_heads // kv_heads, head_dim, plan.block_size, sliding
        )
        | {"FP8": fp8},
    )
    _merge_kernel[(rows, num_heads)](
        acc, stats, out, num_heads, out.stride(0), out.stride(1), **merge_constants(head_dim)
    )
    return out
