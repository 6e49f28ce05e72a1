"""float16 K/V rows of a float32 model (`--kv-cache-dtype float16`, models/kv_half.py) in the
C++ paged attention:

- the rounding every writer applies is torch's `.to(torch.float16)` (nearest, ties to even)
  wherever that is finite, and saturates at +-65504 where torch's overflows (hand-worked ties,
  the largest finite value, NaN);
- the kernel reading float16 rows in place gives the float32 kernel's bits over the same rows
  rounded and stored as float32 (the widening is exact, the order the float32 one): decode rows
  (block edges, several chunks, two key ranges, a window), a prefill chunk's rows (which read
  the chunk's rows widened once into L1), head dims 40 and 128; and both equal the float64
  reference attention over the rounded rows to float32's tolerance;
- a row's output has the same bits alone or in batches of 2..41 (both work splits; the
  invariance test of tests/models/test_cpu_kernel_invariance.py over float16 rows).
Oracles: the float32 kernel (itself held to the float64 reference and to batch invariance by
tests/models/test_cpu_paged_attention.py and test_cpu_kernel_invariance.py), the float64
reference (models/attention.reference_attention), torch's float16 conversion."""

from __future__ import annotations

import pytest
import torch

from models.attention import reference_attention
from models.cpu_kernels.paged_attention import paged_decode_attention
from models.kv_half import HALF_MAX, to_half_rows
from tests.models import test_cpu_kernel_invariance as invariance

pytestmark = pytest.mark.cpu_kernels  # skipped off the CPU (tests/conftest.py)


def test_the_rounding_is_torchs_nearest_even_and_saturates_past_the_largest_half() -> None:
    one = 1.0
    ties = torch.tensor([one + 2**-11, one + 3 * 2**-11, -(one + 2**-11)])  # halfway cases
    assert to_half_rows(ties).tolist() == [1.0, 1.0 + 2**-9, -1.0]  # to the even neighbour
    x = torch.tensor([65504.0, 65519.0, 65520.0, 1e6, -7e4, -float("inf"), float("inf")])
    got = to_half_rows(x)
    assert got.dtype == torch.float16
    assert got.tolist() == [HALF_MAX, HALF_MAX, HALF_MAX, HALF_MAX, -HALF_MAX, -HALF_MAX, HALF_MAX]
    assert torch.isinf(x[2:3].to(torch.float16)).all()  # where torch's own conversion overflows
    assert torch.isnan(to_half_rows(torch.tensor([float("nan")]))).all()
    gen = torch.Generator().manual_seed(0)
    finite = torch.randn(4096, generator=gen) * torch.logspace(-9, 4, 4096)  # subnormals too
    assert torch.equal(to_half_rows(finite), finite.to(torch.float16))
    assert torch.equal(to_half_rows(finite.bfloat16()), finite.bfloat16().to(torch.float16))


def half_case(heads, kv_heads, block_size, seq_lens, window, head_dim=64, seed=0, rows=None):
    """Float32 K/V rounded into shuffled blocks of a float16 cache, each sequence's queries its
    last `rows[i]` tokens (default 1: decode rows) -> (kernel out over the float16 cache, the
    float32 kernel over the rounded rows as float32, the float64 reference over them)."""
    gen = torch.Generator().manual_seed(seed)
    rows = rows or [1] * len(seq_lens)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3  # spare blocks hold garbage the kernel must not read
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k16 = to_half_rows(torch.randn(shape, generator=gen) * 3)
    v16 = to_half_rows(torch.randn(shape, generator=gen))
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables, lens, qs, want = [], [], [], []
    width = max(blocks_per_seq) + 1
    for n, r, nb in zip(seq_lens, rows, blocks_per_seq, strict=True):
        table = torch.tensor([free.pop() for _ in range(nb)] + [0] * (width - nb))
        q = torch.randn(r, heads, head_dim, generator=gen)
        keys = torch.arange(n)
        k_seq = k16[table[keys // block_size], keys % block_size].float()
        v_seq = v16[table[keys // block_size], keys % block_size].float()
        want.append(reference_attention(q, k_seq, v_seq, head_dim**-0.5, window))
        tables.append(table.expand(r, width))
        lens.append(torch.arange(n - r + 1, n + 1))
        qs.append(q)
    args = (torch.cat(tables).contiguous(), torch.cat(lens), head_dim**-0.5, window)
    q = torch.cat(qs)
    out = paged_decode_attention(q, k16, v16, *args)
    as_float = paged_decode_attention(q, k16.float(), v16.float(), *args)
    return out, as_float, torch.cat(want)


@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (6, 1)])
@pytest.mark.parametrize("block_size,window", [(1, None), (16, 5)])
def test_float16_rows_give_the_float32_bits_over_the_rounded_rows(
    heads, kv_heads, block_size, window
) -> None:
    # one token, a block edge, several key chunks, and a context of two key ranges (> 256)
    out, as_float, want = half_case(heads, kv_heads, block_size, [1, 16, 17, 70, 300], window)
    assert out.dtype == torch.float32
    assert torch.equal(out, as_float)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head_dim", [40, 128])
def test_a_prefill_chunk_over_float16_rows_gives_the_float32_bits(head_dim) -> None:
    """Rows of one sequence attend to each chunk together (their V rows widened once into L1),
    head dims without (40) and with (128) a compiled specialisation."""
    out, as_float, want = half_case(8, 2, 16, [300, 45], None, head_dim, seed=1, rows=[37, 9])
    assert torch.equal(out, as_float)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 300])
def test_a_float16_row_does_not_depend_on_the_batch(window) -> None:
    invariance.test_an_attention_row_does_not_depend_on_the_batch(
        torch.float32, window, cache_dtype=torch.float16
    )


def test_float16_caches_refuse_queries_the_kernel_cannot_read() -> None:
    cache = torch.zeros(2, 4, 2, 64, dtype=torch.float16)
    tables, lens = torch.zeros(1, 1, dtype=torch.int64), torch.ones(1, dtype=torch.int64)
    with pytest.raises(ValueError, match="or float32 q, float16 caches"):
        paged_decode_attention(torch.randn(1, 4, 64).bfloat16(), cache, cache, tables, lens, 0.1)
    with pytest.raises(ValueError, match="or float32 q, float16 caches"):
        paged_decode_attention(torch.randn(1, 4, 64), cache, cache.float(), tables, lens, 0.1)
