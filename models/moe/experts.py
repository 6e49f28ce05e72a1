"""The routed experts of a sparse block: one grouped weight per projection, and the
reference computation (tokens grouped by expert) that runs on any device.

Layout: `gate_up_proj.weight` is [E * 2I, H] (expert e's gate rows, then its up rows, at
e * 2I: transformers' [E, 2I, H] flattened), `down_proj.weight` is [E * H, I]. `gate_up(e)`
and `down(e)` are the [2I, H] / [H, I] views of one expert.

Contract: `GroupedExperts.forward(x [T, H], experts [T, k], weights [T, k] float32) -> [T, H]`
in x's dtype: for every (token, rank) slot, down(silu(gate(x)) * up(x)) of the slot's
expert, then the sum over ranks in rank order (rank 0 first, the router's highest score) of
the float32 slot outputs times their float32 weights, rounded once to x's dtype.

Batch invariance: each expert's rows go through a linear whose rows do not depend on the other
rows (on a CPU models/linear_backend.invariant_linear, the PyTorch path's GEMM; a kernel
subclass, models/moe/cpu_experts.py, the C++ kernels), the activation is elementwise, and the
weighted sum of a token runs over its own slots in a fixed order: a row's bits never depend
on which other tokens chose the same experts.

On CUDA (where Triton is available) the experts run as models/moe/triton_experts.py's two
launches instead, tested against this reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models import pointwise, triton_kernels
from models.linear_backend import invariant_linear


class StackedWeight(nn.Module):
    """A holder of one grouped weight [E * N, K] (not an nn.Linear: nothing routes it as one)."""

    def __init__(self, rows: int, cols: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, cols), requires_grad=False)


class GroupedExperts(nn.Module):
    # Whether models/moe/triton_experts.py computes these experts on CUDA (its kernels run plain
    # SwiGLU without biases: a subclass computing anything else sets it False).
    triton_kernel = True

    def __init__(self, num_experts: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.num_experts, self.hidden, self.intermediate = num_experts, hidden, intermediate
        self.gate_up_proj = StackedWeight(num_experts * 2 * intermediate, hidden)
        self.down_proj = StackedWeight(num_experts * hidden, intermediate)

    def gate_up(self, e: int) -> torch.Tensor:
        """Expert e's [2I, H] gate-then-up rows."""
        n = 2 * self.intermediate
        return self.gate_up_proj.weight[e * n : (e + 1) * n]

    def down(self, e: int) -> torch.Tensor:
        """Expert e's [H, I] down rows."""
        return self.down_proj.weight[e * self.hidden : (e + 1) * self.hidden]

    def run_expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """x [m, H] -> [m, H] in x's dtype: expert e's SwiGLU MLP."""
        linear = invariant_linear if x.device.type == "cpu" else F.linear
        gate, up = linear(x, self.gate_up(e), None).split(self.intermediate, dim=-1)
        return linear(pointwise.silu(gate) * up, self.down(e), None)

    def forward(
        self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        # CUDA: two launches, no host read (capture-safe)
        if self.triton_kernel and triton_kernels.enabled(x):
            from models.moe.triton_experts import triton_experts

            return triton_experts(
                x, experts, weights, self.gate_up_proj.weight, self.down_proj.weight
            )
        slots = x.new_zeros(*experts.shape, self.hidden)  # [T, k, H]
        # Which experts this step's tokens chose (one host read: the grouping's sizes need it).
        for e in torch.unique(experts).tolist():
            tokens, ranks = (experts == e).nonzero(as_tuple=True)  # [m] each
            slots[tokens, ranks] = self.run_expert(e, x[tokens])
        return weighted_sum(slots, weights).to(x.dtype)


def weighted_sum(slots: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """slots [T, k, H], weights [T, k] float32 -> float32 [T, H]: sum over ranks in rank order."""
    out = slots[:, 0].float() * weights[:, :1]
    for r in range(1, slots.shape[1]):
        out = out + slots[:, r].float() * weights[:, r : r + 1]
    return out
