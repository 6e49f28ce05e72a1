"""GGUF metadata -> a Hugging Face style config.json dict (then `ModelConfig.from_hf_dict`).

Contract: `gguf_to_hf_config(gguf)` reads `general.architecture` ("llama", "qwen2", "qwen3", "gpt2",
and the mixture-of-experts "qwen3moe", "qwen2moe" and "llama" with `expert_count` (Mixtral), whose
`expert_used_count`, `expert_feed_forward_length`, `expert_shared_feed_forward_length` and
`expert_weights_norm` keys become the experts' config keys, and "gemma2", "gemma3", "phi3" with
their own keys: models/gguf/dense_families.py; "gpt-oss": models/gpt_oss/gguf.py) and
that architecture's keys (`<arch>.block_count`, `.embedding_length`, `.feed_forward_length`,
`.attention.head_count(_kv)`, `.rope.freq_base`, `.attention.layer_norm_rms_epsilon`,
`.context_length`, `.vocab_size` (else the rows of `token_embd.weight`), rope scaling keys)
plus `tokenizer.ggml.bos/eos/eot_token_id`, and returns the dict transformers would find in the
model's config.json. `tie_word_embeddings` is set when the file has no `output.weight`. Llama-3
rope scaling, which llama.cpp stores as a `rope_freqs.weight` tensor rather than as keys, is
recognised by regenerating that tensor from the known Llama-3.x parameters; anything else raises
`ValueError` naming the file (silently ignoring it would give wrong logits).
`read_gguf_config(path)` opens a file and returns (GGUFFile, that dict, ModelConfig).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from models.gguf.dense_families import family_config
from models.gguf.file import GGUFFile
from models.gpt_oss.gguf import ARCH as GPT_OSS
from models.gpt_oss.gguf import gpt_oss_config

if TYPE_CHECKING:
    from models.config import ModelConfig

# GGUF architecture -> HF architecture class. Mistral GGUFs say "llama" (see below).
GGUF_ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    # mixture-of-experts (models/moe); llama.cpp writes Mixtral as "llama" with experts
    "qwen3moe": "Qwen3MoeForCausalLM",
    "qwen2moe": "Qwen2MoeForCausalLM",
    "gemma2": "Gemma2ForCausalLM",  # these three: models/gguf/dense_families.py
    "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gpt-oss": "GptOssForCausalLM",  # its own keys: models/gpt_oss/gguf.py
}
# GGUF architecture -> whether llama.cpp renormalises the top-k expert weights (its norm_w;
# Qwen3-MoE always does, Qwen2-MoE never, Mixtral always) when no expert_weights_norm key says.
_EXPERT_WEIGHTS_NORM = {"llama": True, "qwen3moe": True, "qwen2moe": False}

# (factor is read from the tensor) low_freq_factor, high_freq_factor, original context: the
# values every published Llama-3.1/3.2/3.3 uses.
_LLAMA3_ROPE_CANDIDATES = ((1.0, 4.0, 8192),)
_EOS_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")


def gguf_to_hf_config(gguf: GGUFFile) -> dict[str, Any]:
    arch = gguf.architecture
    hf_arch = GGUF_ARCHITECTURES.get(arch)
    if hf_arch is None:
        raise ValueError(
            f"{gguf.path}: unsupported GGUF architecture {arch!r}; tgserve reads: "
            f"{', '.join(sorted(GGUF_ARCHITECTURES))}"
        )
    meta = gguf.metadata

    def key(name: str, default: Any = None, *, required: bool = False) -> Any:
        full = f"{arch}.{name}"
        if required and full not in meta:
            raise ValueError(f"{gguf.path}: GGUF metadata lacks {full!r}")
        return meta.get(full, default)

    # The embedding's rows are what the weights need (some vocabularies are padded).
    vocab = key("vocab_size") or _embedding_rows(gguf)
    tied = "output.weight" not in gguf.tensor_names
    # End of turn (eot) ends generation too (Llama-3 chat: <|eot_id|> beside <|end_of_text|>).
    eos = list(dict.fromkeys(meta[k] for k in _EOS_KEYS if k in meta))
    common: dict[str, Any] = {
        "architectures": [hf_arch],
        "vocab_size": int(vocab),
        "tie_word_embeddings": tied,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos if len(eos) > 1 else (eos[0] if eos else None),
    }
    hidden = int(key("embedding_length", required=True))
    heads = int(key("attention.head_count", required=True))
    if arch == "gpt2":
        return common | {
            "model_type": "gpt2",
            "n_embd": hidden,
            "n_head": heads,
            "n_layer": int(key("block_count", required=True)),
            "n_inner": int(key("feed_forward_length", 4 * hidden)),
            "n_positions": int(key("context_length", 1024)),
            "layer_norm_epsilon": float(key("attention.layer_norm_epsilon", 1e-5)),
            "activation_function": "gelu_new",
        }
    name = str(meta.get("general.name", "")).lower()
    if arch == "llama" and "mistral" in name:
        # llama.cpp writes Mistral as "llama"; transformers makes it a MistralForCausalLM too.
        common["architectures"] = ["MistralForCausalLM"]
    out = common | {
        "model_type": arch,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": int(key("attention.key_length", 0) or key("rope.dimension_count", 0))
        or hidden // heads,
        "num_hidden_layers": int(key("block_count", required=True)),
        "intermediate_size": int(key("feed_forward_length", required=True)),
        "max_position_embeddings": int(key("context_length", 2048)),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(gguf, arch, key),
    }
    if arch == GPT_OSS:
        return out | gpt_oss_config(gguf, key)
    if key("expert_count"):
        out |= _moe_keys(gguf, arch, key, out)
    if key("attention.sliding_window") is not None:
        out["sliding_window"] = int(key("attention.sliding_window"))
        out["use_sliding_window"] = True
    return out | family_config(gguf, arch, key)


def _moe_keys(gguf: GGUFFile, arch: str, key: Any, out: dict[str, Any]) -> dict[str, Any]:
    """The experts' config.json keys; a layer without a router (`ffn_gate_inp`) is dense."""
    experts, layers = int(key("expert_count")), out["num_hidden_layers"]
    norm = key("expert_weights_norm", _EXPERT_WEIGHTS_NORM.get(arch, False))
    moe: dict[str, Any] = {
        "num_experts_per_tok": int(key("expert_used_count", required=True)),
        "norm_topk_prob": bool(norm),
        "mlp_only_layers": [
            n for n in range(layers) if f"blk.{n}.ffn_gate_inp.weight" not in gguf.tensor_names
        ],
    }
    if arch == "llama":  # Mixtral: the experts' width is feed_forward_length
        return moe | {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                      "num_local_experts": experts}  # fmt: skip
    return moe | {
        "model_type": arch.replace("moe", "_moe"),
        "num_experts": experts,
        "moe_intermediate_size": int(key("expert_feed_forward_length", required=True)),
        "shared_expert_intermediate_size": int(key("expert_shared_feed_forward_length", 0)),
    }


