"""GPT-2: learned absolute positions, pre-LayerNorm blocks, GELU-tanh MLP, tied LM head.

Same contract as models/llama.py. HF stores GPT-2's projections as Conv1D weights
`[in, out]`; load_weights transposes them into nn.Linear's `[out, in]`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from models.attention import AttentionMetadata, KVCache
from models.config import ModelConfig
from models.layers import DecoderBlock, GeluMLP, PagedSelfAttention, Rope, embedding
from models.weights import WeightLoader


class GPT2Block(DecoderBlock):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.ln_1 = nn.LayerNorm(hidden, eps=config.norm_eps)
        self.attn = PagedSelfAttention(
            hidden,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            qkv_bias=True,
            out_bias=True,
            rotary=False,
        )
        self.ln_2 = nn.LayerNorm(hidden, eps=config.norm_eps)
        self.mlp = GeluMLP(hidden, config.intermediate_size, config.hidden_act)

    def dense_in(self, x: torch.Tensor, rope: Rope | None) -> tuple[torch.Tensor, ...]:
        return self.attn.project(self.ln_1(x), None)

    def dense_out(self, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        x = x + self.attn.o_proj(attn_out)
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.wte = embedding(config.vocab_size, config.hidden_size)
        self.wpe = embedding(config.max_position_embeddings, config.hidden_size)
        self.h = nn.ModuleList(GPT2Block(config) for _ in range(config.num_layers))
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.norm_eps)


class GPT2LMHeadModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = GPT2Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        self.lm_head.weight = self.transformer.wte.weight  # GPT-2 always ties

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        x = self.transformer.wte(input_ids) + self.transformer.wpe(positions)  # [T, hidden]
        for block, cache in zip(self.transformer.h, kv_caches, strict=True):
            x = block(x, None, meta, cache)
        return self.transformer.ln_f(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        # Names are transformers' (`transformer.h.0...`): load_checkpoint gives files saved from
        # GPT2Model (no `transformer.` prefix) those names, in one place (models/loader.py).
        loader = WeightLoader(self)
        loader.fuse("attn.c_attn", "attn.qkv_proj", 0, 3 * self.config.hidden_size)
        loader.fuse("attn.c_proj", "attn.o_proj", 0, self.config.hidden_size)
        for conv1d in ("attn.qkv_proj", "attn.o_proj", "mlp.c_fc", "mlp.c_proj"):
            loader.transpose(conv1d)
        loader.ignore("lm_head.weight")
        loader.ignore_suffix(".attn.bias")  # causal-mask buffers of old checkpoints
        loader.ignore_suffix(".attn.masked_bias")
        loader.load(weights)
