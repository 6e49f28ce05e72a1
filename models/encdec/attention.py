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
depends on the rest of the batch. Sequences of the same shape (query rows, keys) run as one
batched matmul / softmax (a decode step's rows mostly share one: one op per layer instead of one
per sequence); a batched matmul computes each matrix of the batch as it would alone, so the
grouping changes no bit of a row. Attention without a bias (cross-attention, BART) on the CPU
with `SeqSpans.cpu_kernel` runs the C++ paged kernel (models/cpu_kernels/paged_attention.py):
one query per row over its own sequence's blocks read in place (no gathered copy of the
encoder's K/V), each row alone, so also batch-invariant.

Contract: `attend_rows(q, k, v, scale, bias)` (the encoder: some rows of one sequence over all
its keys, models/encdec/staged_encoder.py) and `attend_paged(q, cache, spans, scale, bias_fn,
causal)` take q [T, H, D] (k, v [L, H, D] or the cache (k, v) [num_blocks, block_size, H, D])
and return [T, H * D]. `bias_fn(q_len, k_len)`
gives the bias [H, q_len, k_len] of a sequence whose last query is its last key, or None;
`no_bias` is the one that always gives None (and lets the C++ kernel take the attention).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from models.attention import KVCache
from models.cpu_kernels import paged_attention
from models.linear_backend import ROW_QUANTUM

BiasFn = Callable[[int, int], torch.Tensor | None]


def no_bias(q_len: int, k_len: int) -> None:
    return None


@dataclass(frozen=True)
class SeqSpans:
    query_lens: list[int]  # new rows per sequence, in batch order
    context_lens: list[int]  # keys each sequence attends to, its new rows included
    block_tables: list[torch.Tensor]  # per sequence int64 [num_blocks] on the cache's device
    slot_mapping: torch.Tensor | None  # [sum(query_lens)] int64: where new K/V go (None: read)
    block_size: int
    cpu_kernel: bool = False  # unbiased attention may run the C++ paged kernel
    # per-step index tensors every layer reuses (built by the first layer that needs them)
    plans: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(
        cls,
        block_tables: Sequence[Sequence[int]],
        context_lens: Sequence[int],
        query_lens: Sequence[int],
        block_size: int,
        device: torch.device | str,
        writes: bool = True,
        cpu_kernel: bool = False,
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
            cpu_kernel=cpu_kernel,
        )


def attend_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """Rows q [M, H, D] of one sequence attend to all its keys k, v [L, H, D] (the encoder: no
    mask); `bias` [H, M, L] or None. The rows are padded with zero rows to a multiple of
    ROW_QUANTUM, so a row's bits do not depend on which other rows of the sequence come along
    (models/linear_backend.py: the GEMMs sum a row in one order from 8 rows on)."""
    rows = q.shape[0]
    pad = -rows % ROW_QUANTUM
    q_heads = F.pad(q.transpose(0, 1), (0, 0, 0, pad))  # [H, M + pad, D]
    scores = torch.matmul(q_heads, k.permute(1, 2, 0)).float()  # [H, M + pad, L]
    if scale != 1.0:
        scores = scores * scale
    if bias is not None:
        scores = scores + F.pad(bias.float(), (0, 0, 0, pad))
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    out = torch.matmul(probs, v.transpose(0, 1))  # [H, M + pad, D]
    return out[:, :rows].transpose(0, 1).reshape(rows, -1)


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
    if bias_fn is no_bias and spans.cpu_kernel and _kernel_fits(q, k_cache):
        return _attend_paged_kernel(q, cache, spans, scale, causal)
    if "groups" not in spans.plans:
        spans.plans["groups"] = _group_plan(spans, q.device)
    out = q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
    for n, context, rows, tables in spans.plans["groups"]:
        k, v = _gather(k_cache, tables, context), _gather(v_cache, tables, context)
        q_group = q[rows].view(tables.shape[0], n, *q.shape[1:])  # [G, n, H, D]
        out[rows] = _attend_group(q_group, k, v, scale, bias_fn, causal).flatten(0, 1)
    return out


