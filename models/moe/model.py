"""The mixture-of-experts decoder family: Mixtral, Qwen3-MoE, Qwen2-MoE.

Their layers are Llama's (RMSNorm, rotary GQA attention; Qwen3-MoE's q/k norms, Qwen2-MoE's
qkv bias) with the MLP of each sparse layer (`MoeConfig.is_sparse`) a `SparseMoeBlock`; the
other layers keep a dense SwiGLU MLP.

Contract: as `LlamaForCausalLM` (models/llama.py): `forward`, `compute_logits`, and
`load_weights` over Hugging Face names, both as the files store experts (one tensor per expert
and projection: `mlp.experts.{e}.gate_proj.weight`, Mixtral's
`block_sparse_moe.experts.{e}.w1/w3/w2.weight`) and as transformers' state_dict holds them
(`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I]).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch

from models.config import ModelConfig
from models.llama import LlamaForCausalLM
from models.moe.block import SparseMoeBlock
from models.weights import WeightLoader

# Mixtral's expert projections by their names in the files.
_MIXTRAL_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_MIXTRAL_EXPERT = re.compile(r"\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.")


class MoeForCausalLM(LlamaForCausalLM):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)  # on the meta device (models.build_meta_model): no memory
        moe = config.moe
        if moe is None:
            raise ValueError(f"{config.architecture} has no mixture-of-experts config")
        for index, layer in enumerate(self.model.layers):
            if moe.is_sparse(index):
                layer.mlp = SparseMoeBlock(config)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.weight_loader().load(_canonical_expert_names(weights))

    def weight_loader(self) -> WeightLoader:
        """Llama's name map, and where each expert's tensors land in the grouped weights."""
        loader = super().weight_loader()
        moe, h = self.config.moe, self.config.hidden_size
        assert moe is not None  # __init__ refused a config without one
        i, si = moe.expert_intermediate_size, moe.shared_expert_intermediate_size
        loader.fuse("mlp.shared_expert.gate_proj", "mlp.shared_expert.gate_up_proj", 0, si)
        loader.fuse("mlp.shared_expert.up_proj", "mlp.shared_expert.gate_up_proj", si, si)
        for e in range(moe.num_experts):  # expert e's rows inside the grouped weights
            experts = f"mlp.experts.{e}"
            loader.fuse(f"{experts}.gate_proj", "mlp.experts.gate_up_proj", 2 * i * e, i)
            loader.fuse(f"{experts}.up_proj", "mlp.experts.gate_up_proj", 2 * i * e + i, i)
            loader.fuse(f"{experts}.down_proj", "mlp.experts.down_proj", h * e, h)
        return loader


def _canonical_expert_names(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """Mixtral's file names and transformers' grouped [E, N, K] tensors under the names the
    loader places: `mlp.experts.{e}.{gate,up,down}_proj.weight` and `....weight` [E * N, K]."""
    for name, tensor in weights:
        name = name.replace(".block_sparse_moe.gate.", ".mlp.gate.")
        match = _MIXTRAL_EXPERT.search(name)
        if match:
            e, w = match.groups()
            name = name.replace(match.group(0), f".mlp.experts.{e}.{_MIXTRAL_NAMES[w]}.")
        if name.endswith((".experts.gate_up_proj", ".experts.down_proj")):
            name, tensor = name + ".weight", tensor.reshape(-1, tensor.shape[-1])
        yield name, tensor
