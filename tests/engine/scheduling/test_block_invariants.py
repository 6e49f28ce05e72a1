"""engine/scheduling/block_invariants.py names each inconsistency it is written to find: a block
manager put in a known state (one sequence holding 3 blocks, 2 of them full and registered; a
finished one whose 2 full blocks are parked) is corrupted one way at a time, by hand, and the
check must raise with that inconsistency's message; the untouched state passes."""

from __future__ import annotations

import pytest

from engine.requests.request import TokenSequence
from engine.scheduling.block_manager import BlockManager

BS = 4


def _computed(bm: BlockManager, tokens: list[int], seq_id: int) -> TokenSequence:
    seq = TokenSequence(seq_id=seq_id, token_ids=tokens, num_prompt_tokens=len(tokens))
    bm.admit([seq], [bm.match_prefix(seq.token_ids)], [seq.num_tokens])
    seq.num_computed_tokens = seq.num_tokens
    bm.mark_computed(seq)
    return seq


def _state() -> tuple[BlockManager, TokenSequence]:
    bm = BlockManager(num_blocks=12, block_size=BS)
    live = _computed(bm, list(range(10)), 0)  # 3 blocks, blocks 0 and 1 full
    bm.free(_computed(bm, list(range(20, 29)), 1))  # its 2 full blocks parked, 1 block freed
    bm.check_invariants()
    assert bm._cache.num_parked == 2 and len(live.block_table) == 3
    return bm, live


def _free_block(bm: BlockManager) -> int:
    return next(iter(bm._free))


def _wrong_ref(bm: BlockManager, live: TokenSequence) -> None:
    bm._ref[live.block_table[0]] += 1


def _registered_free_block(bm: BlockManager, live: TokenSequence) -> None:
    # the live sequence's last (partial) block is not registered: register a free one instead
    block = _free_block(bm)
    bm._cache._by_block[block] = bm._cache.entry(live.block_table[0])


def _unregistered_parked_block(bm: BlockManager, live: TokenSequence) -> None:
    del bm._cache._by_block[bm._cache.parked_blocks()[0]]


def _wrong_tokens(bm: BlockManager, live: TokenSequence) -> None:
    live.token_ids[1] = 99  # block 0's cached tokens are no longer the sequence's own


def _lost_block(bm: BlockManager, live: TokenSequence) -> None:
    bm._free.remove(_free_block(bm))


@pytest.mark.parametrize(
    "corrupt,message",
    [
        (_wrong_ref, "ref count 2 but 1 table references"),
        (_registered_free_block, "truly free block is still registered"),
        (_unregistered_parked_block, "parked block is not registered"),
        (_wrong_tokens, "does not hold its tokens"),
        (_lost_block, "neither free, parked nor referenced"),
    ],
)
def test_each_inconsistency_is_named(corrupt, message) -> None:
    bm, live = _state()
    corrupt(bm, live)
    with pytest.raises(AssertionError, match=message):
        bm.check_invariants()
