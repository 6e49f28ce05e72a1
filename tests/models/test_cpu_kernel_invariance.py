"""Batch invariance of the C++ CPU kernels (issue #14): a row's output has the same bits whatever
M is and whatever the other rows hold — for the packed linear kernel (every M, odd K, bias,
float32 or bfloat16 out), the paged attention (both work splits: few rows cut into key ranges,
many rows whole; contexts spanning several ranges; sliding windows), and the whole C++ step (a
sequence alone vs beside others, a prompt in one chunk vs several: same logits, same K/V bits).

The oracles are the same computation run solo (the bits must match exactly) and a float64
matmul (the packed kernel's values, to float32-accumulation tolerance)."""

from __future__ import annotations

import pytest
import torch

from models import cpu_kernels
from models.attention import reference_attention
from models.cpu_kernels.fused_decoder import FusedDecoder
from models.cpu_kernels.paged_attention import paged_decode_attention
from tests.checkpoints import VOCAB, make_hf_model
from tests.models.paged_driver import PagedDriver
from tests.models.test_fused_decoder import ours_from, prompts

pytestmark = pytest.mark.cpu_kernels  # skipped off the CPU (tests/conftest.py)

DTYPES = [torch.float32, torch.bfloat16]


def ext():
    built = cpu_kernels.extension()
    assert built is not None, "the C++ kernels must build on this machine"
    return built


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(37, 5), (64, 96), (200, 577)])
def test_packed_linear_equals_a_float64_matmul(dtype: torch.dtype, n: int, k: int) -> None:
    gen = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=gen).to(dtype)
    bias = torch.randn(n, generator=gen).to(dtype)
    x = torch.randn(9, k, generator=gen).to(dtype)
    got = ext().linear(x, ext().pack_linear(w), bias, n, True)
    want = x.double() @ w.double().T + bias.double()
    torch.testing.assert_close(got.double(), want, atol=1e-5 * k**0.5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("float_out", [True, False])
@pytest.mark.parametrize("n,k", [(48, 64), (100, 577), (960, 576)])
def test_a_packed_linear_row_does_not_depend_on_the_other_rows(
    dtype: torch.dtype, float_out: bool, n: int, k: int
) -> None:
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(n, k, generator=gen).to(dtype)
    bias = torch.randn(n, generator=gen).to(dtype)
    packed = ext().pack_linear(w)
    x = torch.randn(1, k, generator=gen).to(dtype)
    solo = ext().linear(x, packed, bias, n, float_out)[0]
    for m in (2, 5, 6, 7, 13, 64, 301):  # every register-tile remainder, and large M
        others = torch.randn(m, k, generator=gen).to(dtype) * 10
        row = int(torch.randint(m, (1,), generator=gen))
        others[row] = x[0]
        got = ext().linear(others, packed, bias, n, float_out)[row]
        assert torch.equal(got, solo), f"M={m}, row {row}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(100, 577), (960, 576), (37, 1537)])
def test_every_row_of_a_prefill_sized_call_equals_its_solo_row(
    dtype: torch.dtype, n: int, k: int
) -> None:
    """M = 2048 spans many of the kernel's L2 row blocks (their size depends on K) and splits
    between threads mid-walk: rows at every block and share boundary, and a random sample, equal
    the same row computed alone, bitwise; all rows match a float64 matmul."""
    gen = torch.Generator().manual_seed(n * k)
    w = torch.randn(n, k, generator=gen).to(dtype)
    bias = torch.randn(n, generator=gen).to(dtype)
    packed = ext().pack_linear(w)
    m = 2048
    x = torch.randn(m, k, generator=gen).to(dtype)
    got = ext().linear(x, packed, bias, n, False)
    want = x.double() @ w.double().T + bias.double()
    tol = 1e-5 * k**0.5 if dtype == torch.float32 else 1e-2 * k**0.5
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=1e-2)
    edges = {r for b in range(6, m, 6) for r in (b - 1, b)}  # every pass (and so block) edge
    rows = sorted(edges | set(torch.randint(m, (64,), generator=gen).tolist()))
    for r in rows:
        solo = ext().linear(x[r : r + 1].contiguous(), packed, bias, n, False)[0]
        assert torch.equal(got[r], solo), f"row {r}"


