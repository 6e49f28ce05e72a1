"""The Triton LoRA kernels (models/triton_kernels/lora.py) equal the PyTorch reference of
models/lora/stack.py on rows of several adapters, of one adapter leaving a slice out, and of the
base model (float32 and bfloat16), and a row's result does not depend on the batch."""

from __future__ import annotations

import pytest
import torch

from models.lora.stack import LoraStack
from tests.models.triton_kernels.row_checks import TOLERANCE, assert_rows_batch_invariant


def stack_on(device, dtype: torch.dtype) -> LoraStack:
    stack = LoraStack(3, 4, 40, [24, 8, 8], dtype, "cpu")
    gen = torch.Generator().manual_seed(0)
    for slot in range(3):
        for piece, width in enumerate([24, 8, 8]):
            if (slot, piece) == (2, 1):
                continue  # this adapter leaves k out
            r = 1 + (slot + piece) % 4
            a, b = torch.randn(r, 40, generator=gen), torch.randn(width, r, generator=gen)
            stack.put(slot, piece, a.to(dtype), b.to(dtype), 0.5 + slot)
    for name in ("a", "b", "scales", "offsets"):
        setattr(stack, name, getattr(stack, name).to(device))
    return stack


def inputs(device, dtype, rows: int = 7):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(rows, 40, generator=gen).to(dtype).to(device)
    y = torch.randn(rows, 40, generator=gen).to(dtype).to(device)
    slots = torch.tensor([(i % 4) - 1 for i in range(rows)], device=device)
    return x, y, slots


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equals_the_reference(triton_kernels, dtype) -> None:
    from models.triton_kernels.lora import lora_add, slice_of_outputs

    stack = stack_on(triton_kernels, dtype)
    x, y, slots = inputs(triton_kernels, dtype)
    got = lora_add(x, y, slots, stack.a, stack.b, stack.scales, slice_of_outputs(stack.offsets))
    want = stack.reference_add(x, y, slots)
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(got, want, rtol=rtol * 10, atol=atol * 10)
    assert torch.equal(got[slots < 0], y[slots < 0])  # base rows untouched


def test_a_row_does_not_depend_on_the_batch(triton_kernels) -> None:
    from models.triton_kernels.lora import lora_add, slice_of_outputs

    stack = stack_on(triton_kernels, torch.bfloat16)
    slices = slice_of_outputs(stack.offsets)

    def kernel(x, y, slots):
        return lora_add(x, y, slots, stack.a, stack.b, stack.scales, slices)

    assert_rows_batch_invariant(kernel, *inputs(triton_kernels, torch.bfloat16))
