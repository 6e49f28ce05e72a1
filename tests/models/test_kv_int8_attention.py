"""int8 K/V rows (`--kv-cache-dtype int8`, models/kv_quant.py) in the C++ paged attention:

- the rows the C++ append writes are the bits of the PyTorch statement of the layout
  (`quantize_rows`: Walsh-Hadamard-rotated values), and each value they stand for is within
  half a step (s / 2) of what was written;
- on rows with a few large channels (RoPE'd K), the rotated rows' rounding error is less than
  half that of plain per-row rounding (stated in the test: the oracle);
- the kernel reading int8 rows in place equals the float64 reference attention over the
  dequantised K/V (`dequantize_rows`), to the float32 kernel's own tolerance (the int8 rows are
  exact in float32, so only the kernel's float32 arithmetic separates them);
- against the float K/V it was quantised from, the output moves by no more than the bound
  derived from the rows' scales (below);
- a row's output has the same bits alone or in batches of 2..41 (both work splits), and alone
  or among the rows of its prefill chunk (which read the chunk's int8 rows widened).
Each kernel claim holds too for `--kv-cache-dtype int8v` (`half_k`: a float32 model's float16 K
rows, models/kv_half.py, with int8 V rows), whose append writes `to_half_rows` K rows and
`quantize_rows` V rows bit for bit.
The oracle is the float64 reference attention (models/attention.reference_attention)."""

from __future__ import annotations

import math

import pytest
import torch

from models import cpu_kernels
from models.attention import reference_attention
from models.cpu_kernels.paged_attention import paged_decode_attention
from models.kv_half import to_half_rows
from models.kv_quant import SCALE_BYTES, dequantize_rows, quantize_rows

pytestmark = pytest.mark.cpu_kernels  # skipped off the CPU (tests/conftest.py)


def ext():
    built = cpu_kernels.extension()
    assert built is not None, "the C++ kernels must build on this machine"
    return built


# rotation blocks of 8 and 64 values (AVX2: one register, eight)
@pytest.mark.parametrize("head_dim", [40, 64])
def test_the_cpp_append_writes_the_documented_rows_within_half_a_step(head_dim) -> None:
    gen = torch.Generator().manual_seed(1)
    kv_heads, slots = 3, 12
    k = torch.randn(slots, kv_heads, head_dim, generator=gen) * 7
    v = torch.randn(slots, kv_heads, head_dim, generator=gen)
    k[4, 1] = 0.0  # an all-zero row: q = 0, s = 0
    v[5, 2, 7] = 1e-30  # a row whose amax is tiny
    k_cache = torch.full((4, 4, kv_heads, head_dim + SCALE_BYTES), 99, dtype=torch.int8)
    v_cache = k_cache.clone()
    where = torch.randperm(16, generator=gen)[:slots]
    ext().write_kv_int8(k_cache, v_cache, k, v, where)
    for cache, x in ((k_cache, k), (v_cache, v)):
        rows = cache.flatten(0, 1)[where]
        assert torch.equal(rows, quantize_rows(x))
        scale = rows[..., head_dim:].contiguous().view(torch.float32)  # [slots, kvh, 1]
        assert torch.all((dequantize_rows(rows) - x).abs() <= scale / 2 * (1 + 1e-6))
    assert torch.all(dequantize_rows(k_cache.flatten(0, 1)[where][4, 1]) == 0)
    # bf16 rows quantise from their float32 values
    ext().write_kv_int8(k_cache, v_cache, k.bfloat16(), v.bfloat16(), where)
    assert torch.equal(k_cache.flatten(0, 1)[where], quantize_rows(k.bfloat16()))


