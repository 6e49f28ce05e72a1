"""int8 activations (models/activation_quant.py, models/cpu_kernels/q8_linear.cpp) against
independent oracles:
- the repacked weights dequantise bitwise as the file's blocks (gguf's values, through
  BlockWeight.rows) and as `--quantization int8` rows (q * scale);
- the kernel's activation quantiser equals torch's float32 steps of the same recipe (per block
  of 32: d = amax / 127, q = round-half-even(x * (1 / d)));
- the linear equals a float64 computation of the same quantised product: integer sums per block
  exact (int64 einsum), scales applied in float64; with one block the kernel's single fma
  rounds that exact value once, so there it must match bit for bit;
- a row alone gives the bits it gives among others, at any thread count (batch invariance).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize
from torch import nn

from models import cpu_kernels
from models.activation_quant import (
    Q8Linear,
    Q8Weight,
    int8_dot_product_refusal,
    quantize_activations_int8,
)
from models.block_linear import BlockLinear, BlockWeight
from models.quantization import Int8Linear

pytestmark = [
    pytest.mark.cpu_kernels,  # skipped off the CPU (tests/conftest.py)
    pytest.mark.skipif(
        not cpu_kernels.is_available(), reason="tgserve's C++ CPU kernels did not build here"
    ),
]
TYPES = [QT.Q4_0, QT.Q4_1, QT.Q8_0]


def block_weight(qtype: QT, n: int, k: int, seed: int) -> BlockWeight:
    values = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    return BlockWeight.pack(torch.from_numpy(quantize(values, qtype)), qtype, k)


def reference_quantize(
    x: torch.Tensor, qmax: int = 127
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] -> (xq int8 (qmax 127) or int16 (32767), d float32 [M, K / 32], sum of q
    int32), in torch's float32 ops."""
    blocks = x.float().reshape(x.shape[0], -1, 32)
    d = blocks.abs().amax(-1) / float(qmax)
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inv[..., None]).clamp(-qmax, qmax)  # torch.round: half to even
    dtype = torch.int8 if qmax == 127 else torch.int16
    return q.to(dtype).reshape(x.shape), d, q.sum(-1).int()


def reference_linear(x: torch.Tensor, w: Q8Weight) -> torch.Tensor:
    """float64 [M, N] of the quantised product (w's act_bits): exact integer sums per block,
    then the scales."""
    xq, dx, sx = reference_quantize(x, 32767 if w.act_bits == 16 else 127)
    q, d, m = w.parts()
    m_rows, n = x.shape[0], w.out_features
    isum = torch.einsum(
        "mbk,nbk->mnb", xq.long().reshape(m_rows, -1, 32), q.long().reshape(n, -1, 32)
    )  # exact
    y = (isum.double() * d.double()[None] * dx.double()[:, None]).sum(-1)
    if m is not None:
        y += (m.double()[None] * (dx.double() * sx.double())[:, None]).sum(-1)
    return y


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_repacked_blocks_dequantise_as_the_file(qtype: QT) -> None:
    bw = block_weight(qtype, 37, 96, seed=int(qtype))  # a partial last panel
    w = Q8Weight.from_blocks(bw)
    assert torch.equal(w.dequantized(), bw.dequantized())
    # a panel block: the file's 16 fp16 scales (Q4_1: and 16 fp16 mins), then 16 x 32 quants
    assert w.packed.shape == (
        3,
        3 * {QT.Q4_0: 32 + 256, QT.Q4_1: 64 + 256, QT.Q8_0: 32 + 512}[qtype],
    )


