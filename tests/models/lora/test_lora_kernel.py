"""The C++ LoRA kernel (models/cpu_kernels/lora.cpp) against the PyTorch reference of
models/lora/stack.py and a float64 product, and both batch-invariant: a row's bits are those of
the row computed alone, whatever adapters (or the base) share its call."""

from __future__ import annotations

import pytest
import torch

from models import cpu_kernels
from models.lora.stack import LoraStack

pytestmark = pytest.mark.cpu_kernels


def random_stack(dtype: torch.dtype, slots: int = 4, rank: int = 8) -> LoraStack:
    stack = LoraStack(slots, rank, 40, [24, 8, 8], dtype, "cpu")  # a qkv-like projection
    gen = torch.Generator().manual_seed(0)
    for slot in range(slots):
        for piece, (lo, hi) in enumerate([(0, 24), (24, 32), (32, 40)]):
            if slot == 3 and piece == 1:
                continue  # an adapter that leaves k out
            r = 1 + (slot + piece) % rank
            a, b = torch.randn(r, 40, generator=gen), torch.randn(hi - lo, r, generator=gen)
            stack.put(slot, piece, a.to(dtype), b.to(dtype), 0.5 + slot)
    return stack


def float64_delta(stack: LoraStack, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(x.shape[0], stack.b.shape[2], dtype=torch.float64)
    for t, slot in enumerate(rows.tolist()):
        if slot < 0:
            continue
        u = stack.a[slot].double() @ x[t].double()
        for s, (lo, hi) in enumerate(zip(stack.bounds, stack.bounds[1:], strict=False)):
            seg = u[s * stack.rank : (s + 1) * stack.rank]
            out[t, lo:hi] = stack.scales[slot, lo:hi].double() * (
                stack.b[slot, :, lo:hi].double().T @ seg
            )
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_equals_reference_and_float64(dtype: torch.dtype) -> None:
    ext = cpu_kernels.extension()
    stack = random_stack(dtype)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(37, 40, generator=gen).to(dtype)
    y = torch.randn(37, 40, generator=gen).to(dtype)
    rows = torch.tensor([(i % 6) - 1 for i in range(37)])  # -1 (base) and slots 0..3, and 4 -> ok
    rows[rows == 4] = 2
    ref = stack.reference_add(x, y, rows)
    stack.kernel = ext.lora_add
    got = stack.add(x, y.clone(), rows)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), ref.float(), atol=tol * 10, rtol=tol)
    exact = y.double() + float64_delta(stack, x, rows)
    torch.testing.assert_close(got.double(), exact, atol=tol * 10, rtol=tol)
    assert torch.equal(got[rows < 0], y[rows < 0])  # base rows untouched


@pytest.mark.parametrize("use_kernel", [True, False])
def test_a_rows_bits_do_not_depend_on_its_neighbours(use_kernel: bool) -> None:
    stack = random_stack(torch.bfloat16)
    if use_kernel:
        stack.kernel = cpu_kernels.extension().lora_add
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(64, 40, generator=gen).bfloat16()
    y = torch.randn(64, 40, generator=gen).bfloat16()
    rows = torch.randint(-1, 4, (64,), generator=gen)
    together = stack.add(x, y.clone(), rows)
    for t in range(0, 64, 7):
        alone = stack.add(x[t : t + 1], y[t : t + 1].clone(), rows[t : t + 1])
        assert torch.equal(together[t], alone[0]), t


def test_a_slot_outside_the_bank_is_refused() -> None:
    stack = random_stack(torch.float32)
    stack.kernel = cpu_kernels.extension().lora_add
    x = torch.zeros(2, 40)
    with pytest.raises(RuntimeError, match="outside 4 slots"):
        stack.add(x, x.clone(), torch.tensor([0, 4]))
