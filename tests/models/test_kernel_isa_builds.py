"""The C++ kernels built for older instruction sets give the native build's float32 bits.

Every kernel fixes a lane's sequence of operations (models/cpu_kernels/*.cpp headers), and its
SIMD passes (AVX-512, or AVX2 through simd16.h) claim the portable loops' order for float32
activations. This host builds the same sources for `-march=haswell` (AVX2 + FMA: the simd16
AVX2 passes, compiler-vectorised dense loops), `-march=icelake-server` (AVX-512 without
AVX512-BF16, as most cloud Xeons) and `-march=x86-64-v2` (no AVX: the scalar loops) and runs
them on the same packed weights: float32 outputs must equal the native build's bit for bit.
bfloat16 activations run the portable order on every build without AVX512-BF16, so there the
scalar build's bits are the oracle (where the CPU has AVX512-BF16 the native build uses
vdpbf16ps, another order by design). Row counts reach the many-rows passes (more than 8 rows:
a dequantised group under the dense kernel's register tile), several row passes and groups.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize

from bench.kquantize import quantize_k
from models import cpu_kernels
from models.block_linear import BlockWeight
from models.cpu_features import AVX2_FLAGS, AVX512_FLAGS, cpu_flags

pytestmark = pytest.mark.cpu_kernels  # skipped off the CPU (tests/conftest.py)

SIMD_ISAS = [
    march
    for march, flags in (("haswell", AVX2_FLAGS), ("icelake-server", AVX512_FLAGS))
    if set(cpu_flags()) >= flags
]
ISAS = SIMD_ISAS + ["x86-64-v2"]
ROWS = [1, 3, 9, 40, 130]
BLOCK_TYPES = [QT.Q4_0, QT.Q4_1, QT.Q8_0, QT.Q5_0, QT.Q5_1, QT.Q4_K, QT.Q6_K]


def kernel_set(march: str) -> str:
    """The whole library for haswell (the build TGSERVE_CPU_ISA=avx2 serves, which
    tests/models/test_forced_avx2_build.py builds anyway), else the "linear" set alone (a cold
    build in a third of the time): the linear kernels compile with the same flags in both."""
    return "all" if march == "haswell" else "linear"


KERNEL_BUILDS = [(march, kernel_set(march)) for march in ISAS]  # tests/kernel_prebuild.py


@functools.cache
def isa_build(march: str):
    return cpu_kernels.build(march, kernels=kernel_set(march))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def block_weight(qtype: QT, n: int, k: int, seed: int) -> BlockWeight:
    values = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    if qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K):
        raw = quantize_k(values, qtype)
    else:
        raw = quantize(values, qtype)
    return BlockWeight.pack(torch.from_numpy(raw), qtype, k)


def assert_block_kernels_agree(reference, other, qtype: QT, dtype: torch.dtype) -> None:
    """n = 200: 13 panels, 4 groups of the many-rows pass, the last one partial."""
    n, k = 200, 512
    w = block_weight(qtype, n, k, seed=int(qtype))
    gen = torch.Generator().manual_seed(int(qtype))
    bias = torch.randn(n, generator=gen).to(dtype)
    for m in ROWS:
        x = torch.randn(m, k, generator=gen).to(dtype)
        for b in (None, bias):
            for float_out in (True, False):
                want = reference.block_linear(x, w.packed, w.type_id, n, b, float_out)
                got = other.block_linear(x, w.packed, w.type_id, n, b, float_out)
                assert torch.equal(got, want) and same_bits(got.float(), want.float()), (
                    m,
                    b is None,
                    float_out,
                )


@pytest.mark.parametrize("march", ISAS)
@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_block_kernels_give_the_native_bits(march, qtype) -> None:
    assert_block_kernels_agree(cpu_kernels.extension(), isa_build(march), qtype, torch.float32)


@pytest.mark.parametrize("march", SIMD_ISAS)
@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_bfloat16_block_kernels_without_avx512_bf16_give_the_scalar_builds_bits(
    march, qtype
) -> None:
    scalar = isa_build("x86-64-v2")
    assert_block_kernels_agree(scalar, isa_build(march), qtype, torch.bfloat16)


@pytest.mark.parametrize("march", ISAS)
def test_the_dense_float32_kernel_gives_the_native_bits(march) -> None:
    native, other = cpu_kernels.extension(), isa_build(march)
    gen = torch.Generator().manual_seed(7)
    n, k = 75, 321  # a partial panel, an odd K
    weight = torch.randn(n, k, generator=gen)
    packed = native.pack_linear(weight)
    assert torch.equal(other.pack_linear(weight), packed)
    bias = torch.randn(n, generator=gen)
    for m in [1, 2, 7, 13, 64]:
        x = torch.randn(m, k, generator=gen)
        assert same_bits(
            other.linear(x, packed, bias, n, True), native.linear(x, packed, bias, n, True)
        ), m


@pytest.mark.parametrize("march", ISAS)
@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1, QT.Q8_0])
def test_few_rows_passes_give_the_native_bits_at_every_row_count(march, qtype) -> None:
    """2..8 rows (a speculative verify) run one register tile per pass whose shape depends on
    the rows and the ISA (AVX2: 4 rows at a time): float32 against the native build, bf16
    against the scalar build (where the native build has no AVX512-BF16 of its own: every
    build then runs the portable order)."""
    n, k = 200, 512
    w = block_weight(qtype, n, k, seed=int(qtype) + 1)
    gen = torch.Generator().manual_seed(int(qtype) + 1)
    native, other, scalar = cpu_kernels.extension(), isa_build(march), isa_build("x86-64-v2")
    for m in range(2, 9):
        for dtype, reference in ((torch.float32, native), (torch.bfloat16, scalar)):
            if dtype == torch.bfloat16 and march == "x86-64-v2":
                continue  # the scalar build is the reference itself
            x = torch.randn(m, k, generator=gen).to(dtype)
            want = reference.block_linear(x, w.packed, w.type_id, n, None, True)
            got = other.block_linear(x, w.packed, w.type_id, n, None, True)
            assert same_bits(got, want), (m, dtype)
