"""The sparse MLP of a gpt-oss layer: its router and its experts, as transformers computes them.

Contract: `GptOssMoeBlock(config)(x [T, H]) -> [T, H]` in x's dtype. The router (`router`, a
linear [E, H] with bias) scores the experts; each token takes its `top_k` highest logits and the
float32 softmax over those k (models/moe/router.route_topk_softmax). `GptOssExperts` is
`GroupedExperts` (the grouping by expert and the float32 rank-order weighted sum,
models/moe/experts.py) with gpt-oss's expert: gate_up = x W_gu^T + b_gu, its even columns the
gate and odd ones the up (interleaved, as the checkpoints store the rows), then
`clamped_swiglu`, then x' W_d^T + b_d.

Layout: `gate_up_proj.weight` [E * 2I, H] (expert e's 2I interleaved rows at e * 2I: the files'
[E, H, 2I] transposed per expert), `gate_up_proj.bias` [E * 2I], `down_proj.weight` [E * H, I],
`down_proj.bias` [E * H].

Tensor parallel (models/gpt_oss/parallel.py): every expert on every rank, its columns split;
`group` all-reduces the block's output.

Which path runs: the PyTorch experts on every device (CPU: models/linear_backend's
batch-invariant GEMM per expert; the C++ expert kernels (models/moe/cpu_experts.py, which picks
plain `GroupedExperts` only) and the Triton launches compute a plain SwiGLU without biases, so
neither is chosen for gpt-oss).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from models.config import ModelConfig
from models.linear_backend import invariant_linear
from models.moe.experts import GroupedExperts, StackedWeight
from models.moe.router import route_topk_softmax

if TYPE_CHECKING:
    from models.parallel.group import ParallelGroup


def clamped_swiglu(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gate_up [m, 2I] (gate, up interleaved) -> [m, I] in its dtype: with gate clamped above at
    `limit` and up to +-limit, (up + 1) * gate * sigmoid(alpha * gate), in float32 and rounded
    once (sigmoid written with exp: batch-invariant, models/pointwise.py)."""
    gate = gate_up[..., ::2].float().clamp(max=limit)
    up = gate_up[..., 1::2].float().clamp(min=-limit, max=limit)
    glu = gate / (1.0 + torch.exp(-alpha * gate))
    return ((up + 1.0) * glu).to(gate_up.dtype)


class StackedLinear(StackedWeight):
    """A grouped weight [E * N, K] and its bias [E * N]."""

    def __init__(self, rows: int, cols: int) -> None:
        super().__init__(rows, cols)
        self.bias = nn.Parameter(torch.empty(rows), requires_grad=False)


class GptOssExperts(GroupedExperts):
    triton_kernel = False  # module doc: clamped SwiGLU and biases

    def __init__(self, config: ModelConfig) -> None:
        moe = config.moe
        if moe is None or moe.swiglu_limit is None:
            raise ValueError(f"{config.architecture} has no gpt-oss experts config")
        super().__init__(moe.num_experts, config.hidden_size, moe.expert_intermediate_size)
        e, h, i = moe.num_experts, config.hidden_size, moe.expert_intermediate_size
        self.gate_up_proj = StackedLinear(e * 2 * i, h)
        self.down_proj = StackedLinear(e * h, i)
        self.alpha, self.limit = moe.swiglu_alpha, moe.swiglu_limit

    def run_expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """x [m, H] -> [m, H] in x's dtype: expert e's biased, clamped SwiGLU MLP."""
        linear = invariant_linear if x.device.type == "cpu" else F.linear
        n, h = 2 * self.intermediate, self.hidden
        gate_up = linear(x, self.gate_up(e), self.gate_up_proj.bias[e * n : (e + 1) * n])
        act = clamped_swiglu(gate_up, self.alpha, self.limit)
        return linear(act, self.down(e), self.down_proj.bias[e * h : (e + 1) * h])


class GptOssMoeBlock(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        assert config.moe is not None  # GptOssExperts refuses a config without one
        self.top_k = config.moe.top_k
        self.experts = GptOssExperts(config)
        self.router = nn.Linear(config.hidden_size, config.moe.num_experts, bias=True)

        self.group: ParallelGroup | None = None  # tensor parallel: models/gpt_oss/parallel.py

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = route_topk_softmax(self.router(x), self.top_k)  # [T, k] each
        out = self.experts(x, experts, weights)
        # each rank holds a slice of every expert's columns (and rank 0 the down biases)
        return out if self.group is None else self.group.all_reduce(out)
