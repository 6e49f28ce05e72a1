"""The packed linear kernel's int8 weights (linear.cpp): widened in registers (few rows) or once
per panel group into a bf16 scratch (more than one pass of rows), both exactly, so a call over
int8 panels gives the bits of the bf16 pass over the same values with the row scale applied
after it, and a row's bits do not depend on which of the two paths ran it.

Oracles: the bf16 pass over `q.to(bfloat16)` (every int8 is exact in bf16; that pass loads its
pairs as stored, no widening) times the scales in float64 (a float32 product is exact there, so
rounding it once to float32 is the kernel's fma with a zero bias), bitwise; solo rows, bitwise;
a float64 matmul over the dequantised weights, within float32-accumulation tolerance.
"""

from __future__ import annotations

import pytest
import torch

from models import cpu_kernels

pytestmark = pytest.mark.cpu_kernels  # skipped off the CPU (tests/conftest.py)


def ext():
    built = cpu_kernels.extension()
    assert built is not None, "the C++ kernels must build on this machine"
    return built


def every_int8(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """[n, k] int8 holding each of the 256 values (-128 included) at least once when n*k >= 256."""
    flat = torch.randint(-128, 128, (n * k,), generator=gen, dtype=torch.int16)
    first = min(256, n * k)
    flat[:first] = torch.arange(-128, 128, dtype=torch.int16)[torch.randperm(256, generator=gen)][
        :first
    ]
    return flat[torch.randperm(n * k, generator=gen)].to(torch.int8).view(n, k)


@pytest.mark.parametrize("n,k", [(37, 5), (100, 577), (960, 576), (48, 1536)])
def test_int8_panels_give_the_bf16_pass_over_the_same_values_bitwise(n: int, k: int) -> None:
    gen = torch.Generator().manual_seed(n * 31 + k)
    q = every_int8(n, k, gen)
    scales = torch.rand(n, generator=gen) / 50 + 1e-4
    packed, as_bf16 = ext().pack_linear(q), ext().pack_linear(q.bfloat16())
    for m in (1, 2, 5, 6, 7, 13, 64, 301):  # in-register widening (M <= 6) and the scratch
        x = torch.randn(m, k, generator=gen).bfloat16()
        got = ext().linear(x, packed, None, n, True, scales)
        acc = ext().linear(x, as_bf16, None, n, True)
        want = (acc.double() * scales.double()).float()
        assert torch.equal(got, want), f"M={m}"


@pytest.mark.parametrize("float_out", [True, False])
@pytest.mark.parametrize("n,k", [(100, 577), (960, 576)])
def test_every_row_of_a_prefill_sized_int8_call_equals_its_solo_row(
    float_out: bool, n: int, k: int
) -> None:
    """M = 2048 runs the widened scratch over many row blocks and splits between threads
    mid-walk; M = 1 widens in registers: the bits must agree at every pass edge."""
    gen = torch.Generator().manual_seed(n + k)
    q = every_int8(n, k, gen)
    scales = torch.rand(n, generator=gen) / 50 + 1e-4
    bias = torch.randn(n, generator=gen).bfloat16()
    packed = ext().pack_linear(q)
    m = 2048
    x = torch.randn(m, k, generator=gen).bfloat16()
    got = ext().linear(x, packed, bias, n, float_out, scales)
    want = x.double() @ (q.double() * scales.double()[:, None]).T + bias.double()
    tol = 1e-5 * k**0.5 if float_out else 1e-2 * k**0.5
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=1e-2)
    edges = {r for b in range(6, m, 6) for r in (b - 1, b)}
    rows = sorted(edges | set(torch.randint(m, (64,), generator=gen).tolist()))
    for r in rows:
        solo = ext().linear(x[r : r + 1].contiguous(), packed, bias, n, float_out, scales)[0]
        assert torch.equal(got[r], solo), f"row {r}"
