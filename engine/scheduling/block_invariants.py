"""The block manager's invariants, re-derived from the sequences' tables (tests call them).

Contract: `check_block_invariants` raises AssertionError naming the first inconsistency: a ref
count that differs from the tables' references, a block both free and referenced or parked, a
block in no state, a free block still registered, a parked one not registered, a table that
holds a block twice, does not cover its computed tokens, or holds a cached block whose tokens
are not its own.

The scheduler tests call it after every step (thousands of steps over thousands of blocks), so
the whole-pool checks run as list and set operations (the per-block loop that names a wrong
ref count runs only once the lists differ).
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any

from engine.scheduling.prefix_cache import PrefixCache


def check_block_invariants(
    bm: Any, ref: list[int], free_list: deque[int], cache: PrefixCache, seqs: dict[Any, Any]
) -> None:
    counts = Counter(b for seq in seqs for b in seq.block_table)
    if list(ref) != _dense(counts, bm.num_blocks):  # one comparison; the loop names the block
        for b in range(bm.num_blocks):
            if ref[b] != counts[b]:
                raise AssertionError(
                    f"block {b}: ref count {ref[b]} but {counts[b]} table references"
                )
    free, parked = set(free_list), set(cache.parked_blocks())
    if len(free) != len(free_list):
        raise AssertionError("a block is on the free list twice")
    if free & parked or (free | parked) & set(counts):
        raise AssertionError("a block is both free and referenced (or free and parked)")
    if len(free) + len(parked) + len(counts) != bm.num_blocks:
        raise AssertionError("some block is neither free, parked nor referenced")
    registered = cache.registered_blocks()  # set operations, not a lookup per block
    if not free.isdisjoint(registered):
        raise AssertionError("a truly free block is still registered in the prefix cache")
    if not registered >= parked:
        raise AssertionError("a parked block is not registered in the prefix cache")
    for seq, state in seqs.items():
        table = seq.block_table
        if len(set(table)) != len(table):
            raise AssertionError(f"sequence {seq.seq_id} holds a block twice")
        if len(table) < bm.blocks_for(seq.num_computed_tokens):
            raise AssertionError(f"sequence {seq.seq_id}: table does not cover computed tokens")
        full = seq.num_computed_tokens // bm.block_size
        for idx, b in enumerate(table):
            entry = cache.entry(b)
            if entry is not None and (
                idx >= full
                or entry.tokens
                != tuple(seq.token_ids[idx * bm.block_size : (idx + 1) * bm.block_size])
            ):
                raise AssertionError(
                    f"sequence {seq.seq_id}: cached block {b} at {idx} does not hold its tokens"
                )
        if any(cache.entry(b) is None for b in table[: state.num_registered]):
            raise AssertionError(f"sequence {seq.seq_id}: a registered block lost its entry")


def _dense(counts: Counter, num_blocks: int) -> list[int]:
    """counts[b] for b in range(num_blocks), as a list (ids outside the pool are not looked at,
    as the per-block loop does not look at them)."""
    dense = [0] * num_blocks
    for b, n in counts.items():
        if 0 <= b < num_blocks:
            dense[b] = n
    return dense
