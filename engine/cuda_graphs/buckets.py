"""Batch-size buckets of the decode CUDA graphs, and a decode step's rows as host lists.

Contract (pure Python, no torch):
- `graph_buckets(max_num_seqs)`: the batch sizes a graph is captured for, ascending:
  1, 2, 4, 8, 16, 32, 64, ... doubling below `max_num_seqs`, then `max_num_seqs` itself, so
  every decode step of up to `max_num_seqs` rows has a bucket and at most half of a replay's
  rows are padding (1.5x beyond 8 is what vLLM uses; doubling keeps the number of graphs, hence
  capture time and memory, logarithmic).
- `bucket_for(num_rows, buckets)`: the smallest bucket holding `num_rows` rows; None when no
  bucket does (zero rows, or more rows than were captured: the step runs eagerly).
- `DecodeRows.from_chunks(chunks)`: a decode-only step's host lists (token, position, block
  table per row; decode columns read by index); models/decode_buffers.py pads them to the
  bucket and copies them in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.step_inputs import adapter_slots, request_slots


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
    block_tables: list[list[int]]  # [B][blocks of that row] (ragged)
    adapter_slots: list[int] | None = None  # [B] each row's LoRA slot (-1: base); None: all base

    @property
    def num_rows(self) -> int:
        return len(self.token_ids)

    @classmethod
    def from_chunks(cls, chunks: Sequence) -> DecodeRows:
        """From scheduled decode chunks (`.input_ids`, `.seq.block_table`, `.start`, and
        `.request.lora_slot` where there is one); a steady step's decode columns by index
        (their `decode_inputs`, engine/scheduling/decode_columns.py)."""
        if (columns := getattr(chunks, "decode_inputs", None)) is not None:
            ids, starts, requests = columns()
            slots = request_slots(requests)
            tables = [seq.block_table for seq in chunks.seqs]
            return cls(ids, list(starts), tables, list(slots) or None)
        slots = adapter_slots(chunks)
        return cls(
            [chunk.input_ids[0] for chunk in chunks],  # (a carried input resolved)
            [chunk.start for chunk in chunks],
            [chunk.seq.block_table for chunk in chunks],
            list(slots) or None,
        )
