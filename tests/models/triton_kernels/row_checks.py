"""What every kernel test checks besides closeness: a row computed in a batch equals the same
row computed alone, bit for bit (batch invariance)."""

from __future__ import annotations

from collections.abc import Callable

import torch

# (rtol, atol) against the PyTorch reference: float32 tight, bfloat16 one or two units in the
# last place of its 8-bit mantissa (the kernels round once where torch rounds per op).
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1e-2)}


def assert_rows_batch_invariant(kernel: Callable[..., torch.Tensor], *row_args) -> None:
    """`kernel(*args)` on the whole batch (args are [R, ...] tensors, or None) equals, row by
    row, `kernel` on each row alone."""
    batched = kernel(*row_args)
    num_rows = next(a for a in row_args if a is not None).shape[0]
    for r in range(num_rows):
        alone = kernel(*(None if a is None else a[r : r + 1] for a in row_args))
        assert torch.equal(batched[r : r + 1], alone), f"row {r} differs from its solo run"
