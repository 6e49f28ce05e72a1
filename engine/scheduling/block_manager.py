"""BlockManager: which KV blocks each sequence owns, with ref counts, copy-on-write and prefix caching.

Contract (pure Python, no torch):
- Block ids are 0..num_blocks-1. Every block is exactly one of: referenced (ref count > 0, in
  one or more `TokenSequence.block_table`s), parked (ref 0 but registered in the prefix cache, so a
  later request may reuse it), or truly free. `num_free_blocks` counts free + parked: parked
  blocks are evicted, least recently parked first, when the free list runs dry.
- A sequence's table covers the tokens it has computed plus those scheduled this step: token t
  lives in block `block_table[t // block_size]` at offset `t % block_size`.
- `admit` gives a waiting sequence its table (prefix-cache hit + fresh blocks), `append` grows a
  running one's table for this step's chunk, `fork` shares a table (ref + 1 per block), `free`
  drops one (ref - 1; with `keep`, only past its first blocks: rejected speculative tokens').
  Before a sequence writes into a block that others share, `append` gives it a fresh block and
  returns the (src, dst) copy the runner must apply before the forward. `blocks_to_admit` /
  `blocks_to_append` count exactly what those calls will take (copies included): checked first.
- Prefix caching: `mark_computed(seq)` registers the sequence's full, computed blocks
  (hash of parent hash + block tokens; see prefix_cache.py). If an equal block is already
  registered the sequence switches to it and its own copy is released (dedup). `match_prefix`
  returns the longest confirmed chain of cached blocks for a token list, leaving at least one token
  uncomputed so the model still produces logits.
- K/V tiers (`tiers`: tier_bridge.py): evicted (or, `spill_cached_blocks`, all parked) registered
  blocks are copied out to them, and a hit continues past the pool into them (`PrefixMatch.
  tier_blocks`: fresh blocks filled before the forward); `prefetch` starts disk reads.
- Usage figures: `usage()`; prefix-cache queries and hits are counted in TOKENS, once per
  admission (queried = the sequence's tokens, hits = tokens served from the cache).
- `check_invariants()` re-derives every ref count from the tables; tests call it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from engine.requests.request import TokenSequence
from engine.scheduling.block_invariants import check_block_invariants
from engine.scheduling.prefix_cache import HashFn, PrefixCache, block_hash, full_blocks, root_hash
from engine.scheduling.tier_bridge import TierBridge, TierIndex


@dataclass(frozen=True)
class PrefixMatch:
    block_ids: tuple[int, ...]  # cached blocks holding the first len(block_ids) full blocks
    num_tokens: int  # tokens they and tier_blocks hold (a multiple of block_size)
    num_queried_tokens: int  # tokens of the sequence that was looked up
    tier_blocks: tuple[Any, ...] = ()  # the next blocks, held by a K/V tier (RAM)
    root: str | None = None  # the LoRA adapter key looked up under (None: the base model)


@dataclass(frozen=True)
class BlockUsage:
    num_blocks: int
    num_free: int  # truly free + parked (evictable) cached blocks
    num_used: int  # referenced by at least one sequence
    num_cached: int  # parked: free for use, still reusable by a prefix hit
    prefix_cache_queries: int  # tokens looked up at admission
    prefix_cache_hits: int  # of those, tokens served from the cache


@dataclass
class _SeqState:
    num_registered: int = 0  # leading blocks of the table known to the prefix cache
    broken: bool = False  # a hash collision stopped registration for this sequence
    root: str | None = None  # the LoRA adapter key its K/V was computed under (None: base)


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        hash_fn: HashFn = block_hash,
        tiers: TierIndex | None = None,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"num_blocks ({num_blocks}) and block_size ({block_size}) must be >= 1"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = self._ref = [0] * num_blocks  # read-only outside: step_builder.py
        self._free: deque[int] = deque(range(num_blocks))
        self._cache = PrefixCache(hash_fn)
        on = tiers is not None and enable_prefix_caching
        self.tiers = TierBridge(tiers, hash_fn) if on else None
        self._seqs: dict[TokenSequence, _SeqState] = {}
        self._queries = 0
        self._hits = 0

    # ----- figures -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + self._cache.num_parked

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def usage(self) -> BlockUsage:
        return BlockUsage(
            num_blocks=self.num_blocks,
            num_free=self.num_free_blocks,
            num_used=self.num_used_blocks,
            num_cached=self._cache.num_parked,
            prefix_cache_queries=self._queries,
            prefix_cache_hits=self._hits,
        )

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    # ----- admission -----------------------------------------------------------------------
    def match_prefix(self, token_ids: list[int], root: str | None = None) -> PrefixMatch:
        """Longest chain of cached blocks equal to the start of `token_ids`; no side effects."""
        found: list[int] = []
        parent, tier, bs = None, (), self.block_size
        n = (len(token_ids) - 1) // bs if self.enable_prefix_caching else 0  # >= 1 token left
        blocks = (tuple(token_ids[i * bs : (i + 1) * bs]) for i in range(n))  # lazily: a
        for tokens in blocks:  # waiting queue is matched every step, most of it missing
            if (entry := self._cache.lookup(parent, tokens, root)) is None:
                break
            found.append(entry.block_id)
            parent = entry
        if self.tiers is not None:  # the chain goes on in the tiers (from the adapter's root)
            rest = (tuple(token_ids[i * bs : (i + 1) * bs]) for i in range(len(found), n))
            tier = self.tiers.extend(parent.hash if parent else root_hash(root), rest)
        num = (len(found) + len(tier)) * self.block_size
        return PrefixMatch(tuple(found), num, len(token_ids), tier, root)

    def prefetch(self, seq: TokenSequence, root: str | None = None) -> None:
        """A new sequence (of adapter key `root`): starts reading its prefix's disk-tier blocks."""
        if self.tiers is not None:
            match = self.match_prefix(seq.token_ids, root)
            last = self._cache.entry(match.block_ids[-1]) if match.block_ids else None
            rest = full_blocks(seq.token_ids, self.block_size)[len(match.block_ids) :]
            self.tiers.prefetch(seq, last.hash if last else root_hash(root), rest)

    def spill_cached_blocks(self) -> None:
        """Every parked block goes to the tiers too, staying parked (an engine's close)."""
        for b in self._cache.parked_blocks() if self.tiers is not None else ():
            self.tiers.evicted(self._cache.entry(b))

    def blocks_to_admit(self, matches: list[PrefixMatch], num_tokens: list[int]) -> int:
        """Free-pool blocks `admit` takes: parked hits leave the pool, plus fresh blocks."""
        parked = {b for m in matches for b in m.block_ids if self._ref[b] == 0}
        fresh = sum(
            max(0, self.blocks_for(n) - len(m.block_ids))
            for m, n in zip(matches, num_tokens, strict=True)
        )
        return len(parked) + fresh

    def admit(
        self, seqs: list[TokenSequence], matches: list[PrefixMatch], num_tokens: list[int]
    ) -> None:
        """Gives each waiting sequence its matched blocks plus fresh ones covering `num_tokens`.
        All hits are pinned before any fresh block is taken, so none is evicted under us. The
        caller sets `num_computed_tokens = match.num_tokens`."""
        if self.blocks_to_admit(matches, num_tokens) > self.num_free_blocks:
            raise RuntimeError("admit without enough free blocks; check blocks_to_admit first")
        for seq, match in zip(seqs, matches, strict=True):
            if seq in self._seqs or seq.block_table:
                raise RuntimeError(f"sequence {seq.seq_id} already holds blocks")
            for b in match.block_ids:
                if self._ref[b] == 0:
                    self._cache.unpark(b)
                self._ref[b] += 1
            seq.block_table = list(match.block_ids)
            self._seqs[seq] = _SeqState(num_registered=len(match.block_ids), root=match.root)
            self._queries += match.num_queried_tokens
            self._hits += match.num_tokens
        for seq, n, match in zip(seqs, num_tokens, matches, strict=True):
            for block in match.tier_blocks:  # filled from the tier before the forward
                seq.block_table.append(self._take_block())
                self.tiers.load(seq.block_table[-1], block)
            while len(seq.block_table) < self.blocks_for(n):
                seq.block_table.append(self._take_block())

    # ----- running sequences ---------------------------------------------------------------
    def blocks_to_append(self, chunks: list[tuple[TokenSequence, int]]) -> int:
        """Blocks `append` takes for these (sequence, new tokens) chunks of one group, in that
        order: fresh table blocks plus copy-on-write blocks (the last of a block's sharers to
        write keeps it when all its sharers write this step)."""
        need = 0
        writers: dict[int, int] = {}  # a plain dict: a Counter per call cost the decode steps
        for seq, n in chunks:
            if n <= 0:
                continue
            table = seq.block_table
            end_blocks = self.blocks_for(seq.num_computed_tokens + n)
            need += max(0, end_blocks - len(table))
            first = seq.num_computed_tokens // self.block_size
            for idx in range(first, min(end_blocks, len(table))):
                if self._ref[table[idx]] > 1:
                    writers[table[idx]] = writers.get(table[idx], 0) + 1
        for b, w in writers.items():
            need += w - 1 if w == self._ref[b] else w
        return need

    def append(self, seq: TokenSequence, num_new_tokens: int) -> list[tuple[int, int]]:
        """Covers tokens up to num_computed + num_new_tokens; returns (src, dst) block copies."""
        if seq not in self._seqs:
            raise RuntimeError(f"sequence {seq.seq_id} holds no blocks; admit it first")
        table = seq.block_table
        end_blocks = self.blocks_for(seq.num_computed_tokens + num_new_tokens)
        copies: list[tuple[int, int]] = []
        for idx in range(seq.num_computed_tokens // self.block_size, min(end_blocks, len(table))):
            src = table[idx]
            if self._ref[src] > 1:  # shared: writing would change what the sharers read
                dst = self._take_block()
                self._ref[src] -= 1
                table[idx] = dst
                copies.append((src, dst))
        while len(table) < end_blocks:
            table.append(self._take_block())
        return copies

    def fork(self, parent: TokenSequence, child: TokenSequence) -> None:
        """The child shares all the parent's blocks (ref + 1 each); no block is taken."""
        if parent not in self._seqs:
            raise RuntimeError(f"sequence {parent.seq_id} holds no blocks to fork")
        if child in self._seqs or child.block_table:
            raise RuntimeError(f"sequence {child.seq_id} already holds blocks")
        for b in parent.block_table:
            self._ref[b] += 1
        child.block_table = list(parent.block_table)
        state = self._seqs[parent]
        self._seqs[child] = _SeqState(state.num_registered, state.broken, state.root)

    def free(self, seq: TokenSequence, keep: int = 0) -> None:
        """Drops its blocks past the first `keep` (0: all), tail first (tails are evicted first)."""
        if seq in self._seqs:
            while len(seq.block_table) > keep:
                self._release(seq.block_table.pop())
            if not keep:
                del self._seqs[seq]
        if not keep and self.tiers is not None:
            self.tiers.forget(seq)

    def mark_computed(self, seq: TokenSequence) -> None:
        """Registers the sequence's full computed blocks in the prefix cache (after a step)."""
        state = self._seqs.get(seq) if self.enable_prefix_caching else None
        if state is None or state.broken:
            return
        table, bs = seq.block_table, self.block_size
        for idx in range(state.num_registered, min(seq.num_computed_tokens // bs, len(table))):
            parent = self._cache.entry(table[idx - 1]) if idx > 0 else None
            tokens = tuple(seq.token_ids[idx * bs : (idx + 1) * bs])
            fits = idx == 0 or parent is not None  # (root: the adapter's key, block 0 only)
            entry = self._cache.register(table[idx], parent, tokens, state.root) if fits else None
            if entry is None:  # collision: later blocks have no registered parent either
                state.broken = True
                return
            if entry.block_id != table[idx]:  # same content cached elsewhere: share that one
                if self._ref[entry.block_id] == 0:
                    self._cache.unpark(entry.block_id)
                self._ref[entry.block_id] += 1
                self._release(table[idx])
                table[idx] = entry.block_id
            state.num_registered = idx + 1

    # ----- internals -----------------------------------------------------------------------
    def forget_cached_blocks(self) -> int:
        """Frees every parked prefix-cache block (no sequence holds them); returns how many.
        For a change of forward path: K/V computed by the old one must not serve a prefix."""
        count = 0
        while self._cache.num_parked:
            self._free.append(self._cache.evict_lru().block_id)
            count += 1
        return count

    def _take_block(self) -> int:
        if self._free:
            b = self._free.popleft()
        elif self._cache.num_parked:
            entry = self._cache.evict_lru()
            b = entry.block_id
            if self.tiers is not None:  # its K/V goes to the tiers before it is reused
                self.tiers.evicted(entry)
        else:
            raise RuntimeError("out of KV blocks; the scheduler must check before allocating")
        self._ref[b] = 1
        return b

    def _release(self, b: int) -> None:
        self._ref[b] -= 1
        if self._ref[b] == 0:
            if self._cache.entry(b) is not None:
                self._cache.park(b)
            else:
                self._free.append(b)

    def check_invariants(self) -> None:
        """Raises AssertionError if the bookkeeping is inconsistent (block_invariants.py)."""
        check_block_invariants(self, self._ref, self._free, self._cache, self._seqs)
