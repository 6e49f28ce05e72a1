"""Tiny seeded random checkpoints made with transformers (the test oracle), per architecture.

`make_hf_model(arch)` builds the transformers model; `save_checkpoint(arch, folder)` writes
config.json + model.safetensors the way a real checkpoint folder looks.
"""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 320

_LLAMA_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=96,  # 6 heads of 16
    intermediate_size=112,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,  # GQA ratio 3
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

# Mixture-of-experts checkpoints (models/moe): 8 experts, top-2 / top-4, with Qwen3-MoE's
# dense first layer (mlp_only_layers) and Qwen2-MoE's shared expert and qkv bias.
_MOE_COMMON = dict(
    _LLAMA_COMMON,
    hidden_size=64,  # 4 heads of 16
    intermediate_size=96,  # every matrix width a multiple of 32: GGUF Q8_0 / Q4_0 blocks
    num_attention_heads=4,
    initializer_range=0.1,  # weights large enough that a wrong expert or weight shows
)
_MOE = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(num_experts=8, num_experts_per_tok=4, moe_intermediate_size=32,
                       norm_topk_prob=True, mlp_only_layers=[0], head_dim=24)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=64, norm_topk_prob=False)),
}  # fmt: skip
MOE_ARCHITECTURES = tuple(_MOE)

ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral", "gpt2")


def make_hf_model(arch: str, seed: int = 0, **overrides):
    import transformers as tf

    torch.manual_seed(seed)
    if arch == "llama":
        config = tf.LlamaConfig(**{**_LLAMA_COMMON, "rope_theta": 10000.0, **overrides})
        cls = tf.LlamaForCausalLM
    elif arch == "llama3":
        scaling = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
            "rope_theta": 500000.0,
        }
        config = tf.LlamaConfig(
            **{
                **_LLAMA_COMMON,
                "rope_parameters": scaling,
                "tie_word_embeddings": True,
                **overrides,
            }
        )
        cls = tf.LlamaForCausalLM
    elif arch == "qwen2":
        config = tf.Qwen2Config(**{**_LLAMA_COMMON, **overrides})
        cls = tf.Qwen2ForCausalLM
    elif arch == "qwen3":  # head_dim 32, not hidden / heads: q is wider than the hidden state
        config = tf.Qwen3Config(**{**_LLAMA_COMMON, "head_dim": 32, **overrides})
        cls = tf.Qwen3ForCausalLM
    elif arch == "mistral":
        config = tf.MistralConfig(**{**_LLAMA_COMMON, "sliding_window": 8, **overrides})
        cls = tf.MistralForCausalLM
    elif arch in _MOE:
        config_cls, cls = (getattr(tf, name) for name in _MOE[arch][:2])
        config = config_cls(**{**_MOE_COMMON, **_MOE[arch][2], **overrides})
    elif arch == "gpt2":
        config = tf.GPT2Config(
            **{
                "vocab_size": VOCAB,
                "n_embd": 64,
                "n_layer": 2,
                "n_head": 4,
                "n_positions": 256,
                "bos_token_id": 1,
                "eos_token_id": 2,
                "pad_token_id": 0,
                **overrides,
            }
        )
        cls = tf.GPT2LMHeadModel
    else:
        raise ValueError(arch)
    config._attn_implementation = "eager"
    model = cls(config).eval()
    if arch in _MOE:  # Qwen routers start at zero (every expert tied): make routing decisive
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith(("mlp.gate.weight", "shared_expert_gate.weight")):
                    param.normal_(0, 1.0)
                elif name.endswith("proj.bias"):
                    param.normal_(0, 0.5)
    if arch == "qwen2":  # random init leaves biases at zero; make the qkv bias matter
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (
                    layer.self_attn.q_proj,
                    layer.self_attn.k_proj,
                    layer.self_attn.v_proj,
                ):
                    proj.bias.normal_(0, 0.5)
    return model


def save_checkpoint(arch: str, folder: Path, seed: int = 0, **overrides) -> Path:
    model = make_hf_model(arch, seed, **overrides)
    model.save_pretrained(folder)
    return folder
