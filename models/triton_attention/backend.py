"""The Triton attention backend (models/attention_backend.py's contract): a step's metadata with
its tile plan, the Triton K/V write and paged attention, and the persistent buffers whose
capture-time and replay-time builders serve captured decode steps (models/decode_buffers.py).

Contract: `TritonAttentionBackend(group, block_size, sliding_window, device, split_decode)`:
- `build(...)` (the base class's) adds the tile layout of the step's query rows
  (tile_plan.tile_layout) to the one host-to-device copy and builds the `TilePlan` over it;
  `split_decode`: decode-only steps of a few rows may split each row's keys across programs
  (tile_plan.decode_splits; off where batch invariance is promised), the same rule in eager
  and captured steps.
- `write_kv` / `forward`: kv_write.triton_write_kv and paged_attention.triton_paged_attention,
  K/V read in place through the block tables (their docstrings give the order they fix).
- `graph_support` is DECODE_ONLY: `decode_buffers(max_rows, max_blocks_per_seq, scratch_block)`
  hands out the persistent buffers, whose metadata names this backend.
Triton itself is imported when a kernel first runs, not with this module.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from models.attention import AttentionMetadata, KVCache
from models.attention_backend import AttentionBackend, GraphSupport
from models.decode_buffers import DecodeBuffers
from models.triton_attention.tile_plan import TilePlan, decode_splits, tile_layout


class TritonAttentionBackend(AttentionBackend):
    name = "Triton paged"
    graph_support = GraphSupport.DECODE_ONLY

    def __init__(
        self,
        group: int,
        block_size: int,
        sliding_window: int | None,
        device: torch.device,
        split_decode: bool = False,
    ) -> None:
        super().__init__(group, block_size, sliding_window, device)
        self.split_decode = split_decode

    def _plan_parts(self, query_lens: Sequence[int]) -> list[list[int]]:
        return list(tile_layout(query_lens, self.group))

    def _plan(
        self, meta: AttentionMetadata, parts: Sequence[torch.Tensor], query_lens: Sequence[int]
    ) -> AttentionMetadata:
        plan = TilePlan(
            self.group,
            self.block_size,
            self.sliding_window,
            meta.block_tables,
            meta.seq_lens,
            query_start=parts[0],
            tile_seq=parts[1],
            tile_first=parts[2],
            decode_splits=decode_splits(query_lens, self.split_decode),
        )
        return meta.use_tile_plan(plan)

    def write_kv(self, cache: KVCache, k: torch.Tensor, v: torch.Tensor, meta) -> None:
        from models.triton_attention.kv_write import triton_write_kv

        triton_write_kv(cache[0], cache[1], k, v, meta.slot_mapping)

    def forward(self, q: torch.Tensor, cache: KVCache, meta, scale: float) -> torch.Tensor:
        from models.triton_attention.paged_attention import triton_paged_attention

        k_cache, v_cache = cache
        group = q.shape[1] // k_cache.shape[2]
        return triton_paged_attention(q, k_cache, v_cache, meta.tile_plan(group), scale)

    def decode_buffers(
        self, max_rows: int, max_blocks_per_seq: int, scratch_block: int
    ) -> DecodeBuffers:
        return DecodeBuffers(
            max_rows,
            max_blocks_per_seq,
            self.block_size,
            scratch_block,
            self.group,
            self.sliding_window,
            self.device,
            self.split_decode,
            backend=self,
        )