MAX_ROWS, MAX_LEN = 41, 900


def _attention_call(q_rows, lens, window, dtype, kv_heads=3, block_size=16, cache_dtype=None):
    """Runs the kernel over the first rows of one fixed random cache (of `dtype`, or
    `cache_dtype`: a float32 model's float16 rows): row i always reads the same blocks,
    whatever the batch."""
    gen = torch.Generator().manual_seed(3)
    head_dim, blocks = q_rows.shape[-1], -(-MAX_LEN // block_size)
    cache_shape = (blocks * MAX_ROWS, block_size, kv_heads, head_dim)
    k_cache = torch.randn(cache_shape, generator=gen).to(cache_dtype or dtype)
    v_cache = torch.randn(cache_shape, generator=gen).to(cache_dtype or dtype)
    tables = torch.arange(blocks * MAX_ROWS, dtype=torch.int64).view(MAX_ROWS, blocks)
    tables = tables[: len(lens)].contiguous()
    lens_t = torch.tensor(lens, dtype=torch.int64)
    return paged_decode_attention(q_rows, k_cache, v_cache, tables, lens_t, head_dim**-0.5, window)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [None, 300])
def test_an_attention_row_does_not_depend_on_the_batch(
    dtype: torch.dtype, window, cache_dtype: torch.dtype | None = None
) -> None:
    gen = torch.Generator().manual_seed(5)
    # Row 0's context spans several key ranges; the batch sizes take both work splits.
    lens = [700] + torch.randint(1, MAX_LEN, (MAX_ROWS - 1,), generator=gen).tolist()
    q = torch.randn(len(lens), 9, 64, generator=gen).to(dtype)
    solo = None
    for batch in (1, 2, 3, 8, MAX_ROWS):
        # Row 0 is the same query over the same blocks (block ids are per row index).
        out = _attention_call(
            q[:batch].contiguous(), lens[:batch], window, dtype, cache_dtype=cache_dtype
        )
        if solo is None:
            solo = out[0]
        assert torch.equal(out[0], solo), f"batch of {batch}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [None, 300])
