"""LoraStack: every slot's low-rank weights for ONE fused projection of one layer, and the
batched shrink / expand that adds them to the projection's output, row by row.

Layout (S slices: qkv has q, k, v; gate_up has gate, up; o and down have one):
- `a` [slots, S * R, K]: slice s's lora_A in rows s*R .. s*R + r (zeros past its rank r);
- `b` [slots, R, N]: lora_B transposed, output n's column holding its slice's B row (zeros
  past the slice's rank r), so the C++ expand runs along N;
- `scales` [slots, N] float32: each output row's scale (0 where the slot leaves the slice);
- `offsets` [S + 1] int64: where each slice's outputs start in N (host copy: `bounds`).
Zero padding adds exact zeros, so a slot's values do not depend on R.

`add(x [T, K], y [T, N], rows [T])` returns y + for each row t with rows[t] = s >= 0:
`scale[s] * ((x[t] @ a[s].T)[slice] @ b[s][slice].T)` per slice (rows[t] = -1: the base model,
y[t] untouched): the C++ kernel on CPUs (models/cpu_kernels/lora.cpp), the Triton kernels on
CUDA (models/triton_kernels/lora.py), else the reference. Batch invariance: the reference groups
rows by slot (one Python step per
distinct slot, never per row) and runs each group through models/linear_backend's
`invariant_linear`, whose row bits do not depend on the other rows; the C++ kernel
(models/cpu_kernels/lora.cpp) computes each row alone in a fixed order. Rounding points, both:
the shrink rounds to the model dtype, the expand too, the scaled delta too, then one add.
"""

from __future__ import annotations

import torch

from models import triton_kernels
from models.linear_backend import invariant_linear


class LoraStack:
    def __init__(
        self,
        slots: int,
        rank: int,
        in_features: int,
        slice_outputs: list[int],
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        s, n = len(slice_outputs), sum(slice_outputs)
        self.rank = rank
        self.bounds = [0]
        for width in slice_outputs:
            self.bounds.append(self.bounds[-1] + width)
        self.a = torch.zeros(slots, s * rank, in_features, dtype=dtype, device=device)
        self.b = torch.zeros(slots, rank, n, dtype=dtype, device=device)
        self.scales = torch.zeros(slots, n, dtype=torch.float32, device=device)
        self.offsets = torch.tensor(self.bounds, dtype=torch.int64, device=device)
        self.kernel = None  # the C++ kernel's entry (models/lora/bank.py sets it on CPUs)
        self._slices: torch.Tensor | None = None  # [N] each output's slice (the Triton kernel)

    @property
    def nbytes(self) -> int:
        return self.a.nbytes + self.b.nbytes + self.scales.nbytes

    def clear(self, slot: int) -> None:
        self.a[slot].zero_()
        self.b[slot].zero_()
        self.scales[slot].zero_()

    def put(self, slot: int, piece: int, a: torch.Tensor, b: torch.Tensor, scale: float) -> None:
        """Slice `piece`'s pair into `slot`: a [r, K], b [N_piece, r]."""
        r, lo, hi = a.shape[0], self.bounds[piece], self.bounds[piece + 1]
        if r > self.rank:
            raise ValueError(f"rank {r} is above the bank's max rank {self.rank}")
        self.a[slot, piece * self.rank : piece * self.rank + r].copy_(a)
        self.b[slot, :r, lo:hi].copy_(b.T)
        self.scales[slot, lo:hi] = scale

    def add(self, x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        if rows is None:
            return y
        if self.kernel is not None and x.device.type == "cpu":
            y = y.contiguous()
            self.kernel(x.contiguous(), y, rows, self.a, self.b, self.scales, self.offsets)
            return y
        if triton_kernels.enabled(x):  # the GPU: two launches, no host read (capture-safe)
            from models.triton_kernels.lora import lora_add, slice_of_outputs

            if self._slices is None:
                self._slices = slice_of_outputs(self.offsets)
            return lora_add(x, y, rows, self.a, self.b, self.scales, self._slices)
        return self.reference_add(x, y, rows)

    def reference_add(self, x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The readable PyTorch form (any device; reads the distinct slots to the host)."""
        out = y.clone()
        for slot in rows.unique().tolist():
            if slot < 0:
                continue
            picked = (rows == slot).nonzero().squeeze(1)  # [n] rows of this slot
            u = invariant_linear(x.index_select(0, picked), self.a[slot], None)  # [n, S*R]
            parts = [
                invariant_linear(
                    u[:, s * self.rank : (s + 1) * self.rank],
                    self.b[slot, :, lo:hi].T.contiguous(),  # the slice's lora_B [N_s, R]
                    None,
                )
                for s, (lo, hi) in enumerate(zip(self.bounds, self.bounds[1:], strict=False))
            ]
            delta = (torch.cat(parts, dim=1).float() * self.scales[slot]).to(y.dtype)
            out.index_copy_(0, picked, y.index_select(0, picked) + delta)
        return out
