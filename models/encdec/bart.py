"""BART (and mBART): learned absolute positions (stored with an offset of 2), an embedding
LayerNorm, post-norm layers (mBART: pre-norm, with a final LayerNorm per stack), scaled
attention with biases, GELU feed-forward, the head tied to the shared embedding plus
`final_logits_bias`; `scale_embedding` multiplies token embeddings by sqrt(d_model).

Same contract as models/encdec/t5.py. Names are transformers' (`model.encoder.layers.0...`);
the attention projections q_proj / k_proj / v_proj / out_proj load into the shared
MultiHeadAttention's q / k / v / o.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from models.attention import KVCache
from models.config import ModelConfig
from models.encdec.attention import SeqSpans
from models.encdec.layers import MultiHeadAttention, activation, no_bias, row_linears
from models.encdec.staged_encoder import WholeEncoderMethods
from models.layers import embedding
from models.weights import WeightLoader

POSITION_OFFSET = 2  # BART's position table starts two rows in (a fairseq leftover)


class BartLayer(nn.Module):
    """One encoder layer, or (with cross-attention) one decoder layer."""

    def __init__(self, config: ModelConfig, heads: int, ffn: int, decoder: bool) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.norm_eps
        head_dim = hidden // heads
        self.pre_norm = config.encoder_decoder.pre_norm
        self.self_attn = MultiHeadAttention(hidden, heads, head_dim, True, head_dim**-0.5)
        self.self_attn_layer_norm = nn.LayerNorm(hidden, eps=eps)
        if decoder:
            self.encoder_attn = MultiHeadAttention(hidden, heads, head_dim, True, head_dim**-0.5)
            self.encoder_attn_layer_norm = nn.LayerNorm(hidden, eps=eps)
        self.act = activation(config.hidden_act)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)
        self.final_layer_norm = nn.LayerNorm(hidden, eps=eps)

    def residual(self, x: torch.Tensor, norm: nn.LayerNorm, sublayer) -> torch.Tensor:
        """Post-norm: norm(x + f(x)); pre-norm (mBART): x + f(norm(x))."""
        if self.pre_norm:
            return x + sublayer(norm(x))
        return norm(x + sublayer(x))

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.residual(x, self.final_layer_norm, lambda h: self.fc2(self.act(self.fc1(h))))


class BartStack(nn.Module):
    def __init__(self, config: ModelConfig, layers: int, heads: int, ffn: int, decoder: bool):
        super().__init__()
        hidden = config.hidden_size
        self.embed_positions = embedding(config.max_position_embeddings + POSITION_OFFSET, hidden)
        self.layernorm_embedding = nn.LayerNorm(hidden, eps=config.norm_eps)
        self.layers = nn.ModuleList(BartLayer(config, heads, ffn, decoder) for _ in range(layers))
        pre_norm = config.encoder_decoder.pre_norm
        self.layer_norm = nn.LayerNorm(hidden, eps=config.norm_eps) if pre_norm else None

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.layernorm_embedding(tokens + self.embed_positions(positions + POSITION_OFFSET))

    def final(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.layer_norm is None else self.layer_norm(x)


class BartModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        encdec = config.encoder_decoder
        self.shared = embedding(config.vocab_size, config.hidden_size)
        self.encoder = BartStack(
            config, encdec.num_encoder_layers, encdec.encoder_heads, encdec.encoder_ffn, False
        )
        self.decoder = BartStack(
            config, config.num_layers, config.num_heads, config.intermediate_size, True
        )


class BartForConditionalGeneration(WholeEncoderMethods, nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        encdec = config.encoder_decoder
        if encdec is None:
            raise ValueError(f"{config.architecture} is not an encoder-decoder config")
        self.config = config
        self.model = BartModel(config)
        self.embed_scale = math.sqrt(config.hidden_size) if encdec.scale_embedding else 1.0
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        # A buffer in transformers, saved with the weights; a parameter here so loading fills it.
        self.final_logits_bias = nn.Parameter(torch.empty(1, config.vocab_size), False)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.shared.weight

    def _tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.model.shared(input_ids)  # [T, hidden]
        return x if self.embed_scale == 1.0 else x * self.embed_scale

    # ----- the encoder, as models/encdec/staged_encoder.py runs it -------------------------
    @property
    def encoder_num_layers(self) -> int:
        return len(self.model.encoder.layers)

    @property
    def encoder_device(self) -> torch.device:
        return self.model.shared.weight.device

    def encoder_embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model.encoder.embed(self._tokens(ids), positions)

    def encoder_qkv(self, layer: int, x: torch.Tensor, parts: str) -> list[torch.Tensor]:
        block = self.model.encoder.layers[layer]
        h = block.self_attn_layer_norm(x) if block.pre_norm else x
        return block.self_attn.project(h, parts)

    def encoder_bias(self, first: int, q_len: int, k_len: int) -> None:
        return None  # learned absolute positions, in the embedding

    def encoder_scale(self) -> float:
        return self.model.encoder.layers[0].self_attn.scale

    def encoder_finish(self, layer: int, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        block = self.model.encoder.layers[layer]
        out = block.self_attn.o(attended)
        x = x + out if block.pre_norm else block.self_attn_layer_norm(x + out)
        return block.feed_forward(x)

    def encoder_final(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.encoder.final(x)

    def cross_kv(self, encoder_out: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        attns = (layer.encoder_attn for layer in self.model.decoder.layers)
        return [tuple(a.project(encoder_out, "kv")) for a in attns]

    def decoder_row_linears(self) -> list[nn.Linear]:
        cross = [layer.encoder_attn for layer in self.model.decoder.layers]
        return row_linears(self.model.decoder, cross, self.lm_head)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        spans: SeqSpans,
        kv_caches: list[KVCache],
        cross: SeqSpans,
    ) -> torch.Tensor:
        stack = self.model.decoder
        x = stack.embed(self._tokens(input_ids), positions)
        for layer, cache in zip(stack.layers, kv_caches, strict=True):
            x = layer.residual(
                x,
                layer.self_attn_layer_norm,
                lambda h, a=layer.self_attn, c=cache: a.decoder_self(h, spans, c, no_bias),
            )
            x = layer.residual(
                x,
                layer.encoder_attn_layer_norm,
                lambda h, a=layer.encoder_attn, c=cache: a.cross(h, cross, c),
            )
            x = layer.feed_forward(x)
        return stack.final(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return (self.lm_head(hidden) + self.final_logits_bias).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        hidden = self.config.hidden_size
        loader = WeightLoader(self)
        for theirs, ours in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("out_proj", "o")):
            loader.fuse(theirs, ours, 0, hidden)  # a rename: the whole matrix
        loader.ignore("model.encoder.embed_tokens.weight")  # copies of model.shared
        loader.ignore("model.decoder.embed_tokens.weight")
        if self.config.tie_word_embeddings:
            loader.ignore("lm_head.weight")
        loader.load(_with_logits_bias(weights, self.config.vocab_size))


def _with_logits_bias(
    weights: Iterable[tuple[str, torch.Tensor]], vocab: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights, then a zero `final_logits_bias` when the file has none (as transformers)."""
    seen = False
    for name, tensor in weights:
        seen = seen or name == "final_logits_bias"
        yield name, tensor
    if not seen:
        yield "final_logits_bias", torch.zeros(1, vocab)
