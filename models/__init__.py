"""Model registry: family name -> model class, and `build_model`.

Contract: `build_model(config, dtype, device)` returns a module with
`forward(input_ids[T], positions[T], meta, kv_caches) -> hidden[T, H]`,
`compute_logits(hidden[R, H]) -> [R, V]` float32 and `load_weights(pairs)`.
"""

from __future__ import annotations

import torch
from torch import nn

from models.config import ModelConfig
from models.gpt2 import GPT2LMHeadModel
from models.llama import LlamaForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "llama": LlamaForCausalLM,
    "gpt2": GPT2LMHeadModel,
}


def build_model(config: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> nn.Module:
    """An uninitialised model of the config's family (weights come from load_weights)."""
    cls = MODEL_REGISTRY.get(config.family)
    if cls is None:
        raise ValueError(f"no model class for family {config.family!r}")
    with torch.device("meta"):
        model = cls(config)
    # Materialise on the target device without spending time on random init.
    model = model.to_empty(device=device).to(dtype)
    model.tie_weights()  # materialising off the meta device unties shared parameters
    _reset_buffers(model, config)
    return model.eval()


def _reset_buffers(model: nn.Module, config: ModelConfig) -> None:
    """Buffers computed in __init__ (rotary tables) were lost on the meta device: recompute."""
    from models.layers import RotaryEmbedding, rope_inverse_frequencies

    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.inv_freq = rope_inverse_frequencies(
                config.head_dim, config.rope_theta, config.rope_scaling
            ).to(module.inv_freq.device)


def allocate_kv_cache(
    config: ModelConfig,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
    num_kv_heads: int | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (k, v), each [num_blocks, block_size, num_kv_heads, head_dim]; a
    tensor-parallel rank passes the KV heads it holds (default: the model's)."""
    heads = config.num_kv_heads if num_kv_heads is None else num_kv_heads
    shape = (num_blocks, block_size, heads, config.head_dim)
    return [
        (
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
        )
        for _ in range(config.num_layers)
    ]


__all__ = ["MODEL_REGISTRY", "ModelConfig", "allocate_kv_cache", "build_model"]
