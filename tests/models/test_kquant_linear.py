"""GGUF Q5_0, Q5_1, Q4_K, Q5_K and Q6_K kept as stored (models/cpu_kernels/kquant_linear.cpp,
reached through models/block_linear.py).

Oracles: the `gguf` package's dequantisation (the unpacked rows must equal it bit for bit on
hand-made blocks: random quant and scale bytes, random fp16 d / dmin / m from subnormal to 10^3,
a partial last panel), a float64 matmul over the dequantised weights (the kernel, to a bound
derived from float32 accumulation), and the same row computed alone (batch invariance)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize

from models.block_linear import STORED_TYPES, BlockLinear, BlockWeight
from tests.models.test_block_linear import (
    assert_rows_alone_equal_rows_in_batches,
    assert_within_tight_bound,
)

pytestmark = pytest.mark.cpu_kernels  # skipped off the CPU (tests/conftest.py)

TYPES = [QT.Q5_0, QT.Q5_1, QT.Q4_K, QT.Q5_K, QT.Q6_K]
DTYPES = [torch.float32, torch.bfloat16]
WIDTH = {QT.Q5_0: 32, QT.Q5_1: 32, QT.Q4_K: 256, QT.Q5_K: 256, QT.Q6_K: 256}
BLOCK_BYTES = {QT.Q5_0: 22, QT.Q5_1: 24, QT.Q4_K: 144, QT.Q5_K: 176, QT.Q6_K: 210}
# Byte offsets of the fp16 fields (d, and m or dmin) in a block; the rest is quants / scales.
HALVES = {QT.Q5_0: (0,), QT.Q5_1: (0, 2), QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,)}
# Bytes that hold quants (zeroed, a block's dequantisation is minus its min term).
QUANTS = {QT.Q5_1: slice(4, 24), QT.Q4_K: slice(16, 144), QT.Q5_K: slice(16, 176)}


def hand_made_blocks(qtype: QT, rows: int, k: int, seed: int, spread: int = 7) -> np.ndarray:
    """Random bytes; the fp16 fields random finite fp16 of magnitude 10^-spread .. 10^3."""
    rng = np.random.default_rng(seed)
    nb = k // WIDTH[qtype]
    raw = rng.integers(0, 256, (rows, nb, BLOCK_BYTES[qtype]), dtype=np.uint8)
    for at in HALVES[qtype]:
        half = rng.standard_normal((rows, nb, 1)) * 10.0 ** rng.integers(-spread, 4, (rows, nb, 1))
        raw[..., at : at + 2] = half.astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def bits(a: np.ndarray | torch.Tensor) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def test_the_new_types_are_kept_as_stored() -> None:
    assert set(TYPES) <= STORED_TYPES


@pytest.mark.parametrize("qtype", TYPES)
def test_unpacked_hand_made_blocks_equal_gguf_dequantisation_bitwise(qtype: QT) -> None:
    k = 3 * WIDTH[qtype]
    raw = hand_made_blocks(qtype, rows=37, k=k, seed=int(qtype))  # 37: a partial last panel
    weight = BlockWeight.pack(torch.from_numpy(raw), qtype, k)
    assert weight.nbytes == 48 * raw.shape[1]  # the file's bytes, 16-row panels (3 of them)
    got = weight.dequantized().numpy()
    assert np.array_equal(bits(got), bits(dequantize(raw, qtype)))
    ids = torch.tensor([36, 0, 17, 36])
    assert np.array_equal(bits(weight.rows(ids)), bits(dequantize(raw[ids.numpy()], qtype)))


def reference_and_bound(x: torch.Tensor, raw: np.ndarray, qtype: QT, k: int):
    """float64 x @ W^T over gguf's dequantised W, and the float32-accumulation error bound.

    The kernel sums s_j * (sum of x q over sub-block j) (+ min_j * (sum of x over j)) sub-block
    by sub-block in float32; gguf rounds fl(s q) and fl(s q) - min once more each. Every term's
    error is at most (k + 6) u times the magnitudes summed, B = sum_k |x_k| (|s q_k| + |min|),
    u = 2^-24, with |s q| <= |w| + |min| (1 + u): B <= sum |x| (|w| + 2.01 |min|)."""
    w = dequantize(raw, qtype).astype(np.float64)
    mins = np.zeros_like(w)
    if qtype in QUANTS:  # quants zeroed: w = 0 * s - min (Q5_1: + m)
        zeroed = raw.reshape(raw.shape[0], k // WIDTH[qtype], -1).copy()
        zeroed[..., QUANTS[qtype]] = 0
        mins = np.abs(dequantize(zeroed.reshape(raw.shape[0], -1), qtype)).astype(np.float64)
    mag = torch.from_numpy(np.abs(w) + 2.01 * mins)
    xd = x.double()
    return xd @ torch.from_numpy(w).T, (k + 6) * 2.0**-24 * (xd.abs() @ mag.T)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kquant_linear_equals_a_float64_matmul_of_the_dequantised_weights(qtype, dtype) -> None:
    gen = torch.Generator().manual_seed(int(qtype))
    n, k = 53, 2 * 256
    raw = hand_made_blocks(qtype, rows=n, k=k, seed=int(qtype) + 1, spread=2)
    layer = BlockLinear(BlockWeight.pack(torch.from_numpy(raw), qtype, k))
    x = torch.randn(13, k, generator=gen).to(dtype)
    want, bound = reference_and_bound(x, raw, qtype, k)
    assert_within_tight_bound(layer.apply(x, float_out=True).double(), want, bound)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_kquant_linear_row_does_not_depend_on_the_other_rows(qtype, dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    n, k = 200, 512
    raw = hand_made_blocks(qtype, rows=n, k=k, seed=7, spread=2)
    bias = torch.nn.Parameter(torch.randn(n, generator=gen).to(dtype), requires_grad=False)
    layer = BlockLinear(BlockWeight.pack(torch.from_numpy(raw), qtype, k), bias)
    assert_rows_alone_equal_rows_in_batches(layer, dtype, gen)


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K])
def test_rows_that_are_not_whole_super_blocks_are_refused(qtype) -> None:
    raw = torch.zeros(4, BLOCK_BYTES[qtype], dtype=torch.uint8)  # one super-block: 256 weights
    with pytest.raises(RuntimeError, match="do not hold 512 weights"):
        BlockWeight.pack(raw, qtype, 512)
    with pytest.raises(RuntimeError, match="do not hold 32 weights"):
        BlockWeight.pack(raw[:, :0].contiguous(), qtype, 32)


def test_a_mixed_weight_computes_each_part_as_its_own_type_does() -> None:
    """Parts of different types in one layer (a Q4_K_M fused q/k/v): every column's bits equal
    that part's one-type layer's, unpacked rows equal gguf's; bytes: the file's + header."""
    k, gen = 512, torch.Generator().manual_seed(11)
    spec = [(QT.Q4_K, 48), (QT.Q6_K, 37), (QT.Q5_0, 16), (QT.Q4_K, 20)]  # 37, 20: partial panels
    raws = [hand_made_blocks(t, n, k, seed=i, spread=2) for i, (t, n) in enumerate(spec)]
    parts = [(torch.from_numpy(raw), t) for raw, (t, _) in zip(raws, spec, strict=True)]
    mixed = BlockWeight.pack_parts(parts, k)
    assert mixed.qtype is None and mixed.parts == tuple(spec) and mixed.out_features == 121
    file_bytes = sum(raw.nbytes for raw in raws)
    pad = 11 * raws[1].shape[1] + 12 * raws[3].shape[1]  # zero rows: 37 -> 48, 20 -> 32
    assert mixed.nbytes == 64 + file_bytes + pad
    want_rows = np.concatenate([dequantize(raw, t) for raw, (t, _) in zip(raws, spec, strict=True)])
    assert np.array_equal(bits(mixed.dequantized()), bits(want_rows))
    for dtype in DTYPES:
        bias = torch.randn(121, generator=gen).to(dtype)
        x = torch.randn(5, k, generator=gen).to(dtype)
        layer = BlockLinear(mixed, torch.nn.Parameter(bias, requires_grad=False))
        for out in (True, False):
            got, first = layer.apply(x, float_out=out), 0
            for raw, (t, n) in zip(raws, spec, strict=True):
                alone = BlockWeight.pack(torch.from_numpy(raw), t, k)
                part_bias = torch.nn.Parameter(bias[first : first + n], requires_grad=False)
                want = BlockLinear(alone, part_bias).apply(x, float_out=out)
                assert torch.equal(got[:, first : first + n], want), (t, dtype, out)
                first += n


def test_parts_that_cannot_be_mixed_are_refused() -> None:
    q41 = torch.zeros(16, 2 * 20 * 8, dtype=torch.uint8)  # Q4_1 rows of 512
    q4k = torch.zeros(16, 2 * 144, dtype=torch.uint8)
    with pytest.raises(ValueError, match="Q4_1, Q4_K"):
        BlockWeight.pack_parts([(q41, QT.Q4_1), (q4k, QT.Q4_K)], 512)
    one = BlockWeight.pack_parts([(q4k, QT.Q4_K), (q4k, QT.Q4_K)], 512)  # one type: plain
    assert one.qtype == QT.Q4_K and one.out_features == 32
