"""Layers T5 and BART share: multi-head attention in its three uses (encoder self-attention,
decoder self-attention on the paged cache, cross-attention over the encoder's paged K/V) and
the activations their feed-forward layers name.

Contract: `MultiHeadAttention(hidden, heads, head_dim, bias, scale)` holds the projections
`q`, `k`, `v`, `o` (BART's q_proj / k_proj / v_proj / out_proj load into them by a name map);
the decoder's methods take and return flat rows [T, hidden] (models/encdec/attention.py has
the layout of a step); the encoder's self-attention is `project` then the staged pass's
attention (models/encdec/staged_encoder.py). `activation(name)` returns the elementwise
function of a config's activation name (batch-invariant versions from models/pointwise.py), ValueError otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from models import pointwise
from models.attention import KVCache, write_kv
from models.encdec.attention import BiasFn, SeqSpans, attend_paged, no_bias

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu,
    "gelu": pointwise.gelu_erf,
    "gelu_new": pointwise.gelu_tanh,
    "gelu_pytorch_tanh": pointwise.gelu_tanh,
    "silu": pointwise.silu,
    "swish": pointwise.silu,
}


def row_linears(
    decoder: nn.Module, cross: Iterable[MultiHeadAttention], head: nn.Linear
) -> list[nn.Linear]:
    """The linears a decode step's rows go through: every linear of the `decoder` stack but the
    `cross` attentions' k and v (they project the encoder's output once), then the `head`."""
    encoder_side = {id(p) for attn in cross for p in (attn.k, attn.v)}
    layers = [m for m in decoder.modules() if isinstance(m, nn.Linear)]
    return [m for m in layers if id(m) not in encoder_side] + [head]


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in _ACTIVATIONS:
        supported = ", ".join(sorted(_ACTIVATIONS))
        raise ValueError(f"unsupported activation {name!r}; supported: {supported}")
    return _ACTIVATIONS[name]


class MultiHeadAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, head_dim: int, bias: bool, scale: float) -> None:
        super().__init__()
        self.heads, self.head_dim, self.scale = heads, head_dim, scale
        inner = heads * head_dim
        self.q = nn.Linear(hidden, inner, bias=bias)
        self.k = nn.Linear(hidden, inner, bias=bias)
        self.v = nn.Linear(hidden, inner, bias=bias)
        self.o = nn.Linear(inner, hidden, bias=bias)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(-1, self.heads, self.head_dim)  # [T, H, D]

    def project(self, x: torch.Tensor, parts: str) -> list[torch.Tensor]:
        """The encoder's projections of rows x: "q" -> [q], "kv" -> [k, v], each [T, H, D]
        (models/encdec/staged_encoder.py attends them)."""
        return [self._heads(getattr(self, name)(x)) for name in parts]

    def decoder_self(
        self, x: torch.Tensor, spans: SeqSpans, cache: KVCache, bias_fn: BiasFn
    ) -> torch.Tensor:
        """Writes the new rows' K/V at `spans.slot_mapping`, then attends causally."""
        q, k, v = (self._heads(p(x)) for p in (self.q, self.k, self.v))
        if spans.slot_mapping is None:
            raise ValueError("decoder self-attention needs the slots its new K/V go to")
        write_kv(cache, k, v, spans.slot_mapping)
        return self.o(attend_paged(q, cache, spans, self.scale, bias_fn, causal=True))

    def cross(self, x: torch.Tensor, spans: SeqSpans, cache: KVCache) -> torch.Tensor:
        """Attends to the encoder K/V the encoder pass stored in the sequences' cross blocks."""
        q = self._heads(self.q(x))
        return self.o(attend_paged(q, cache, spans, self.scale, no_bias, causal=False))
