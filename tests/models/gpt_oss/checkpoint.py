"""A tiny seeded gpt-oss checkpoint made with transformers (the oracle).

`make_gpt_oss(window=8)`: 2 layers (sliding, then full), hidden 64, 4 query heads of 16 over
2 KV heads, 4 experts top-2 of width 32, vocab 320; YaRN rope with factor 4 over an original
length of 16 (the tests' sequences cross it). Random init leaves what makes gpt-oss itself at
zero or too small to show, so the sinks, the router and expert biases and the q/k/v/o biases
are drawn at scales that move the logits, and the SwiGLU clamp (`swiglu_limit` 1.0) bites.
`save_gpt_oss(folder)` writes it as a checkpoint folder looks.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.checkpoints import VOCAB


def make_gpt_oss(seed: int = 0, window: int = 8, **overrides):
    import transformers as tf

    torch.manual_seed(seed)
    config = tf.GptOssConfig(
        **{
            "vocab_size": VOCAB,
            "hidden_size": 64,
            "intermediate_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": window,
            "max_position_embeddings": 64,  # = factor x original: YaRN as configured
            "initializer_range": 0.1,
            "swiglu_limit": 1.0,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 16,
            },
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
            **overrides,
        }
    )
    config._attn_implementation = "eager"
    model = tf.GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("sinks", "router.bias")):
                param.normal_(0, 1.0)
            elif name.endswith(("_bias", "proj.bias")):
                param.normal_(0, 0.5)
            elif "norm" in name:
                param.add_(torch.randn_like(param) * 0.3)
    return model


def save_gpt_oss(folder: Path, seed: int = 0, **overrides) -> Path:
    make_gpt_oss(seed, **overrides).save_pretrained(folder)
    return folder
