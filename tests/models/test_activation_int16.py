"""int16 activations (`--activation-quantization int16`: models/cpu_kernels/q16_dot.h,
q16_avx2.h (few rows) and q16_tile.h (8 rows or more, AVX2) over the int8 path's Q8 panels)
against independent oracles:
- the kernel's quantiser equals torch's float32 steps of the recipe (per block of 32: d = amax /
  32767, q = round-half-even(x * (1 / d)));
- the linear equals a float64 computation of the same int16-quantised product (exact integer
  sums per block, int64 einsum; scales in float64) to float32 rounding, for every kind; with one
  block the kernel's single fma rounds fl(d * dx) * float(isum) once, so there it matches bit
  for bit (Q8_0's |isum| may pass 2^24: float(isum) is then one rounding of its own);
- a row alone gives the bits it gives among others, at any thread count, whichever pass
  (few-row, many-row tile with ragged passes, portable) computes it (batch invariance);
- blocks at the exactness bound (|q| = 32767 against the largest weights) keep exact sums;
- a layer's answer is float-like: its error against the float32 product of the dequantised
  weights is within the int16 step's bound (d / 2 per activation), far inside int8's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize

from models import cpu_kernels
from models.activation_quant import Q8Linear, Q8Weight, quantize_activations
from models.block_linear import BlockLinear, BlockWeight
from tests.models.test_activation_quant import (
    TYPES,
    block_weight,
    reference_linear,
    reference_quantize,
)

pytestmark = [
    pytest.mark.cpu_kernels,  # skipped off the CPU (tests/conftest.py)
    pytest.mark.skipif(
        not cpu_kernels.is_available(), reason="tgserve's C++ CPU kernels did not build here"
    ),
]


def weights(n: int, k: int) -> list[Q8Weight]:
    """Every kind with int16 activations: Q4_0, Q4_1, Q8_0 blocks and `--quantization int8` rows."""
    gen = torch.Generator().manual_seed(n + k)
    rows = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    blocks = [Q8Weight.from_blocks(block_weight(t, n, k, seed=int(t))) for t in TYPES]
    ws = blocks + [Q8Weight.from_int8(rows, torch.rand(n, generator=gen) + 0.01)]
    return [w.with_bits(16) for w in ws]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantiser_matches_torch(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(7, 128, generator=gen) * torch.logspace(-3, 3, 128)
    x[2, :32] = 0.0  # an all-zero block: d = 0, q = 0
    x[3, 5] = 1e4  # an outlier flattens only its own block
    x = x.to(dtype)
    got = cpu_kernels.extension().q16_quantize(x)
    for g, want in zip(got, reference_quantize(x, 32767), strict=True):
        assert torch.equal(g, want)


def test_linear_matches_the_float64_quantised_product() -> None:
    n, k = 200, 256  # 13 panels (6 pairs and a single last one), 8 blocks
    gen = torch.Generator().manual_seed(2)
    for w in weights(n, k):
        for m in (1, 2, 3, 4, 9, 37):  # 9, 37: the many-rows tile, passes of 6 and a ragged one
            x = torch.randn(m, k, generator=gen)
            want = reference_linear(x, w)
            got = Q8Linear(w).apply(x, float_out=True).double()
            # float32 rounding of 8-16 fma steps: far below the terms' magnitudes
            bound = 4e-6 * want.abs().amax().item() + 1e-6
            assert (got - want).abs().max().item() <= bound, (w.kind, m)


def test_one_block_is_the_integer_sum_rounded_once() -> None:
    gen = torch.Generator().manual_seed(3)
    for w in weights(48, 32)[::2]:  # Q4_0 (offset: isum - 8 sum(q)) and Q8_0 (no min term)
        x = torch.randn(9, 32, generator=gen) * 3  # 9 rows: the many-rows tile
        xq, dx, _ = reference_quantize(x, 32767)
        q, d, _ = w.parts()
        isum = (xq.long() @ q.long().T).float()  # [M, N]: float32(isum), exact below 2^24
        scale = (d[:, 0][None, :] * dx[:, 0][:, None]).double()  # fl(d * dx), float32
        want = (scale * isum.double()).float()  # two 24-bit factors: exact, then one rounding
        assert torch.equal(Q8Linear(w).apply(x, float_out=True), want), w.qtype.name
        assert torch.equal(Q8Linear(w).apply(x[:4], float_out=True), want[:4]), w.qtype.name


def extreme_weights(n: int, k: int) -> list[Q8Weight]:
    """Weights at their kinds' largest |integer|: Q4_0 nibble 0 (w = -8), Q4_1 nibble 15 (each
    block's one 0 sets the min, the rest 1.0 -> 15), Q8_0 and int8 rows +-127."""
    ones = np.ones((n, k), dtype=np.float32)
    ones[:, ::32] = 0.0  # Q4_1's min
    signs = np.where(np.arange(k) % 3 == 0, -1.0, 1.0).astype(np.float32)
    raw = {
        QT.Q4_0: quantize(-ones - 1.0, QT.Q4_0),  # -2 is the block's amax: nibble 0
        QT.Q4_1: quantize(ones, QT.Q4_1),
        QT.Q8_0: quantize(ones * 0 + signs, QT.Q8_0),
    }
    ws = [Q8Weight.from_blocks(BlockWeight.pack(torch.from_numpy(r), t, k)) for t, r in raw.items()]
    rows = torch.from_numpy(signs).to(torch.int8).repeat(n, 1) * 127
    return [w.with_bits(16) for w in ws + [Q8Weight.from_int8(rows, torch.full((n,), 0.5))]]


