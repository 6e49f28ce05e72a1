"""The AVX2 int8-activation passes for many rows (models/cpu_kernels/q8_rows_avx2.h: tiles of 3-4
rows x one panel) keep every row's bits, on the forced AVX2 build (-march=haswell) on any host
that runs it.

For M = 1..9 rows (passes of 1, 2, 3 and 4 rows, every remainder) over each panel kind (Q4_0,
Q4_1, Q8_0 from a file, `--quantization int8` rows) and 13 output panels (pairs and a single
last one), each row of the M-row product:
- equals that row computed alone (the one-row decode pass) bit for bit: batch invariance;
- equals the portable build's (x86-64-v2: scalar loops, the generic pass) bit for bit;
- equals a float64 computation of the same quantised product (exact integer sums per block,
  scales in float64) within the float32 rounding the epilogue does: per block one rounded scale
  product d * dx (Q4_1: and m * dx) and one rounded fma into the sum, so at most
  (2 * blocks + 2) * 2^-24 times the sum of the terms' magnitudes.
"""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from models import cpu_kernels
from models.activation_quant import Q8Weight
from models.cpu_features import AVX2_FLAGS, cpu_flags
from tests.models.test_activation_quant import block_weight, reference_quantize
from tests.models.test_kernel_isa_builds import KERNEL_BUILDS, isa_build  # noqa: F401

pytestmark = [
    pytest.mark.cpu_kernels,  # skipped off the CPU (tests/conftest.py)
    pytest.mark.skipif(
        not cpu_kernels.is_available(), reason="tgserve's C++ CPU kernels did not build here"
    ),
    pytest.mark.skipif(not set(cpu_flags()) >= AVX2_FLAGS, reason="the CPU cannot run AVX2 code"),
]
N, K = 200, 256  # 13 panels of 16 (the last a single one), 8 blocks of 32


def int8_rows_weight() -> Q8Weight:
    gen = torch.Generator().manual_seed(11)
    q = torch.randint(-127, 128, (N, K), generator=gen, dtype=torch.int8)
    return Q8Weight.from_int8(q, torch.rand(N, generator=gen) + 0.01)


def reference(x: torch.Tensor, w: Q8Weight) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 [M, N] of the quantised product, and the sum of its terms' magnitudes."""
    xq, dx, sx = reference_quantize(x)
    q, d, m = w.parts()
    isum = torch.einsum(
        "mbk,nbk->mnb", xq.long().reshape(len(x), -1, 32), q.long().reshape(N, -1, 32)
    )  # exact
    terms = [isum.double() * d.double()[None] * dx.double()[:, None]]  # [M, N, blocks]
    if m is not None:
        terms.append(m.double()[None] * (dx.double() * sx.double())[:, None])
    y = sum(t.sum(-1) for t in terms)
    return y, sum(t.abs().sum(-1) for t in terms)


@pytest.mark.parametrize(
    "qtype", [QT.Q4_0, QT.Q4_1, QT.Q8_0, None], ids=lambda t: t.name if t else "int8_rows"
)
def test_each_row_of_many_equals_itself_alone_and_the_float64_product(qtype) -> None:
    avx2, portable = isa_build("haswell"), isa_build("x86-64-v2")
    assert avx2.q8_isa() == "avx2"
    w = Q8Weight.from_blocks(block_weight(qtype, N, K, seed=4)) if qtype else int8_rows_weight()
    gen = torch.Generator().manual_seed(12)
    blocks = K // 32
    for m in range(1, 10):
        x = torch.randn(m, K, generator=gen) * torch.logspace(-1, 1, K)
        args = (w.packed, w.kind, N, None, True)
        got = avx2.q8_linear(x, *args)
        alone = torch.cat([avx2.q8_linear(x[i : i + 1], *args) for i in range(m)])
        assert torch.equal(got.view(torch.int32), alone.view(torch.int32)), m
        scalar = portable.q8_linear(x, *args)
        assert torch.equal(got.view(torch.int32), scalar.view(torch.int32)), m
        want, magnitude = reference(x, w)
        bound = (2 * blocks + 2) * 2.0**-24 * magnitude
        assert ((got.double() - want).abs() <= bound).all(), m


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_avx2_quantiser_gives_the_portable_loops_bits_on_any_values(dtype) -> None:
    """Any bit pattern (NaN, infinities, subnormals, signed zeros), halfway values (round to
    even) and all-zero blocks: q, d and the block sums of the AVX2 build equal the scalar
    loops' (q8_quantize_rows' AVX2 branch, models/cpu_kernels/q8_linear.cpp)."""
    avx2, portable = isa_build("haswell"), isa_build("x86-64-v2")
    gen = torch.Generator().manual_seed(13)
    bits = torch.randint(-(2**31), 2**31 - 1, (64, 96), generator=gen, dtype=torch.int32)
    halves = (torch.randint(-254, 255, (64, 96), generator=gen) * 0.5).float()
    x = torch.cat([bits.view(torch.float32), halves, torch.zeros(2, 96)]).to(dtype)
    for got, want in zip(avx2.q8_quantize(x), portable.q8_quantize(x), strict=True):
        assert torch.equal(got.view(torch.int8), want.view(torch.int8))