def test_a_prefill_row_gives_the_same_bits_whichever_rows_share_its_group(dtype, window) -> None:
    """A prefill chunk's rows (one sequence: the same block table, consecutive lengths) attend
    to each K/V chunk together, up to 32 at a time: every row equals its solo call, for chunks
    of 1 to 300 rows starting anywhere (at two threads: 10 groups shared out whole, 3 groups
    split by key range), contexts of several key ranges; and the float64 reference."""
    gen = torch.Generator().manual_seed(8)
    heads, kv_heads, head_dim, block_size = 6, 2, 64, 16
    seq_len, chunk = 700, 300
    blocks = -(-seq_len // block_size)
    k_cache = torch.randn(blocks + 2, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(blocks + 2, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    table = torch.randperm(blocks + 2, generator=gen)[:blocks].view(1, blocks)
    q = torch.randn(chunk, heads, head_dim, generator=gen).to(dtype)
    lens = torch.arange(seq_len - chunk + 1, seq_len + 1)  # row i: the token at lens[i] - 1
    scale = head_dim**-0.5

    def call(rows: slice) -> torch.Tensor:
        n = len(range(*rows.indices(chunk)))
        tables = table.expand(n, blocks).contiguous()
        return paged_decode_attention(q[rows].contiguous(), k_cache, v_cache, tables,
                                      lens[rows].contiguous(), scale, window)  # fmt: skip

    solo = [call(slice(i, i + 1))[0] for i in range(chunk)]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the kernel's work split depends on the thread count
    try:
        for rows in (slice(0, chunk), slice(3, 70), slice(5, 6), slice(2, 290)):
            out = call(rows)
            for i, row in zip(range(*rows.indices(chunk)), out, strict=True):
                assert torch.equal(row, solo[i]), (rows, i)
    finally:
        torch.set_num_threads(threads)
    keys = torch.arange(seq_len)
    k_seq = k_cache[table[0, keys // block_size], keys % block_size].float()
    v_seq = v_cache[table[0, keys // block_size], keys % block_size].float()
    want = reference_attention(q.float(), k_seq, v_seq, scale, window)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(torch.stack(solo).float(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_the_cpp_step_gives_a_sequence_the_same_bits_alone_or_batched(
    dtype, arch, kv_cache_dtype: str = "auto"
) -> None:
    """The same prompt, prefilled alone in one chunk, or in chunks of 3 beside other
    sequences' prefills and decodes: identical logits and identical K/V in the cache (of the
    model's dtype, or int8 rows: tests/models/test_kv_int8_model.py)."""
    ours = ours_from(make_hf_model(arch), dtype)
    tokens = prompts((11, 5, 17, 9), seed=4)
    alone = PagedDriver(ours, block_size=4, kv_cache_dtype=kv_cache_dtype)
    busy = PagedDriver(ours, block_size=4, kv_cache_dtype=kv_cache_dtype)
    fused_alone, fused_busy = FusedDecoder.build(ours, alone.kv), FusedDecoder.build(ours, busy.kv)
    seq = alone.add_sequence()
    want = alone.step({seq: tokens[0]}, fused=fused_alone)[seq]
    seqs = [busy.add_sequence() for _ in tokens]
    busy.step({s: tokens[s] for s in seqs[1:]}, fused=fused_busy)  # others' prefills first
    gen = torch.Generator().manual_seed(9)
    got = []
    for start in range(0, len(tokens[0]), 3):
        decodes = {s: [int(torch.randint(3, VOCAB, (1,), generator=gen))] for s in seqs[1:]}
        out = busy.step({seqs[0]: tokens[0][start : start + 3], **decodes}, fused=fused_busy)
        got.append(out[seqs[0]])
    assert torch.equal(torch.cat(got), want)
    # Then decodes: alone vs beside the others, token by token.
    for _ in range(4):
        nxt = [int(want[-1].argmax())]
        want = alone.step({seq: nxt}, fused=fused_alone)[seq]
        decodes = {s: [int(torch.randint(3, VOCAB, (1,), generator=gen))] for s in seqs[1:]}
        got_row = busy.step({seqs[0]: nxt, **decodes}, fused=fused_busy)[seqs[0]]
        assert torch.equal(got_row, want)
    for (k_a, v_a), (k_b, v_b) in zip(alone.kv, busy.kv, strict=True):
        a_slots = _slots(alone, seq)
        b_slots = _slots(busy, seqs[0])
        assert torch.equal(k_a.flatten(0, 1)[a_slots], k_b.flatten(0, 1)[b_slots])
        assert torch.equal(v_a.flatten(0, 1)[a_slots], v_b.flatten(0, 1)[b_slots])


def _slots(driver: PagedDriver, seq: int) -> torch.Tensor:
    """Flat cache slots of a sequence's tokens, in order."""
    bs = driver.block_size
    return torch.tensor(
        [driver.tables[seq][t // bs] * bs + t % bs for t in range(driver.lens[seq])]
    )


@pytest.mark.parametrize("float_out", [True, False])
def test_int8_weights_equal_their_dequantised_matmul_and_keep_rows_invariant(float_out) -> None:
    """Weight-only int8 (one scale per output row): the values of a float64 matmul over the
    dequantised weights, and the same bits for a row whatever else is in the batch."""
    gen = torch.Generator().manual_seed(11)
    n, k = 100, 577
    q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    scales = torch.rand(n, generator=gen) / 100
    bias = torch.randn(n, generator=gen).bfloat16()
    packed = ext().pack_linear(q)
    x = torch.randn(7, k, generator=gen).bfloat16()
    got = ext().linear(x, packed, bias, n, True, scales)
    want = x.double() @ (q.double() * scales.double()[:, None]).T + bias.double()
    torch.testing.assert_close(got.double(), want, atol=1e-5 * k**0.5, rtol=1e-5)
    solo = ext().linear(x[:1], packed, bias, n, float_out, scales)[0]
    for m in (2, 6, 13, 64):
        others = torch.randn(m, k, generator=gen).bfloat16()
        others[m - 1] = x[0]
        assert torch.equal(ext().linear(others, packed, bias, n, float_out, scales)[m - 1], solo)
