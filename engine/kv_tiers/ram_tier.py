"""RamTier: K/V blocks in host memory, bounded in bytes, least recently used out.

Contract: `put(key, tokens, kv)` keeps a block (a CPU tensor `[layers, 2, block_size, kv_heads,
head_dim]` nobody writes to again) and evicts the least recently used blocks past
`limit_bytes`; a block larger than the bound is not kept. `get(key, tokens)` returns the block
only when its tokens are the ones asked for, and marks it most recently used. Thread-safe
(the tier store's worker stages disk hits here while the engine's thread reads).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RamBlock:
    tokens: tuple[int, ...]
    kv: torch.Tensor  # [layers, 2, block_size, kv_heads, head_dim] on the CPU

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


class RamTier:
    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._blocks: OrderedDict[int, RamBlock] = OrderedDict()  # oldest first
        self._lock = threading.Lock()
        self.bytes_held = 0
        self.hits = self.bytes_read = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: int) -> bool:
        return key in self._blocks

    def lru_keys(self) -> list[int]:
        """Least recently used first."""
        with self._lock:
            return list(self._blocks)

    def get(self, key: int, tokens: tuple[int, ...]) -> RamBlock | None:
        with self._lock:
            block = self._blocks.get(key)
            if block is None or block.tokens != tokens:
                return None
            self._blocks.move_to_end(key)
            return block

    def get_any(self, key: int) -> RamBlock | None:
        """The block under `key` whatever its tokens, LRU order untouched (tests, reports)."""
        with self._lock:
            return self._blocks.get(key)

    def count_hit(self, block: RamBlock) -> None:
        with self._lock:
            self.hits += 1
            self.bytes_read += block.nbytes

    def put(self, key: int, tokens: tuple[int, ...], kv: torch.Tensor) -> None:
        block = RamBlock(tokens, kv)
        if block.nbytes > self.limit_bytes:
            return
        with self._lock:
            old = self._blocks.pop(key, None)
            if old is not None:
                self.bytes_held -= old.nbytes
            self._blocks[key] = block
            self.bytes_held += block.nbytes
            while self.bytes_held > self.limit_bytes:
                _, dropped = self._blocks.popitem(last=False)
                self.bytes_held -= dropped.nbytes

    def clear(self) -> None:
        with self._lock:
            self._blocks.clear()
            self.bytes_held = 0
