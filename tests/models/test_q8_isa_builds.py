"""int8 and int16 activations give the same bits on every ISA build (models/cpu_kernels/
q8_linear.h, q16_dot.h).

The integer sums are exact on every path (AVX512-VNNI vpdpbusd, AVX2 vpmaddubsw, scalar loops)
and the float epilogue is one lane-wise IEEE sequence, so unlike the bf16 block kernels every
build must match the native one bit for bit, float32 and bfloat16 activations alike. The builds
are those of tests/models/test_kernel_isa_builds.py (-march=haswell, icelake-server where the
CPU runs them, x86-64-v2 everywhere); each reports the integer path it compiled. int16 runs
q16_avx2.h's vpmaddwd pass in every AVX2 build (AVX-512 ones too) for up to 7 rows and
q16_tile.h's tile over widened panels from 8 rows on (m = 9, 40 below), and the scalar loops on
x86-64-v2: exact int32 sums everywhere, the same epilogue.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize

from models import cpu_kernels
from models.activation_quant import Q8Weight
from models.block_linear import BlockWeight
from tests.models.test_kernel_isa_builds import ISAS, KERNEL_BUILDS, isa_build  # noqa: F401

pytestmark = [
    pytest.mark.cpu_kernels,  # skipped off the CPU (tests/conftest.py)
    pytest.mark.skipif(
        not cpu_kernels.is_available(), reason="tgserve's C++ CPU kernels did not build here"
    ),
]
EXPECTED_PATH = {"haswell": "avx2", "icelake-server": "avx512_vnni", "x86-64-v2": "scalar"}
EXPECTED_Q16 = {"haswell": "avx2", "icelake-server": "avx2", "x86-64-v2": "scalar"}


def q8_weight(qtype: QT, n: int, k: int) -> Q8Weight:
    values = np.random.default_rng(int(qtype)).standard_normal((n, k)).astype(np.float32)
    raw = torch.from_numpy(quantize(values, qtype))
    return Q8Weight.from_blocks(BlockWeight.pack(raw, qtype, k))


@pytest.mark.parametrize("march", ISAS)
def test_every_build_gives_the_native_bits(march: str) -> None:
    native, other = cpu_kernels.extension(), isa_build(march)
    assert other.q8_isa() == EXPECTED_PATH[march]
    assert other.q16_isa() == EXPECTED_Q16[march]
    n, k = 200, 256  # 13 panels: pairs and a single last one
    gen = torch.Generator().manual_seed(0)
    int8_rows = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    weights = [q8_weight(qtype, n, k) for qtype in (QT.Q4_0, QT.Q4_1, QT.Q8_0)]
    weights.append(Q8Weight.from_int8(int8_rows, torch.rand(n, generator=gen) + 0.01))
    for w in weights + [w.with_bits(16) for w in weights]:
        qtype = w.qtype
        for dtype in (torch.float32, torch.bfloat16):
            bias = torch.randn(n, generator=gen).to(dtype)
            for m in (1, 2, 3, 9, 40):
                x = (torch.randn(m, k, generator=gen) * 3).to(dtype)
                quantized = (other.q8_quantize(x), native.q8_quantize(x))
                if w.act_bits == 16:
                    quantized = (other.q16_quantize(x), native.q16_quantize(x))
                for got, want in zip(*quantized, strict=True):
                    assert torch.equal(got, want), (qtype.name, dtype, m)
                for b in (None, bias):
                    for float_out in (True, False):
                        args = (x, w.packed, w.kind, n, b, float_out)
                        got, want = other.q8_linear(*args), native.q8_linear(*args)
                        assert torch.equal(got.float().view(torch.int32), want.float().view(torch.int32)), (
                            qtype.name, dtype, m, b is None, float_out,
                        )  # fmt: skip
