"""Batch-size buckets of the decode CUDA graphs, and the padding of a step up to its bucket.

Contract (pure Python, no torch):
- `graph_buckets(max_num_seqs)`: the batch sizes a graph is captured for, ascending:
  1, 2, 4, 8, 16, 32, 64, ... doubling below `max_num_seqs`, then `max_num_seqs` itself, so
  every decode step of up to `max_num_seqs` rows has a bucket and at most half of a replay's
  rows are padding (1.5x beyond 8 is what vLLM uses; doubling keeps the number of graphs, hence
  capture time and memory, logarithmic).
- `bucket_for(num_rows, buckets)`: the smallest bucket holding `num_rows` rows; None when no
  bucket does (zero rows, or more rows than were captured: the step runs eagerly).
- `pad_decode_rows(rows, bucket, scratch_block, block_size)`: the step's host lists padded to
  `bucket` rows. A padding row reads token 0 at position 0, writes its K/V into slot 0 of the
  scratch block (a KV block the block manager never hands out), and attends to that one slot
  (seq_len 1) through a block table naming only the scratch block: it never writes into, nor
  reads from, a live block, and every op of the forward is row-wise or reads only its own
  row's context, so the real rows come out as they would without the padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def graph_buckets(max_num_seqs: int) -> tuple[int, ...]:
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    buckets = []
    size = 1
    while size < max_num_seqs:
        buckets.append(size)
        size *= 2
    buckets.append(max_num_seqs)
    return tuple(buckets)


def bucket_for(num_rows: int, buckets: Sequence[int]) -> int | None:
    if num_rows < 1:
        return None
    for size in buckets:  # ascending, a handful of entries
        if size >= num_rows:
            return size
    return None


@dataclass(frozen=True)
class DecodeRows:
    """Host lists of a decode-only step, one entry per row (one new token per sequence)."""

    token_ids: list[int]  # [B] the token each row feeds in
    positions: list[int]  # [B] its position (= seq_len - 1)
    slots: list[int]  # [B] flat KV-cache slot its K/V go to
    block_tables: list[list[int]]  # [B][blocks of that row] (ragged: padded when copied)
    seq_lens: list[int]  # [B] context length including the new token

    @property
    def num_rows(self) -> int:
        return len(self.token_ids)

    @classmethod
    def from_chunks(cls, chunks: Sequence, block_size: int) -> DecodeRows:
        """From scheduled decode chunks (`.seq.token_ids`, `.seq.block_table`, `.start`)."""
        ids, positions, slots, tables, lens = [], [], [], [], []
        for chunk in chunks:
            pos, table = chunk.start, chunk.seq.block_table
            ids.append(chunk.seq.token_ids[pos])
            positions.append(pos)
            slots.append(table[pos // block_size] * block_size + pos % block_size)
            tables.append(list(table))
            lens.append(pos + 1)
        return cls(ids, positions, slots, tables, lens)


def pad_decode_rows(
    rows: DecodeRows, bucket: int, scratch_block: int, block_size: int
) -> DecodeRows:
    """`rows` followed by `bucket - rows.num_rows` padding rows (see the module doc)."""
    pad = bucket - rows.num_rows
    if pad < 0:
        raise ValueError(f"{rows.num_rows} rows do not fit a bucket of {bucket}")
    return DecodeRows(
        token_ids=rows.token_ids + [0] * pad,
        positions=rows.positions + [0] * pad,
        slots=rows.slots + [scratch_block * block_size] * pad,
        block_tables=rows.block_tables + [[scratch_block]] * pad,
        seq_lens=rows.seq_lens + [1] * pad,
    )