def _embedding_rows(gguf: GGUFFile) -> int:
    info = gguf.info("token_embd.weight")
    if info is not None:
        return info.shape[0]  # [vocab, hidden]
    tokens = gguf.array_lengths.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ValueError(f"{gguf.path}: no vocab size in metadata and no token_embd.weight tensor")
    return tokens


def _rope_scaling(gguf: GGUFFile, arch: str, key: Any) -> dict[str, Any] | None:
    kind = key("rope.scaling.type")
    factor = key("rope.scaling.factor") or key("rope.scale_linear")
    if kind in (None, "none") and key("rope.scale_linear") is not None:
        kind = "linear"
    if kind == "linear" and factor:
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        return {
            "rope_type": "yarn",
            "factor": float(factor),
            "original_max_position_embeddings": int(key("rope.scaling.original_context_length")),
        }
    if kind not in (None, "none"):
        raise ValueError(
            f"{gguf.path}: unsupported rope scaling type {kind!r} in {arch}.rope.scaling"
        )
    info = gguf.info("rope_freqs.weight")
    if info is None:
        return None
    return _llama3_scaling_from_freqs(gguf, gguf.tensor(info).float(), key)


def _llama3_scaling_from_freqs(gguf: GGUFFile, stored: torch.Tensor, key: Any) -> dict[str, Any]:
    """Finds the Llama-3 rope parameters whose per-frequency factors equal the stored ones."""
    theta = float(key("rope.freq_base", 10000.0))
    head_dim = 2 * stored.numel()
    factor = float(stored.max())
    for low, high, original in _LLAMA3_ROPE_CANDIDATES:
        expected = llama3_rope_factors(theta, head_dim, factor, low, high, original)
        if torch.allclose(stored, expected, rtol=1e-5, atol=1e-6):
            return {
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low,
                "high_freq_factor": high,
                "original_max_position_embeddings": original,
            }
    raise ValueError(
        f"{gguf.path}: tensor 'rope_freqs.weight' holds rope frequency factors that match no "
        "known Llama-3 rope scaling; load the model from its Hugging Face folder instead"
    )


def llama3_rope_factors(
    theta: float, head_dim: int, factor: float, low: float, high: float, original: int
) -> torch.Tensor:
    """The divisor applied to each rotary frequency ([head_dim // 2]), as llama.cpp stores it."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    low_wavelen, high_wavelen = original / low, original / high
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32)


def read_gguf_config(path: Path) -> tuple[GGUFFile, dict[str, Any], ModelConfig]:
    """The opened file, its Hugging Face config dict and our ModelConfig; ValueError naming the
    file when the metadata does not describe a model tgserve runs."""
    from models.config import ModelConfig
    from models.gguf.file import open_gguf

    gguf = open_gguf(path)
    hf_config = gguf_to_hf_config(gguf)
    try:
        return gguf, hf_config, ModelConfig.from_hf_dict(hf_config)
    except (ValueError, KeyError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
