"""TierBridge: the block manager's side of the K/V tiers (engine/kv_tiers), as plain data.

Contract (pure Python, no torch): the block manager tells it which registered blocks it evicts
(`evicted`) and which fresh blocks it fills from a tier (`load`); `take_moves()` hands both
over, in that order, for the engine to apply before the next forward (`TierStore.transfer`).
`chain(parent_hash, blocks)` keys blocks as the pool does. `extend(parent_hash, blocks)` continues a pool prefix hit with the blocks the tiers hold (RAM
only; each confirmed by its tokens), and `prefetch(seq, ...)` starts reading the blocks past
that from disk, holding the sequence back (`is_loading`) until the read is done; `forget(seq)`
drops that hold when the sequence goes.

`TierIndex` is what the bridge needs of a store; engine/kv_tiers/tier_store.py implements it.
Keys are the block manager's own chained hashes (engine/kv_tiers/keys.py's strong hash when
tiers are on), so a key names a whole prefix.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from engine.kv_tiers.moves import TierMoves
from engine.scheduling.prefix_cache import CacheEntry, HashFn

Chain = list[tuple[int, tuple[int, ...]]]  # (block key, block tokens)


class Pending(Protocol):
    def done(self) -> bool: ...


class TierIndex(Protocol):
    def lookup(self, key: int, tokens: tuple[int, ...]) -> Any | None: ...

    def count_hit(self, block: Any) -> None: ...

    def prefetch(self, chain: Chain) -> Pending | None: ...


class TierBridge:
    def __init__(self, index: TierIndex, hash_fn: HashFn) -> None:
        self.index = index
        self._hash_fn = hash_fn
        self._saves: list[tuple[int, int, tuple[int, ...]]] = []
        self._loads: list[tuple[int, Any]] = []
        self._loading: dict[Any, Pending] = {}

    def evicted(self, entry: CacheEntry) -> None:
        """A registered block leaves the pool: its K/V goes to the tiers before it is reused."""
        self._saves.append((entry.block_id, entry.hash, entry.tokens))

    def load(self, block_id: int, payload: Any) -> None:
        self.index.count_hit(payload)
        self._loads.append((block_id, payload))

    def take_moves(self) -> TierMoves:
        moves = TierMoves(saves=tuple(self._saves), loads=tuple(self._loads))
        self._saves.clear()
        self._loads.clear()
        return moves

    def extend(self, parent_hash: int | None, blocks: Iterable[tuple[int, ...]]) -> tuple[Any, ...]:
        """The tier blocks continuing a chain whose last pool block hashes to `parent_hash`."""
        found = []
        for tokens in blocks:
            key = self._hash_fn(parent_hash, tokens)
            payload = self.index.lookup(key, tokens)
            if payload is None:
                break
            found.append(payload)
            parent_hash = key
        return tuple(found)

    def chain(self, parent_hash: int | None, blocks: list[tuple[int, ...]]) -> Chain:
        """Each block's key, continuing the chain whose last block hashes to `parent_hash`."""
        chain: Chain = []
        for tokens in blocks:
            parent_hash = self._hash_fn(parent_hash, tokens)
            chain.append((parent_hash, tokens))
        return chain

    def prefetch(self, seq: Any, parent_hash: int | None, blocks: list[tuple[int, ...]]) -> None:
        pending = self.index.prefetch(self.chain(parent_hash, blocks))
        if pending is not None:
            self._loading[seq] = pending

    def is_loading(self, seq: Any) -> bool:
        pending = self._loading.get(seq)
        if pending is not None and pending.done():
            del self._loading[seq]
            return False
        return pending is not None

    def forget(self, seq: Any) -> None:
        self._loading.pop(seq, None)
