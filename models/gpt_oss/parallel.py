"""Tensor parallel for a gpt-oss sparse block, as models/moe/parallel.py splits the others'.

Contract: `shard_gpt_oss_block(block, world, rank, group)` cuts `block` in place for `rank`:
the router and every expert stay on every rank (the routing is computed identically
everywhere), each expert keeps its intermediate columns [lo, hi) (near-equal contiguous
ranges): the interleaved gate / up rows 2 lo .. 2 hi and their biases, the down projection's
columns lo .. hi; the down biases stay on rank 0 only (they join the partial outputs' sum
once); `block.group` all-reduces the block's output. TP=2 equals TP=1 up to the order of that
sum (tests/engine/parallel/test_tp_logits.py).
"""

from __future__ import annotations

import torch
from torch import nn

from models.gpt_oss.experts import GptOssMoeBlock
from models.parallel.group import ParallelGroup
from models.parallel.layout import even_split


def shard_gpt_oss_block(block: GptOssMoeBlock, world: int, rank: int, group: ParallelGroup) -> None:
    experts = block.experts
    e, i, h = experts.num_experts, experts.intermediate, experts.hidden
    lo, hi = even_split(i, world, rank)
    gate_up = experts.gate_up_proj
    rows = gate_up.weight.detach().view(e, 2 * i, h)[:, 2 * lo : 2 * hi].reshape(-1, h)
    bias = gate_up.bias.detach().view(e, 2 * i)[:, 2 * lo : 2 * hi].reshape(-1)
    down = experts.down_proj
    columns = down.weight.detach().view(e, h, i)[:, :, lo:hi].reshape(e * h, -1)
    down_bias = down.bias.detach() if rank == 0 else torch.zeros_like(down.bias)
    for holder, name, tensor in ((gate_up, "weight", rows), (gate_up, "bias", bias),
                                 (down, "weight", columns), (down, "bias", down_bias)):  # fmt: skip
        setattr(holder, name, nn.Parameter(tensor.contiguous().clone(), requires_grad=False))
    experts.intermediate = hi - lo
    block.group = group
