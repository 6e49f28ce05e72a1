"""T5 (v1.0: ReLU feed-forward, head tied to the embedding with outputs scaled by
d_model**-0.5; v1.1 / flan: gated-GELU, untied head): pre-norm blocks with T5's RMS-style
LayerNorm (no mean, no bias), unscaled attention with a learned relative position bias that
the first layer of each stack computes (bidirectional buckets in the encoder, causal in the
decoder) and every layer of that stack adds.

Contract (every encoder-decoder model, models/encdec/__init__.py):
- `encode(input_ids [T], positions [T], seq_lens) -> [T, hidden]`: the encoder's output for a
  flat batch of whole inputs (sequence i is `seq_lens[i]` rows, positions from 0);
- `write_cross_kv(encoder_out [T, hidden], slots [T], kv_caches)`: every decoder layer's cross
  K/V written once into the paged cache (the request's cross blocks);
- `forward(input_ids [T], positions [T], spans, kv_caches, cross) -> [T, hidden]`: decoder
  rows, self-attention over `spans` (writing their K/V), cross-attention over `cross`;
- `compute_logits(hidden [R, hidden]) -> [R, vocab]` float32; `load_weights(pairs)` takes
  transformers' names (the module names here are the checkpoint's);
- the `EncoderStack` methods (`encoder_*`, `cross_kv`) through which
  models/encdec/staged_encoder.py runs the encoder a unit at a time (`encode` runs it whole).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from models.attention import KVCache
from models.config import ModelConfig
from models.encdec.attention import BiasFn, SeqSpans
from models.encdec.layers import MultiHeadAttention, activation, row_linears
from models.encdec.staged_encoder import WholeEncoderMethods
from models.layers import RMSNorm, embedding
from models.weights import WeightLoader


def relative_position_bucket(
    relative: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> torch.Tensor:
    """T5's buckets of key - query distances: exact below half the buckets, logarithmic up to
    `max_distance`, one bucket beyond; the encoder gives later keys buckets of their own."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)  # later keys are masked anyway
    exact = num_buckets // 2
    log_ratio = torch.log(distance.float() / exact) / math.log(max_distance / exact)
    far = (exact + (log_ratio * (num_buckets - exact)).long()).clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < exact, distance, far)


class T5Attention(MultiHeadAttention):
    def __init__(self, config: ModelConfig, has_relative_bias: bool) -> None:
        super().__init__(config.hidden_size, config.num_heads, config.head_dim, False, 1.0)
        encdec = config.encoder_decoder
        self.num_buckets = encdec.relative_attention_num_buckets
        self.max_distance = encdec.relative_attention_max_distance
        self.relative_attention_bias = (
            embedding(self.num_buckets, config.num_heads) if has_relative_bias else None
        )

    def bias_rows(self, first: int, q_len: int, k_len: int, bidirectional: bool) -> torch.Tensor:
        """The position bias [H, q_len, k_len] of queries at positions first.. over keys 0.."""
        device = self.relative_attention_bias.weight.device
        query = torch.arange(first, first + q_len, device=device)[:, None]
        key = torch.arange(k_len, device=device)[None, :]
        buckets = relative_position_bucket(
            key - query, bidirectional, self.num_buckets, self.max_distance
        )
        return self.relative_attention_bias(buckets).permute(2, 0, 1)

    def bias_fn(self, bidirectional: bool) -> BiasFn:
        """The stack's position bias [H, Q, K] for a sequence whose last query is its last key,
        computed once per shape in a forward and shared by the stack's layers."""
        memo: dict[tuple[int, int], torch.Tensor] = {}

        def bias(q_len: int, k_len: int) -> torch.Tensor:
            if (q_len, k_len) not in memo:
                memo[(q_len, k_len)] = self.bias_rows(k_len - q_len, q_len, k_len, bidirectional)
            return memo[(q_len, k_len)]

        return bias