def test_blocks_at_the_exactness_bound_keep_their_exact_sums() -> None:
    """Every |q| = 32767 (x all +-1) against the largest weights: a Q4_1 block's sum reaches
    31 * 15 * 32767 = 15.2e6 (its float32 partial sums stay exact below 2^24), Q8_0's 32 * 127
    * 32767 = 1.33e8 (exact in int32, rounded once by float(isum)); the many-rows tile (9
    rows), the few-rows pass (1 row) and the float64 oracle agree."""
    n, k = 40, 64
    x = torch.ones(9, k)
    x[1::2] = -1.0
    for w in extreme_weights(n, k):
        q, _, _ = w.parts()
        assert q.abs().max().item() == {QT.Q4_0: 8, QT.Q4_1: 15}.get(w.qtype, 127), w.kind
        got = Q8Linear(w).apply(x, float_out=True)
        alone = torch.cat([Q8Linear(w).apply(x[i : i + 1], float_out=True) for i in range(2)])
        assert torch.equal(got[:2], alone), w.kind
        want = reference_linear(x, w)
        assert (got.double() - want).abs().max().item() <= 4e-6 * want.abs().max().item(), w.kind


def test_a_row_alone_gives_its_bits_among_others() -> None:
    """37 rows (the many-rows tile: passes of 6, a ragged one of 1) at 2 and 1 threads, 8-row
    slices (tile passes of 6 and 2), 13 rows, 5-row slices (few-row passes of 4 and 1), 3-row
    slices and each row alone (the few-row passes): the same bits for every row."""
    x = torch.randn(37, 256, generator=torch.Generator().manual_seed(7))
    threads = torch.get_num_threads()
    for w in weights(70, 256):
        layer = Q8Linear(w, torch.randn(70, generator=torch.Generator().manual_seed(6)))
        try:
            torch.set_num_threads(2)
            together = layer(x)
            torch.set_num_threads(1)
            others = [
                layer(x),
                torch.cat([layer(x[i : i + 1]) for i in range(37)]),
                torch.cat([layer(x[i : i + 8]) for i in range(0, 37, 8)]),
                torch.cat([layer(x[:13]), layer(x[13:])]),
                torch.cat([layer(x[i : i + 5]) for i in range(0, 37, 5)]),
                torch.cat([layer(x[i : i + 3]) for i in range(0, 37, 3)]),
                layer(x.flip(0)).flip(0),
            ]
        finally:
            torch.set_num_threads(threads)
        for i, other in enumerate(others):
            assert torch.equal(together, other), (w.kind, i)


def test_error_against_float_is_within_the_int16_step() -> None:
    """|y - x @ W^T| <= sum over k of |W[n, k]| * d_block / 2 (each activation rounds by at most
    half its block's step) plus float32 rounding; int8's steps are 258x larger."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(4, 256, generator=gen)
    for w in weights(64, 256):
        exact = x.double() @ w.dequantized().double().T
        got = Q8Linear(w).apply(x, float_out=True).double()
        _, dx, _ = reference_quantize(x, 32767)
        half_step = (dx.double() / 2).repeat_interleave(32, dim=1)  # [M, K]
        bound = half_step @ w.dequantized().double().abs().T + 4e-6 * exact.abs().amax()
        assert ((got - exact).abs() <= bound).all(), w.kind
        int8 = Q8Linear(w.with_bits(8)).apply(x, float_out=True).double()
        assert (got - exact).abs().max() < (int8 - exact).abs().max() / 20


def test_model_layers_take_the_int16_kind() -> None:
    blocks = block_weight(QT.Q4_1, 32, 64, seed=1)
    model = torch.nn.Sequential(BlockLinear(blocks))
    assert quantize_activations(model, 16) == 1
    assert model[0].q8_weight.act_bits == 16 and "q16 x Q4_1" in repr(model)
    x = torch.randn(3, 64)
    want = Q8Linear(Q8Weight.from_blocks(blocks).with_bits(16))(x)
    assert torch.equal(model[0](x), want)
    with pytest.raises(ValueError, match="8 or 16 bits"):
        Q8Weight.from_blocks(blocks).with_bits(4)
