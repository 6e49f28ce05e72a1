"""PrefixCache: which full, computed KV blocks hold which token prefix, and which may be evicted.

Contract: a full block is registered under `hash_fn(parent_hash, tokens)` where `parent_hash` is
the hash of the block before it in its sequence (for the first block: `root_hash(root)`: None
for the base model, else a stable 128-bit hash of the LoRA adapter's `root` key -- the same in
every process, so the K/V tiers' keys carry the adapter too -- which the entry keeps and a
lookup checks). A hash is only an index: `lookup` confirms a hit by comparing the block's own tokens AND the identity of its parent
entry (a serial number unique to each registration), so a hash collision can only cost a miss,
never return a wrong block. At most one block is registered per hash; a second block with the
same content is deduplicated by the caller.

Registered blocks with no owner are "parked": still reusable by a later lookup, and evicted
least recently parked first when the block manager runs out of truly free blocks. Reference
counts live in the BlockManager; this class only knows registered vs parked.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, KeysView
from dataclasses import dataclass

HashFn = Callable[[int | None, tuple[int, ...]], int]


def block_hash(parent_hash: int | None, tokens: tuple[int, ...]) -> int:
    """Chained block hash; Python's tuple hash of ints is stable across processes."""
    return hash((parent_hash, tokens))


def full_blocks(token_ids: list[int], block_size: int) -> list[tuple[int, ...]]:
    """The full blocks of `token_ids` a prefix hit may cover: at least one token is left to
    compute, so the model still produces logits."""
    bs = block_size
    return [tuple(token_ids[i * bs : (i + 1) * bs]) for i in range((len(token_ids) - 1) // bs)]


@dataclass(frozen=True)
class CacheEntry:
    block_id: int
    hash: int
    tokens: tuple[int, ...]
    parent_serial: int | None  # serial of the entry of the previous block; None for block 0
    serial: int  # unique per registration: a recycled block id gets a new serial
    root: str | None = None  # block 0 only: what computed it (a LoRA adapter's key; None: base)


class PrefixCache:
    def __init__(self, hash_fn: HashFn = block_hash) -> None:
        self._hash_fn = hash_fn
        self._by_hash: dict[int, CacheEntry] = {}
        self._by_block: dict[int, CacheEntry] = {}
        self._parked: OrderedDict[int, None] = OrderedDict()  # LRU order: oldest first
        self._next_serial = 0

    def __len__(self) -> int:
        return len(self._by_block)

    @property
    def num_parked(self) -> int:
        return len(self._parked)

    def entry(self, block_id: int) -> CacheEntry | None:
        return self._by_block.get(block_id)

    def is_parked(self, block_id: int) -> bool:
        return block_id in self._parked

    def parked_blocks(self) -> list[int]:
        return list(self._parked)

    def registered_blocks(self) -> KeysView[int]:
        """The blocks holding an entry: a live view (block_invariants.py's set operations)."""
        return self._by_block.keys()

    def lookup(
        self, parent: CacheEntry | None, tokens: tuple[int, ...], root: str | None = None
    ) -> CacheEntry | None:
        """The registered block holding `tokens` right after `parent` (block 0: computed under
        `root`), confirmed, or None."""
        entry = self._by_hash.get(self._hash_fn(_parent_hash(parent, root), tokens))
        if entry is None or entry.tokens != tokens:
            return None
        if entry.parent_serial != (parent.serial if parent is not None else None):
            return None
        if parent is None and entry.root != root:  # a hit never crosses adapters
            return None
        return entry

    def register(
        self,
        block_id: int,
        parent: CacheEntry | None,
        tokens: tuple[int, ...],
        root: str | None = None,
    ) -> CacheEntry | None:
        """Registers an owned, computed full block. Returns the entry that now holds this
        content: the new one, an equal one registered before (the caller switches to it), or
        None when a different block already holds the hash (a collision: not cacheable)."""
        existing = self.lookup(parent, tokens, root)
        if existing is not None:
            return existing
        h = self._hash_fn(_parent_hash(parent, root), tokens)
        if h in self._by_hash or block_id in self._by_block:
            return None
        entry = CacheEntry(
            block_id=block_id,
            hash=h,
            tokens=tokens,
            parent_serial=parent.serial if parent is not None else None,
            serial=self._next_serial,
            root=root if parent is None else None,
        )
        self._next_serial += 1
        self._by_hash[h] = entry
        self._by_block[block_id] = entry
        return entry

    def park(self, block_id: int) -> None:
        """The last owner let go of a registered block: keep it, most recently used last."""
        self._parked[block_id] = None

    def unpark(self, block_id: int) -> None:
        """A lookup hit reuses a parked block."""
        del self._parked[block_id]

    def evict_lru(self) -> CacheEntry:
        """Forgets the least recently parked block and returns its entry (the block is now
        truly free; the entry says what it held, for the K/V tiers)."""
        block_id, _ = self._parked.popitem(last=False)
        entry = self._by_block.pop(block_id)
        del self._by_hash[entry.hash]
        return entry


def _parent_hash(parent: CacheEntry | None, root: str | None) -> int | None:
    return parent.hash if parent is not None else root_hash(root)


def root_hash(root: str | None) -> int | None:
    """Where block 0 chains from: None for the base model, else a hash of the adapter's key, so
    the same tokens under two adapters (their K/V differ) are two chains. BLAKE2b, not hash():
    a disk tier's keys must name the same adapter in the next process."""
    if root is None:
        return None
    return int.from_bytes(
        hashlib.blake2b(b"lora\x00" + root.encode(), digest_size=16).digest(), "little"
    )