def test_int8_rows_pack_with_their_row_scale() -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(-127, 128, (20, 64), generator=gen, dtype=torch.int8)
    scale = torch.rand(20, generator=gen) + 0.01
    w = Q8Weight.from_int8(q, scale)
    assert torch.equal(w.dequantized(), q.float() * scale[:, None])
    assert w.packed.shape == (2, 2 * (64 + 512))  # float32 scales: any row scale stays exact
    x = torch.randn(3, 64, generator=gen)
    want = reference_linear(x, w)
    got = Q8Linear(w).apply(x, float_out=True).double()
    assert (got - want).abs().max().item() <= 4e-6 * want.abs().amax().item() + 1e-6
    with pytest.raises(ValueError, match="multiple of 32"):
        Q8Weight.from_int8(q[:, :48], scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_quantiser_matches_torch(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(7, 128, generator=gen) * torch.logspace(-3, 3, 128)
    x[2, :32] = 0.0  # an all-zero block: d = 0, q = 0
    x[3, 5] = 1e4  # an outlier flattens only its own block
    x = x.to(dtype)
    got = cpu_kernels.extension().q8_quantize(x)
    for g, want in zip(got, reference_quantize(x), strict=True):
        assert torch.equal(g, want)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_matches_the_float64_quantised_product(qtype: QT, dtype: torch.dtype) -> None:
    n, k = 200, 512  # 13 panels (7 pairs, the last a single panel), 16 blocks
    w = Q8Weight.from_blocks(block_weight(qtype, n, k, seed=int(qtype)))
    gen = torch.Generator().manual_seed(int(qtype))
    for m in (1, 2, 3, 4, 9, 40):
        x = torch.randn(m, k, generator=gen).to(dtype)
        want = reference_linear(x, w)
        got = Q8Linear(w).apply(x, float_out=True).double()
        # float32 rounding of 16-32 fma steps: far below the terms' magnitudes
        bound = 4e-6 * want.abs().amax().item() + 1e-6
        assert (got - want).abs().max().item() <= bound, m


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q8_0], ids=lambda t: t.name)
def test_one_block_is_the_exact_integer_sum_rounded_once(qtype: QT) -> None:
    """K = 32: y = fma(fl(d * dx), isum, 0) = fl(fl(d * dx) * isum), one rounding of an exact
    float64 product (24-bit times at most 20-bit): any wrong integer shows."""
    w = Q8Weight.from_blocks(block_weight(qtype, 48, 32, seed=3))
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(3))
    xq, dx, _ = reference_quantize(x)
    q, d, _ = w.parts()
    isum = xq.long() @ q.long().T  # [M, N]
    scale = (d[:, 0][None, :] * dx[:, 0][:, None]).double()  # fl(d * dx) [M, N], float32
    want = (scale * isum.double()).float()
    assert torch.equal(Q8Linear(w).apply(x, float_out=True), want)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_a_row_alone_gives_its_bits_among_others(qtype: QT) -> None:
    n, k = 70, 256
    w = Q8Weight.from_blocks(block_weight(qtype, n, k, seed=5))
    bias = torch.randn(n, generator=torch.Generator().manual_seed(6))
    layer = Q8Linear(w, nn.Parameter(bias, requires_grad=False))
    x = torch.randn(13, k, generator=torch.Generator().manual_seed(7))
    threads = torch.get_num_threads()
    try:
        together = layer(x)
        torch.set_num_threads(1)
        alone = torch.cat([layer(x[i : i + 1]) for i in range(13)])
        # passes of 1, 2 or 3 rows (AVX2: registers for 1 or 2, the 4-row tile's code for 3)
        pairs = torch.cat([layer(x[i : i + 2]) for i in range(0, 13, 2)])
        threes = torch.cat([layer(x[i : i + 3]) for i in range(0, 13, 3)])
        shuffled = layer(x.flip(0)).flip(0)
    finally:
        torch.set_num_threads(threads)
    for other in (alone, pairs, threes, shuffled):
        assert torch.equal(together, other)


def test_bias_and_bfloat16_rounding() -> None:
    w = Q8Weight.from_blocks(block_weight(QT.Q4_1, 40, 64, seed=8))
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(6, 64, generator=gen).bfloat16()
    bias = torch.randn(40, generator=gen).bfloat16()
    plain = Q8Linear(w).apply(x, float_out=True)
    with_bias = Q8Linear(w, bias).apply(x, float_out=True)
    assert torch.equal(with_bias, plain + bias.float())  # one float32 add
    assert torch.equal(Q8Linear(w, bias)(x), with_bias.bfloat16())  # then one rounding


def test_kernel_refuses_bad_shapes() -> None:
    ext = cpu_kernels.extension()
    w = Q8Weight.from_blocks(block_weight(QT.Q8_0, 16, 64, seed=1))
    with pytest.raises(RuntimeError, match="multiple of 32"):
        ext.q8_linear(torch.zeros(1, 48), w.packed, w.kind, 16, None, True)
    with pytest.raises(RuntimeError, match="does not match"):
        ext.q8_linear(torch.zeros(1, 96), w.packed, w.kind, 16, None, True)
    with pytest.raises(RuntimeError, match="unknown kind"):
        ext.q8_linear(torch.zeros(1, 64), w.packed, 8, 16, None, True)


def test_refusals_name_the_reason() -> None:
    assert "CPU only" in int8_dot_product_refusal("cuda")
    assert "AVX512-VNNI" in int8_dot_product_refusal("cpu", flags=("sse2", "fma"))
    assert int8_dot_product_refusal("cpu", flags=("avx2",)) is None


def test_model_layers_are_replaced_where_they_can_run() -> None:
    blocks = block_weight(QT.Q4_1, 32, 64, seed=1)
    model = nn.Sequential(
        BlockLinear(blocks),
        Int8Linear(nn.Linear(64, 32)),
        Int8Linear(nn.Linear(48, 16)),  # K not a multiple of 32: kept
        nn.Linear(32, 8),  # float weights: kept
    )
    assert quantize_activations_int8(model) == 2
    assert [type(m).__name__ for m in model] == ["Q8Linear", "Q8Linear", "Int8Linear", "Linear"]
    x = torch.randn(3, 64)
    assert torch.equal(model[0](x), Q8Linear(Q8Weight.from_blocks(blocks))(x))
    # the int8 rows: the same quantised product as a Q8_0 weight of the row scale
    int8 = model[1].q8_weight
    assert int8.qtype == QT.Q8_0 and torch.allclose(
        model[1](x).double(), reference_linear(x, int8) + model[1].bias.double(), atol=1e-5
    )
