"""The architecture facts of encoder-decoder checkpoints (T5, BART, mBART), read from config.json.

Contract: `encoder_decoder_fields(d, family)` maps a Hugging Face config.json dict of family "t5"
or "bart" to the keyword arguments of `ModelConfig` (models/config.py): the decoder's shape in
the common fields (the KV cache is the decoder's: `num_layers` decoder layers of `num_kv_heads`
heads of `head_dim`), the rest in an `EncoderDecoderConfig` under `encoder_decoder`. Missing
keys take transformers' defaults; a key the architecture cannot do without raises KeyError
(the loader names the file). This module imports nothing of models/ (models/config.py imports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# T5 configs without n_positions: relative positions have no table, so no hard limit; this is
# the length the original T5 was trained at, used as the served context when nothing is said.
T5_DEFAULT_CONTEXT = 512


@dataclass(frozen=True)
class EncoderDecoderConfig:
    num_encoder_layers: int
    encoder_heads: int
    encoder_ffn: int
    decoder_start_token_id: int
    pad_token_id: int | None = None
    # T5: relative position buckets (first layer of each stack), RMS-style norms, gated FF.
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    gated_ffn: bool = False  # T5 v1.1 / flan: act(wi_0 x) * wi_1 x
    scale_decoder_outputs: bool = False  # T5 v1.0: hidden * d_model**-0.5 before the tied head
    # BART: learned positions (offset 2), LayerNorm; mBART puts the norms first.
    scale_embedding: bool = False  # token embeddings times sqrt(d_model)
    pre_norm: bool = False  # mBART: pre-norm layers and a final LayerNorm per stack
    forced_bos_token_id: int | None = None  # generation: the first generated token, if set
    forced_eos_token_id: int | None = None  # generation: the last token at the length limit


def encoder_decoder_fields(d: dict[str, Any], family: str) -> dict[str, Any]:
    return _t5_fields(d) if family == "t5" else _bart_fields(d)


def _t5_fields(d: dict[str, Any]) -> dict[str, Any]:
    heads = d.get("num_heads", 8)
    layers = d.get("num_layers", 6)
    proj = d.get("feed_forward_proj", "relu")
    gated = proj.startswith("gated-")
    act = proj.removeprefix("gated-")
    if proj == "gated-gelu":
        act = "gelu_new"  # transformers' reading of the name (T5 v1.1 is GELU-tanh)
    # transformers >= 5 writes `scale_decoder_outputs`; older configs say it through
    # tie_word_embeddings (v1.0 ties and scales, v1.1 / flan neither).
    tied = d.get("tie_word_embeddings", True) is not False
    scale = d.get("scale_decoder_outputs", tied)
    encdec = EncoderDecoderConfig(
        num_encoder_layers=layers,
        encoder_heads=heads,
        encoder_ffn=d.get("d_ff", 2048),
        decoder_start_token_id=_start_token(d, d.get("pad_token_id", 0)),
        pad_token_id=d.get("pad_token_id", 0),
        relative_attention_num_buckets=d.get("relative_attention_num_buckets", 32),
        relative_attention_max_distance=d.get("relative_attention_max_distance", 128),
        gated_ffn=gated,
        scale_decoder_outputs=bool(scale),
        forced_bos_token_id=d.get("forced_bos_token_id"),
        forced_eos_token_id=d.get("forced_eos_token_id"),
    )
    return dict(
        vocab_size=d["vocab_size"],
        hidden_size=d["d_model"],
        intermediate_size=d.get("d_ff", 2048),
        num_layers=d.get("num_decoder_layers") or layers,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=d.get("d_kv", 64),
        max_position_embeddings=d.get("n_positions", T5_DEFAULT_CONTEXT),
        norm_eps=d.get("layer_norm_epsilon", 1e-6),
        tie_word_embeddings=tied,
        hidden_act=act,
        bos_token_id=None,
        eos_token_ids=_ids(d.get("eos_token_id", 1)),
        encoder_decoder=encdec,
    )


def _bart_fields(d: dict[str, Any]) -> dict[str, Any]:
    hidden = d["d_model"]
    heads = d.get("decoder_attention_heads", 16)
    pre_norm = bool(d.get("normalize_before", d.get("model_type") == "mbart"))
    encdec = EncoderDecoderConfig(
        num_encoder_layers=d.get("encoder_layers", 12),
        encoder_heads=d.get("encoder_attention_heads", 16),
        encoder_ffn=d.get("encoder_ffn_dim", 4096),
        decoder_start_token_id=_start_token(d, d.get("eos_token_id", 2)),
        pad_token_id=d.get("pad_token_id", 1),
        scale_embedding=bool(d.get("scale_embedding", False)),
        pre_norm=pre_norm,
        forced_bos_token_id=d.get("forced_bos_token_id"),
        forced_eos_token_id=d.get("forced_eos_token_id"),
    )
    return dict(
        vocab_size=d["vocab_size"],
        hidden_size=hidden,
        intermediate_size=d.get("decoder_ffn_dim", 4096),
        num_layers=d.get("decoder_layers", 12),
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        max_position_embeddings=d.get("max_position_embeddings", 1024),
        norm_eps=1e-5,  # nn.LayerNorm's default: BART's norms take no eps from the config
        tie_word_embeddings=d.get("tie_word_embeddings", True) is not False,
        hidden_act=d.get("activation_function", "gelu"),
        bos_token_id=d.get("bos_token_id", 0),
        eos_token_ids=_ids(d.get("eos_token_id", 2)),
        encoder_decoder=encdec,
    )


def _start_token(d: dict[str, Any], default: int) -> int:
    start = d.get("decoder_start_token_id")
    return int(default if start is None else start)


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return (int(value),) if isinstance(value, int) else tuple(int(v) for v in value)
