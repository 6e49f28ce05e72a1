"""The PyTorch path's kernels give a row the same bits whatever else is in the batch (issue
#14): the padded-row linear, the position-independent activations and the key-block
attention, each against the same row computed alone or elsewhere; the attention also
against the float64 reference. These pin library properties the design relies on (see
models/linear_backend.py and models/block_attention.py): a torch upgrade that breaks one
fails here."""

from __future__ import annotations

import os
import random

import pytest
import torch
import torch.nn.functional as F

from models import pointwise
from models.attention import (
    AttentionMetadata,
    layer_attention,
    paged_attention,
    reference_attention,
    write_kv,
)
from models.block_attention import KEY_BLOCK, tile_rows
from models.linear_backend import invariant_linear

# (in, out) of the tiny test checkpoints and of SmolLM2-135M's layers
SHAPES = [(96, 112), (112, 96), (96, 320), (576, 960), (1536, 576)]
ROW_COUNTS = [1, 2, 3, 4, 5, 7, 8, 9, 16, 23, 64, 100, 257]


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_a_linear_row_is_the_same_whatever_the_other_rows(dtype, shape, threads) -> None:
    k, n = shape
    gen = torch.Generator().manual_seed(k * n)
    weight = torch.randn(n, k, generator=gen).to(dtype)
    bias = torch.randn(n, generator=gen).to(dtype)
    row = torch.randn(k, generator=gen).to(dtype)
    rng = random.Random(0)
    for use_bias in (False, True):
        b = bias if use_bias else None
        want = invariant_linear(row.view(1, k), weight, b)[0]
        for num_threads in (1, 2, 4, 16):
            threads(num_threads)
            for m in ROW_COUNTS:
                x = torch.randn(m, k, generator=gen).to(dtype)
                at = rng.randrange(m)
                x[at] = row
                got = invariant_linear(x, weight, b)
                assert torch.equal(got[at], want), (num_threads, m, at, use_bias)
    torch.testing.assert_close(
        want.float(), F.linear(row.view(1, k), weight, bias)[0].float(), rtol=2e-2, atol=2e-2
    )


def _softcap(t: torch.Tensor) -> torch.Tensor:
    return pointwise.softcap(t, 3.0)


@pytest.mark.parametrize("fn", [pointwise.silu, pointwise.gelu_tanh, pointwise.gelu_erf, _softcap])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_activation_does_not_depend_on_where_the_element_sits(fn, dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(20_000, generator=gen) * 4).to(dtype)
    whole = fn(x)
    for length in (1, 7, 31, 33, 63, 65, 127, 1000):
        for start in (0, 1, 5, 17, 40):
            assert torch.equal(fn(x[start : start + length]), whole[start : start + length])
    torch_fn = {
        pointwise.silu: F.silu,
        pointwise.gelu_tanh: lambda t: F.gelu(t, approximate="tanh"),
        pointwise.gelu_erf: F.gelu,
        _softcap: lambda t: 3.0 * torch.tanh(t / 3.0),
    }[fn]
    tol = 1e-6 if dtype is torch.float32 else 1e-2
    torch.testing.assert_close(whole.float(), torch_fn(x).float(), rtol=tol, atol=tol)