def _group_plan(spans: SeqSpans, device: torch.device) -> list:
    """Per shape (query rows n, keys L): n, L, the group's rows in the step [G * n] and its
    block tables [G, blocks of L]."""
    starts = _starts(spans.query_lens)
    plan = []
    shapes = zip(spans.query_lens, spans.context_lens, strict=True)
    for (n, context), members in _same_shape(shapes).items():
        blocks = -(-context // spans.block_size)
        tables = torch.stack([spans.block_tables[i][:blocks] for i in members])
        rows = [r for i in members for r in range(starts[i], starts[i] + n)]
        plan.append((n, context, torch.tensor(rows, dtype=torch.int64, device=device), tables))
    return plan


def _starts(lens: Sequence[int]) -> list[int]:
    starts, total = [], 0
    for n in lens:
        starts.append(total)
        total += n
    return starts


def _same_shape(shapes) -> dict[tuple[int, int], list[int]]:
    """(query rows, keys) -> the indices of the sequences of that shape, in batch order."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, shape in enumerate(shapes):
        groups.setdefault(shape, []).append(i)
    return groups


def _gather(cache: torch.Tensor, tables: torch.Tensor, context: int) -> torch.Tensor:
    """The first `context` positions of each sequence of a group, [G, L, H, D], from its block
    tables [G, blocks]: whole blocks by `index_select` (several times faster on the CPU than
    indexing the cache with the tables)."""
    groups, blocks = tables.shape
    picked = cache.view(cache.shape[0], -1).index_select(0, tables.flatten())
    return picked.view(groups, blocks * cache.shape[1], *cache.shape[2:])[:, :context]


def _attend_group(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    bias_fn: BiasFn,
    causal: bool,
) -> torch.Tensor:
    """q [G, Q, H, D] (the last Q of L positions of each of G sequences), k, v [G, L, H, D]
    -> [G, Q, H * D]."""
    groups, q_len, heads, dim = q.shape
    k_len = k.shape[1]
    # One bmm over G * H matrices (what torch.matmul of the 4-d views runs, in fewer copies).
    q_heads = q.transpose(1, 2).reshape(groups * heads, q_len, dim)
    k_heads = k.permute(0, 2, 3, 1).reshape(groups * heads, dim, k_len)
    scores = torch.bmm(q_heads, k_heads).view(groups, heads, q_len, k_len).float()
    if scale != 1.0:
        scores = scores * scale
    bias = bias_fn(q_len, k_len)  # [H, Q, L], the same for every sequence of the group
    if bias is not None:
        scores = scores + bias.float()
    if causal:
        query_pos = torch.arange(k_len - q_len, k_len, device=q.device)[:, None]
        key_pos = torch.arange(k_len, device=q.device)[None, :]
        scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype).view(groups * heads, q_len, k_len)
    v_heads = v.transpose(1, 2).reshape(groups * heads, k_len, dim)
    out = torch.bmm(probs, v_heads).view(groups, heads, q_len, dim)
    return out.transpose(1, 2).reshape(groups, q_len, -1)


def _kernel_fits(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    return (
        q.device.type == "cpu"
        and q.dtype == k_cache.dtype
        and k_cache.is_contiguous()
        and paged_attention.is_available(q.device)
    )


def _attend_paged_kernel(
    q: torch.Tensor, cache: KVCache, spans: SeqSpans, scale: float, causal: bool
) -> torch.Tensor:
    """Each query row alone through the C++ kernel: row r of sequence i sees the first
    `context_lens[i]` keys (causal: up to its own position)."""
    k_cache, v_cache = cache
    key = ("kernel", causal)
    if key not in spans.plans:
        widest = max(len(t) for t in spans.block_tables)
        tables, keys = [], []
        for n, context, table in zip(
            spans.query_lens, spans.context_lens, spans.block_tables, strict=True
        ):
            padded = torch.nn.functional.pad(table, (0, widest - len(table)))  # unread past L
            tables.append(padded.expand(n, widest))
            first = context - n + 1 if causal else context
            keys.extend(range(first, first + n) if causal else [context] * n)
        spans.plans[key] = (torch.cat(tables), torch.tensor(keys, dtype=torch.int64))
    row_tables, seq_lens = spans.plans[key]  # [T, nb], [T]
    out = paged_attention.paged_decode_attention(
        q, k_cache, v_cache, row_tables, seq_lens, scale
    )  # [T, H, D]
    return out.flatten(1)
