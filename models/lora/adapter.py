"""A LoRA adapter as tgserve applies it: per (layer, module) one low-rank pair and its scale.

Contract: `LoraAdapter(name, modules)` where `modules[(layer, module)] = ModuleLora(a, b, scale)`,
`a` [r, in_features] ("lora_A", the shrink), `b` [out_features, r] ("lora_B", the expand) and
`scale` the float the product is multiplied by (alpha / r, or alpha / sqrt(r) under rsLoRA):
a module's output becomes `base(x) + scale * (x @ a.T) @ b.T`, as PEFT computes it unmerged.
`module` is one of `TARGET_MODULES` (the Llama family's seven projections). `check_fits(config)`
raises `LoraRefused` naming the module when the adapter's shapes or layers do not fit the base
model. `nbytes`: the adapter's own bytes (what a slot of the bank holds, models/lora/bank.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.config import ModelConfig

# The projections LoRA can adapt, by their checkpoint name -> (tgserve's fused projection, the
# slice of it, in order). q/k/v share `qkv_proj`, gate/up share `gate_up_proj` (models/llama.py).
TARGET_MODULES: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv", 0),
    "k_proj": ("qkv", 1),
    "v_proj": ("qkv", 2),
    "o_proj": ("o", 0),
    "gate_proj": ("gate_up", 0),
    "up_proj": ("gate_up", 1),
    "down_proj": ("down", 0),
}
# Module names a PEFT folder may name that tgserve refuses, with why.
REFUSED_MODULES: dict[str, str] = {
    "embed_tokens": "embedding adapters are not supported (only q/k/v/o/gate/up/down)",
    "lm_head": "LM-head adapters are not supported (only q/k/v/o/gate/up/down)",
}


class LoraRefused(ValueError):
    """An adapter tgserve cannot apply; the message names the reason (and the file / module)."""


@dataclass(frozen=True)
class ModuleLora:
    a: torch.Tensor  # [r, in_features]
    b: torch.Tensor  # [out_features, r]
    scale: float

    @property
    def rank(self) -> int:
        return self.a.shape[0]


@dataclass(frozen=True)
class LoraAdapter:
    name: str
    modules: dict[tuple[int, str], ModuleLora]

    @property
    def max_rank(self) -> int:
        return max((m.rank for m in self.modules.values()), default=0)

    @property
    def nbytes(self) -> int:
        return sum(m.a.nbytes + m.b.nbytes for m in self.modules.values())

    def check_fits(self, config: ModelConfig) -> None:
        for (layer, module), lora in self.modules.items():
            if not 0 <= layer < config.num_layers:
                raise LoraRefused(
                    f"adapter {self.name!r}: layer {layer} of {module} is past the base "
                    f"model's {config.num_layers} layers (a base model mismatch)"
                )
            k, n = module_shape(config, module)
            if lora.a.dim() != 2 or lora.b.dim() != 2 or lora.b.shape[1] != lora.rank:
                raise LoraRefused(
                    f"adapter {self.name!r}: layer {layer} {module}: lora_A {tuple(lora.a.shape)}"
                    f" and lora_B {tuple(lora.b.shape)} are not a rank-r pair"
                )
            if lora.a.shape[1] != k or lora.b.shape[0] != n:
                raise LoraRefused(
                    f"adapter {self.name!r}: layer {layer} {module} maps {lora.a.shape[1]} -> "
                    f"{lora.b.shape[0]} features, the base model's {module} maps {k} -> {n} "
                    "(a base model mismatch)"
                )


def module_shape(config: ModelConfig, module: str) -> tuple[int, int]:
    """(in_features, out_features) of a target module of a Llama-family model."""
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    hidden, inter = config.hidden_size, config.intermediate_size
    shapes = {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }
    return shapes[module]


def lora_scale(alpha: float, rank: int, rslora: bool) -> float:
    """PEFT's scaling: alpha / r, or alpha / sqrt(r) for rank-stabilised LoRA."""
    return alpha / rank**0.5 if rslora else alpha / rank
