"""Gemma 2 and Gemma 3 (text-only Gemma3ForCausalLM): decoder layers with four RMSNorms of
weight (1 + w) (before and after the attention and the MLP), GeGLU, embeddings scaled by
sqrt(hidden), attention scaled by 1 / sqrt(query_pre_attn_scalar), sliding-window and global
layers alternating, tied LM head. Gemma 2 soft-caps the attention scores and the logits
(cap * tanh(x / cap)); Gemma 3 normalises q and k per head and rotates its sliding layers with
their own rope base (`local_rope_theta`).

Contract: as models/llama.py (`forward(input_ids[T], positions[T], meta, kv_caches) ->
hidden[T, hidden]`, `compute_logits(hidden[R, hidden]) -> [R, vocab]` float32, `load_weights`
with transformers' names, q/k/v and gate/up fused as they are copied). Each layer attends with
its own window and cap through `models.attention.layer_attention`: the C++ attention on a CPU
for uncapped layers (Gemma 3; `kernel_attention`), else the PyTorch key-block attention;
`plain_attention` keeps the family off the Triton path and the C++ step
(models/forward_path.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from models import pointwise
from models.attention import AttentionMetadata, KVCache, layer_attention
from models.config import ModelConfig
from models.layers import (
    DecoderBlock,
    GatedMLP,
    PagedSelfAttention,
    Rope,
    embedding,
    rms_normalize,
)
from models.llama import projection_loader
from models.rotary import RotaryEmbedding


class GemmaRMSNorm(nn.Module):
    """x / rms(x) * (1 + weight), in float32 and rounded once (transformers' Gemma order)."""

    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden))  # w; the norm scales by 1 + w
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = rms_normalize(x.float(), self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)


class GemmaAttention(PagedSelfAttention):
    def __init__(self, config: ModelConfig, window: int | None) -> None:
        super().__init__(
            config.hidden_size,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            qkv_bias=config.attention_bias,
            out_bias=config.attention_bias,
            rotary=True,
        )
        self.scale = float(config.query_pre_attn_scalar or config.head_dim) ** -0.5
        self.window, self.softcap = window, config.attn_logit_softcapping
        if config.qk_norm:  # Gemma 3: per-head norms of q and k, before rotary
            self.q_norm = GemmaRMSNorm(config.head_dim, config.norm_eps)
            self.k_norm = GemmaRMSNorm(config.head_dim, config.norm_eps)

    def attention(self, q: torch.Tensor, cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        return layer_attention(q, cache, meta, self.scale, self.window, self.softcap)


class GemmaDecoderLayer(DecoderBlock):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.norm_eps
        self.sliding = config.layer_windows[index] is not None
        self.input_layernorm = GemmaRMSNorm(hidden, eps)
        self.self_attn = GemmaAttention(config, config.layer_windows[index])
        self.post_attention_layernorm = GemmaRMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, eps)
        self.mlp = GatedMLP(hidden, config.intermediate_size, config.hidden_act)
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, eps)

    @property
    def attn(self) -> PagedSelfAttention:
        return self.self_attn

    def dense_in(self, x: torch.Tensor, rope: Rope | None) -> tuple[torch.Tensor, ...]:
        return self.self_attn.project(self.input_layernorm(x), rope)

    def dense_out(self, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn.out(attn_out))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class GemmaModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = embedding(config.vocab_size, config.hidden_size)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
        self.rotary_emb_local = (
            None
            if config.local_rope_theta is None
            else RotaryEmbedding(config.head_dim, config.local_rope_theta, None)
        )
        self.layers = nn.ModuleList(GemmaDecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, config.norm_eps)


class GemmaForCausalLM(nn.Module):
    plain_attention = True  # per-layer windows: no Triton path, no C++ step (module doc)

    @property
    def kernel_attention(self) -> bool:
        """Whether the C++ attention serves its layers: not under Gemma 2's score caps."""
        return self.config.attn_logit_softcapping is None

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if len(config.layer_windows) != config.num_layers:
            raise ValueError("a Gemma config needs one window entry per layer (layer_windows)")
        self.config = config
        self.model = GemmaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        # sqrt(hidden) rounded to each dtype, as transformers multiplies in the weights' dtype
        root = config.hidden_size**0.5
        self._embed_scale = {
            dtype: float(torch.tensor(root, dtype=dtype, device="cpu"))
            for dtype in (torch.float32, torch.bfloat16, torch.float16)
        }
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        inner = self.model
        x = inner.embed_tokens(input_ids)  # [T, hidden]
        x = x * self._embed_scale[x.dtype]
        rope = inner.rotary_emb(positions, x.dtype)
        local = (
            rope if inner.rotary_emb_local is None else inner.rotary_emb_local(positions, x.dtype)
        )
        for layer, cache in zip(inner.layers, kv_caches, strict=True):
            x = layer(x, local if layer.sliding else rope, meta, cache)
        return inner.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        cap = self.config.final_logit_softcapping
        return logits if cap is None else pointwise.softcap(logits, cap)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        projection_loader(self, self.config).load(weights)
