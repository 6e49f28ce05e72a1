"""GGUF files of the Gemma 2 / Gemma 3 (`gemma2`, `gemma3`) and Phi-3 / Phi-4 (`phi3`)
architectures, as llama.cpp's converter writes them: their config keys and tensor names.

Contract:
- `family_config(gguf, arch, key)` returns the config.json keys these architectures add to the
  generic ones (models/gguf/config.py), {} for another architecture:
  - gemma2 / gemma3: `<arch>.attention.sliding_window`, `<arch>.attn_logit_softcapping`,
    `<arch>.final_logit_softcapping`; Gemma 3's sliding layers' rope base
    (`rope.freq_base_swa`, else the 10000 llama.cpp assumes) and its pattern
    (`attention.sliding_window_pattern`: per-layer flags or a period, else every 6th layer
    global, as llama.cpp assumes). llama.cpp stores no query_pre_attn_scalar: it scales by
    1 / sqrt(head_dim), or 1 / sqrt(hidden / heads) for the 27B models (46 layers for Gemma 2,
    62 for Gemma 3); the same rule here.
  - phi3: a partial rotary from `rope.dimension_count` below the head's dims (Phi-4-mini);
    LongRoPE from the `rope_factors_long.weight` / `rope_factors_short.weight` tensors,
    `rope.scaling.original_context_length` and `rope.scaling.attn_factor`; a sliding window of 0
    (llama.cpp's mark of Phi-4) is none.
- `BLOCK_NAMES[arch]`: llama.cpp's per-layer tensor names -> transformers' module names.
  Phi-3 stores q/k/v as one `attn_qkv` and gate/up as one `ffn_up` (transformers' own fused
  matrices); none of the three permutes Q/K rows (NeoX rope).
- `FIXUPS[arch](part)`: what undoes llama.cpp's storage for a tensor: Gemma's norm weights are
  stored with the 1 of (1 + w) added (transformers' GGUF loader subtracts it the same way).
- `CONFIG_TENSORS`: tensors that are config, not weights (skipped by the name map).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from models.gguf.file import GGUFFile

CONFIG_TENSORS = {"rope_factors_long.weight", "rope_factors_short.weight"}
_27B_LAYERS = {"gemma2": 46, "gemma3": 62}

_GEMMA_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q_norm": "self_attn.q_norm",  # gemma3
    "attn_k_norm": "self_attn.k_norm",
}
_PHI3_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_up": "mlp.gate_up_proj",
    "ffn_down": "mlp.down_proj",
}
BLOCK_NAMES: dict[str, dict[str, str]] = {
    "gemma2": _GEMMA_BLOCK,
    "gemma3": _GEMMA_BLOCK,
    "phi3": _PHI3_BLOCK,
}


def _minus_one(w: torch.Tensor) -> torch.Tensor:
    return w - 1.0


def _gemma_fixup(part: str) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """Every Gemma norm (the output norm too: part "output_norm") is stored as 1 + w."""
    return _minus_one if part.endswith("norm") else None


FIXUPS: dict[str, Callable[[str], Callable[[torch.Tensor], torch.Tensor] | None]] = {
    "gemma2": _gemma_fixup,
    "gemma3": _gemma_fixup,
}


def family_config(gguf: GGUFFile, arch: str, key: Callable[..., Any]) -> dict[str, Any]:
    if arch in ("gemma2", "gemma3"):
        return _gemma_config(arch, key)
    if arch == "phi3":
        return _phi3_config(gguf, key)
    return {}


def _gemma_config(arch: str, key: Callable[..., Any]) -> dict[str, Any]:
    layers = int(key("block_count"))
    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    head_dim = int(key("attention.key_length", 0)) or hidden // heads
    out: dict[str, Any] = {
        "model_type": "gemma2" if arch == "gemma2" else "gemma3_text",
        "head_dim": head_dim,
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": hidden / heads if layers == _27B_LAYERS[arch] else head_dim,
        "attn_logit_softcapping": key("attn_logit_softcapping"),
        "final_logit_softcapping": key("final_logit_softcapping"),
        "sliding_window": key("attention.sliding_window"),
    }
    if arch == "gemma3":
        out["rope_local_base_freq"] = float(key("rope.freq_base_swa", 10_000.0))
        out["rope_theta"] = float(key("rope.freq_base", 1_000_000.0))
        pattern = key("attention.sliding_window_pattern", 6)
        if isinstance(pattern, list | tuple):  # per layer: True where the layer slides
            out["layer_types"] = ["sliding_attention" if s else "full_attention" for s in pattern]
        else:
            out["sliding_window_pattern"] = int(pattern)
    return out


def _phi3_config(gguf: GGUFFile, key: Callable[..., Any]) -> dict[str, Any]:
    # rope.dimension_count is the rotated dims (fewer than a head's for Phi-4-mini)
    head_dim = int(key("embedding_length")) // int(key("attention.head_count"))
    rotated = int(key("rope.dimension_count", 0)) or head_dim
    out: dict[str, Any] = {"model_type": "phi3", "rope_scaling": None, "head_dim": head_dim}
    if rotated < head_dim:
        out["partial_rotary_factor"] = rotated / head_dim
    if not key("attention.sliding_window"):  # 0: Phi-4, no window
        out["sliding_window"] = None
    long_info, short_info = (gguf.info(f"rope_factors_{k}.weight") for k in ("long", "short"))
    if long_info is None or short_info is None:
        return out
    original = key("rope.scaling.original_context_length")
    if original is None:
        raise ValueError(
            f"{gguf.path}: LongRoPE factors without phi3.rope.scaling.original_context_length"
        )
    out["rope_scaling"] = {
        "rope_type": "longrope",
        "long_factor": gguf.tensor(long_info).float().tolist(),
        "short_factor": gguf.tensor(short_info).float().tolist(),
        "original_max_position_embeddings": int(original),
    }
    if key("rope.scaling.attn_factor") is not None:
        out["rope_scaling"]["attention_factor"] = float(key("rope.scaling.attn_factor"))
    return out
