"""How a step's rows are cut into the query tiles of the Triton paged attention.

Contract: `TilePlan.build(meta, group)` turns one step's `AttentionMetadata` (host lists) into
the device tensors the kernel (models/triton_attention/paged_attention.py) reads: which
sequence and which of its new tokens each tile starts at, plus the sequences' new-token
offsets. It is built by the first layer of a step and reused by every other one.

A tile is `tokens_per_tile(group)` consecutive new tokens of ONE sequence, times the query
heads of one KV head (padded to a power of two): `TILE_ROWS` rows in all, whatever the step
holds. A sequence with n new tokens gets ceil(n / tokens_per_tile) tiles, in batch order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TILE_ROWS = 64  # (token, query head) rows per program: one dot shape for decode and prefill


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
    tile_seq: torch.Tensor  # [num_tiles] int32: the sequence of each tile
    tile_first: torch.Tensor  # [num_tiles] int32: its first row among the sequence's new tokens

    @property
    def num_tiles(self) -> int:
        return self.tile_seq.numel()

    @classmethod
    def build(cls, meta, group: int) -> TilePlan:
        """meta: an `AttentionMetadata` (models/attention.py), read through its host lists."""
        per_tile = tokens_per_tile(group)
        device = meta.block_tables.device
        starts, tile_seq, tile_first = [0], [], []
        for i, q_len in enumerate(meta.query_lens):
            starts.append(starts[-1] + q_len)
            for first in range(0, q_len, per_tile):
                tile_seq.append(i)
                tile_first.append(first)
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
