"""The K/V sender and receiver threads around a channel (fakes here: the wire is test_channel.py).

Guarantees defended: the sender queues without waiting for the wire, refuses (KVSenderFull)
a batch past its byte bound while earlier ones wait, and after one failed send refuses every
later batch with the failure (KVPeerError) instead of queueing it; the receiver sets a waited
batch's future with its block count once the blocks are in the tier store, lands a batch nobody
waits for too, and when its channel fails, fails every waiting future and every later `expect`
at once (no request waits out its timeout for a peer that is gone).
Oracles: hand-built batches and the calls the fakes saw.
"""

from __future__ import annotations

import queue
import threading

import pytest
import torch

from engine.kv_tiers.keys import TierNamespace
from engine.kv_transfer.blocks import BlockBatch, namespace_digest
from engine.kv_transfer.errors import KVPeerError, KVSenderFull
from engine.kv_transfer.receiver import KVReceiver
from engine.kv_transfer.sender import KVSender

SHAPE = (1, 2, 4, 1, 2)
NAMESPACE = TierNamespace("m", "t", "float32", "torch.float32", "PyTorch ops", "1")


def batch(transfer_id: int, blocks: int) -> BlockBatch:
    kv = torch.full((blocks, *SHAPE), float(transfer_id))
    keys = tuple(range(transfer_id * 10, transfer_id * 10 + blocks))
    tokens = tuple((transfer_id, i, 0, 0) for i in range(blocks))
    return BlockBatch(transfer_id, keys, tokens, kv, namespace_digest(NAMESPACE))


class GatedChannel:
    """send() waits for the test to open the gate; fails once told to."""

    peer = "10.0.0.2:29600"

    def __init__(self) -> None:
        self.gate = threading.Semaphore(0)
        self.sent: list[int] = []
        self.fail = False

    def send(self, b: BlockBatch) -> None:
        self.gate.acquire()
        if self.fail:
            raise KVPeerError(f"the K/V transfer peer at {self.peer} is gone")
        self.sent.append(b.transfer_id)


def test_the_sender_queues_at_once_bounds_its_bytes_and_refuses_after_a_failure() -> None:
    channel = GatedChannel()
    one = batch(1, 2).nbytes
    sender = KVSender(channel, max_queued_bytes=2 * one)
    sender.put(batch(1, 2))  # returns although nothing went out yet
    sender.put(batch(2, 2))
    with pytest.raises(KVSenderFull):
        sender.put(batch(3, 2))  # the bound: two batches wait
    channel.gate.release()
    channel.gate.release()
    while sender.sent_blocks < 4:
        threading.Event().wait(0.01)
    assert channel.sent == [1, 2] and sender.sent_bytes == 2 * one
    channel.fail = True
    sender.put(batch(4, 1))
    channel.gate.release()
    while sender.broken is None:
        threading.Event().wait(0.01)
    with pytest.raises(KVPeerError, match="10.0.0.2:29600"):
        sender.put(batch(5, 1))


class FeedChannel:
    peer = "10.0.0.2:29600"

    def __init__(self) -> None:
        self.feed: queue.Queue = queue.Queue()

    def recv(self) -> BlockBatch:
        item = self.feed.get()
        if isinstance(item, Exception):
            raise item
        return item


class FakeStore:
    namespace = NAMESPACE

    def __init__(self) -> None:
        self.blocks: dict[int, tuple] = {}

    def put_received(self, key: int, tokens: tuple, kv: torch.Tensor) -> None:
        self.blocks[key] = (tokens, kv)


def test_the_receiver_lands_batches_wakes_their_waiters_and_fails_them_all_when_down() -> None:
    channel, store = FeedChannel(), FakeStore()
    receiver = KVReceiver(channel, store)
    waited, pending = receiver.expect(1), receiver.expect(3)
    channel.feed.put(batch(2, 1))  # nobody waits for it: it lands all the same
    channel.feed.put(batch(1, 3))
    assert waited.result(10) == 3
    assert set(store.blocks) == {20, 10, 11, 12} and store.blocks[11][0] == (1, 1, 0, 0)
    assert torch.equal(store.blocks[12][1], torch.full(SHAPE, 1.0))
    channel.feed.put(KVPeerError("the K/V transfer peer at 10.0.0.2:29600 is gone"))
    with pytest.raises(KVPeerError, match="is gone"):
        pending.result(10)
    with pytest.raises(KVPeerError, match="is gone"):
        receiver.expect(4).result(0)  # at once: already failed
    assert receiver.received_blocks == 4


def test_a_waiter_that_gave_up_does_not_stop_the_receiver() -> None:
    channel, store = FeedChannel(), FakeStore()
    receiver = KVReceiver(channel, store)
    given_up = receiver.expect(5)
    given_up.cancel()  # its request timed out; the batch comes after all
    channel.feed.put(batch(5, 1))
    later = receiver.expect(6)
    channel.feed.put(batch(6, 2))
    assert later.result(10) == 2 and receiver.broken is None
