"""The config.json fields of the Gemma 2 / Gemma 3, Phi-3 / Phi-4 and gpt-oss families that the
generic decoder-only reader in models/config.py does not know, as `ModelConfig` keyword arguments.

Contract: `family_fields(arch, d)` returns the arguments that replace or add to the generic ones
for `arch` ({} for the other families); ValueError names a field tgserve cannot serve. Both
config.json layouts are read: transformers' current one (`layer_types`, `rope_parameters`, per
layer type for Gemma 3) and the one older files carry (`sliding_window_pattern`,
`rope_local_base_freq`, `rope_scaling`).
"""

from __future__ import annotations

from typing import Any

from models.moe.config import MoeConfig

GEMMA_ARCHITECTURES = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")


def family_fields(arch: str, d: dict[str, Any]) -> dict[str, Any]:
    if arch in GEMMA_ARCHITECTURES:
        return _gemma_fields(arch, d)
    if arch == "Phi3ForCausalLM":
        return _phi3_fields(d)
    if arch == "GptOssForCausalLM":
        return _gpt_oss_fields(d)
    return {}


def _layer_windows(d: dict[str, Any], types: list[str]) -> tuple[int | None, ...]:
    """Each layer's window from `layer_types` ("sliding..." layers: `sliding_window`)."""
    if len(types) != d["num_hidden_layers"]:
        raise ValueError(f"layer_types lists {len(types)} layers for {d['num_hidden_layers']}")
    window = d.get("sliding_window")
    return tuple(window if t.startswith("sliding") else None for t in types)


def _gemma_fields(arch: str, d: dict[str, Any]) -> dict[str, Any]:
    gemma3 = arch == "Gemma3ForCausalLM"
    if d.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention (an embedding model) is not served")
    layers = d["num_hidden_layers"]
    types = d.get("layer_types")
    if not types:  # older files: every `pattern`-th layer is global, the others sliding
        pattern = int(d.get("sliding_window_pattern") or 6) if gemma3 else 2
        types = ["full_attention" if (i + 1) % pattern == 0 else "sliding" for i in range(layers)]
    windows = _layer_windows(d, types)
    params = d.get("rope_parameters") or {}
    fields: dict[str, Any] = {
        "family": "gemma",
        "norm_eps": d.get("rms_norm_eps", 1e-6),
        "hidden_act": d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh",
        "tie_word_embeddings": bool(d.get("tie_word_embeddings", True)),
        "sliding_window": None,  # per layer, below: the model-wide value would mask every layer
        "layer_windows": windows,
        "query_pre_attn_scalar": float(d.get("query_pre_attn_scalar") or d["head_dim"]),
        "attn_logit_softcapping": d.get("attn_logit_softcapping"),
        "final_logit_softcapping": d.get("final_logit_softcapping"),
        "qk_norm": gemma3,
    }
    if not gemma3:
        return fields
    # Gemma 3: the global layers' rope (theta 1e6, maybe linear scaling) and the sliding ones'
    # (rope_local_base_freq, 1e4 by default).
    full = params.get("full_attention") or {}
    local = params.get("sliding_attention") or {}
    scaling = full if full else (d.get("rope_scaling") or {})
    kind = scaling.get("rope_type") or scaling.get("type")
    fields["rope_theta"] = float(full.get("rope_theta") or d.get("rope_theta") or 1_000_000.0)
    fields["rope_scaling"] = None if kind in (None, "default") else dict(scaling)
    fields["local_rope_theta"] = float(
        local.get("rope_theta") or d.get("rope_local_base_freq") or 10_000.0
    )
    return fields


def _phi3_fields(d: dict[str, Any]) -> dict[str, Any]:
    scaling = d.get("rope_scaling") or d.get("rope_parameters") or {}
    fields: dict[str, Any] = {}
    partial = float(scaling.get("partial_rotary_factor") or d.get("partial_rotary_factor") or 1.0)
    if partial < 1:  # Phi-4-mini: rotary on the first dims of each head
        head_dim = d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"]
        fields["rotary_dim"] = int(head_dim * partial)
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind != "longrope":
        return fields
    # LongRoPE reads the original and the extended lengths (models/rotary.longrope_tables).
    original = scaling.get("original_max_position_embeddings") or d.get(
        "original_max_position_embeddings"
    )
    if original is None:
        raise ValueError("rope_scaling type longrope needs original_max_position_embeddings")
    return fields | {
        "rope_scaling": dict(scaling)
        | {
            "original_max_position_embeddings": int(original),
            "max_position_embeddings": int(d.get("max_position_embeddings", original)),
        }
    }


# transformers' GptOssConfig defaults, for config.json files that leave them out.
_GPT_OSS_YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                 "truncate": False, "original_max_position_embeddings": 4096}  # fmt: skip


def _gpt_oss_fields(d: dict[str, Any]) -> dict[str, Any]:
    quant = (d.get("quantization_config") or {}).get("quant_method")
    if quant not in (None, "mxfp4"):  # mxfp4 experts are dequantised at load (models/gpt_oss)
        raise ValueError(f"quantization_config quant_method {quant!r} is not served; mxfp4 is")
    layers = d["num_hidden_layers"]
    types = d.get("layer_types") or [
        "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)
    ]
    experts, top_k = int(d["num_local_experts"]), int(d["num_experts_per_tok"])
    if not 0 < top_k <= experts:
        raise ValueError(f"num_experts_per_tok {top_k} must be in 1..{experts} experts")
    fields: dict[str, Any] = {
        "attention_bias": bool(d.get("attention_bias", True)),
        "sliding_window": None,  # per layer, below
        "layer_windows": _layer_windows(d, types),
        "moe": MoeConfig(
            num_experts=experts,
            top_k=top_k,
            expert_intermediate_size=int(d["intermediate_size"]),
            renormalize=True,  # the softmax runs over the chosen k (models/moe/router.py)
            swiglu_limit=float(d.get("swiglu_limit", 7.0)),
            swiglu_alpha=float(d.get("swiglu_alpha", 1.702)),
        ),
    }
    if not (d.get("rope_scaling") or d.get("rope_parameters")):
        fields["rope_scaling"] = dict(_GPT_OSS_YARN)
    if not (d.get("rope_theta") or (d.get("rope_parameters") or {}).get("rope_theta")):
        fields["rope_theta"] = 150000.0
    return fields
