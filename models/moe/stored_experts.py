"""A mixture-of-experts GGUF's expert tensors kept as stored: each expert's rows of llama.cpp's
3-D `ffn_{gate,up,down}_exps` blocks packed for the C++ block kernels (models/block_linear.py).

Contract:
- `stored_expert_groups(plan)`: layer -> {"gate", "up", "down": the 3-D tensor's info} for the
  layers whose three expert tensors are in `STORED_TYPES` (gate and up of one type, or both
  `MIXABLE_TYPES`), from a GGUF plan (models/gguf/names.gguf_to_hf_plan);
- `keep_experts_as_stored(model, gguf, plan)` puts a `BlockExperts` in place of those layers'
  `mlp.experts` (on the meta-device model, before anything is allocated) and returns the
  Hugging Face names it consumed; ValueError naming the file for a shape the model does not
  expect.
- `BlockExperts` computes what `GroupedExperts` computes over the dequantised weights, bitwise:
  the same grouping and float32 rank-order sum, each expert's gate-up (one packed weight: its
  gate rows, then its up rows) and down through `BlockLinear` (a row's values depend on K alone:
  batch-invariant). Memory: the file's expert bytes, nothing dense.
"""

from __future__ import annotations

import re

import torch
from gguf import GGMLQuantizationType
from torch import nn

from models import pointwise
from models.block_linear import MIXABLE_TYPES, STORED_TYPES, BlockLinear, BlockWeight
from models.gguf.file import GGUFFile
from models.gguf.header import GGUFTensorInfo
from models.host_memory import release_freed_memory
from models.moe.experts import GroupedExperts

_EXPERT = re.compile(
    r"model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.\d+\."
    r"(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight"
)
_ROLE = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down",
         "w2": "down"}  # fmt: skip


class BlockExperts(GroupedExperts):
    def __init__(self, gate_up: list[BlockWeight], down: list[BlockWeight]) -> None:
        nn.Module.__init__(self)  # no grouped dense weights: the blocks are the only copy
        self.num_experts, self.hidden = len(gate_up), down[0].out_features
        self.intermediate = down[0].in_features
        self.gate_up_blocks = nn.ModuleList(BlockLinear(w) for w in gate_up)
        self.down_blocks = nn.ModuleList(BlockLinear(w) for w in down)

    def run_expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_blocks[e](x).split(self.intermediate, dim=-1)
        return self.down_blocks[e](pointwise.silu(gate) * up)


def _qtype(info: GGUFTensorInfo) -> GGMLQuantizationType | None:
    try:
        return GGMLQuantizationType(info.type_id)
    except ValueError:
        return None


def stored_expert_groups(plan) -> dict[int, dict[str, GGUFTensorInfo]]:
    found: dict[int, dict[str, GGUFTensorInfo]] = {}
    for info, hf_name, _ in plan:
        m = _EXPERT.fullmatch(hf_name)
        if m is not None and len(info.shape) == 3:
            found.setdefault(int(m.group(1)), {})[_ROLE[m.group(2)]] = info
    groups = {}
    for layer, parts in found.items():
        types = {role: _qtype(info) for role, info in parts.items()}
        if len(parts) != 3 or not set(types.values()) <= STORED_TYPES:
            continue
        gate, up = types["gate"], types["up"]
        if gate == up or {gate, up} <= MIXABLE_TYPES:
            groups[layer] = parts
    return groups


def keep_experts_as_stored(model: nn.Module, gguf: GGUFFile, plan) -> set[str]:
    groups = stored_expert_groups(plan)
    infos = {id(info) for parts in groups.values() for info in parts.values()}
    for layer, parts in groups.items():
        old = model.model.layers[layer].mlp.experts
        e, i, h = parts["gate"].shape
        if (e, i, h) != (old.num_experts, old.intermediate, old.hidden) or parts["down"].shape != (
            e, h, i,
        ):  # fmt: skip
            raise ValueError(
                f"{gguf.path}: layer {layer}'s expert tensors have shapes "
                f"{[parts[r].shape for r in ('gate', 'up', 'down')]}, the model expects "
                f"{old.num_experts} experts of {old.intermediate} x {old.hidden}"
            )
        blocks = {role: gguf.blocks(info) for role, info in parts.items()}  # [E, rows, bytes]
        qt = {role: _qtype(info) for role, info in parts.items()}
        gate_up = [
            BlockWeight.pack_parts(
                [(blocks["gate"][n], qt["gate"]), (blocks["up"][n], qt["up"])], h
            )  # fmt: skip
            for n in range(e)
        ]
        down = [BlockWeight.pack(blocks["down"][n], qt["down"], i) for n in range(e)]
        model.model.layers[layer].mlp.experts = BlockExperts(gate_up, down)
        del blocks, gate_up, down
        release_freed_memory()  # a layer's raw reads, kept resident by glibc until trimmed
    return {hf_name for info, hf_name, _ in plan if id(info) in infos}
