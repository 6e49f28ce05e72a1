"""MoeConfig: the mixture-of-experts facts of a Hugging Face config.json.

Contract: `moe_config(d, arch)` returns the `MoeConfig` of MixtralForCausalLM,
Qwen3MoeForCausalLM or Qwen2MoeForCausalLM, None for any other architecture. Which layers are
sparse follows transformers: layer i is sparse unless i is in `mlp_only_layers` or
(i + 1) is not a multiple of `decoder_sparse_step` (Mixtral: every layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# HF architectures whose MLPs are sparse blocks (the "moe" family of models/__init__.py).
MOE_ARCHITECTURES = ("MixtralForCausalLM", "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM")


@dataclass(frozen=True)
class MoeConfig:
    num_experts: int
    top_k: int  # experts per token
    expert_intermediate_size: int  # each routed expert's gate / up width
    renormalize: bool  # divide the top-k probabilities by their sum (Mixtral, norm_topk_prob)
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE: one dense expert behind a sigmoid gate
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    # gpt-oss (models/gpt_oss): its experts' clamped SwiGLU, (up + 1) * gate * sigmoid(alpha *
    # gate) with gate clamped above at `swiglu_limit` and up at +-swiglu_limit.
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.702

    def is_sparse(self, layer: int) -> bool:
        """Whether decoder layer `layer` has a sparse block (else a dense MLP)."""
        return layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0


def moe_config(d: dict[str, Any], arch: str) -> MoeConfig | None:
    if arch not in MOE_ARCHITECTURES:
        return None
    experts = d.get("num_local_experts") if arch == "MixtralForCausalLM" else None
    experts = experts or d.get("num_experts") or d.get("num_local_experts")
    top_k = int(d["num_experts_per_tok"])
    if not experts or not 0 < top_k <= int(experts):
        raise ValueError(f"{arch}: num_experts_per_tok {top_k} must be in 1..{experts} experts")
    mixtral = arch == "MixtralForCausalLM"
    return MoeConfig(
        num_experts=int(experts),
        top_k=top_k,
        expert_intermediate_size=int(
            d["intermediate_size"] if mixtral else d["moe_intermediate_size"]
        ),
        renormalize=True if mixtral else bool(d.get("norm_topk_prob", False)),
        shared_expert_intermediate_size=int(d.get("shared_expert_intermediate_size") or 0)
        if arch == "Qwen2MoeForCausalLM"
        else 0,
        decoder_sparse_step=1 if mixtral else int(d.get("decoder_sparse_step") or 1),
        mlp_only_layers=() if mixtral else tuple(int(i) for i in d.get("mlp_only_layers") or ()),
    )
