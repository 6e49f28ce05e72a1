"""TierStore: the RAM and disk tiers behind the pool, and the copies between them and the pool.

Contract (the block manager's `TierIndex`, engine/scheduling/block_manager.py, plus the copies):
- `lookup(key, tokens)`: the block held in the RAM tier under that key and those tokens, or
  None. Only RAM blocks are served: a disk block is read, checked and staged in RAM by
  `prefetch` first, so a hit the scheduler counts can never turn out corrupt later.
- `prefetch(chain)`: for a request's `(key, tokens)` chain (its blocks past the pool's hit),
  starts reading the run of blocks found on disk into the RAM tier on the store's worker thread
  and returns its future (None when nothing needs reading). The scheduler holds the request
  back until it is done, so the reads overlap other requests' steps instead of stalling them.
- `transfer(kv_caches, moves)` runs on the engine's thread before a forward: first the pool
  blocks evicted since the last step (`moves.saves`: block id, key, tokens) are copied out into
  the RAM tier (and queued for the disk tier on the worker, written through so a restart finds
  them), then the RAM blocks given to admitted sequences (`moves.loads`) are copied into their
  pool blocks. In that order: an evicted block may be handed out and filled in the same step.
- `set_forward_path(name)`: K/V of another forward path is not this one's (they agree to
  rounding only): the namespace changes and the RAM tier is emptied.
- `put_received(key, tokens, kv)`: a block another server computed (engine/kv_transfer, its
  shape and dtype this store's) goes into the RAM tier, where a hit finds it as any other.
- `stats()`: hits and bytes per tier. `flush()` waits for queued disk writes.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from engine.kv_tiers.block_layout import BlockLayout
from engine.kv_tiers.config import KVTierConfig
from engine.kv_tiers.disk_tier import DiskTier
from engine.kv_tiers.keys import TierNamespace
from engine.kv_tiers.moves import TierMoves
from engine.kv_tiers.ram_tier import RamBlock, RamTier
from engine.kv_tiers.tier_stats import TierStats

log = logging.getLogger("tgserve.engine")

Chain = list[tuple[int, tuple[int, ...]]]  # (block key, block tokens), first block first
KVCaches = list[tuple[torch.Tensor, torch.Tensor]]  # per layer [num_blocks, bs, heads, dim]


class TierStore:
    def __init__(self, config: KVTierConfig, namespace: TierNamespace, kv_caches: KVCaches) -> None:
        # [layers, K/V, bs, heads, dim], or the bytes of K and V rows of two layouts
        self.layout = BlockLayout.of(kv_caches)
        self.block_shape = self.layout.shape
        self.dtype = self.layout.dtype
        self.namespace = namespace
        self.ram = RamTier(config.ram_limit)
        self.disk = DiskTier(config.disk_dir, config.disk_limit) if config.disk_dir else None
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="tgserve-kv-tier")
        self._writes: list[Future] = []
        self._queued_bytes = 0  # K/V waiting for the disk worker: at most the RAM tier's bound
        self._prefetches: list[Future] = []
        self._lock = threading.Lock()
        self._saved = 0
        self.skipped_writes = 0  # blocks not written to disk: the write queue was full

    # ----- the scheduler's side (pure data) --------------------------------------------------
    def lookup(self, key: int, tokens: tuple[int, ...]) -> RamBlock | None:
        return self.ram.get(key, tokens)

    def count_hit(self, block: RamBlock) -> None:
        self.ram.count_hit(block)

    def put_received(self, key: int, tokens: tuple[int, ...], kv: torch.Tensor) -> None:
        if tuple(kv.shape) != self.block_shape or kv.dtype != self.dtype:
            raise ValueError(
                f"a received K/V block is {tuple(kv.shape)} {kv.dtype}, not this pool's"
            )
        self.ram.put(key, tokens, kv)

    def prefetch(self, chain: Chain) -> Future | None:
        if self.disk is None:
            return None
        namespace, todo = self.namespace, []
        for key, tokens in chain:
            if key in self.ram:
                continue
            if not self.disk.has(namespace, key):
                break
            todo.append((key, tokens))
        if not todo:
            return None
        future = self._worker.submit(self._read_run, namespace, todo)
        with self._lock:
            self._prefetches = [f for f in self._prefetches if not f.done()] + [future]
        return future

    def wait_for_prefetches(self, timeout: float) -> None:
        """Blocks up to `timeout` s for the reads in flight (an engine with nothing else to do)."""
        with self._lock:
            pending = [f for f in self._prefetches if not f.done()]
        for future in pending:
            try:
                future.result(timeout)
            except Exception:  # a timeout, or a read failure already logged by the worker
                return

    # ----- the engine's side (device copies) -------------------------------------------------
    def transfer(self, kv_caches: KVCaches, moves: TierMoves) -> None:
        if moves.saves:
            self._save(moves, kv_caches)
        if not moves.loads:
            return
        device = kv_caches[0][0].device
        if device.type == "cpu":  # block by block: small copies stay on one thread (below)
            for block_id, block in moves.loads:
                self.layout.write(kv_caches, block_id, block.kv)
            return
        # A GPU pool's K and V rows are alike (int8v, two layouts, is a CPU cache's)
        ids = torch.tensor([b for b, _ in moves.loads], dtype=torch.int64, device=device)
        kv = torch.stack([block.kv for _, block in moves.loads]).to(device)  # [N, L, 2, ...]
        for layer, (k_cache, v_cache) in enumerate(kv_caches):
            k_cache.index_copy_(0, ids, kv[:, layer, 0])
            v_cache.index_copy_(0, ids, kv[:, layer, 1])

    def _save(self, moves: TierMoves, kv_caches: KVCaches) -> None:
        """Each evicted block into a CPU tensor of its own. Block by block: one large gather
        split over OpenMP threads ran 10x slower than these small copies on a busy 2-core host
        (1 s against 60 ms for 61 blocks of the default model)."""
        for block_id, key, tokens in moves.saves:
            kv = torch.empty(self.block_shape, dtype=self.dtype)
            self.layout.read(kv_caches, block_id, kv)
            self.ram.put(key, tokens, kv)
            if self.disk is not None:
                self._queue_write(key, tokens, kv)
        self._saved += len(moves.saves)

    def _queue_write(self, key: int, tokens: tuple[int, ...], kv: torch.Tensor) -> None:
        """A disk write on the worker; skipped (the block stays in RAM only) while the writes
        queued already hold the RAM tier's bound: a slow disk never grows memory unbounded."""
        nbytes = kv.numel() * kv.element_size()
        with self._lock:
            if self._queued_bytes + nbytes > self.ram.limit_bytes:
                self.skipped_writes += 1
                return
            self._queued_bytes += nbytes
        future = self._worker.submit(self._write, self.namespace, key, tokens, kv)
        future.add_done_callback(lambda _: self._written(nbytes))
        with self._lock:
            self._writes = [f for f in self._writes if not f.done()] + [future]

    def _write(self, namespace: TierNamespace, key: int, tokens: tuple[int, ...], kv) -> None:
        try:
            self.disk.write(namespace, key, tokens, kv)
        except OSError as exc:  # a full or read-only disk costs the tier, never the engine
            log.warning("K/V tier write to %s failed: %s", self.disk.directory, exc)

    def _written(self, nbytes: int) -> None:
        with self._lock:
            self._queued_bytes -= nbytes

    def _read_run(self, namespace: TierNamespace, todo: Chain) -> int:
        """On the worker: reads blocks in chain order into RAM; stops at the first bad one."""
        assert self.disk is not None
        for count, (key, tokens) in enumerate(todo):
            kv = self.disk.read(namespace, key, tokens, self.block_shape, self.dtype)
            if kv is None or namespace != self.namespace:
                return count
            self.ram.put(key, tokens, kv)
        return len(todo)

    # ----- lifetime and figures --------------------------------------------------------------
    def set_forward_path(self, forward_path: str) -> None:
        if forward_path != self.namespace.forward_path:
            self.namespace = dataclasses.replace(self.namespace, forward_path=forward_path)
            self.ram.clear()

    def flush(self) -> None:
        with self._lock:
            pending = list(self._writes)
        for future in pending:
            future.result()

    def close(self) -> None:
        """An engine's close: its queued writes land (the worker stays: a level-1 sleep's
        engine runs again)."""
        self.flush()

    def stats(self) -> TierStats:
        disk = self.disk
        return TierStats(
            ram_hits=self.ram.hits,
            ram_hit_bytes=self.ram.bytes_read,
            ram_bytes=self.ram.bytes_held,
            ram_blocks=len(self.ram),
            disk_hits=disk.hits if disk else 0,
            disk_hit_bytes=disk.bytes_read if disk else 0,
            disk_bytes=disk.bytes_held if disk else 0,
            disk_written_bytes=disk.bytes_written if disk else 0,
            disk_rejected=disk.rejected if disk else 0,
            saved_blocks=self._saved,
        )
