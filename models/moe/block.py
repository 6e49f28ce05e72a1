"""The sparse MLP block of a mixture-of-experts decoder layer.

Contract: `SparseMoeBlock(config)(x [T, H]) -> [T, H]` in x's dtype: the router (`gate`, a
linear [E, H] without bias) scores the experts, `route` picks each token's top-k
(models/moe/router.py), `experts` computes their weighted sum (models/moe/experts.py); with a
shared expert (Qwen2-MoE) `sigmoid(shared_expert_gate(x)) * shared_expert(x)` is added, as
transformers adds it. Module names are the checkpoints' (`mlp.gate`, `mlp.experts`,
`mlp.shared_expert`, `mlp.shared_expert_gate`). Under tensor parallel (models/moe/parallel.py)
`group` all-reduces the routed experts' partial output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from models.config import ModelConfig
from models.layers import GatedMLP
from models.moe.experts import GroupedExperts
from models.moe.router import route

if TYPE_CHECKING:
    from models.parallel.group import ParallelGroup


class SparseMoeBlock(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        moe = config.moe
        if moe is None:
            raise ValueError(f"{config.architecture} has no mixture-of-experts config")
        if config.hidden_act not in ("silu", "swish"):
            raise ValueError(f"unsupported hidden_act {config.hidden_act!r} for experts: silu")
        self.top_k, self.renormalize = moe.top_k, moe.renormalize
        self.gate = nn.Linear(config.hidden_size, moe.num_experts, bias=False)
        self.experts = GroupedExperts(
            moe.num_experts, config.hidden_size, moe.expert_intermediate_size
        )
        self.group: ParallelGroup | None = None  # tensor parallel: models/moe/parallel.py
        self.shared_expert: GatedMLP | None = None
        self.shared_expert_gate: nn.Linear | None = None
        if moe.shared_expert_intermediate_size:
            self.shared_expert = GatedMLP(
                config.hidden_size, moe.shared_expert_intermediate_size, config.hidden_act
            )
            self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = route(self.gate(x), self.top_k, self.renormalize)  # [T, k] each
        out = self.experts(x, experts, weights)
        if self.group is not None:  # each rank holds a slice of every expert's columns
            out = self.group.all_reduce(out)
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out
