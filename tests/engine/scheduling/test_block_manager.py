"""BlockManager: allocation, ref counts, fork + copy-on-write, prefix caching and LRU eviction.

The oracle is a fake KV store: writing token t at position p of a sequence puts (t, p) in the
slot its block table names; a sequence "reads" its whole context back through its table. Any
wrong table, missing copy or wrongly shared block makes a read differ from the sequence's own
tokens.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.requests.request import TokenSequence
from engine.scheduling.block_manager import BlockManager

BS = 4


class FakeKV:
    def __init__(self, num_blocks: int) -> None:
        self.slots: list[list[tuple[int, int] | None]] = [[None] * BS for _ in range(num_blocks)]

    def copy(self, copies: list[tuple[int, int]]) -> None:
        for src, dst in copies:
            self.slots[dst] = list(self.slots[src])

    def write(self, seq: TokenSequence, start: int, end: int) -> None:
        for p in range(start, end):
            self.slots[seq.block_table[p // BS]][p % BS] = (seq.token_ids[p], p)

    def read(self, seq: TokenSequence, length: int) -> list[int]:
        out = []
        for p in range(length):
            slot = self.slots[seq.block_table[p // BS]][p % BS]
            assert slot is not None and slot[1] == p, f"position {p} holds {slot}"
            out.append(slot[0])
        return out


def new_seq(tokens: list[int], seq_id: int = 0) -> TokenSequence:
    return TokenSequence(seq_id=seq_id, token_ids=list(tokens), num_prompt_tokens=len(tokens))


def admit_and_compute(bm: BlockManager, kv: FakeKV, seq: TokenSequence) -> int:
    """Admits with a prefix lookup, computes everything, registers; returns tokens computed."""
    match = bm.match_prefix(seq.token_ids)
    bm.admit([seq], [match], [seq.num_tokens])
    seq.num_computed_tokens = match.num_tokens
    kv.write(seq, match.num_tokens, seq.num_tokens)
    seq.num_computed_tokens = seq.num_tokens
    bm.mark_computed(seq)
    bm.check_invariants()
    return seq.num_tokens - match.num_tokens


def step(bm: BlockManager, kv: FakeKV, seqs: list[TokenSequence], new_tokens: list[int]) -> None:
    """One decode step of a group: each seq gets a token, blocks are appended, K/V written."""
    for seq, tok in zip(seqs, new_tokens, strict=True):
        seq.token_ids.append(tok)
    chunks = [(s, 1) for s in seqs]
    predicted = bm.blocks_to_append(chunks)
    free_before = bm.num_free_blocks
    copies = [c for s in seqs for c in bm.append(s, 1)]
    assert free_before - bm.num_free_blocks == predicted
    kv.copy(copies)
    for seq in seqs:
        kv.write(seq, seq.num_computed_tokens, seq.num_tokens)
        seq.num_computed_tokens = seq.num_tokens
        bm.mark_computed(seq)
    bm.check_invariants()


def test_allocate_and_free_return_every_block():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    seq = new_seq(list(range(10)))  # 10 tokens -> 3 blocks
    bm.admit([seq], [bm.match_prefix(seq.token_ids)], [10])
    assert len(seq.block_table) == 3 and len(set(seq.block_table)) == 3
    assert (bm.num_free_blocks, bm.num_used_blocks) == (5, 3)
    bm.check_invariants()
    bm.free(seq)
    assert seq.block_table == [] and bm.num_free_blocks == 8
    bm.check_invariants()


def test_append_takes_a_block_only_when_crossing_a_block_boundary():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    kv = FakeKV(8)
    seq = new_seq([1, 2, 3])
    admit_and_compute(bm, kv, seq)
    step(bm, kv, [seq], [4])  # 4 tokens: still one block
    assert len(seq.block_table) == 1
    step(bm, kv, [seq], [5])  # 5th token: second block
    assert len(seq.block_table) == 2 and bm.num_used_blocks == 2
    assert kv.read(seq, 5) == [1, 2, 3, 4, 5]


def test_fork_shares_blocks_and_copy_on_write_isolates_the_writer():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    kv = FakeKV(8)
    parent = new_seq([10, 11, 12, 13, 14, 15])  # blocks: [10..13] full, [14, 15] partial
    admit_and_compute(bm, kv, parent)
    child = parent.clone(seq_id=1)
    bm.fork(parent, child)
    assert child.block_table == parent.block_table
    assert [bm.ref_count(b) for b in parent.block_table] == [2, 2]
    assert bm.num_used_blocks == 2  # no block taken by the fork
    bm.check_invariants()

    child.token_ids.append(99)
    assert bm.blocks_to_append([(child, 1)]) == 1
    copies = bm.append(child, 1)
    assert copies == [(parent.block_table[1], child.block_table[1])]
    assert child.block_table[0] == parent.block_table[0]  # the full block stays shared
    kv.copy(copies)
    kv.write(child, 6, 7)
    child.num_computed_tokens = 7

    parent.token_ids.append(42)
    assert bm.append(parent, 1) == []  # now the only owner: writes in place
    kv.write(parent, 6, 7)
    parent.num_computed_tokens = 7
    bm.check_invariants()
    assert kv.read(child, 7) == [10, 11, 12, 13, 14, 15, 99]
    assert kv.read(parent, 7) == [10, 11, 12, 13, 14, 15, 42]


def test_group_block_count_is_exact_when_all_sharers_write():
    bm = BlockManager(num_blocks=16, block_size=BS, enable_prefix_caching=False)
    kv = FakeKV(16)
    root = new_seq([1, 2, 3, 4, 5])
    admit_and_compute(bm, kv, root)
    beams = [root] + [root.clone(i) for i in range(1, 4)]
    for b in beams[1:]:
        bm.fork(root, b)
    step(bm, kv, beams, [6, 7, 8, 9])  # 4 sharers of the partial block: 3 copies, 1 in place
    assert bm.num_used_blocks == 1 + 4
    for b, tok in zip(beams, [6, 7, 8, 9], strict=True):
        assert kv.read(b, 6) == [1, 2, 3, 4, 5, tok]
    for b in beams:
        bm.free(b)
    assert bm.num_free_blocks == 16
    bm.check_invariants()


def test_freeing_a_shared_block_keeps_it_until_the_last_owner_lets_go():
    bm = BlockManager(num_blocks=4, block_size=BS, enable_prefix_caching=False)
    kv = FakeKV(4)
    parent = new_seq([1, 2, 3, 4, 5])
    admit_and_compute(bm, kv, parent)
    child = parent.clone(1)
    bm.fork(parent, child)
    bm.free(parent)
    assert bm.num_used_blocks == 2 and [bm.ref_count(b) for b in child.block_table] == [1, 1]
    assert kv.read(child, 5) == [1, 2, 3, 4, 5]
    bm.free(child)
    assert bm.num_free_blocks == 4
    bm.check_invariants()


def test_prefix_hit_reuses_full_blocks_and_leaves_one_token_to_compute():
    bm = BlockManager(num_blocks=16, block_size=BS)
    kv = FakeKV(16)
    first = new_seq(list(range(100, 110)))  # 2 full blocks + 2 tokens
    admit_and_compute(bm, kv, first)
    bm.free(first)
    assert bm.num_free_blocks == 16 and bm.usage().num_cached == 2

    second = new_seq(list(range(100, 108)) + [7, 7, 7])
    assert admit_and_compute(bm, kv, second) == 3  # 8 tokens from the cache
    assert kv.read(second, 11) == second.token_ids
    # A prompt that is exactly the cached blocks still computes its last token (for logits).
    exact = new_seq(list(range(100, 108)), seq_id=5)
    assert bm.match_prefix(exact.token_ids).num_tokens == BS
    u = bm.usage()
    assert (u.prefix_cache_queries, u.prefix_cache_hits) == (10 + 11, 0 + 8)  # in tokens


def test_prefix_cache_is_off_when_disabled():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    kv = FakeKV(8)
    admit_and_compute(bm, kv, new_seq(list(range(9))))
    assert bm.match_prefix(list(range(9))).num_tokens == 0


def test_hash_collisions_never_give_a_wrong_hit():
    bm = BlockManager(num_blocks=16, block_size=BS, hash_fn=lambda parent, tokens: 0)
    kv = FakeKV(16)
    cached = new_seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    admit_and_compute(bm, kv, cached)
    other = new_seq([9, 9, 9, 9, 5, 6, 7, 8, 9], seq_id=1)  # same hash, other tokens
    assert bm.match_prefix(other.token_ids).num_tokens == 0
    same = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert bm.match_prefix(same).num_tokens == BS  # block 0 confirmed; block 1 never registered
    assert admit_and_compute(bm, kv, other) == 9
    assert kv.read(other, 9) == other.token_ids


def test_a_hit_needs_the_same_parent_not_just_the_same_block_tokens():
    # The hash ignores the parent, so only the parent check tells the two chains apart.
    bm = BlockManager(num_blocks=16, block_size=BS, hash_fn=lambda parent, tokens: hash(tokens))
    kv = FakeKV(16)
    admit_and_compute(bm, kv, new_seq([5, 5, 5, 5, 0]))  # registers block A2 = [5,5,5,5]
    admit_and_compute(bm, kv, new_seq([1, 1, 1, 1, 2, 2, 2, 2, 0], 1))  # A, then B after A
    query = [5, 5, 5, 5, 2, 2, 2, 2, 0]  # A2 then B's tokens: B's K/V were computed after A
    assert bm.match_prefix(query).num_tokens == BS


def test_eviction_takes_the_least_recently_freed_blocks_first():
    bm = BlockManager(num_blocks=6, block_size=BS)
    kv = FakeKV(6)
    old, new = new_seq([1] * 9), new_seq([2] * 9, 1)  # 2 full blocks + 1 partial each
    for s in (old, new):
        admit_and_compute(bm, kv, s)
    bm.free(old)
    bm.free(new)
    assert bm.usage().num_cached == 4 and bm.num_free_blocks == 6
    filler = new_seq([3] * 7, 2)  # needs 2 blocks: the 2 truly free ones
    admit_and_compute(bm, kv, filler)
    assert bm.match_prefix([1] * 9).num_tokens == 8
    more = new_seq([4] * 3, 3)  # 1 block: evicts old's tail block (freed tail first)
    admit_and_compute(bm, kv, more)
    assert bm.match_prefix([1] * 9).num_tokens == 4
    assert bm.match_prefix([2] * 9).num_tokens == 8  # the recently freed chain survives
    bm.check_invariants()


def test_identical_blocks_computed_twice_are_deduplicated():
    bm = BlockManager(num_blocks=8, block_size=BS)
    kv = FakeKV(8)
    a, b = new_seq([7] * 9), new_seq([7] * 9, 1)
    for s in (a, b):  # both admitted before either is computed: no hit for b
        bm.admit([s], [bm.match_prefix(s.token_ids)], [9])
    assert bm.num_used_blocks == 6
    for s in (a, b):
        kv.write(s, 0, 9)
        s.num_computed_tokens = 9
        bm.mark_computed(s)
    assert b.block_table[:2] == a.block_table[:2] and bm.num_used_blocks == 4
    assert kv.read(b, 9) == [7] * 9
    bm.check_invariants()


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_forks_writes_and_frees_keep_contents_and_counts_right(data):
    num_blocks = 24
    bm = BlockManager(num_blocks=num_blocks, block_size=BS)
    kv = FakeKV(num_blocks)
    live: list[TokenSequence] = []
    for next_id in range(data.draw(st.integers(5, 40))):
        op = data.draw(st.sampled_from(["admit", "grow", "fork", "free"]))
        if op == "admit":
            tokens = data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=12))
            seq = new_seq(tokens, next_id)
            match = bm.match_prefix(tokens)
            if bm.blocks_to_admit([match], [len(tokens)]) <= bm.num_free_blocks:
                admit_and_compute(bm, kv, seq)
                live.append(seq)
        elif live and op == "grow":
            seq = data.draw(st.sampled_from(live))
            n = data.draw(st.integers(1, 6))
            if bm.blocks_to_append([(seq, n)]) <= bm.num_free_blocks:
                seq.token_ids.extend(data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))
                kv.copy(bm.append(seq, n))
                kv.write(seq, seq.num_computed_tokens, seq.num_tokens)
                seq.num_computed_tokens = seq.num_tokens
                bm.mark_computed(seq)
        elif live and op == "fork":
            parent = data.draw(st.sampled_from(live))
            child = parent.clone(next_id)
            bm.fork(parent, child)
            live.append(child)
        elif live and op == "free":
            seq = data.draw(st.sampled_from(live))
            bm.free(seq)
            live.remove(seq)
        bm.check_invariants()
        for seq in live:
            assert kv.read(seq, seq.num_tokens) == seq.token_ids
    for seq in live:
        bm.free(seq)
    assert bm.num_free_blocks == num_blocks
    bm.check_invariants()


def test_allocation_beyond_the_pool_is_refused_before_any_change():
    bm = BlockManager(num_blocks=2, block_size=BS)
    seq = new_seq(list(range(12)))
    match = bm.match_prefix(seq.token_ids)
    assert bm.blocks_to_admit([match], [12]) == 3
    with pytest.raises(RuntimeError, match="enough free blocks"):
        bm.admit([seq], [match], [12])
    assert bm.num_free_blocks == 2 and seq.block_table == []
    bm.check_invariants()
