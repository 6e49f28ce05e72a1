"""The MLP tensors a mixture-of-experts checkpoint must have, by layer, as the files name them.

Contract: `moe_mlp_shapes(config, layer) -> {name inside the layer: shape}`, every entry
required: a dense layer's `mlp.{gate,up,down}_proj.weight`; a sparse layer's router and one
tensor per expert and projection (Mixtral: `block_sparse_moe.gate.weight` and
`block_sparse_moe.experts.{e}.w1/w3/w2.weight`; Qwen: `mlp.gate.weight` and
`mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`), and Qwen2-MoE's shared expert;
gpt-oss's router with bias and grouped expert tensors with biases, as transformers names them.
"""

from __future__ import annotations

from models.config import ModelConfig

Shape = tuple[int, ...]


def moe_mlp_shapes(c: ModelConfig, layer: int) -> dict[str, Shape]:
    moe, h = c.moe, c.hidden_size
    if moe is None or not moe.is_sparse(layer):
        i = c.intermediate_size
        return {"mlp.gate_proj.weight": (i, h), "mlp.up_proj.weight": (i, h),
                "mlp.down_proj.weight": (h, i)}  # fmt: skip
    i, e = moe.expert_intermediate_size, moe.num_experts
    if c.family == "gpt_oss":  # transformers' grouped [E, K, N] tensors (MXFP4: dequantised)
        return {"mlp.router.weight": (e, h), "mlp.router.bias": (e,),
                "mlp.experts.gate_up_proj": (e, h, 2 * i), "mlp.experts.gate_up_proj_bias": (e, 2 * i),
                "mlp.experts.down_proj": (e, i, h), "mlp.experts.down_proj_bias": (e, h)}  # fmt: skip
    mixtral = c.architecture == "MixtralForCausalLM"
    prefix = "block_sparse_moe" if mixtral else "mlp"
    gate, up, down = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    shapes: dict[str, Shape] = {f"{prefix}.gate.weight": (e, h)}
    for n in range(e):
        p = f"{prefix}.experts.{n}."
        shapes |= {f"{p}{gate}.weight": (i, h), f"{p}{up}.weight": (i, h),
                   f"{p}{down}.weight": (h, i)}  # fmt: skip
    si = moe.shared_expert_intermediate_size
    if si:
        shapes |= {"mlp.shared_expert.gate_proj.weight": (si, h),
                   "mlp.shared_expert.up_proj.weight": (si, h),
                   "mlp.shared_expert.down_proj.weight": (h, si),
                   "mlp.shared_expert_gate.weight": (1, h)}  # fmt: skip
    return shapes
