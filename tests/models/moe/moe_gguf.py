"""Writing a transformers mixture-of-experts model as llama.cpp's converter writes it: the
router `ffn_gate_inp` (kept float32, as llama-quantize keeps it), the experts as 3-D
`ffn_{gate,up,down}_exps` [E, rows, cols], Qwen2-MoE's shared expert `ffn_*_shexp` and its
gate `ffn_gate_inp_shexp` [hidden], metadata `expert_count` / `expert_used_count` /
`expert_feed_forward_length`; Mixtral as "llama" with experts (Q/K rows permuted)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as QT

from tests.models.gguf.tiny_gguf import write_tensors

_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.experts.down_proj": "ffn_down_exps.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
} | {
    f"self_attn.{p}_proj.{kind}": f"attn_{g}.{kind}"
    for p, g in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output"))
    for kind in ("weight", "bias")
}
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}  # fmt: skip


def gguf_tensors(model: torch.nn.Module, arch: str) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array in llama.cpp's layout."""
    cfg, out = model.config, {}
    for name, tensor in model.state_dict().items():
        w = tensor.detach().float()
        if name in _GLOBAL:
            out[_GLOBAL[name]] = w
            continue
        layer, rest = name.removeprefix("model.layers.").split(".", 1)
        blk = f"blk.{layer}."
        if rest == "mlp.experts.gate_up_proj":  # [E, 2I, H]: gate rows, then up rows
            half = w.shape[1] // 2
            out[blk + "ffn_gate_exps.weight"], out[blk + "ffn_up_exps.weight"] = (
                w[:, :half],
                w[:, half:],
            )
            continue
        if arch == "llama" and rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
            heads = cfg.num_attention_heads if "q_proj" in rest else cfg.num_key_value_heads
            w = w.reshape(heads, 2, w.shape[0] // heads // 2, -1).transpose(1, 2).reshape(w.shape)
        if rest == "mlp.shared_expert_gate.weight":
            w = w.reshape(-1)
        out[blk + _LAYER[rest]] = w
    return {k: np.ascontiguousarray(v.numpy()) for k, v in out.items()}


def write_moe_gguf(model: torch.nn.Module, path: Path, arch: str, qtype: QT | None) -> Path:
    """`arch`: "qwen3moe", "qwen2moe" or "llama" (Mixtral); `qtype` None: float32 throughout,
    else every matrix but the router in that type (gguf's own quantize)."""
    cfg = model.config
    moe_width = getattr(cfg, "moe_intermediate_size", None)
    meta = {
        "block_count": cfg.num_hidden_layers, "context_length": cfg.max_position_embeddings,
        "embedding_length": cfg.hidden_size, "feed_forward_length": cfg.intermediate_size,
        "attention.head_count": cfg.num_attention_heads,
        "attention.head_count_kv": cfg.num_key_value_heads,
        "attention.key_length": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        "rope.freq_base": float(cfg.rope_parameters["rope_theta"]),
        "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
        "vocab_size": cfg.vocab_size,
        "expert_count": getattr(cfg, "num_experts", None) or cfg.num_local_experts,
        "expert_used_count": cfg.num_experts_per_tok,
        "expert_feed_forward_length": moe_width,
        "expert_shared_feed_forward_length": getattr(cfg, "shared_expert_intermediate_size", None),
    }  # fmt: skip
    meta["attention.value_length"] = meta["attention.key_length"]
    keys = {f"{arch}.{k}": v for k, v in meta.items() if v is not None}
    keys |= {"tokenizer.ggml.bos_token_id": cfg.bos_token_id,
             "tokenizer.ggml.eos_token_id": cfg.eos_token_id}  # fmt: skip
    tensors = {
        name: (gguf.quants.quantize(array, qtype), qtype)
        if qtype is not None and array.ndim >= 2 and "ffn_gate_inp" not in name
        else (array, None)
        for name, array in gguf_tensors(model, arch).items()
    }
    return write_tensors(path, tensors, arch, keys)
