"""The Triton K/V write stores every token's keys and values where the PyTorch `write_kv`
does (block sizes 1/16/32, a cache dtype other than the input's, rows taken out of a wider
projection), touches no other slot, and skips padding rows (slot -1)."""

from __future__ import annotations

import pytest
import torch

from models.attention import write_kv


def _caches(block_size: int, dtype: torch.dtype, device: torch.device):
    """Two identical pairs of random (k, v) caches: one to write, one to compare with."""
    shape = (12, block_size, 2, 64)
    gen = torch.Generator().manual_seed(1)
    k, v = (torch.randn(shape, generator=gen).to(dtype).to(device) for _ in range(2))
    return (k, v), (k.clone(), v.clone())


@pytest.mark.parametrize("block_size", [1, 16, 32])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_slots_hold_what_write_kv_stores(triton_kernels, block_size, cache_dtype) -> None:
    from models.triton_attention.kv_write import triton_write_kv

    device = triton_kernels
    num_slots = 12 * block_size
    tokens = min(9, num_slots)
    gen = torch.Generator().manual_seed(0)
    # k and v as the attention layer gets them: views into one [T, (H + 2 * KVH) * D] row
    qkv = torch.randn(tokens, (4 + 2 + 2) * 64, generator=gen).to(device)
    k = qkv[:, 4 * 64 : 6 * 64].view(tokens, 2, 64)
    v = qkv[:, 6 * 64 :].view(tokens, 2, 64)
    slots = torch.randperm(num_slots, generator=gen)[:tokens].to(device)
    (want_k, want_v), (got_k, got_v) = _caches(block_size, cache_dtype, device)
    before = got_k.clone()
    write_kv((want_k, want_v), k, v, slots)
    triton_write_kv(got_k, got_v, k, v, slots)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
    assert not torch.equal(got_k, before)  # it wrote


def test_padding_rows_store_nothing(triton_kernels) -> None:
    from models.triton_attention.kv_write import triton_write_kv

    device = triton_kernels
    (k_cache, v_cache), (k_before, v_before) = _caches(16, torch.float32, device)
    k = torch.randn(3, 2, 64, device=device)
    slots = torch.tensor([5, -1, 40], device=device)
    triton_write_kv(k_cache, v_cache, k, k + 1, slots)
    k_before.view(-1, 2, 64)[[5, 40]] = k[[0, 2]]
    v_before.view(-1, 2, 64)[[5, 40]] = k[[0, 2]] + 1
    assert torch.equal(k_cache, k_before) and torch.equal(v_cache, v_before)
