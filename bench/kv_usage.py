"""KV cache figures of a tgserve run: bytes per token and allocation waste at peak usage.

Contract: `KvPeakTracker(engine, request_ids)` is told `observe()` after every engine step; it
keeps the step where the most KV blocks were in use (`Engine.stats()`) and, at that step, asks
the engine for the tracked requests' live sequences (`kv_slots`, through `Engine.get_request`):
a sequence holding `len(block_table)` blocks for `num_computed_tokens` cached tokens wastes
`len(block_table) * block_size - num_computed_tokens` slots. Paged allocation promises at most
one partial block per sequence (waste <= block_size - 1); `figures()` reports the total, the
worst sequence and whether the promise held. Bytes per token are measured on the cache tensors
as allocated (`Engine.describe()`: their bytes / token slots), next to what a cache repeating the
KV heads for every query head would take, so the GQA saving is visible.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KvCacheFigures:
    bytes_per_token: int  # measured: cache tensor bytes / token slots
    bytes_per_token_all_heads: int  # if K/V were repeated per query head (no GQA)
    block_size: int
    num_blocks: int
    peak_blocks_used: int
    peak_num_seqs: int  # live sequences at the peak
    peak_cached_tokens: int  # K/V slots holding a token at the peak
    peak_waste_slots: int  # allocated but unused slots at the peak, all sequences
    max_waste_slots_per_seq: int
    waste_within_one_block: bool  # every sequence wasted <= block_size - 1 slots


class KvPeakTracker:
    def __init__(self, engine: Any, request_ids: Iterable[str]) -> None:
        self._engine = engine
        self._ids = list(request_ids)
        self._peak_blocks = -1
        self._peak_seqs: list[tuple[int, int]] = []  # (allocated slots, cached tokens) per sequence

    def observe(self) -> None:
        used = self._engine.stats().kv_blocks_used
        if used <= self._peak_blocks:
            return
        self._peak_blocks = used
        self._peak_seqs = [slots for rid in self._ids for slots in kv_slots(self._engine, rid)]

    def figures(self) -> KvCacheFigures:
        engine = self._engine
        block_size = engine.config.block_size
        described = engine.describe()  # the cache as allocated: its element size, bytes per token
        waste = [allocated - cached for allocated, cached in self._peak_seqs]
        return KvCacheFigures(
            bytes_per_token=described.kv_bytes_per_token,
            bytes_per_token_all_heads=described.kv_bytes_per_token_all_heads,
            block_size=block_size,
            num_blocks=engine.info.kv_blocks_total,
            peak_blocks_used=max(self._peak_blocks, 0),
            peak_num_seqs=len(self._peak_seqs),
            peak_cached_tokens=sum(cached for _, cached in self._peak_seqs),
            peak_waste_slots=sum(waste),
            max_waste_slots_per_seq=max(waste, default=0),
            waste_within_one_block=all(0 <= w <= block_size - 1 for w in waste),
        )


def kv_slots(engine: Any, request_id: str) -> list[tuple[int, int]]:
    """KV cache slots of a request's live sequences: `(allocated, cached)` per sequence.

    `allocated` = `len(block_table) * block_size` (the slots its blocks hold), `cached` =
    `num_computed_tokens` (the slots holding a token). Only sequences that hold blocks are
    listed, in creation order; an unknown or finished request gives `[]`.
    """
    request = engine.get_request(request_id)
    if request is None or request.is_finished:
        return []
    block_size = engine.config.block_size
    return [
        (len(seq.block_table) * block_size, seq.num_computed_tokens)
        for seq in request.live_seqs
        if seq.block_table
    ]