def test_the_cpp_append_writes_float16_k_and_int8_v_rows_under_int8v() -> None:
    """A float16 K cache beside an int8 V cache: K rows as models/kv_half.py rounds them
    (saturated), V rows as quantize_rows; float32 and bf16 inputs."""
    gen = torch.Generator().manual_seed(2)
    kv_heads, slots, head_dim = 3, 12, 64
    k = torch.randn(slots, kv_heads, head_dim, generator=gen) * 7
    k[3, 0, 5] = 1e6  # past float16's largest finite value: saturated, never inf
    v = torch.randn(slots, kv_heads, head_dim, generator=gen)
    k_cache = torch.full((4, 4, kv_heads, head_dim), 3.0, dtype=torch.float16)
    v_cache = torch.full((4, 4, kv_heads, head_dim + SCALE_BYTES), 99, dtype=torch.int8)
    where = torch.randperm(16, generator=gen)[:slots]
    for x, y in ((k, v), (k.bfloat16(), v.bfloat16())):
        ext().write_kv_int8(k_cache, v_cache, x, y, where)
        assert torch.equal(k_cache.flatten(0, 1)[where], to_half_rows(x))
        assert torch.equal(v_cache.flatten(0, 1)[where], quantize_rows(y))
    assert torch.isfinite(k_cache).all()


