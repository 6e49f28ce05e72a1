"""KVSender: a prefill server's batches go out on one background thread, from a bounded queue.

Contract: `put(batch)` queues a batch and returns at once, so the engine goes on with the next
prompt while this one's K/V is on the wire (the transfer overlaps the next prefill); it raises
`KVPeerError` when the channel is down (the reason: `broken`) and `KVSenderFull` when
`max_queued_bytes` of K/V already wait (a slow link never grows memory unbounded: the caller
answers 503). The first failed send marks the channel down for good: every later `put` fails
at once. `sent_blocks` / `sent_bytes` / `send_seconds` count what went out.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from engine.kv_transfer.blocks import BlockBatch
from engine.kv_transfer.channel import KVChannel
from engine.kv_transfer.errors import KVPeerError, KVSenderFull

log = logging.getLogger("tgserve.engine")


class KVSender:
    def __init__(self, channel: KVChannel, max_queued_bytes: int) -> None:
        self.channel = channel
        self.max_queued_bytes = max_queued_bytes
        self.broken: str | None = None
        self.sent_blocks = self.sent_bytes = 0
        self.send_seconds = 0.0
        self._queue: queue.SimpleQueue[BlockBatch] = queue.SimpleQueue()  # bounded in bytes
        self._queued_bytes = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="tgserve-kv-send", daemon=True).start()

    def put(self, batch: BlockBatch) -> None:
        with self._lock:
            if self.broken is not None:
                raise KVPeerError(self.broken)
            if self._queued_bytes and self._queued_bytes + batch.nbytes > self.max_queued_bytes:
                raise KVSenderFull(f"{self._queued_bytes} bytes of K/V are waiting to be sent")
            self._queued_bytes += batch.nbytes
        self._queue.put(batch)

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            t0 = time.perf_counter()
            try:
                self.channel.send(batch)
            except KVPeerError as exc:
                with self._lock:
                    self.broken = str(exc)
                log.error("K/V transfer channel down: %s", exc)
                return
            with self._lock:
                self._queued_bytes -= batch.nbytes
                self.sent_blocks += len(batch.keys)
                self.sent_bytes += batch.nbytes
                self.send_seconds += time.perf_counter() - t0
