"""The CPU paged attention kernel (one query per row) equals the float64 reference attention
for float32, bfloat16 and float16 across GQA ratios (1, 3, all heads on one KV head), block
sizes (1, 4, 16), head dims (64, 128 and odd ones that leave partial vectors), uneven seq_lens
crossing block boundaries, sliding windows, scores that keep rising (the online softmax's
rescaling) and the split-keys path of small batches.

The extension is compiled on first use (~45 s cold, cached afterwards); without a compiler
the tests that need it fail loudly rather than skip, since is_available() must then be False
for a reason the log states."""

from __future__ import annotations

import pytest
import torch

from models.attention import reference_attention
from models.cpu_kernels.paged_attention import is_available, paged_decode_attention

pytestmark = pytest.mark.cpu_kernels  # skipped off the CPU (tests/conftest.py)

HEAD_DIM = 64


def run_case(heads, kv_heads, block_size, seq_lens, window, dtype, head_dim=HEAD_DIM, drift=0.0):
    """Scatters each sequence's K/V into shuffled blocks, returns (kernel out, reference out).
    drift > 0 adds drift * position to every key, so scores climb along the sequence."""
    torch.manual_seed(0)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3  # spare blocks hold garbage the kernel must not read
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim).to(dtype) * 100
    v_cache = torch.randn_like(k_cache) * 100
    free = torch.randperm(num_blocks).tolist()
    width = max(blocks_per_seq) + 1  # padded tables, as AttentionMetadata builds them
    tables = torch.zeros(len(seq_lens), width, dtype=torch.int64)
    qs, expected = [], []
    for i, n in enumerate(seq_lens):
        table = [free.pop() for _ in range(blocks_per_seq[i])]
        tables[i, : len(table)] = torch.tensor(table)
        k = torch.randn(n, kv_heads, head_dim) + drift * torch.arange(n).view(n, 1, 1)
        k = k.to(dtype)
        v = torch.randn(n, kv_heads, head_dim).to(dtype)
        for t in range(n):
            k_cache[table[t // block_size], t % block_size] = k[t]
            v_cache[table[t // block_size], t % block_size] = v[t]
        q = torch.randn(1, heads, head_dim)
        if drift:  # positive q . 1 so the drift raises the scores
            q = q.abs()
        q = q.to(dtype)
        qs.append(q)
        expected.append(
            reference_attention(q.float(), k.float(), v.float(), head_dim**-0.5, window)
        )
    lens = torch.tensor(seq_lens, dtype=torch.int64)
    out = paged_decode_attention(
        torch.cat(qs), k_cache, v_cache, tables, lens, head_dim**-0.5, window
    )
    return out, torch.cat(expected)


def test_kernel_builds_on_this_cpu() -> None:
    assert is_available(), "the extension failed to build; see the logged reason"


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3), (6, 1)])
@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("window", [None, 5])
def test_float32_equals_reference(heads, kv_heads, block_size, window) -> None:
    # 1 token, exactly one block, one past a block edge, long enough for several key chunks.
    out, expected = run_case(heads, kv_heads, block_size, [1, 16, 17, 3, 70], window, torch.float32)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3), (6, 1)])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_bfloat16_equals_reference(heads, kv_heads, block_size) -> None:
    out, expected = run_case(heads, kv_heads, block_size, [2, 15, 33, 64], None, torch.bfloat16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("window", [None, 300])
def test_split_keys_path_equals_reference(window) -> None:
    # One long sequence (fewer sequences than 2 x threads) is cut into several key ranges of
    # >= 256 keys whose partial softmaxes get merged.
    torch.set_num_threads(2)
    out, expected = run_case(9, 3, 16, [1000], window, torch.float32)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_head_dim_without_compiled_specialisation() -> None:
    out, expected = run_case(4, 2, 4, [9, 30], 7, torch.float32, head_dim=40)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 1e-2), (torch.float16, 2e-3)])
@pytest.mark.parametrize("head_dim", [128, 40, 17])
def test_half_precisions_and_head_dims_equal_reference(dtype, tol, head_dim) -> None:
    # 40 and 17 leave a partial vector (bf16 uses 32-wide groups), 128 is compiled specially.
    out, expected = run_case(9, 3, 16, [1, 17, 40, 300], None, dtype, head_dim=head_dim)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_rising_scores_rescale_the_running_softmax(dtype, tol) -> None:
    # Scores grow by ~1 per key: the running max moves many times within and across chunks.
    out, expected = run_case(4, 2, 16, [40, 200], None, dtype, head_dim=16, drift=0.15)
    torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)


def test_large_batch_with_windows_equals_reference() -> None:
    # Enough sequences for one work item each (no key splitting), windows cut mid-block.
    torch.set_num_threads(2)
    lens = [1 + (37 * i) % 150 for i in range(24)]
    out, expected = run_case(9, 3, 16, lens, 50, torch.bfloat16)
    torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=1e-2)


def test_bad_inputs_raise_actionable_errors() -> None:
    k = torch.zeros(4, 4, 2, 8)
    tables = torch.zeros(1, 2, dtype=torch.int64)
    lens = torch.tensor([3])
    with pytest.raises(ValueError, match="share a dtype"):
        paged_decode_attention(torch.zeros(1, 4, 8, dtype=torch.float64), k, k, tables, lens, 1.0)
    with pytest.raises(ValueError, match="KV heads"):
        paged_decode_attention(torch.zeros(1, 3, 8), k, k, tables, lens, 1.0)
    with pytest.raises(ValueError, match="int64"):
        paged_decode_attention(torch.zeros(1, 4, 8), k, k, tables.int(), lens, 1.0)
    with pytest.raises(RuntimeError, match="block table"):  # seq_len beyond the table
        paged_decode_attention(torch.zeros(1, 4, 8), k, k, tables, torch.tensor([9]), 1.0)
    with pytest.raises(RuntimeError, match="outside the cache"):
        paged_decode_attention(torch.zeros(1, 4, 8), k, k, tables + 7, lens, 1.0)


def test_queries_without_heads_give_an_empty_output() -> None:
    # Degenerate, but a call must not bring the process down (9ad8eb0 divided by the heads'
    # partial size when sizing its row groups: SIGFPE).
    k = torch.zeros(4, 16, 1, 64)
    tables = torch.zeros(3, 4, dtype=torch.int64)
    out = paged_decode_attention(torch.zeros(3, 0, 64), k, k, tables, torch.tensor([5, 6, 7]), 1.0)
    assert out.shape == (3, 0, 64)


def test_not_available_off_cpu() -> None:
    assert not is_available("meta")