class T5DenseReluDense(nn.Module):
    """v1.0: wo(act(wi x)); v1.1 (gated): wo(act(wi_0 x) * wi_1 x)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, ff = config.hidden_size, config.intermediate_size
        self.act = activation(config.hidden_act)
        self.gated = config.encoder_decoder.gated_ffn
        if self.gated:
            self.wi_0 = nn.Linear(hidden, ff, bias=False)
            self.wi_1 = nn.Linear(hidden, ff, bias=False)
        else:
            self.wi = nn.Linear(hidden, ff, bias=False)
        self.wo = nn.Linear(ff, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = self.act(self.wi_0(x)) * self.wi_1(x) if self.gated else self.act(self.wi(x))
        return self.wo(inner)


class T5LayerSelfAttention(nn.Module):
    def __init__(self, config: ModelConfig, has_relative_bias: bool) -> None:
        super().__init__()
        self.SelfAttention = T5Attention(config, has_relative_bias)
        self.layer_norm = RMSNorm(config.hidden_size, config.norm_eps)


class T5LayerCrossAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.EncDecAttention = T5Attention(config, has_relative_bias=False)
        self.layer_norm = RMSNorm(config.hidden_size, config.norm_eps)


class T5LayerFF(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.DenseReluDense = T5DenseReluDense(config)
        self.layer_norm = RMSNorm(config.hidden_size, config.norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.DenseReluDense(self.layer_norm(x))


class T5Block(nn.Module):
    def __init__(self, config: ModelConfig, first: bool, decoder: bool) -> None:
        super().__init__()
        parts: list[nn.Module] = [T5LayerSelfAttention(config, has_relative_bias=first)]
        if decoder:
            parts.append(T5LayerCrossAttention(config))
        parts.append(T5LayerFF(config))
        self.layer = nn.ModuleList(parts)

    @property
    def self_attn(self) -> T5LayerSelfAttention:
        return self.layer[0]

    @property
    def cross_attn(self) -> T5LayerCrossAttention:
        return self.layer[1]


class T5Stack(nn.Module):
    def __init__(self, config: ModelConfig, num_layers: int, decoder: bool) -> None:
        super().__init__()
        self.block = nn.ModuleList(T5Block(config, i == 0, decoder) for i in range(num_layers))
        self.final_layer_norm = RMSNorm(config.hidden_size, config.norm_eps)

    def bias_fn(self, bidirectional: bool) -> BiasFn:
        return self.block[0].self_attn.SelfAttention.bias_fn(bidirectional)


class T5ForConditionalGeneration(WholeEncoderMethods, nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        encdec = config.encoder_decoder
        if encdec is None:
            raise ValueError(f"{config.architecture} is not an encoder-decoder config")
        self.config = config
        self.shared = embedding(config.vocab_size, config.hidden_size)
        self.encoder = T5Stack(config, encdec.num_encoder_layers, decoder=False)
        self.decoder = T5Stack(config, config.num_layers, decoder=True)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.output_scale = config.hidden_size**-0.5 if encdec.scale_decoder_outputs else None
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.shared.weight

    # ----- the encoder, as models/encdec/staged_encoder.py runs it -------------------------
    @property
    def encoder_num_layers(self) -> int:
        return len(self.encoder.block)

    @property
    def encoder_device(self) -> torch.device:
        return self.shared.weight.device

    def encoder_embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.shared(ids)  # [M, hidden]: relative positions enter as the bias

    def encoder_qkv(self, layer: int, x: torch.Tensor, parts: str) -> list[torch.Tensor]:
        attn = self.encoder.block[layer].self_attn
        return attn.SelfAttention.project(attn.layer_norm(x), parts)

    def encoder_bias(self, first: int, q_len: int, k_len: int) -> torch.Tensor:
        attn = self.encoder.block[0].self_attn.SelfAttention
        return attn.bias_rows(first, q_len, k_len, bidirectional=True)

    def encoder_scale(self) -> float:
        return 1.0  # T5 folds the scale into its initialisation

    def encoder_finish(self, layer: int, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        block = self.encoder.block[layer]
        return block.layer[-1](x + block.self_attn.SelfAttention.o(attended))

    def encoder_final(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder.final_layer_norm(x)

    def cross_kv(self, encoder_out: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        attns = (block.cross_attn.EncDecAttention for block in self.decoder.block)
        return [tuple(a.project(encoder_out, "kv")) for a in attns]

    def decoder_row_linears(self) -> list[nn.Linear]:
        cross = [block.cross_attn.EncDecAttention for block in self.decoder.block]
        return row_linears(self.decoder, cross, self.lm_head)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        spans: SeqSpans,
        kv_caches: list[KVCache],
        cross: SeqSpans,
    ) -> torch.Tensor:
        x = self.shared(input_ids)  # [T, hidden]
        bias = self.decoder.bias_fn(bidirectional=False)
        for block, cache in zip(self.decoder.block, kv_caches, strict=True):
            attn, xattn = block.self_attn, block.cross_attn
            x = x + attn.SelfAttention.decoder_self(attn.layer_norm(x), spans, cache, bias)
            x = x + xattn.EncDecAttention.cross(xattn.layer_norm(x), cross, cache)
            x = block.layer[-1](x)
        return self.decoder.final_layer_norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.output_scale is not None:
            hidden = hidden * self.output_scale
        return self.lm_head(hidden).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        loader = WeightLoader(self)
        # Copies of `shared` some files keep; the stacks read `shared` itself.
        loader.ignore("encoder.embed_tokens.weight")
        loader.ignore("decoder.embed_tokens.weight")
        if self.config.tie_word_embeddings:
            loader.ignore("lm_head.weight")
        loader.load(weights)


__all__ = ["T5ForConditionalGeneration", "relative_position_bucket"]
