"""The matrix shapes of one forward pass, from a ModelConfig: what the machine bounds are made of.

Contract (pure arithmetic, no torch):
- `layer_linears(config)`: the projections of one decoder layer as `Linear(in, out)` (per token
  each costs `2 * in * out` FLOPs and reads `in * out` weights); `lm_head(config)` the final one.
- `weight_bytes_per_token(config, dtype_bytes)`: bytes of weights a batch-1 decode step must
  stream from memory (every projection, the LM head, one embedding row; norms are negligible).
- `flops_per_token(config, with_lm_head)`: matmul FLOPs of one token through the projections
  (attention score FLOPs grow with the context and are left out: the bound is a lower bound
  on time). Prompt tokens skip the LM head (only the last row of a prompt is projected).
  An encoder-decoder (T5, BART): `layer_linears` is a decoder layer (self-attention, the
  cross-attention's query and output, the feed-forward), a generated token's cost; a prompt
  token (`with_lm_head=False`) is the encoder's input: every encoder layer
  (`encoder_linears`) and every decoder layer's cross-attention key and value.
- `kv_bytes_per_token(config, dtype_bytes, all_heads=False)`: K and V of one token in every layer;
  `all_heads=True` gives what a cache repeating KV heads per query head would take.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the models package imports torch: keep `tgserve --help` fast
    from models.config import ModelConfig


@dataclass(frozen=True)
class Linear:
    name: str
    in_features: int
    out_features: int

    @property
    def params(self) -> int:
        return self.in_features * self.out_features


def layer_linears(config: ModelConfig) -> tuple[Linear, ...]:
    h, inter = config.hidden_size, config.intermediate_size
    q = config.num_heads * config.head_dim
    kv = config.num_kv_heads * config.head_dim
    if config.encoder_decoder is not None:
        attention_ffn = _attention_and_ffn(h, q, inter, config.encoder_decoder.gated_ffn)
        cross = (Linear("cross.q", h, q), Linear("cross.o", q, h))
        return (*attention_ffn[:4], *cross, *attention_ffn[4:])
    if config.family == "gpt2":
        return (
            Linear("c_attn", h, 3 * h),
            Linear("attn.c_proj", h, h),
            Linear("c_fc", h, inter),
            Linear("mlp.c_proj", inter, h),
        )
    return (
        Linear("q_proj", h, q),
        Linear("k_proj", h, kv),
        Linear("v_proj", h, kv),
        Linear("o_proj", q, h),
        Linear("gate_proj", h, inter),
        Linear("up_proj", h, inter),
        Linear("down_proj", inter, h),
    )


def encoder_linears(config: ModelConfig) -> tuple[Linear, ...]:
    """One encoder layer of an encoder-decoder model."""
    encdec = config.encoder_decoder
    inner = encdec.encoder_heads * config.head_dim
    return _attention_and_ffn(config.hidden_size, inner, encdec.encoder_ffn, encdec.gated_ffn)


def _attention_and_ffn(h: int, inner: int, ffn: int, gated: bool) -> tuple[Linear, ...]:
    ups = (
        (Linear("ffn.gate", h, ffn), Linear("ffn.up", h, ffn))
        if gated
        else (Linear("ffn.up", h, ffn),)
    )
    attention = (Linear("q", h, inner), Linear("k", h, inner), Linear("v", h, inner))
    return (*attention, Linear("o", inner, h), *ups, Linear("ffn.down", ffn, h))


def lm_head(config: ModelConfig) -> Linear:
    return Linear("lm_head", config.hidden_size, config.vocab_size)


def weight_bytes_per_token(config: ModelConfig, dtype_bytes: int) -> int:
    per_layer = sum(lin.params for lin in layer_linears(config))
    params = config.num_layers * per_layer + lm_head(config).params + config.hidden_size
    return params * dtype_bytes


def flops_per_token(config: ModelConfig, with_lm_head: bool) -> int:
    encdec = config.encoder_decoder
    if encdec is not None and not with_lm_head:  # an encoder input token
        kv = config.num_heads * config.head_dim
        cross_kv = 2 * config.hidden_size * kv * config.num_layers
        encoder = sum(lin.params for lin in encoder_linears(config)) * encdec.num_encoder_layers
        return 2 * (encoder + cross_kv)
    per_layer = sum(lin.params for lin in layer_linears(config))
    head = lm_head(config).params if with_lm_head else 0
    return 2 * (config.num_layers * per_layer + head)


def kv_bytes_per_token(config: ModelConfig, dtype_bytes: int, all_heads: bool = False) -> int:
    heads = config.num_heads if all_heads else config.num_kv_heads
    return 2 * config.num_layers * heads * config.head_dim * dtype_bytes
