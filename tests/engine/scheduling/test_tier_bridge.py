"""The block manager and scheduler with K/V tiers behind the pool, on the scheduler driver's fake
KV (scheduler_driver.py: a block's slots hold (token, position), every read checks them).

A fake tier store keeps what the bridge saves (a copy of the evicted block's slots) and writes
it back where a hit is loaded, so a wrong key, a load into the wrong block, a save after the
block was reused or a hit counted for blocks that were not filled makes a read fail; the oracle
of every output is `solo` (no scheduler, no cache). Also: the eviction order the tiers see, and
a request held back while its prefix is read from "disk".
"""

from __future__ import annotations

import random
from collections import OrderedDict

from engine.kv_tiers.keys import chained_block_hash
from engine.kv_tiers.moves import TierMoves
from engine.requests.request import TokenSequence
from engine.scheduling.block_manager import BlockManager
from tests.engine.scheduling.scheduler_driver import Driver, expected, prompt


class Pending:
    def __init__(self) -> None:
        self.finished = False

    def done(self) -> bool:
        return self.finished


class FakeTiers:
    hash_fn = staticmethod(chained_block_hash)

    def __init__(self, ram_blocks: int) -> None:
        self.ram: OrderedDict[int, tuple[tuple[int, ...], list]] = OrderedDict()
        self.disk: dict[int, tuple[tuple[int, ...], list]] = {}
        self.ram_blocks = ram_blocks
        self.hits = 0
        self.saved: list[tuple[int, ...]] = []  # tokens of each saved block, in order
        self.reads: list[tuple[Pending, list]] = []

    def lookup(self, key, tokens):
        entry = self.ram.get(key)
        return entry if entry is not None and entry[0] == tokens else None

    def count_hit(self, block) -> None:
        self.hits += 1

    def prefetch(self, chain):
        todo = []  # as the store: the run of blocks on disk, up to the first one nowhere
        for key, tokens in chain:
            if key not in self.ram and key not in self.disk:
                break
            if key not in self.ram:
                todo.append((key, tokens))
        if not todo:
            return None
        self.reads.append((Pending(), todo))
        return self.reads[-1][0]

    def finish_reads(self) -> None:
        for pending, todo in self.reads:
            for key, _ in todo:
                self._put(key, self.disk[key])
            pending.finished = True

    def transfer(self, slots, moves: TierMoves) -> None:
        for block_id, key, tokens in moves.saves:  # before any load: the block may be reused
            self.saved.append(tokens)
            self.disk[key] = (tokens, list(slots[block_id]))
            self._put(key, self.disk[key])
        for block_id, (_, content) in moves.loads:
            slots[block_id] = list(content)

    def _put(self, key, entry) -> None:
        self.ram[key] = entry
        self.ram.move_to_end(key)
        while len(self.ram) > self.ram_blocks:
            self.ram.popitem(last=False)


def test_outputs_equal_solo_with_prefixes_served_from_the_tiers() -> None:
    rng = random.Random(5)
    shared = [prompt(rng, 9) for _ in range(6)]
    tiers = FakeTiers(ram_blocks=40)
    d = Driver(num_blocks=14, tiers=tiers, max_num_seqs=4, max_num_batched_tokens=32)
    requests = []
    for i in range(24):  # re-sent conversations: a shared head plus a varying tail
        body = shared[i % 6] + prompt(rng, rng.randrange(1, 8))
        requests.append(d.add(str(i), body, max_tokens=rng.randrange(1, 5)))
        if i % 4 == 3:
            d.run()
    d.run()
    for r in requests:
        assert list(r.seqs[0].output_token_ids) == expected(r, 0)
    assert tiers.hits > 0 and tiers.saved
    d.assert_no_leaks()


def test_evicted_blocks_reach_the_tiers_least_recently_parked_first() -> None:
    tiers = FakeTiers(ram_blocks=10)
    bm = BlockManager(5, 2, True, chained_block_hash, tiers)
    a, b = TokenSequence(0, [1, 2, 3, 4, 5], 5), TokenSequence(1, [6, 7, 8], 3)
    for seq in (a, b):
        match = bm.match_prefix(seq.token_ids)
        bm.admit([seq], [match], [seq.num_tokens])
        seq.num_computed_tokens = seq.num_tokens
        bm.mark_computed(seq)
    bm.free(b)  # parks (6, 7) first, then a's (1, 2), (3, 4)
    bm.free(a)
    c = TokenSequence(2, [9] * 9, 9)
    bm.admit([c], [bm.match_prefix(c.token_ids)], [9])  # 5 blocks: every parked one goes
    saves = bm.tiers.take_moves().saves
    assert [tokens for _, _, tokens in saves] == [(6, 7), (3, 4), (1, 2)]
    assert bm.tiers.take_moves() == TierMoves()  # handed over once
    bm.check_invariants()


def test_a_request_waits_for_its_disk_read_then_starts_from_the_tier() -> None:
    rng = random.Random(7)
    body = prompt(rng, 21)  # 5 full blocks before the last token
    tiers = FakeTiers(ram_blocks=40)
    first = Driver(num_blocks=12, tiers=tiers)
    first.add("a", body, max_tokens=2)
    first.run()
    first.add("filler", prompt(rng, 45), max_tokens=1)  # the whole pool: "a" goes to the tiers
    first.run()
    tiers.ram.clear()  # a restart: only the "disk" is left
    again = Driver(num_blocks=12, tiers=tiers)
    again.slots = [[None] * 4 for _ in range(12)]
    request = again.add("a", body, max_tokens=2)
    assert not again.step().chunks  # held back: its prefix is being read
    assert not again.step().chunks
    tiers.finish_reads()
    out = again.step()
    assert out.chunks[0].start == 20  # 5 blocks loaded, not prefilled
    again.run()
    assert list(request.seqs[0].output_token_ids) == expected(request, 0)
    again.assert_no_leaks()
