"""The C++ kernels built for older instruction sets give the native build's float32 bits.

Every kernel fixes a lane's sequence of operations (models/cpu_kernels/*.cpp headers), and its
SIMD passes (AVX-512, or AVX2 through simd16.h) claim the portable loops' order for float32
activations. This host builds the same sources for `-march=haswell` (AVX2 + FMA: the simd16
AVX2 passes, compiler-vectorised dense loops) and `-march=x86-64-v2` (no AVX: the scalar loops)
and runs them on the same packed weights: the outputs must equal the native build's bit for
bit. (bfloat16 activations are left out: where the CPU has AVX512-BF16 the native build uses
vdpbf16ps, another order by design.)
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
from models.cpu_features import cpu_flags

# -march=haswell code needs these; a CPU without them can only check the scalar build.
HASWELL_FLAGS = {"avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "abm"}
ISAS = (["haswell"] if set(cpu_flags()) >= HASWELL_FLAGS else []) + ["x86-64-v2"]
ROWS = [1, 3, 9, 40]


@functools.cache
def isa_build(march: str):
    return cpu_kernels.build(march)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def block_weight(qtype: QT, n: int, k: int, seed: int) -> BlockWeight:
    values = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    if qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K):
        raw = quantize_k(values, qtype)
    else:
        raw = quantize(values, qtype)
    return BlockWeight.pack(torch.from_numpy(raw), qtype, k)


@pytest.mark.parametrize("march", ISAS)
@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1, QT.Q8_0, QT.Q5_0, QT.Q5_1, QT.Q4_K, QT.Q6_K])
def test_block_kernels_give_the_native_bits(march, qtype) -> None:
    native, other = cpu_kernels.extension(), isa_build(march)
    n, k = 40, 512
    w = block_weight(qtype, n, k, seed=int(qtype))
    gen = torch.Generator().manual_seed(int(qtype))
    bias = torch.randn(n, generator=gen)
    for m in ROWS:
        x = torch.randn(m, k, generator=gen)
        for b in (None, bias):
            want = native.block_linear(x, w.packed, w.type_id, n, b, True)
            got = other.block_linear(x, w.packed, w.type_id, n, b, True)
            assert same_bits(got, want), (m, b is None)


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
