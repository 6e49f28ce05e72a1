"""Paged attention equals the plain reference across block boundaries, GQA ratios
(1, 3 and all heads sharing one KV head), sliding windows and mixed prefill/decode batches,
through the PyTorch key-block attention and through our CPU kernel (every row one query of it).
The PyTorch attention runs on the tests' device (TGSERVE_TEST_DEVICE); the CPU kernel on the CPU."""

from __future__ import annotations

import random

import pytest
import torch

from models.attention import (
    AttentionMetadata,
    paged_attention,
    reference_attention,
    write_kv,
)
from models.attention_backend import CppAttentionBackend

HEAD_DIM = 16


def run_case(
    num_heads: int,
    kv_heads: int,
    block_size: int,
    cases: list[tuple[int, int]],
    window,
    cpp: bool = False,
    device: torch.device | str = "cpu",
):
    """cases: (cached prefix length, new tokens) per sequence. Inputs are drawn on the CPU and
    moved to `device`; the float64 reference runs on the CPU."""
    torch.manual_seed(0)
    num_blocks = 64
    k_cache = torch.zeros(num_blocks, block_size, kv_heads, HEAD_DIM, device=device)
    v_cache = torch.zeros_like(k_cache)
    free = list(range(num_blocks))
    random.Random(0).shuffle(free)
    tables, seq_lens, query_lens, full_k, full_v, qs = [], [], [], [], [], []
    for cached, new in cases:
        total = cached + new
        table = [free.pop() for _ in range((total + block_size - 1) // block_size)]
        k = torch.randn(total, kv_heads, HEAD_DIM)
        v = torch.randn(total, kv_heads, HEAD_DIM)
        # The cached prefix is already in the cache from earlier steps.
        if cached:
            prefix = AttentionMetadata.build([table], [cached], [cached], block_size, device)
            write_kv(
                (k_cache, v_cache),
                k[:cached].to(device),
                v[:cached].to(device),
                prefix.slot_mapping,
            )
        tables.append(table)
        seq_lens.append(total)
        query_lens.append(new)
        full_k.append(k)
        full_v.append(v)
        qs.append(torch.randn(new, num_heads, HEAD_DIM))
    # the C++ paged attention's backend, or none: the PyTorch key-block attention
    group = num_heads // kv_heads
    backend = CppAttentionBackend(group, block_size, window, torch.device(device)) if cpp else None
    meta = AttentionMetadata.build(
        tables, seq_lens, query_lens, block_size, device, window, backend=backend
    )
    new_k = torch.cat([k[c:] for k, (c, _) in zip(full_k, cases, strict=True)]).to(device)
    new_v = torch.cat([v[c:] for v, (c, _) in zip(full_v, cases, strict=True)]).to(device)
    write_kv((k_cache, v_cache), new_k, new_v, meta.slot_mapping)
    out = paged_attention(torch.cat(qs).to(device), (k_cache, v_cache), meta, HEAD_DIM**-0.5)
    out = out.cpu()
    expected = torch.cat(
        [
            reference_attention(q, k, v, HEAD_DIM**-0.5, window)
            for q, k, v in zip(qs, full_k, full_v, strict=True)
        ]
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_heads,kv_heads", [(4, 4), (6, 2), (4, 1)])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("kernel", [False, True])
def test_paged_equals_reference_mixed_batch(
    num_heads: int, kv_heads: int, window, kernel, device
) -> None:
    # Fresh prefills, a chunk on top of a cached prefix, and decodes at block edges.
    cases = [(0, 9), (7, 6), (3, 1), (8, 1), (15, 1), (0, 1)]
    run_case(
        num_heads,
        kv_heads,
        block_size=4,
        cases=cases,
        window=window,
        cpp=kernel,
        device="cpu" if kernel else device,  # the C++ kernel is CPU-only by nature
    )


@pytest.mark.parametrize("block_size", [1, 3, 16])
@pytest.mark.parametrize("kernel", [False, True])
def test_paged_equals_reference_across_block_sizes(block_size: int, kernel: bool, device) -> None:
    cases = [(0, 20), (19, 1), (5, 12)]
    dev = "cpu" if kernel else device
    run_case(6, 2, block_size, cases=cases, window=None, cpp=kernel, device=dev)


def test_row_plan_gives_each_token_its_sequence_table_and_context() -> None:
    meta = AttentionMetadata.build([[5, 2], [7], [1, 3, 4]], [6, 3, 9], [3, 1, 2], block_size=4)
    tables, lens = meta.row_plan()
    assert lens.tolist() == [4, 5, 6, 3, 8, 9]
    assert tables.tolist() == [[5, 2, 0]] * 3 + [[7, 0, 0]] + [[1, 3, 4]] * 2


def test_write_kv_places_tokens_at_their_slots() -> None:
    k_cache = torch.zeros(4, 2, 1, 1)
    v_cache = torch.zeros_like(k_cache)
    meta = AttentionMetadata.build([[3, 1]], [3], [3], block_size=2)
    assert meta.slot_mapping.tolist() == [6, 7, 2]
    k = torch.tensor([1.0, 2.0, 3.0]).view(3, 1, 1)
    write_kv((k_cache, v_cache), k, -k, meta.slot_mapping)
    assert k_cache[3].flatten().tolist() == [1.0, 2.0]
    assert k_cache[1].flatten().tolist() == [3.0, 0.0]
    assert v_cache[1, 0].item() == -3.0