class Sequences:
    """Random K/V of a few sequences, written into a paged cache with any block size, and
    one step's attention over any choice of (sequence, first new position, new tokens)."""

    def __init__(self, lengths, kv_heads, head_dim, dtype, seed=0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.kv_heads, self.head_dim, self.dtype = kv_heads, head_dim, dtype
        self.k = [torch.randn(n, kv_heads, head_dim, generator=gen).to(dtype) for n in lengths]
        self.v = [torch.randn(n, kv_heads, head_dim, generator=gen).to(dtype) for n in lengths]

    def attend(self, q, rows, block_size, window=None, seed=0, junk=True):
        """rows: (seq, start, count) per sequence of the step, q [sum count, H, D]."""
        total_blocks = sum(-(-(s + c) // block_size) for _, s, c in rows) + 3
        shape = (total_blocks, block_size, self.kv_heads, self.head_dim)
        fill = torch.full if junk else (lambda shape, _v, dtype: torch.zeros(shape, dtype=dtype))
        k_cache, v_cache = fill(shape, 1e4, dtype=self.dtype), fill(shape, -1e4, dtype=self.dtype)
        free = list(range(total_blocks))
        random.Random(seed).shuffle(free)
        tables, seq_lens, query_lens = [], [], []
        for seq, start, count in rows:
            end = start + count
            table = [free.pop() for _ in range(-(-end // block_size))]
            meta = AttentionMetadata.build([table], [end], [end], block_size)
            write_kv((k_cache, v_cache), self.k[seq][:end], self.v[seq][:end], meta.slot_mapping)
            tables.append(table)
            seq_lens.append(end)
            query_lens.append(count)
        meta = AttentionMetadata.build(
            tables, seq_lens, query_lens, block_size, sliding_window=window
        )
        return paged_attention(q, (k_cache, v_cache), meta, self.head_dim**-0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [(6, 2), (4, 4), (4, 1), (9, 3)])
@pytest.mark.parametrize("window", [None, 100])
def test_an_attention_row_is_the_same_however_the_step_is_made(dtype, heads, window) -> None:
    num_heads, kv_heads = heads
    lengths = [300, 150, 40, 270]
    seqs = Sequences(lengths, kv_heads, 16, dtype)
    gen = torch.Generator().manual_seed(2)
    qs = [torch.randn(n, num_heads, 16, generator=gen).to(dtype) for n in lengths]
    rng = random.Random(3)

    def step(rows, block_size):
        q = torch.cat([qs[s][start : start + c] for s, start, c in rows])
        out = seqs.attend(q, rows, block_size, window, seed=rng.randrange(99))
        return {(s, pos): out[r] for r, (s, pos) in enumerate(_flat(rows))}

    # The token at position 260 of sequence 0, computed as a decode alone, as a decode among
    # others, and inside prefill chunks that start at different places.
    target = (0, 260)
    ways = [
        [(0, 260, 1)],
        [(1, 149, 1), (0, 260, 1), (3, 100, 1), (2, 39, 1)],
        [(2, 0, 40), (0, 250, 20)],
        [(0, 0, 261)],
        [(3, 5, 100), (0, 257, 9), (1, 140, 1)],
    ]
    results = []
    for rows in ways:
        for block_size in (1, 4, 16, 32):
            results.append(step(rows, block_size)[target])
    for r in results[1:]:
        assert torch.equal(r, results[0])
    k, v = seqs.k[0][:261], seqs.v[0][:261]
    want = reference_attention(qs[0][260:261].double(), k, v, 16**-0.5, window)[0]
    tol = 1e-5 if dtype is torch.float32 else 2e-2
    torch.testing.assert_close(results[0].double(), want, rtol=tol, atol=tol)


def _flat(rows):
    """(seq, position) of every row of a step's (seq, start, count) list, in row order."""
    return [(s, start + i) for s, start, c in rows for i in range(c)]


@pytest.mark.parametrize("window", [None, 7, 200])
def test_key_block_attention_equals_the_reference_across_many_blocks(window) -> None:
    lengths = [3 * KEY_BLOCK + 5, 2 * KEY_BLOCK, 9]
    seqs = Sequences(lengths, 2, 16, torch.float32)
    gen = torch.Generator().manual_seed(4)
    rows = [(0, KEY_BLOCK - 3, 2 * KEY_BLOCK + 8), (1, 2 * KEY_BLOCK - 1, 1), (2, 0, 9)]
    qs = [torch.randn(c, 6, 16, generator=gen) for _, _, c in rows]
    out = seqs.attend(torch.cat(qs), rows, block_size=16, window=window)
    want = torch.cat(
        [
            reference_attention(q, seqs.k[s][: start + c], seqs.v[s][: start + c], 0.25, window)
            for q, (s, start, c) in zip(qs, rows, strict=True)
        ]
    )
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [None, 7])
def test_layer_attention_windows_and_caps_equal_the_reference(window) -> None:
    """Gemma's per-layer attention: its own window (not the metadata's) and capped scores."""
    seqs = Sequences([KEY_BLOCK + 20, 9], 2, 16, torch.float32)
    rows = [(0, 3, KEY_BLOCK + 17), (1, 8, 1)]
    total = sum(-(-(s + c) // 16) for _, s, c in rows)
    k_cache = torch.zeros(total, 16, 2, 16)
    v_cache = torch.zeros_like(k_cache)
    tables = [list(range(total - 1)), [total - 1]]
    for (seq, start, count), table in zip(rows, tables, strict=True):
        meta = AttentionMetadata.build([table], [start + count], [start + count], 16)
        write_kv(
            (k_cache, v_cache),
            seqs.k[seq][: start + count],
            seqs.v[seq][: start + count],
            meta.slot_mapping,
        )
    meta = AttentionMetadata.build(
        tables, [s + c for _, s, c in rows], [c for *_, c in rows], 16, sliding_window=3
    )
    gen = torch.Generator().manual_seed(5)
    qs = [torch.randn(c, 6, 16, generator=gen) * 3 for *_, c in rows]
    out = layer_attention(torch.cat(qs), (k_cache, v_cache), meta, 0.25, window, 2.0)
    want = torch.cat(
        [
            reference_attention(q, seqs.k[s][: st + c], seqs.v[s][: st + c], 0.25, window, 2.0)
            for q, (s, st, c) in zip(qs, rows, strict=True)
        ]
    )
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    uncapped = reference_attention(
        qs[0], seqs.k[0][: KEY_BLOCK + 20], seqs.v[0][: KEY_BLOCK + 20], 0.25, window
    )
    assert (uncapped - want[: KEY_BLOCK + 17]).abs().max() > 1e-2  # the cap matters here


def test_query_tiles_fill_whole_four_row_blocks() -> None:
    for group in range(1, 17):
        rows = tile_rows(group)
        assert (rows * group) % 4 == 0 and all((r * group) % 4 for r in range(1, rows))


@pytest.mark.parametrize(
    ("vendor", "flags", "preset", "want"),
    [
        ("GenuineIntel", "fpu avx2 avx512f avx512bw", None, "AVX512,STRICT"),
        ("GenuineIntel", "fpu avx avx2 fma", None, "AVX2,STRICT"),
        ("GenuineIntel", "fpu sse4_2", None, None),
        ("AuthenticAMD", "fpu avx2 avx512f avx512_bf16", None, None),
        ("GenuineIntel", "fpu avx2 avx512f", "COMPATIBLE", "COMPATIBLE"),
    ],
)
def test_mkl_is_pinned_to_its_strict_branch_on_intel_only(
    vendor, flags, preset, want, monkeypatch
) -> None:
    # MKL's default float32 path on Intel sums rows 9..16 in another order than a row alone
    # (see models/linear_backend.py); the user's own MKL_CBWR always wins.
    from models.linear_backend import pin_mkl_code_path

    cpuinfo = f"processor\t: 0\nvendor_id\t: {vendor}\nflags\t\t: {flags}\n"
    if preset is None:
        monkeypatch.delenv("MKL_CBWR", raising=False)
    else:
        monkeypatch.setenv("MKL_CBWR", preset)
    set_now = pin_mkl_code_path(cpuinfo)
    assert set_now == (want if preset is None else None)
    assert os.environ.get("MKL_CBWR") == want


@pytest.mark.parametrize(
    ("flags", "preset", "want"),
    [
        ("fpu avx512f avx512_bf16 amx_bf16 amx_tile", None, "AVX512_CORE_BF16"),
        ("fpu avx512f avx512_bf16", None, None),
        ("fpu avx2 fma", None, None),
        ("fpu avx512f avx512_bf16 amx_bf16", ("ONEDNN_MAX_CPU_ISA", "ALL"), "ALL"),
        ("fpu avx512f avx512_bf16 amx_bf16", ("DNNL_MAX_CPU_ISA", "ALL"), None),
    ],
)
def test_onednn_is_capped_below_amx_on_amx_cpus_only(flags, preset, want, monkeypatch) -> None:
    # oneDNN's AMX bf16 GEMM splits K over threads when a call has few blocks (see
    # models/linear_backend.py); the user's own setting (either name) always wins.
    from models.linear_backend import pin_onednn_isa

    cpuinfo = f"processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: {flags}\n"
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    if preset is not None:
        monkeypatch.setenv(*preset)
    set_now = pin_onednn_isa(cpuinfo)
    assert set_now == (want if preset is None else None)
    assert os.environ.get("ONEDNN_MAX_CPU_ISA") == want


@pytest.mark.parametrize(
    ("pinned", "value", "released"),
    [(True, "AVX512_CORE_BF16", True), (False, "AVX512_CORE_BF16", False), (True, "AVX2", False)],
)
def test_only_our_own_onednn_cap_is_lifted(pinned, value, released, monkeypatch) -> None:
    # The bench lifts the cap for in-process peers, never a value the user chose.
    import models.linear_backend as backend

    monkeypatch.setattr(backend, "_onednn_pinned", pinned)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", value)
    assert backend.release_onednn_isa() is released
    assert os.environ["ONEDNN_MAX_CPU_ISA"] == ("ALL" if released else value)
