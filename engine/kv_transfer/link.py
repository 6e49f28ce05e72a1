"""KVLink: the engine's side of prefill/decode disaggregation, one per server with a `--role`.

Contract: `open_kv_link(engine, role, addr, timeout_s)` joins the K/V transfer group of
channel.py at `addr` ("HOST:PORT", the decode server's), waiting at most `timeout_s` for the
peer (`KVPeerError`), and sets `engine.kv_link`. It needs the engine's K/V tiers (their RAM tier
takes received blocks; their keys are the chained hashes both servers compute alike): a
ValueError otherwise. Then, on a prefill server, `export(engine, token_ids, transfer_id)` --
on the engine's thread, between steps (`AsyncEngine.call`), after the prompt was computed --
`export_prefix` gathers the blocks a decode server's prefix match would use for that prompt (its full blocks
but the last token's: the pool's, then the RAM tier's past them) into a `BlockBatch`, and
`send(batch)` queues it (sender.py). On a decode server `expect(transfer_id)` / `forget` are
receiver.py's. The last partial block (and the last token) is recomputed on the decode
server: its K/V depends on nothing but the blocks before it, which it loads bit for bit.
`stats()` is what moved, for /metrics and the tests.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from engine.kv_transfer.blocks import BlockBatch, gather, namespace_digest
from engine.kv_transfer.channel import KVChannel
from engine.kv_transfer.receiver import KVReceiver
from engine.kv_transfer.sender import KVSender
from engine.scheduling.prefix_cache import root_hash

MAX_QUEUED_BYTES = 256 << 20  # K/V a prefill server holds waiting for the link at most


@dataclass(frozen=True)
class KVTransferStats:
    role: str
    peer: str
    broken: str | None  # why the channel is down, or None
    blocks: int  # sent (prefill) or received (decode)
    bytes: int
    seconds: float  # on the wire (prefill) or putting blocks in the tier (decode)
    rejected: int  # batches dropped: another forward path's K/V (decode)


class KVLink:
    def __init__(self, role: str, channel: KVChannel, store: Any) -> None:
        self.role = role
        self.store = store  # the engine's TierStore
        self.sender = KVSender(channel, MAX_QUEUED_BYTES) if role == "prefill" else None
        self.receiver = KVReceiver(channel, store) if role == "decode" else None
        self.peer = channel.peer

    def export(self, engine: Any, token_ids: list[int], transfer_id: int) -> BlockBatch:
        return export_prefix(engine, token_ids, transfer_id)

    def send(self, batch: BlockBatch) -> None:
        self.sender.put(batch)

    def expect(self, transfer_id: int) -> Future[int]:
        return self.receiver.expect(transfer_id)

    def forget(self, transfer_id: int) -> None:
        self.receiver.forget(transfer_id)

    @property
    def broken(self) -> str | None:
        return (self.sender or self.receiver).broken

    def stats(self) -> KVTransferStats:
        if self.sender is not None:
            s = self.sender
            return KVTransferStats(
                "prefill", self.peer, s.broken, s.sent_blocks, s.sent_bytes, s.send_seconds, 0
            )
        r = self.receiver
        return KVTransferStats(
            "decode",
            self.peer,
            r.broken,
            r.received_blocks,
            r.received_bytes,
            r.load_seconds,
            r.rejected,
        )


def export_prefix(engine: Any, token_ids: list[int], transfer_id: int) -> BlockBatch:
    """Engine thread only (the pool is still between steps): the blocks a prefix match of
    `token_ids` finds, keyed as every process keys them (the base model's chain)."""
    manager = engine.scheduler.block_manager
    match = manager.match_prefix(list(token_ids))
    bs = manager.block_size
    blocks = [tuple(token_ids[i * bs : (i + 1) * bs]) for i in range(match.num_tokens // bs)]
    chain = manager.tiers.chain(root_hash(None), blocks)
    kv = gather(engine.runner.kv_caches, list(match.block_ids), [b.kv for b in match.tier_blocks])
    digest = namespace_digest(manager.tiers.index.namespace)
    return BlockBatch(transfer_id, tuple(k for k, _ in chain), tuple(blocks), kv, digest)


def open_kv_link(engine: Any, role: str, addr: str, timeout_s: float) -> KVLink:
    if role not in ("prefill", "decode"):
        raise ValueError(f"--role must be prefill or decode, got {role!r}")
    bridge = engine.scheduler.block_manager.tiers
    if bridge is None:
        raise ValueError(f"--role {role} needs the K/V tiers (a RAM tier) and prefix caching")
    host, _, port = addr.rpartition(":")
    store = bridge.index
    channel = KVChannel.open(role, host, int(port), timeout_s, store.block_shape, store.dtype)
    engine.kv_link = KVLink(role, channel, store)
    return engine.kv_link
