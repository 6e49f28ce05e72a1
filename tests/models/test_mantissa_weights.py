"""The float32 few-rows pass's one-fma weights (models/cpu_kernels/mantissa_weights.h: w =
fma(R + u, d, c), bit for bit gguf's w when c is exact; Q4_1 blocks whose c is not, and blocks
with non-finite scales, must fall back to the two-rounding path) on blocks chosen against that
argument: every fp16 bit pattern as d, Q4_1's m of every bit pattern, m = 0 and -0, subnormal,
the largest, inf and NaN, and the quant extremes (Q8_0 q = -128 and 127, Q4 nibbles 0 and 15).

Oracles: gguf's dequantisation, each weight read back through one-hot activations (acc = fma(1,
w, +0) = w, so the outputs are the weights, -0 as +0), and the dense kernel over those weights
for random activations, every few-rows count (and the many-rows scratch beside), rows mixing
blocks of both paths (bitwise where finite, NaN where it has NaN). On builds without AVX-512
the same tests hold the old path."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize

from models import cpu_kernels
from models.block_linear import BlockLinear, BlockWeight, q4_1_constants_exact
from models.cpu_features import cpu_flags
from tests.models.test_kernel_isa_builds import isa_build, kernel_set

pytestmark = [
    pytest.mark.cpu_kernels,  # skipped off the CPU (tests/conftest.py)
    pytest.mark.skipif(
        not cpu_kernels.is_available(), reason="tgserve's C++ CPU kernels did not build here"
    ),
]

ALL_HALVES = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
# m against d: zeros, the smallest subnormals, the largest finite, infinities, NaNs
SPECIAL_HALVES = np.array(
    [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x7FFF],
    dtype=np.uint16,
)


def halves(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float16).view(np.uint16)


def blocks(qtype: QT, d: np.ndarray, m: np.ndarray | None, seed: int) -> np.ndarray:
    """One block per row: scales d (and m) as fp16 bits, random quants with the extremes."""
    rng = np.random.default_rng(seed)
    n = len(d)
    scales = [d] if m is None else [d, m]
    quants = rng.integers(0, 256, (n, 32 if qtype == QT.Q8_0 else 16), dtype=np.uint8)
    if qtype == QT.Q8_0:
        quants[:, :4] = np.array([-128, 127, 0, -1], dtype=np.int8).view(np.uint8)
    else:  # elements 0 / 16: nibbles 0 / 15, 1 / 17: 15 / 0, 2 / 18: 8 / 8
        quants[:, :3] = [0xF0, 0x0F, 0x88]
    head = np.stack(scales, axis=1).astype(np.uint16).view(np.uint8).reshape(n, -1)
    return np.concatenate([head, quants], axis=1)


def adversarial(qtype: QT) -> np.ndarray:
    """Rows of one block: every fp16 d; Q4_1 also m of every pattern, gguf-like m ~ -8 d, and
    the special m beside random d."""
    rng = np.random.default_rng(int(qtype))
    if qtype != QT.Q4_1:
        return blocks(qtype, ALL_HALVES, None, seed=1)
    d_values = ALL_HALVES.view(np.float16).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        near = halves(-d_values * rng.uniform(0.0, 16.0, len(d_values)).astype(np.float32))
    random_d = rng.permutation(ALL_HALVES)[:4096]
    return np.concatenate(
        [
            blocks(qtype, ALL_HALVES, rng.permutation(ALL_HALVES), seed=1),
            blocks(qtype, ALL_HALVES, near, seed=2),
            blocks(qtype, random_d, np.resize(SPECIAL_HALVES, len(random_d)), seed=3),
            blocks(qtype, np.resize(SPECIAL_HALVES, len(random_d)), random_d, seed=4),
        ]
    )


def gguf_weights(raw: np.ndarray, qtype: QT) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return dequantize(raw, qtype)


def assert_same_outputs(got: torch.Tensor, want: torch.Tensor) -> None:
    assert torch.equal(got.isnan(), want.isnan())
    finite = ~want.isnan()
    bad = (got[finite].view(torch.int32) != want[finite].view(torch.int32)).sum()
    assert int(bad) == 0, int(bad)


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1, QT.Q8_0])
def test_weights_read_through_one_hot_rows_are_gguf_weights(qtype: QT) -> None:
    raw = adversarial(qtype)
    weights = gguf_weights(raw, qtype)  # [N, 32]
    finite = np.isfinite(weights).all(axis=1)  # rows
    assert finite.mean() > 0.5
    layer = BlockLinear(BlockWeight.pack(torch.from_numpy(raw), qtype, 32), None)
    start = 0
    for rows in (8, 5, 3, 2, 1, 8, 5):  # every k once, in calls of every few-rows pass size
        ks = list(range(start, start + rows))
        start += rows
        x = torch.zeros(rows, 32)
        x[range(rows), ks] = 1.0
        got = layer.apply(x, float_out=True).numpy()  # [rows, N]
        want = weights[:, ks].T + np.float32(0.0)  # -0 -> +0, as fma(1, w, +0)
        assert np.array_equal(got[:, finite].view(np.uint32), want[:, finite].view(np.uint32))
        assert np.isnan(got[:, ~finite]).all()  # 0 * inf or a NaN weight in each such row
    assert start == 32
    # all 32 at once: the many-rows pass's dequantised scratch
    got = layer.apply(torch.eye(32), float_out=True).numpy()
    want = weights.T + np.float32(0.0)
    assert np.array_equal(got[:, finite].view(np.uint32), want[:, finite].view(np.uint32))


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1, QT.Q8_0])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 9, 40])
def test_rows_mixing_both_paths_give_the_dense_kernels_bits(qtype: QT, m: int) -> None:
    """Rows of 4 blocks drawn from the adversarial ones (each panel's blocks take one path or
    the other in turn, on the same accumulators; from 9 rows: into the same scratch), random
    activations of spread magnitudes."""
    raw = adversarial(qtype)
    rng = np.random.default_rng(m)
    n = 4096
    raw = raw[rng.integers(0, len(raw), 4 * n)].reshape(n, -1)
    k = 128
    ext = cpu_kernels.extension()
    dense = ext.pack_linear(torch.from_numpy(gguf_weights(raw, qtype)).contiguous())
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=gen) * torch.exp2(torch.randint(-8, 9, (m, k), generator=gen))
    layer = BlockLinear(BlockWeight.pack(torch.from_numpy(raw), qtype, k), None)
    assert_same_outputs(layer.apply(x, float_out=True), ext.linear(x, dense, None, n, True))


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1, QT.Q8_0])
@pytest.mark.parametrize("m", [1, 4])
def test_infinite_scales_with_one_signed_quants_give_infinite_outputs(qtype: QT, m: int) -> None:
    """d = +-inf (Q4_1: or m) over quants of one sign: gguf's weights are +-inf, never NaN, so
    positive activations give +-inf outputs; the one-fma weights would be inf - inf = NaN."""
    rng = np.random.default_rng(m)
    n, k = 64, 96
    infinite = np.resize(halves([np.inf, -np.inf]), n)
    finite = halves(rng.uniform(0.5, 2.0, n))
    raw = blocks(qtype, infinite, finite if qtype == QT.Q4_1 else None, seed=m)
    if qtype == QT.Q4_1:  # half the rows: finite d, m = +-inf
        raw[::2, :4] = blocks(qtype, finite, infinite, seed=m)[::2, :4]
    quants = raw[:, 4 if qtype == QT.Q4_1 else 2 :]
    if qtype == QT.Q8_0:
        quants[:] = rng.integers(1, 128, quants.shape)
    else:  # Q4_0 nibbles 9..15 (q = 1..7), Q4_1 1..15
        low = 9 if qtype == QT.Q4_0 else 1
        quants[:] = rng.integers(low, 16, quants.shape) | rng.integers(low, 16, quants.shape) << 4
    raw = np.tile(raw, (1, k // 32))  # every block of a row the same
    weights = gguf_weights(raw, qtype)
    assert np.isinf(weights).all()
    ext = cpu_kernels.extension()
    dense = ext.pack_linear(torch.from_numpy(weights).contiguous())
    x = torch.rand(m, k, generator=torch.Generator().manual_seed(m)) + 0.5
    layer = BlockLinear(BlockWeight.pack(torch.from_numpy(raw), qtype, k), None)
    got, want = layer.apply(x, float_out=True), ext.linear(x, dense, None, n, True)
    assert want.isinf().all()
    assert_same_outputs(got, want)


SKYLAKE_FLAGS = {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma", "f16c"}
SKYLAKE_BUILD = ("skylake-avx512", kernel_set("skylake-avx512"))
KERNEL_BUILDS = [SKYLAKE_BUILD] if set(cpu_flags()) >= SKYLAKE_FLAGS else []  # kernel_prebuild.py


@pytest.mark.skipif(
    not set(cpu_flags()) >= SKYLAKE_FLAGS, reason="the CPU cannot run -march=skylake-avx512 code"
)
@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1, QT.Q8_0])
def test_avx512_without_vbmi_gives_the_native_bits(qtype: QT) -> None:
    """-march=skylake-avx512 (AVX-512 without VBMI: Q8_0 widens and shifts its words for
    vpternlogd instead of vpermb on the bytes) on the adversarial rows, against the native
    build (which test_weights_read_through_one_hot_rows_are_gguf_weights holds to gguf)."""
    raw = adversarial(qtype)
    rng = np.random.default_rng(int(qtype))
    n, k = 2048, 128
    raw = raw[rng.integers(0, len(raw), 4 * n)].reshape(n, -1)
    w = BlockWeight.pack(torch.from_numpy(raw), qtype, k)
    native, skylake = cpu_kernels.extension(), isa_build(SKYLAKE_BUILD[0])
    gen = torch.Generator().manual_seed(int(qtype))
    for m in (1, 2, 3, 8, 9, 40):
        x = torch.randn(m, k, generator=gen) * torch.exp2(
            torch.randint(-8, 9, (m, k), generator=gen)
        )
        want = native.block_linear(x, w.packed, w.type_id, n, None, True)
        assert_same_outputs(skylake.block_linear(x, w.packed, w.type_id, n, None, True), want)


def _exact_by_fractions(d_bits: int, m_bits: int) -> bool:
    """Oracle of q4_1_constants_exact for one block, in exact rational arithmetic: both
    constant terms m - R d finite and equal to their float32 rounding."""
    d, m = (float(np.uint16(b).view(np.float16)) for b in (d_bits, m_bits))
    if not (np.isfinite(d) and np.isfinite(m)):
        return False
    for r in (2**15, 2**11):
        c = Fraction(m) - r * Fraction(d)
        with np.errstate(over="ignore"):
            c32 = np.float32(float(c))  # float(c) is exact when c32 can be
        if not np.isfinite(c32) or Fraction(float(c32)) != c:
            return False
    return True


def test_q4_1_constants_exact_agrees_with_exact_arithmetic() -> None:
    raw = adversarial(QT.Q4_1)
    rng = np.random.default_rng(7)
    picks = rng.choice(len(raw), 3000, replace=False)
    got, want = [], []
    for i in picks:
        d_bits, m_bits = raw[i, :4].copy().view(np.uint16)
        got.append(q4_1_constants_exact(torch.from_numpy(raw[i : i + 1])))
        want.append(_exact_by_fractions(int(d_bits), int(m_bits)))
    assert got == want
    assert 0.05 < np.mean(want) < 0.95  # both kinds were drawn
    assert not q4_1_constants_exact(torch.from_numpy(raw))  # one inexact block is enough


def _realistic_q4_1(n: int, k: int, seed: int) -> np.ndarray:
    """Rows of Q4_1 blocks with scales as a quantiser makes them: m ~ -8 d (min of the block)."""
    rng = np.random.default_rng(seed)
    d = rng.uniform(0.002, 0.05, n * k // 32).astype(np.float32)
    m = (-d * rng.uniform(6.0, 10.0, len(d))).astype(np.float32)
    return blocks(QT.Q4_1, halves(d), halves(m), seed).reshape(n, -1)


@pytest.mark.parametrize("m", [1, 2, 3, 5, 8])
def test_weights_with_checked_constants_give_the_per_block_paths_bits(m: int) -> None:
    """A Q4_1 weight whose every constant term was found exact when packed (kQ4_1Exact) skips
    the per-block check: the same bits as the checked pass and as the dense kernel."""
    n, k = 512, 256
    raw = _realistic_q4_1(n, k, seed=m)
    weight = BlockWeight.pack(torch.from_numpy(raw), QT.Q4_1, k)
    assert weight.constants_exact and weight.type_id == 1001
    ext = cpu_kernels.extension()
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=gen) * torch.exp2(torch.randint(-8, 9, (m, k), generator=gen))
    trusted = ext.block_linear(x, weight.packed, weight.type_id, n, None, True)
    checked = ext.block_linear(x, weight.packed, int(QT.Q4_1), n, None, True)
    dense = ext.pack_linear(torch.from_numpy(gguf_weights(raw, QT.Q4_1)).contiguous())
    assert_same_outputs(trusted, checked)
    assert_same_outputs(trusted, ext.linear(x, dense, None, n, True))
    ids = torch.tensor([0, 17, n - 1])
    assert torch.equal(
        ext.block_rows(weight.packed, weight.type_id, k, n, ids),
        ext.block_rows(weight.packed, int(QT.Q4_1), k, n, ids),
    )


def test_a_weight_with_one_unchecked_block_keeps_the_checked_pass() -> None:
    raw = _realistic_q4_1(32, 64, seed=3)
    raw[5, :2] = np.array([0x7C00], dtype=np.uint16).view(np.uint8)  # d = +inf in one block
    weight = BlockWeight.pack(torch.from_numpy(raw), QT.Q4_1, 64)
    assert not weight.constants_exact and weight.type_id == int(QT.Q4_1)
    q8 = BlockWeight.pack(
        torch.from_numpy(blocks(QT.Q8_0, halves(np.ones(4)), None, 1)), QT.Q8_0, 32
    )
    assert not q8.constants_exact and q8.type_id == int(QT.Q8_0)
