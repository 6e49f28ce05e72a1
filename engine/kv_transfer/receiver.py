"""KVReceiver: a decode server's batches arrive on one background thread, into its RAM tier.

Contract: `expect(transfer_id)` (before the request that makes the peer send it) returns a
Future set when that batch has arrived and its blocks are in the tier store (its block
count), or failed with `KVPeerError` once the channel is down; `forget(transfer_id)` drops one
no longer waited for. Each block goes in with `TierStore.put_received` under its chained key,
unless the batch's namespace digest is not the store's now (another forward path: its K/V
is not this one's): then the batch is counted in `rejected` and its request recomputes. A
batch nobody waits for still lands (a later request may hit it). The first failed receive
marks the channel down for good: waiting and later futures fail with the reason (`broken`).
`received_blocks` / `received_bytes` / `load_seconds` count what came in and its puts
(`put_batch`, which a test calls without a channel).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future

from engine.kv_tiers.tier_store import TierStore
from engine.kv_transfer.blocks import BlockBatch, namespace_digest
from engine.kv_transfer.channel import KVChannel
from engine.kv_transfer.errors import KVPeerError

log = logging.getLogger("tgserve.engine")


class KVReceiver:
    def __init__(self, channel: KVChannel, store: TierStore) -> None:
        self.channel = channel
        self.store = store
        self.broken: str | None = None
        self.received_blocks = self.received_bytes = self.rejected = 0
        self.load_seconds = 0.0
        self._waiting: dict[int, Future[int]] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="tgserve-kv-recv", daemon=True).start()

    def expect(self, transfer_id: int) -> Future[int]:
        future: Future[int] = Future()
        with self._lock:
            if self.broken is not None:
                future.set_exception(KVPeerError(self.broken))
            else:
                self._waiting[transfer_id] = future
        return future

    def forget(self, transfer_id: int) -> None:
        with self._lock:
            self._waiting.pop(transfer_id, None)

    def _run(self) -> None:
        while True:
            try:
                batch = self.channel.recv()
            except KVPeerError as exc:
                self._fail_all(str(exc))
                return
            count = self._put(batch)
            with self._lock:
                future = self._waiting.pop(batch.transfer_id, None)
            if future is not None and future.set_running_or_notify_cancel():
                future.set_result(count)  # not when its waiter gave up (cancelled) meanwhile

    def _put(self, batch: BlockBatch) -> int:
        t0 = time.perf_counter()
        count = put_batch(self.store, batch)
        self.load_seconds += time.perf_counter() - t0
        self.rejected += bool(batch.keys) and not count
        self.received_blocks += count
        self.received_bytes += batch.nbytes if count else 0
        return count

    def _fail_all(self, reason: str) -> None:
        log.error("K/V transfer channel down: %s", reason)
        with self._lock:
            self.broken = reason
            waiting, self._waiting = list(self._waiting.values()), {}
        for future in waiting:
            if future.set_running_or_notify_cancel():
                future.set_exception(KVPeerError(reason))


def put_batch(store: TierStore, batch: BlockBatch) -> int:
    """The batch's blocks into `store`'s RAM tier (their count), or none (0) when its K/V is of
    another namespace than the store's now."""
    if batch.digest != namespace_digest(store.namespace):
        return 0
    for key, tokens, kv in zip(batch.keys, batch.tokens, batch.kv, strict=True):
        store.put_received(key, tokens, kv.clone())  # its own block: the rest may go
    return len(batch.keys)
