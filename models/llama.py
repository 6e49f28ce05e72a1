"""The Llama family: Llama 2/3, Mistral (sliding window), Qwen2 (qkv bias), Qwen3 (dense: q/k
RMSNorm per head), Phi-3 / Phi-4 (fused qkv and gate-up as stored, LongRoPE: models/rotary.py),
SmolLM2 (tied embeddings) — pre-norm decoder layers with RMSNorm, rotary attention with GQA and SwiGLU.

Contract: `forward(input_ids[T], positions[T], meta, kv_caches) -> hidden[T, hidden]`;
`compute_logits(hidden[R, hidden]) -> [R, vocab]` float32; `load_weights` takes
(Hugging Face name, tensor) pairs and fuses q/k/v and gate/up as it copies.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from models.attention import AttentionMetadata, KVCache
from models.config import ModelConfig
from models.layers import (
    DecoderBlock,
    GatedMLP,
    PagedSelfAttention,
    RMSNorm,
    Rope,
    RotaryEmbedding,
    embedding,
)
from models.weights import WeightLoader

if TYPE_CHECKING:
    from models.lora.bank import LoraBank


class LlamaDecoderLayer(DecoderBlock):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.norm_eps)
        self.self_attn = PagedSelfAttention(
            config.hidden_size,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            qkv_bias=config.attention_bias,
            out_bias=False,
            rotary=True,
            qk_norm_eps=config.norm_eps if config.qk_norm else None,
        )
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.norm_eps)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act)

    @property
    def attn(self) -> PagedSelfAttention:
        return self.self_attn

    def dense_in(self, x: torch.Tensor, rope: Rope | None) -> tuple[torch.Tensor, ...]:
        return self.self_attn.project(self.input_layernorm(x), rope)

    def dense_out(self, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        normed, x = self.post_attention_layernorm.add_and_norm(self.self_attn.out(attn_out), x)
        return x + self.mlp(normed)


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.rotary_emb = RotaryEmbedding(
            config.rotary_dim or config.head_dim, config.rope_theta, config.rope_scaling
        )
        self.embed_tokens = embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.lora_bank: LoraBank | None = None  # adapters' slots (LoraBank.attach sets it)
        self.tie_weights()

    def tie_weights(self) -> None:
        # A GGUF loaded as stored may have put block layers in (BlockEmbedding and a BlockLinear
        # LM head over the same blocks, tied by construction): only dense tables are tied here.
        head, table = self.lm_head, self.model.embed_tokens
        if (
            self.config.tie_word_embeddings
            and isinstance(head, nn.Linear)
            and isinstance(table, nn.Embedding)
        ):
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        if self.lora_bank is not None:  # each row's adapter slot, read by every projection
            self.lora_bank.begin_step(meta.lora_rows)
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        rope = self.model.rotary_emb(positions, x.dtype)
        for layer, cache in zip(self.model.layers, kv_caches, strict=True):
            x = layer(x, rope, meta, cache)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.weight_loader().load(weights)

    def weight_loader(self) -> WeightLoader:
        """The name map from checkpoint tensors to this model's (fused) parameters."""
        return projection_loader(self, self.config)


def projection_loader(model: nn.Module, c: ModelConfig) -> WeightLoader:
    """The name map of a model whose layers hold `self_attn.qkv_proj` and `mlp.gate_up_proj`
    (Llama, Gemma): HF's separate q/k/v and gate/up matrices land in row slices of them, and
    Phi-3's already fused ones load as they are."""
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    loader = WeightLoader(model)
    # HF name fragment -> (our parameter fragment, row offset, rows) inside a fused matrix.
    loader.fuse("self_attn.q_proj", "self_attn.qkv_proj", 0, q)
    loader.fuse("self_attn.k_proj", "self_attn.qkv_proj", q, kv)
    loader.fuse("self_attn.v_proj", "self_attn.qkv_proj", q + kv, kv)
    loader.fuse("mlp.gate_proj", "mlp.gate_up_proj", 0, c.intermediate_size)
    loader.fuse("mlp.up_proj", "mlp.gate_up_proj", c.intermediate_size, c.intermediate_size)
    if c.tie_word_embeddings:
        loader.ignore("lm_head.weight")
    loader.ignore_suffix("rotary_emb.inv_freq")
    return loader
