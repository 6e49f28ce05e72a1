"""Attention for encoder-decoder models: per-sequence attention with an additive position bias,
over dense rows (the encoder) or over paged K/V blocks (decoder self- and cross-attention).

A step's batch is flat, as everywhere in tgserve: sequence i brings `query_lens[i]` rows.
`SeqSpans` says, per sequence, how many keys it attends to (`context_lens[i]`, the new rows
included) and, for paged attention, which cache blocks hold them (token t of a sequence in block
`block_tables[i][t // block_size]` at offset `t % block_size`, the layout of models/attention.py)
and where new K/V go (`slot_mapping`). Decoder self-attention writes its new K/V and attends
causally; cross-attention reads the K/V the request's encoder pass wrote once into blocks of
its own (`write_cross_kv` in the models), never writes them again, and attends to all of them.

Why not models/attention.py's kernels: T5 adds a learned bias to every score, which they do not
take. The math here is the readable reference: each sequence's scores [H, Q, L] are computed
from that sequence alone (scaled, biased, causally masked, softmax in float32), so a row never
depends on the rest of the batch.

Contract: `attend_dense(q, k, v, seq_lens, scale, bias_fn, causal)` and
`attend_paged(q, cache, spans, scale, bias_fn, causal)` take q [T, H, D] (k, v [T, H, D] or the
cache (k, v) [num_blocks, block_size, H, D]) and return [T, H * D]. `bias_fn(q_len, k_len)`
gives the bias [H, q_len, k_len] of a sequence whose last query is its last key, or None.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from models.attention import KVCache

BiasFn = Callable[[int, int], torch.Tensor | None]


@dataclass(frozen=True)
class SeqSpans:
    query_lens: list[int]  # new rows per sequence, in batch order
    context_lens: list[int]  # keys each sequence attends to, its new rows included
    block_tables: list[torch.Tensor]  # per sequence int64 [num_blocks] on the cache's device
    slot_mapping: torch.Tensor | None  # [sum(query_lens)] int64: where new K/V go (None: read)
    block_size: int

    @classmethod
    def build(
        cls,
        block_tables: Sequence[Sequence[int]],
        context_lens: Sequence[int],
        query_lens: Sequence[int],
        block_size: int,
        device: torch.device | str,
        writes: bool = True,
    ) -> SeqSpans:
        """From host lists; `writes`: the new rows' K/V go to the slots of the last
        `query_lens[i]` positions of each sequence (decoder self-attention, cross K/V)."""
        slots: list[int] = []
        for table, context, new in zip(block_tables, context_lens, query_lens, strict=True):
            for pos in range(context - new, context):
                slots.append(table[pos // block_size] * block_size + pos % block_size)
        return cls(
            query_lens=list(query_lens),
            context_lens=list(context_lens),
            block_tables=[torch.tensor(t, dtype=torch.int64, device=device) for t in block_tables],
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device) if writes else None,
            block_size=block_size,
        )


def write_paged(cache: KVCache, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """k, v [T, H, D] into the cache's flat slots."""
    k_cache, v_cache = cache
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v.to(v_cache.dtype))


def attend_dense(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seq_lens: Sequence[int],
    scale: float,
    bias_fn: BiasFn,
    causal: bool,
) -> torch.Tensor:
    """Each sequence's rows attend to its own rows (the encoder: causal False)."""
    outs, start = [], 0
    for n in seq_lens:
        rows = slice(start, start + n)
        outs.append(_attend_one(q[rows], k[rows], v[rows], scale, bias_fn(n, n), causal))
        start += n
    return torch.cat(outs)


def attend_paged(
    q: torch.Tensor,
    cache: KVCache,
    spans: SeqSpans,
    scale: float,
    bias_fn: BiasFn,
    causal: bool,
) -> torch.Tensor:
    """Each sequence's new rows attend to its first `context_lens[i]` cached keys."""
    k_cache, v_cache = cache
    outs, start = [], 0
    for n, context, table in zip(
        spans.query_lens, spans.context_lens, spans.block_tables, strict=True
    ):
        k = k_cache[table].flatten(0, 1)[:context]  # [L, H, D]
        v = v_cache[table].flatten(0, 1)[:context]
        outs.append(_attend_one(q[start : start + n], k, v, scale, bias_fn(n, context), causal))
        start += n
    return torch.cat(outs)


def _attend_one(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    bias: torch.Tensor | None,
    causal: bool,
) -> torch.Tensor:
    """q [Q, H, D] (the last Q of L positions), k, v [L, H, D] -> [Q, H * D]."""
    q_len, k_len = q.shape[0], k.shape[0]
    scores = torch.matmul(q.transpose(0, 1), k.permute(1, 2, 0)).float()  # [H, Q, L]
    if scale != 1.0:
        scores = scores * scale
    if bias is not None:
        scores = scores + bias.float()
    if causal:
        query_pos = torch.arange(k_len - q_len, k_len, device=q.device)[:, None]
        key_pos = torch.arange(k_len, device=q.device)[None, :]
        scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    out = torch.matmul(probs, v.transpose(0, 1))  # [H, Q, D]
    return out.transpose(0, 1).reshape(q_len, -1)
