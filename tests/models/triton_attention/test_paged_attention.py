"""The Triton paged attention equals the float64 reference on mixed steps (prefill chunks on
cached prefixes, decodes across key tiles and cache blocks) for block sizes 1/16/32, GQA
ratios 1/3/8, head dims 64/128, with and without a sliding window, in float32 and bfloat16;
a row's bits do not depend on what else the step holds; stale cache slots never leak in.
On CPU the kernel runs in Triton's interpreter (see conftest.py)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from models.attention import AttentionMetadata, reference_attention, write_kv

KV_HEADS = 2
NUM_BLOCKS = 320  # enough for MIXED at block size 1
# (cached prefix, new tokens) per sequence: a fresh prefill, a chunk crossing the 64-key tile
# edge on top of a cached prefix, decodes in the first, second and third key tile.
MIXED = [(0, 9), (50, 20), (3, 1), (70, 1), (0, 1), (130, 1)]


@dataclass
class Step:
    """One step over a paged cache: K/V of every sequence's whole context already stored."""

    q: list[torch.Tensor]  # per sequence [new, H, D]
    k: list[torch.Tensor]  # per sequence [context, KVH, D], as the cache holds them
    v: list[torch.Tensor]
    cache: tuple[torch.Tensor, torch.Tensor]
    meta: AttentionMetadata


def make_step(
    cases, num_heads, head_dim, block_size, window, dtype, device, seed=0, cache=None, tables=None
) -> Step:
    """Random q/k/v for `cases`; the cache starts as NaN so that any slot read outside a
    sequence's context would poison the output. `tables` reuse a cache's block tables."""
    gen = torch.Generator().manual_seed(seed)
    if cache is None:
        shape = (NUM_BLOCKS, block_size, KV_HEADS, head_dim)
        cache = (
            torch.full(shape, float("nan"), dtype=dtype, device=device),
            torch.full(shape, float("nan"), dtype=dtype, device=device),
        )
    free = list(range(NUM_BLOCKS))
    random.Random(seed).shuffle(free)
    qs, ks, vs, new_tables = [], [], [], []
    for i, (cached, new) in enumerate(cases):
        total = cached + new
        table = tables[i] if tables else [free.pop() for _ in range(-(-total // block_size))]
        new_tables.append(table)
        k = torch.randn(total, KV_HEADS, head_dim, generator=gen).to(dtype).to(device)
        v = torch.randn(total, KV_HEADS, head_dim, generator=gen).to(dtype).to(device)
        written = AttentionMetadata.build([table], [total], [total], block_size, device)
        write_kv(cache, k, v, written.slot_mapping)
        qs.append(torch.randn(new, num_heads, head_dim, generator=gen).to(dtype).to(device))
        ks.append(k)
        vs.append(v)
    meta = AttentionMetadata.build(
        new_tables,
        [c + n for c, n in cases],
        [n for _, n in cases],
        block_size,
        device,
        sliding_window=window,
    )
    return Step(qs, ks, vs, cache, meta)


def run_triton(step: Step, scale: float) -> torch.Tensor:
    from models.triton_attention.paged_attention import triton_paged_attention

    q = torch.cat(step.q)
    plan = step.meta.tile_plan(q.shape[1] // KV_HEADS)
    return triton_paged_attention(q, *step.cache, plan, scale)


# Every block size meets every GQA ratio; head dims, windows and dtypes rotate through them.
CASES = [
    (1, 1, 64, None, torch.float32),
    (1, 3, 128, 20, torch.bfloat16),
    (1, 8, 64, 20, torch.float32),
    (16, 1, 128, 20, torch.float32),
    (16, 3, 64, None, torch.float32),
    (16, 8, 128, None, torch.bfloat16),
    (32, 1, 64, 20, torch.bfloat16),
    (32, 3, 128, None, torch.float32),
    (32, 8, 64, 5, torch.float32),
]


@pytest.mark.parametrize("block_size,group,head_dim,window,dtype", CASES)
def test_mixed_step_equals_float64_reference(
    triton_kernels, block_size, group, head_dim, window, dtype
) -> None:
    num_heads = group * KV_HEADS
    step = make_step(MIXED, num_heads, head_dim, block_size, window, dtype, triton_kernels)
    scale = head_dim**-0.5
    out = run_triton(step, scale)
    want = torch.cat(
        [
            reference_attention(q.cpu().double(), k.cpu(), v.cpu(), scale, window)
            for q, k, v in zip(step.q, step.k, step.v, strict=True)
        ]
    )
    assert out.dtype == dtype and not out.isnan().any()
    # float32: float32 sums against float64; bfloat16: p rounded to bfloat16 before p @ V
    # (as flash attention does) and the output rounded once to bfloat16
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.cpu().double(), want.double(), atol=tol, rtol=tol)


def test_a_long_prefill_spans_several_query_tiles(triton_kernels) -> None:
    # group 1: 64 new tokens per tile, so 150 new tokens take three tiles of one sequence
    step = make_step([(10, 150), (0, 1)], KV_HEADS, 64, 16, None, torch.float32, triton_kernels)
    out = run_triton(step, 0.125)
    want = torch.cat(
        [
            reference_attention(q.cpu(), k.cpu(), v.cpu(), 0.125)
            for q, k, v in zip(step.q, step.k, step.v, strict=True)
        ]
    )
    torch.testing.assert_close(out.cpu(), want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("group,window", [(3, None), (8, 20)])
def test_a_rows_bits_do_not_depend_on_the_rest_of_the_step(triton_kernels, group, window) -> None:
    """Sequence 0 (a 70-token context) computed as one prefill among others, as two chunks
    with other companions, and its last row as a lone decode: the same bits every time."""
    num_heads, dim, bs, dt = group * KV_HEADS, 64, 16, torch.float32
    full = make_step([(0, 70), (0, 5), (30, 1)], num_heads, dim, bs, window, dt, triton_kernels)
    tables = full.meta.block_tables.tolist()
    alone = full.meta.block_tables[:1].tolist()
    q = full.q[0]

    def rows_of_seq0(cases, q0, tabs, companion_scale) -> torch.Tensor:
        step = make_step(
            cases,
            num_heads,
            dim,
            bs,
            window,
            dt,
            triton_kernels,
            seed=0,
            cache=full.cache,
            tables=tabs,
        )
        step.q[0] = q0  # the K/V of sequence 0 are the same random draws (seed 0, first)
        for i in range(1, len(step.q)):
            step.q[i] = torch.randn_like(step.q[i]) * companion_scale
        return run_triton(step, dim**-0.5)[: q0.shape[0]]

    whole = rows_of_seq0([(0, 70), (0, 5), (30, 1)], q, tables, 1.0)
    second_chunk = rows_of_seq0([(41, 29), (0, 5)], q[41:], tables[:2], 2.0)
    last_alone = rows_of_seq0([(69, 1)], q[69:], alone, 3.0)
    assert torch.equal(whole[41:], second_chunk)
    assert torch.equal(whole[69:], last_alone)