def test_the_cpp_append_and_quantize_rows_agree_on_every_row_of_many() -> None:
    """Bit for bit on 80,000 rows, not a dozen: a rounding of 127 / max|y| other than the
    writer's (torch's scalar / tensor is a reciprocal times the scalar) flips a value in a few
    of them (3 of these)."""
    gen = torch.Generator().manual_seed(11)
    slots, kv_heads, head_dim = 20000, 4, 64
    k = torch.randn(slots, kv_heads, head_dim, generator=gen) * 3
    k_cache = torch.zeros(slots // 16, 16, kv_heads, head_dim + SCALE_BYTES, dtype=torch.int8)
    ext().write_kv_int8(k_cache, k_cache.clone(), k, k, torch.arange(slots))
    assert torch.equal(k_cache.flatten(0, 1), quantize_rows(k))


def test_the_rotation_halves_the_rounding_error_of_rows_with_large_channels() -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(512, 64, generator=gen)
    x[:, [5, 37]] *= 20  # two outlier channels, as RoPE'd keys have

    def plain(rows):  # one scale per row, no rotation: round(x * 127 / max|x|) * max|x| / 127
        amax = rows.abs().amax(-1, keepdim=True)
        return torch.round(rows * (127 / amax)) * (amax / 127)

    def rms(e):
        return float(e.pow(2).mean().sqrt())

    rotated = rms(dequantize_rows(quantize_rows(x)) - x)
    assert rotated < 0.5 * rms(plain(x) - x)


def k_rows(half_k: bool):
    """(write, read) of K rows: int8 rows, or int8v's float16 rows (models/kv_half.py)."""
    if half_k:
        return to_half_rows, lambda rows: rows.float()
    return quantize_rows, dequantize_rows


def int8_case(
    heads, kv_heads, block_size, seq_lens, window, q_dtype, head_dim=64, seed=0, half_k=False
):
    """Float K/V quantised into shuffled blocks of an int8 cache (`half_k`: K float16 rows, V
    int8) -> (kernel out, reference over the dequantised K/V, reference over the float K/V, the
    largest V scale and |v|, each row's largest score error E)."""
    gen = torch.Generator().manual_seed(seed)
    write_k, read_k = k_rows(half_k)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3  # spare blocks hold garbage the kernel must not read
    shape = (num_blocks, block_size, kv_heads, head_dim + SCALE_BYTES)
    v_cache = torch.randint(-127, 128, shape, generator=gen, dtype=torch.int8)
    if half_k:
        k_cache = torch.randn(*shape[:3], head_dim, generator=gen).half()
    else:
        k_cache = torch.randint(-127, 128, shape, generator=gen, dtype=torch.int8)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(len(seq_lens), max(blocks_per_seq) + 1, dtype=torch.int64)
    qs, on_int8, on_float, v_scale, v_max, k_err = [], [], [], 0.0, 0.0, []
    for i, n in enumerate(seq_lens):
        table = [free.pop() for _ in range(blocks_per_seq[i])]
        tables[i, : len(table)] = torch.tensor(table)
        k = torch.randn(n, kv_heads, head_dim, generator=gen) * 2
        v = torch.randn(n, kv_heads, head_dim, generator=gen)
        kq, vq = write_k(k), quantize_rows(v)
        for t in range(n):
            k_cache[table[t // block_size], t % block_size] = kq[t]
            v_cache[table[t // block_size], t % block_size] = vq[t]
        q = torch.randn(1, heads, head_dim, generator=gen).to(q_dtype)
        qs.append(q)
        scale = head_dim**-0.5
        on_int8.append(
            reference_attention(q.float(), read_k(kq), dequantize_rows(vq), scale, window)
        )
        on_float.append(reference_attention(q.float(), k, v, scale, window))
        v_scale = max(v_scale, float(vq[..., head_dim:].contiguous().view(torch.float32).max()))
        v_max = max(v_max, float(v.abs().max()))
        # |q . (k - k')| * scale per query head, at most: the score error E of this row
        dk = (read_k(kq) - k).abs().amax(dim=(0, 2))  # [kv_heads]
        group = heads // kv_heads
        k_err.append(
            float((q.float()[0].abs().sum(-1) * dk.repeat_interleave(group)).max() * scale)
        )
    lens = torch.tensor(seq_lens, dtype=torch.int64)
    out = paged_decode_attention(
        torch.cat(qs), k_cache, v_cache, tables, lens, head_dim**-0.5, window
    )
    return out, torch.cat(on_int8), torch.cat(on_float), (v_scale, v_max), k_err


@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (6, 1)])
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("half_k", [False, True], ids=["int8", "int8v"])
def test_int8_rows_equal_the_reference_over_their_dequantised_values(
    heads, kv_heads, block_size, window, half_k
) -> None:
    # one token, a block edge, several key chunks, and a context of two key ranges (> 256)
    lens = [1, 16, 17, 70, 300]
    out, want, _, _, _ = int8_case(
        heads, kv_heads, block_size, lens, window, torch.float32, half_k=half_k
    )
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head_dim", [40, 128])
def test_int8_rows_with_bf16_queries_and_other_head_dims(head_dim) -> None:
    """bf16 q (the C++ step's bf16 models), a head_dim with partial vectors, and the 128 one."""
    out, want, _, _, _ = int8_case(8, 2, 16, [3, 33, 64], None, torch.bfloat16, head_dim)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), want, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("head_dim", [40, 128])
def test_int8v_rows_with_other_head_dims(head_dim) -> None:
    """float16 K with int8 V rows: a head_dim with partial vectors, and the 128 one."""
    out, want, _, _, _ = int8_case(
        8, 2, 16, [3, 33, 64], None, torch.float32, head_dim, half_k=True
    )
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("half_k", [False, True], ids=["int8", "int8v"])
def test_int8_output_stays_within_the_bound_its_scales_give(half_k) -> None:
    """Against the float K/V: V rounding moves a convex combination of V rows by at most
    max s_v / 2; a score error of at most E moves each softmax weight by a factor in
    [e^-2E, e^2E], so the output moves by at most (e^2E - 1) max|v| more."""
    out, _, on_float, (v_scale, v_max), k_err = int8_case(
        6, 2, 16, [40, 200], None, torch.float32, half_k=half_k
    )
    for row in range(out.shape[0]):
        bound = v_scale / 2 + math.expm1(2 * k_err[row]) * v_max + 1e-5  # + float32's own
        assert float((out[row] - on_float[row]).abs().max()) <= bound


@pytest.mark.parametrize("half_k", [False, True], ids=["int8", "int8v"])
def test_an_int8_row_does_not_depend_on_the_batch(half_k) -> None:
    gen = torch.Generator().manual_seed(5)
    rows, max_len, block_size, kv_heads, head_dim = 41, 700, 16, 3, 64
    blocks = -(-max_len // block_size)
    shape = (blocks * rows, block_size, kv_heads, head_dim)
    k_cache = k_rows(half_k)[0](torch.randn(shape, generator=gen))
    v_cache = quantize_rows(torch.randn(shape, generator=gen))
    tables = torch.arange(blocks * rows, dtype=torch.int64).view(rows, blocks)
    lens = [650] + torch.randint(1, max_len, (rows - 1,), generator=gen).tolist()
    q = torch.randn(rows, 9, head_dim, generator=gen)
    solo = None
    for batch in (1, 2, 3, 8, rows):  # both work splits: key ranges, and whole rows
        out = paged_decode_attention(
            q[:batch].contiguous(), k_cache, v_cache, tables[:batch].contiguous(),
            torch.tensor(lens[:batch]), head_dim**-0.5,
        )  # fmt: skip
        solo = out[0] if solo is None else solo
        assert torch.equal(out[0], solo), f"batch of {batch}"


@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (5, 1), (4, 4)])
@pytest.mark.parametrize("half_k", [False, True], ids=["int8", "int8v"])
def test_a_prefill_chunks_int8_rows_equal_each_row_alone(heads, kv_heads, half_k) -> None:
    """Consecutive rows of one sequence (a prefill chunk: groups of up to 8 rows read each K/V
    chunk together, its int8 rows widened once into L1) give each row the bits it gets alone
    (its rows read in place); heads per KV head 3, 5 (4 + 1) and 1."""
    gen = torch.Generator().manual_seed(7)
    length, chunk, block_size, head_dim = 300, 11, 16, 64
    blocks = -(-length // block_size)
    shape = (blocks + 2, block_size, kv_heads, head_dim)
    k_cache = k_rows(half_k)[0](torch.randn(shape, generator=gen) * 3)
    v_cache = quantize_rows(torch.randn(shape, generator=gen))
    table = torch.randperm(blocks + 2, generator=gen)[:blocks].view(1, blocks)
    q = torch.randn(chunk, heads, head_dim, generator=gen)
    lens = torch.arange(length - chunk + 1, length + 1)
    together = paged_decode_attention(
        q, k_cache, v_cache, table.expand(chunk, blocks).contiguous(), lens, head_dim**-0.5
    )
    for row in range(chunk):
        alone = paged_decode_attention(
            q[row : row + 1], k_cache, v_cache, table, lens[row : row + 1], head_dim**-0.5
        )
        assert torch.equal(together[row], alone[0]), f"row {row}"


def test_int8_caches_refuse_what_the_kernel_cannot_read() -> None:
    q = torch.randn(1, 4, 64)
    cache = torch.zeros(2, 4, 2, 64 + SCALE_BYTES, dtype=torch.int8)
    tables, lens = torch.zeros(1, 1, dtype=torch.int64), torch.ones(1, dtype=torch.int64)
    with pytest.raises(ValueError, match="int8 K/V caches are read with q in"):
        paged_decode_attention(q.half(), cache, cache, tables, lens, 0.125)
    with pytest.raises(ValueError, match="KV heads of 64 elements"):
        short = torch.zeros(2, 4, 2, 64, dtype=torch.int8)  # no room for the scales
        paged_decode_attention(q, short, short, tables, lens, 0.125)
    half = torch.zeros(2, 4, 2, 64, dtype=torch.float16)  # int8v: float16 K, int8 V rows
    with pytest.raises(ValueError, match="read with a float32 q"):
        paged_decode_attention(q.bfloat16(), half, cache, tables, lens, 0.125)
    with pytest.raises(ValueError, match="equal caches"):  # int8 V rows without their scales
        paged_decode_attention(q, half, torch.zeros_like(half, dtype=torch.int8), tables, lens, 0.1)
