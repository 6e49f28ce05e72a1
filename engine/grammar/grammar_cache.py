"""GrammarCache: the compiled grammars kept for reuse, bounded by count and by bytes.

Contract: `GrammarCache(max_entries, max_bytes)`; `get(key)` returns a kept value (and marks it
most recently used) or None; `put(key, value, size_bytes)` keeps it, evicting the least recently
used entries until both bounds hold. A value larger than `max_bytes` on its own is not kept (the
caller still uses it: a request never depends on the cache). `bytes_held` is the sum of the
kept entries' sizes (a metric). Thread-safe: requests are validated on worker threads while the
engine's loop thread reads the cache.

Sizes are the caller's estimate (grammar_compiler.py: llguidance exposes no memory figure), so
the byte bound is as good as that estimate; the count bound stays as a second fence.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class GrammarCache(Generic[V]):
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, got {max_bytes}")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: Hashable, value: V, size_bytes: int) -> None:
        if size_bytes > self.max_bytes:
            return  # would evict everything and still not fit
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:  # two threads compiled the same grammar: keep the newer
                self._bytes -= old[1]
            self._entries[key] = (value, size_bytes)
            self._bytes += size_bytes
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._bytes -= evicted

    @property
    def bytes_held(self) -> int:
        with self._lock:
            return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
