"""ModelConfig: the architecture facts a forward pass needs, read from a Hugging Face
config.json dict (GGUF metadata is mapped to the same dict by the loader).

Contract: `ModelConfig.from_hf_dict(d)` accepts the config.json of LlamaForCausalLM,
MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM (dense), the mixture-of-experts MixtralForCausalLM, Qwen3MoeForCausalLM and
Qwen2MoeForCausalLM (models/moe/config.py: their experts in `moe`), GptOssForCausalLM,
Phi3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM (text-only; their own fields: models/config_families.py)
and GPT2LMHeadModel, and of the
encoder-decoders T5ForConditionalGeneration, BartForConditionalGeneration and
MBartForConditionalGeneration (models/encdec/config.py: the decoder's shape here, the rest in
`encoder_decoder`), and raises `ValueError` naming the architecture for anything else. The dataclass is frozen; nothing computed at run time is
written back into it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from models.config_families import family_fields
from models.encdec.config import EncoderDecoderConfig, encoder_decoder_fields
from models.moe.config import MoeConfig, moe_config

# HF architecture name -> our model family (the registry key in models/__init__.py).
ARCHITECTURE_FAMILIES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "Qwen3ForCausalLM": "llama",
    "Phi3ForCausalLM": "llama",  # fused qkv_proj / gate_up_proj, LongRoPE (models/rotary.py)
    "Gemma2ForCausalLM": "gemma",
    "Gemma3ForCausalLM": "gemma",
    "GPT2LMHeadModel": "gpt2",
    "T5ForConditionalGeneration": "t5",
    "BartForConditionalGeneration": "bart",
    "MBartForConditionalGeneration": "bart",
    # mixture-of-experts decoders (models/moe)
    "MixtralForCausalLM": "moe",
    "Qwen3MoeForCausalLM": "moe",
    "Qwen2MoeForCausalLM": "moe",
    "GptOssForCausalLM": "gpt_oss",  # attention sinks, clamped-SwiGLU experts: models/gpt_oss
}


def _as_id_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # the HF class name, e.g. "LlamaForCausalLM"
    family: str  # "llama" | "moe" | "gemma" | "gpt_oss" | "gpt2" | "t5" | "bart"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2)
    sliding_window: int | None = None  # Mistral: attend to at most this many previous tokens
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k, before rotary
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    encoder_decoder: EncoderDecoderConfig | None = None  # T5 / BART: the encoder and generation
    moe: MoeConfig | None = None  # mixture-of-experts decoders: experts, routing, sparse layers
    # Gemma 2 / 3 (models/config_families.py): each layer's sliding window (None: global), the
    # attention's 1 / sqrt(query_pre_attn_scalar) scale, tanh soft-capping of the attention
    # scores and of the logits, the sliding layers' rope theta (Gemma 3).
    layer_windows: tuple[int | None, ...] = ()
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    local_rope_theta: float | None = None
    rotary_dim: int | None = None  # Phi-4-mini: rotary on the first dims of a head only (None: all)
    # generation_config.json as the folder ships it (models/generation_config.py); {}: none
    generation: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_encoder_decoder(self) -> bool:
        return self.encoder_decoder is not None

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        archs = d.get("architectures") or []
        arch = archs[0] if archs else _guess_architecture(d.get("model_type"))
        family = ARCHITECTURE_FAMILIES.get(arch)
        if family is None:
            supported = ", ".join(sorted(ARCHITECTURE_FAMILIES))
            raise ValueError(f"unsupported architecture {arch!r}; tgserve supports: {supported}")
        if family in ("t5", "bart"):
            return cls(architecture=arch, family=family, **encoder_decoder_fields(d, family))
        if family == "gpt2":
            hidden = d["n_embd"]
            heads = d["n_head"]
            return cls(
                architecture=arch,
                family=family,
                vocab_size=d["vocab_size"],
                hidden_size=hidden,
                intermediate_size=d.get("n_inner") or 4 * hidden,
                num_layers=d["n_layer"],
                num_heads=heads,
                num_kv_heads=heads,
                head_dim=hidden // heads,
                max_position_embeddings=d.get("n_positions", 1024),
                norm_eps=d.get("layer_norm_epsilon", 1e-5),
                tie_word_embeddings=d.get("tie_word_embeddings", True),
                attention_bias=True,
                hidden_act=d.get("activation_function", "gelu_new"),
                bos_token_id=d.get("bos_token_id"),
                eos_token_ids=_as_id_tuple(d.get("eos_token_id")),
            )
        hidden = d["hidden_size"]
        heads = d["num_attention_heads"]
        sliding = d.get("sliding_window")
        # Qwen configs carry a sliding_window value but only apply it when use_sliding_window is set.
        qwen = arch.startswith("Qwen")
        if qwen and not d.get("use_sliding_window", False):
            sliding = None
        fields: dict[str, Any] = dict(
            architecture=arch,
            family=family,
            vocab_size=d["vocab_size"],
            hidden_size=hidden,
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or hidden // heads,
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            norm_eps=d.get("rms_norm_eps", 1e-5),
            rope_theta=float(
                d.get("rope_theta") or (d.get("rope_parameters") or {}).get("rope_theta", 10000.0)
            ),
            rope_scaling=_rope_scaling(d),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(
                d.get("attention_bias", d.get("qkv_bias", arch.startswith("Qwen2")))
            ),
            sliding_window=sliding or None,
            qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
            hidden_act=d.get("hidden_act", "silu"),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=_as_id_tuple(d.get("eos_token_id")),
            moe=moe_config(d, arch),
        )
        return cls(**(fields | family_fields(arch, d)))


def _rope_scaling(d: dict[str, Any]) -> dict[str, Any] | None:
    scaling = d.get("rope_scaling") or d.get("rope_parameters")
    if not scaling:
        return None
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind in (None, "default"):
        return None
    return dict(scaling)


def _guess_architecture(model_type: str | None) -> str:
    by_type = {
        "llama": "LlamaForCausalLM",
        "mistral": "MistralForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
        "phi3": "Phi3ForCausalLM",
        "gemma2": "Gemma2ForCausalLM",
        "gemma3_text": "Gemma3ForCausalLM",
        "gpt2": "GPT2LMHeadModel",
        "t5": "T5ForConditionalGeneration",
        "bart": "BartForConditionalGeneration",
        "mbart": "MBartForConditionalGeneration",
        "mixtral": "MixtralForCausalLM",
        "qwen2_moe": "Qwen2MoeForCausalLM",
        "qwen3_moe": "Qwen3MoeForCausalLM",
        "gpt_oss": "GptOssForCausalLM",
    }
    return by_type.get(model_type or "", str(model_type))
