"""DiskTier: K/V blocks as files in one directory, bounded in bytes, least recently used out.

Contract: a block lives in `<dir>/<namespace.file_stem(key)>.kvb` (block_file.py's format).
At start the directory is scanned: files of every namespace count against `limit_bytes`, oldest
modification first in line for eviction (a read touches its file, so the order survives a
restart). `write` skips blocks already on disk and blocks larger than the bound; `read` returns
the payload only after block_file.py's checks, and deletes a file that fails them (it is logged
and counted in `rejected`). Thread-safe: the tier store's worker reads and writes while the
engine's thread asks `has`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path

import torch

from engine.kv_tiers.block_file import SUFFIX, encode_block, read_block_file, write_block_file
from engine.kv_tiers.keys import TierNamespace

log = logging.getLogger("tgserve.engine")


class DiskTier:
    def __init__(self, directory: str, limit_bytes: int) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.limit_bytes = limit_bytes
        self._lock = threading.Lock()
        found = []
        for path in self.directory.glob(f"*{SUFFIX}"):
            try:
                st = path.stat()
            except OSError:
                continue
            found.append((st.st_mtime, path.name, st.st_size))
        self._files: OrderedDict[str, int] = OrderedDict(
            (name, size) for _, name, size in sorted(found)
        )  # file name -> bytes, least recently used first
        self.bytes_held = sum(self._files.values())
        self.hits = self.bytes_read = self.bytes_written = self.rejected = 0
        with self._lock:
            self._evict()

    def __len__(self) -> int:
        return len(self._files)

    def has(self, namespace: TierNamespace, key: int) -> bool:
        return namespace.file_stem(key) + SUFFIX in self._files

    def read(
        self,
        namespace: TierNamespace,
        key: int,
        tokens: tuple[int, ...],
        shape: tuple[int, ...],
        dtype: torch.dtype,
    ) -> torch.Tensor | None:
        name = namespace.file_stem(key) + SUFFIX
        path = self.directory / name
        kv, why = read_block_file(path, namespace.digest, key, tokens, shape, dtype)
        with self._lock:
            if kv is None:
                log.warning("K/V tier file %s ignored and removed: %s", path, why)
                self.rejected += 1
                self._drop(name)
                return None
            self.hits += 1
            self.bytes_read += kv.numel() * kv.element_size()
            if name in self._files:
                self._files.move_to_end(name)
        with contextlib.suppress(OSError):  # most recently used, for the next process's scan
            os.utime(path)
        return kv

    def write(
        self, namespace: TierNamespace, key: int, tokens: tuple[int, ...], kv: torch.Tensor
    ) -> None:
        name = namespace.file_stem(key) + SUFFIX
        with self._lock:
            if name in self._files:
                self._files.move_to_end(name)
                return
        data = encode_block(namespace.digest, key, tokens, kv)
        if len(data) > self.limit_bytes:
            return
        write_block_file(self.directory / name, data)
        with self._lock:
            self._files[name] = len(data)
            self.bytes_held += len(data)
            self.bytes_written += len(data)
            self._evict()

    def _evict(self) -> None:
        while self.bytes_held > self.limit_bytes and self._files:
            self._drop(next(iter(self._files)))

    def _drop(self, name: str) -> None:
        self.bytes_held -= self._files.pop(name, 0)
        with contextlib.suppress(OSError):
            (self.directory / name).unlink()
