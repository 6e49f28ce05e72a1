"""How a step's rows are cut into the query tiles of the Triton paged attention.

Contract: `TilePlan.build(meta, group)` turns one step's `AttentionMetadata` (host lists) into
the device tensors the kernel (models/triton_attention/paged_attention.py) reads: which
sequence and which of its new tokens each tile starts at, plus the sequences' new-token
offsets. `tile_layout(query_lens, group)` is that layout as host lists (the attention backend,
models/attention_backend.py, packs it into the step's one host-to-device copy, before the
forward). `TilePlan.for_decode(...)` is the plan of a decode-only batch of b rows: one tile per
row (row i: sequence i, its token 0), the same for every step of b rows, so it lives in
persistent tensors a CUDA graph can hold (models/decode_buffers.py). Every layer of a step
shares one plan.

A tile is `tokens_per_tile(group)` consecutive new tokens of ONE sequence, times the query
heads of one KV head (padded to a power of two): `TILE_ROWS` rows in all, whatever the step
holds. A sequence with n new tokens gets ceil(n / tokens_per_tile) tiles, in batch order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

TILE_ROWS = 64  # (token, query head) rows per program: one dot shape for decode and prefill
# Decode-only steps of at most SPLIT_MAX_ROWS rows may split each row's keys DECODE_SPLITS ways
# (split_decode.py; not under --batch-invariant): fewer rows leave the GPU idle in one pass.
DECODE_SPLITS = 16
SPLIT_MAX_ROWS = 8


def decode_splits(query_lens: Sequence[int], enabled: bool) -> int:
    """`TilePlan.decode_splits` of a step: DECODE_SPLITS for a decode-only step (every row one
    new token) of 1 .. SPLIT_MAX_ROWS rows when `enabled`, else 0 (the one-pass kernel)."""
    rows = len(query_lens)
    if enabled and 0 < rows <= SPLIT_MAX_ROWS and all(n == 1 for n in query_lens):
        return DECODE_SPLITS
    return 0


def group_pad(group: int) -> int:
    """Query heads per KV head, rounded up to a power of two (Triton tensor shapes)."""
    return 1 << max(group - 1, 0).bit_length()


def tokens_per_tile(group: int) -> int:
    return max(TILE_ROWS // group_pad(group), 1)


@dataclass(frozen=True)
class TilePlan:
    group: int
    block_size: int
    sliding_window: int | None
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int64 (the metadata's, not copied)
    seq_lens: torch.Tensor  # [num_seqs] int64
    query_start: torch.Tensor  # [num_seqs + 1] int64: first flat row of each sequence
    tile_seq: torch.Tensor  # [num_tiles] int32 or int64: the sequence of each tile
    tile_first: torch.Tensor  # [num_tiles] int32 or int64: its first row among the sequence's
    # new tokens
    decode_splits: int = 0  # > 0: a decode-only step through split_decode.py, split so many ways

    @property
    def num_tiles(self) -> int:
        return self.tile_seq.numel()

    @classmethod
    def build(cls, meta, group: int) -> TilePlan:
        """meta: an `AttentionMetadata` (models/attention.py), read through its host lists."""
        starts, tile_seq, tile_first = tile_layout(meta.query_lens, group)
        device = meta.block_tables.device
        return cls(
            group=group,
            block_size=meta.block_size,
            sliding_window=meta.sliding_window,
            block_tables=meta.block_tables,
            seq_lens=meta.seq_lens,
            query_start=torch.tensor(starts, dtype=torch.int64, device=device),
            tile_seq=torch.tensor(tile_seq, dtype=torch.int32, device=device),
            tile_first=torch.tensor(tile_first, dtype=torch.int32, device=device),
        )

    @classmethod
    def for_decode(
        cls,
        group: int,
        block_size: int,
        sliding_window: int | None,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        row_ids: torch.Tensor,
        zeros: torch.Tensor,
        split_decode: bool = False,
    ) -> TilePlan:
        """A decode-only batch of b = seq_lens.numel() rows. row_ids: [>= b + 1] int64
        0, 1, 2, ...; zeros: [>= b] int64 (persistent tensors; only views are taken);
        `split_decode`: split_decode.py may serve it (`decode_splits`)."""
        rows = seq_lens.shape[0]
        return cls(
            group=group,
            block_size=block_size,
            sliding_window=sliding_window,
            block_tables=block_tables,
            seq_lens=seq_lens,
            query_start=row_ids[: rows + 1],
            tile_seq=row_ids[:rows],
            tile_first=zeros[:rows],
            decode_splits=decode_splits([1] * rows, split_decode),
        )


def tile_layout(query_lens: Sequence[int], group: int) -> tuple[list[int], list[int], list[int]]:
    """Host lists of a step's plan: (query_start [S + 1], tile_seq [U], tile_first [U])."""
    per_tile = tokens_per_tile(group)
    starts, tile_seq, tile_first = [0], [], []
    for i, q_len in enumerate(query_lens):
        starts.append(starts[-1] + q_len)
        for first in range(0, q_len, per_tile):
            tile_seq.append(i)
            tile_first.append(first)
    return starts, tile_seq, tile_first
