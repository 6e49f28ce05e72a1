"""Tiny seeded Gemma 2, Gemma 3 and Phi-3 checkpoints made with transformers (the oracle).

`make_family_model(arch)` for arch in FAMILIES: 2 layers, hidden 64, head_dim 16,
GQA 2; a sliding window of 6 tokens so prompts and generations cross it; norm weights drawn
around 0 (Gemma's are stored as w with (1 + w) applied) and weights of std 0.1 (transformers'
0.02 init would leave rotary, caps and windows nearly without effect). Gemma 2 caps its
attention scores at 4 and its logits at 3 (tanh bites at this scale); Gemma 3 alternates one
sliding and one global layer with local / global rope bases 100 / 1e6; `phi3-longrope` has
LongRoPE factors with original_max_position_embeddings 16, crossed by the tests' sequences;
`phi4-mini` rotates 3/4 of each head (partial_rotary_factor 0.75).
`save_family_checkpoint(arch, folder)` writes it the way a checkpoint folder looks;
`hf_incremental` and `hf_greedy` run transformers as its generate does (prefill, then one
token at a time over its cache).
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.checkpoints import VOCAB

FAMILIES = ("gemma2", "gemma3", "phi3", "phi3-longrope", "phi4-mini")
WINDOW = 6
LONGROPE_ORIGINAL = 16

_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,  # one sliding and one global layer
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    initializer_range=0.1,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def make_family_model(arch: str, seed: int = 0):
    import transformers as tf

    torch.manual_seed(seed)
    gemma = dict(_COMMON, sliding_window=WINDOW, query_pre_attn_scalar=24)
    if arch == "gemma2":
        config = tf.Gemma2Config(**gemma, attn_logit_softcapping=4.0, final_logit_softcapping=3.0)
        cls = tf.Gemma2ForCausalLM
    elif arch == "gemma3":
        config = tf.Gemma3TextConfig(
            **gemma, sliding_window_pattern=2, rope_theta=1e6, rope_local_base_freq=100.0
        )
        cls = tf.Gemma3ForCausalLM
    elif arch.startswith("phi"):
        phi = dict(_COMMON)
        if arch == "phi4-mini":  # rotary on 12 of each head's 16 dims, as Phi-4-mini's 0.75
            phi["partial_rotary_factor"] = 0.75
        if arch == "phi3-longrope":
            pairs = range(phi["head_dim"] // 2)
            phi |= dict(
                original_max_position_embeddings=LONGROPE_ORIGINAL,
                rope_scaling={
                    "type": "longrope",
                    "short_factor": [1.0 + 0.4 * i for i in pairs],
                    "long_factor": [3.0 + 2.0 * i for i in pairs],
                },
            )
        config = tf.Phi3Config(**phi)
        cls = tf.Phi3ForCausalLM
    else:
        raise ValueError(arch)
    config._attn_implementation = "eager"
    config.architectures = [cls.__name__]
    model = cls(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:  # Gemma's zeros and Phi's ones say nothing of the norms' order
                param.add_(torch.randn_like(param) * 0.3)
    return model


def save_family_checkpoint(arch: str, folder: Path, seed: int = 0) -> Path:
    make_family_model(arch, seed).save_pretrained(folder)
    return folder


def hf_incremental(hf, prompt: list[int], continuation: list[int]) -> list[torch.Tensor]:
    """transformers' logits [len(prompt), V] of the prompt, then [V] for each continuation
    token fed alone over its cache (what its generate computes)."""
    device = next(hf.parameters()).device
    with torch.no_grad():
        out = hf(torch.tensor([prompt], device=device), use_cache=True)
        rows, cache = [out.logits[0].float()], out.cache
        for token in continuation:
            out = hf(torch.tensor([[token]], device=device), cache=cache, use_cache=True)
            rows.append(out.logits[0, -1].float())
            cache = out.cache
    return rows


def hf_greedy(hf, prompt: list[int], max_tokens: int) -> list[int]:
    """transformers' greedy continuation over its cache, eos not special (ignore_eos)."""
    device = next(hf.parameters()).device
    new: list[int] = []
    with torch.no_grad():
        out = hf(torch.tensor([prompt], device=device), use_cache=True)
        for _ in range(max_tokens):
            new.append(int(out.logits[0, -1].argmax()))
            ids = torch.tensor([new[-1:]], device=device)
            out = hf(ids, cache=out.cache, use_cache=True)
    return new
