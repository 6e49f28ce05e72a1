"""Tensor parallel for a sparse block: each expert sharded like a dense MLP.

Why this split (not experts by rank): every rank keeps every expert and the router, so the
routing is computed identically on every rank and the load is even whatever the router picks;
each expert's intermediate columns are split in near-equal contiguous ranges (its gate and up
rows, its down columns), as models/parallel shards a dense MLP, and the block's routed output
is one all-reduce of the ranks' partial weighted sums. TP=2 equals TP=1 up to the order of
that sum (tests/engine/parallel/test_tp_logits.py).

Contract: `shard_sparse_block(block, world, rank, group, shard_mlp)` cuts `block` in place for
`rank`: its GroupedExperts keep rows / columns [lo, hi) of every expert's intermediate, the
router and the shared expert's gate are replicated, the shared expert is cut by `shard_mlp`
(models/parallel/shard.py's dense-MLP cut, its down projection all-reducing), and
`block.group` all-reduces the routed experts' output.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from models.moe.block import SparseMoeBlock
from models.parallel.group import ParallelGroup
from models.parallel.layout import Range, even_split


def shard_sparse_block(
    block: SparseMoeBlock,
    world: int,
    rank: int,
    group: ParallelGroup,
    shard_mlp: Callable[[nn.Module, Range], None],
) -> None:
    experts = block.experts
    e, i, h = experts.num_experts, experts.intermediate, experts.hidden
    lo, hi = even_split(i, world, rank)
    gate_up = experts.gate_up_proj.weight.detach().view(e, 2 * i, h)
    rows = torch.cat((gate_up[:, lo:hi], gate_up[:, i + lo : i + hi]), dim=1)  # [E, 2w, H]
    down = experts.down_proj.weight.detach().view(e, h, i)[:, :, lo:hi]  # [E, H, w]
    experts.gate_up_proj.weight = nn.Parameter(rows.reshape(-1, h).contiguous().clone(),
                                               requires_grad=False)  # fmt: skip
    experts.down_proj.weight = nn.Parameter(down.reshape(e * h, -1).contiguous().clone(),
                                            requires_grad=False)  # fmt: skip
    experts.intermediate = hi - lo
    if block.shared_expert is not None:
        shard_mlp(block.shared_expert, even_split(block.shared_expert.intermediate, world, rank))
    block.group = group
