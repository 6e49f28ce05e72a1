"""Softmax top-k routing, as Mixtral, Qwen3-MoE and Qwen2-MoE route, and gpt-oss's top-k then
softmax.

Contract: `route(logits [T, E], top_k, renormalize) -> (weights [T, top_k] float32,
experts [T, top_k] int64)`: the softmax of each row in float32, its `top_k` largest
probabilities in descending order (rank 0 = the highest score; ties as torch.topk breaks
them), divided by their sum when `renormalize` (Mixtral always, Qwen with norm_topk_prob).
A row's result depends on that row alone. The weights stay float32: the experts' weighted
sum is taken in float32 (models/moe/experts.py) and rounded once.
`route_topk_softmax(logits [T, E], top_k)` (gpt-oss): the `top_k` largest logits in
descending order, then the float32 softmax over those k alone; the same shapes and rank order.
"""

from __future__ import annotations

import torch


def route(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(logits.float(), dim=-1)  # [T, E]
    weights, experts = torch.topk(probs, top_k, dim=-1)  # [T, top_k] each, descending
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def route_topk_softmax(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    top, experts = torch.topk(logits, top_k, dim=-1)  # [T, top_k] each, descending
    return torch.softmax(top.float(), dim=-1), experts
