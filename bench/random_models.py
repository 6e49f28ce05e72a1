"""Named model shapes bench can build with random weights in memory: `--model random:NAME`.

Contract (pure Python, no torch): `RANDOM_SHAPES` maps a name to a transformers-style
config.json dict; `random_shape(spec)` returns `(name, dict)` for `random:NAME` (ValueError
naming the choices otherwise); `is_random_spec(text)` says whether `--model` asks for one.
The shapes are those of the published checkpoints (Meta's Llama 3 8B and Llama 3.2 1B:
hidden sizes, layers, GQA heads, vocabulary, RoPE), so weight bytes per token and FLOPs are
what the real models cost; the weights (models/random_weights.py, seeded, in `--dtype`) are
noise, so the output text is meaningless and only speed is measured. No download.
`tiny-llama` is a Llama 3 structure (GQA, llama3 RoPE) small enough for CPU dry runs (the GPU
check's `--tiny` mode, tests). `t5-small` is Google's T5 v1.0 small (an encoder-decoder: the
prompt is the encoder's input) and `tiny-t5` the same structure, small, for tests.
"""

from __future__ import annotations

from typing import Any

PREFIX = "random:"

_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

RANDOM_SHAPES: dict[str, dict[str, Any]] = {
    # 8,030,261,248 parameters: 16.06 GB of bf16 weights.
    "llama3-8b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    },
    # 1,235,814,400 parameters (embeddings tied): 2.47 GB of bf16 weights.
    "llama3-1b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": _LLAMA3_ROPE,
        "tie_word_embeddings": True,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    },
    # 2 layers of 64 wide, 4 query heads over 2 KV heads of 16: 0.2 M parameters.
    "tiny-llama": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": _LLAMA3_ROPE,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    # Google's t5-small: 6 + 6 layers of 512, 8 heads of 64, ReLU feed-forward of 2048, head tied
    # to the embedding: 60,506,624 parameters.
    "t5-small": {
        "architectures": ["T5ForConditionalGeneration"],
        "model_type": "t5",
        "d_model": 512,
        "d_kv": 64,
        "d_ff": 2048,
        "num_layers": 6,
        "num_decoder_layers": 6,
        "num_heads": 8,
        "vocab_size": 32128,
        "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128,
        "feed_forward_proj": "relu",
        "layer_norm_epsilon": 1e-6,
        "tie_word_embeddings": True,
        "decoder_start_token_id": 0,
        "pad_token_id": 0,
        "eos_token_id": 1,
    },
    # t5-small's structure, 2 + 2 layers of 64, 4 heads of 16: for tests and dry runs.
    "tiny-t5": {
        "architectures": ["T5ForConditionalGeneration"],
        "model_type": "t5",
        "d_model": 64,
        "d_kv": 16,
        "d_ff": 128,
        "num_layers": 2,
        "num_decoder_layers": 2,
        "num_heads": 4,
        "vocab_size": 512,
        "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128,
        "feed_forward_proj": "relu",
        "layer_norm_epsilon": 1e-6,
        "tie_word_embeddings": True,
        "decoder_start_token_id": 0,
        "pad_token_id": 0,
        "eos_token_id": 1,
    },
}


def is_random_spec(text: str | None) -> bool:
    return text is not None and str(text).startswith(PREFIX)


def random_shape(spec: str) -> tuple[str, dict[str, Any]]:
    name = spec.removeprefix(PREFIX)
    if not is_random_spec(spec) or name not in RANDOM_SHAPES:
        raise ValueError(
            f"--model {spec}: random-weight models are {', '.join(PREFIX + n for n in RANDOM_SHAPES)}"
        )
    return name, dict(RANDOM_SHAPES[name])
