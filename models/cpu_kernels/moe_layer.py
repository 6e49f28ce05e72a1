"""A mixture-of-experts MLP handed to the C++ step (models/cpu_kernels/moe_block.h) as its weights.

Contract:
- `runs_sparse_block(mlp)`: whether the C++ step computes this decoder layer's MLP as a sparse
  block: a `SparseMoeBlock` (models/moe/block.py, SiLU experts; a tensor-parallel shard too:
  the step all-reduces its partial sums where the block does) whose experts are dense
  `GroupedExperts` or GGUF blocks as stored (`BlockExperts`), in float32 / bfloat16 on a CPU.
  Other variants (a subclass, another activation) keep the PyTorch layers.
- `moe_weights(ext, mlp, linear) -> (ext.MoeWeights, packed bytes)`: the router, each
  expert's gate-up and down, and Qwen2-MoE's shared expert with its gate. `linear(module)`
  is the step's own wrapper of an `nn.Linear` / `BlockLinear` (fused_decoder.py); dense
  experts are packed here (`pack_linear` of each expert's [2I, H] and [H, I] rows: a second copy
  of their bytes, as the step keeps for dense layers), GGUF blocks run in place (no copy).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from models.moe.block import SparseMoeBlock
from models.moe.experts import GroupedExperts
from models.moe.stored_experts import BlockExperts


def runs_sparse_block(mlp: nn.Module) -> bool:
    if type(mlp) is not SparseMoeBlock:
        return False
    experts = mlp.experts
    if type(experts) is BlockExperts:
        return True
    if type(experts) is not GroupedExperts:
        return False
    weight = experts.gate_up_proj.weight
    return weight.device.type == "cpu" and weight.dtype in (torch.float32, torch.bfloat16)


def moe_weights(ext, mlp: SparseMoeBlock, linear: Callable[[nn.Module], object]):
    experts = mlp.experts
    packed_bytes = 0
    if isinstance(experts, BlockExperts):
        gate_up = [linear(block) for block in experts.gate_up_blocks]
        down = [linear(block) for block in experts.down_blocks]
    else:

        def pack(weight: torch.Tensor):
            nonlocal packed_bytes
            weight = weight.detach().contiguous()
            packed = ext.pack_linear(weight)
            packed_bytes += packed.nbytes
            return ext.LinearWeights(weight=weight, packed=packed)

        gate_up = [pack(experts.gate_up(e)) for e in range(experts.num_experts)]
        down = [pack(experts.down(e)) for e in range(experts.num_experts)]
    shared = {}
    if mlp.shared_expert is not None and mlp.shared_expert_gate is not None:
        shared = dict(
            shared_gate_up=linear(mlp.shared_expert.gate_up_proj),
            shared_down=linear(mlp.shared_expert.down_proj),
            shared_gate=linear(mlp.shared_expert_gate),
        )
    weights = ext.MoeWeights(
        router=linear(mlp.gate),
        gate_up=gate_up,
        down=down,
        top_k=mlp.top_k,
        renormalize=mlp.renormalize,
        **shared,
    )
    return weights, packed_bytes
