"""The Triton rotary equals models/layers.py's apply_rotary on q and k (views into a fused qkv
row, Llama-3 scaled tables, GQA head counts, in place and not); a row's result does not
depend on the batch."""

from __future__ import annotations

import pytest
import torch

from models.layers import RotaryEmbedding, apply_rotary
from tests.models.triton_kernels.row_checks import TOLERANCE, assert_rows_batch_invariant

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def _qkv(tokens: int, heads: int, kv_heads: int, head_dim: int, dtype, device):
    """q, k as views into one [T, (H + 2 KVH) D] projection, and the tables of positions."""
    gen = torch.Generator().manual_seed(tokens * 31 + heads)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    qkv = qkv.to(device)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    positions = torch.randint(0, 4000, (tokens,), generator=gen).to(device)
    cos, sin = RotaryEmbedding(head_dim, 500000.0, LLAMA3).to(device)(positions, dtype)
    return q, k, cos, sin


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens,heads,kv_heads,head_dim", [(1, 4, 2, 16), (5, 3, 1, 24)])
@pytest.mark.parametrize("inplace", [False, True])
def test_equals_apply_rotary(triton_kernels, dtype, tokens, heads, kv_heads, head_dim, inplace):
    from models.triton_kernels.rotary import reference, rotary

    q, k, cos, sin = _qkv(tokens, heads, kv_heads, head_dim, dtype, triton_kernels)
    want_q, want_k = apply_rotary(q, (cos, sin)), apply_rotary(k, (cos, sin))
    assert all(map(torch.equal, reference(q, k, cos, sin), (want_q, want_k)))
    got_q, got_k = rotary(q, k, cos, sin, inplace=inplace)
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(got_q, want_q, rtol=rtol, atol=atol)
    torch.testing.assert_close(got_k, want_k, rtol=rtol, atol=atol)
    if inplace:  # written back into the projection's views
        assert got_q is q and torch.equal(q, got_q) and got_k is k
    else:
        assert not torch.equal(q, got_q)  # the input is left as it was


def test_a_row_does_not_depend_on_the_batch(triton_kernels) -> None:
    from models.triton_kernels.rotary import rotary

    q, k, cos, sin = _qkv(6, 4, 2, 32, torch.bfloat16, triton_kernels)
    assert_rows_batch_invariant(lambda *a: torch.cat(rotary(*a), dim=1), q, k, cos, sin)
