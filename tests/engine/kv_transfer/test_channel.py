"""The K/V channel's wire: a prefill rank and a decode rank (two threads here, each with its own
gloo group over one rendezvous) move a `BlockBatch` bit for bit -- 128-bit keys, token ids and
K/V bytes in bfloat16, whatever their values (NaN payloads included) -- and an empty batch
(a prompt with no full block); two servers whose blocks differ in shape fail at start-up with
an error naming the rendezvous address, within the join timeout, instead of exchanging K/V; a
decode server whose prefill server never comes fails after the timeout, naming the address.

Oracle: the batch that was sent, compared as bytes.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from engine.kv_transfer.blocks import BlockBatch
from engine.kv_transfer.channel import KVChannel
from engine.kv_transfer.errors import KVPeerError
from models.parallel.group import free_port

SHAPE = (2, 2, 4, 2, 8)  # [layers, K/V, block_size, kv_heads, head_dim]
HOST = "127.0.0.1"


def open_pair(shapes: tuple[tuple[int, ...], tuple[int, ...]], timeout: float = 20.0):
    port = free_port()
    with ThreadPoolExecutor(2) as pool:
        decode = pool.submit(
            KVChannel.open, "decode", HOST, port, timeout, shapes[1], torch.bfloat16
        )
        prefill = pool.submit(
            KVChannel.open, "prefill", HOST, port, timeout, shapes[0], torch.bfloat16
        )
        return prefill, decode, port


def test_a_batch_crosses_bit_for_bit_and_an_empty_one_too() -> None:
    prefill, decode, _ = open_pair((SHAPE, SHAPE))
    sender, receiver = prefill.result(30), decode.result(30)
    gen = torch.Generator().manual_seed(3)
    raw = torch.randint(0, 256, (3 * 2 * 2 * 2 * 4 * 2 * 8,), dtype=torch.uint8, generator=gen)
    kv = raw.view(torch.bfloat16).reshape(3, *SHAPE)  # any bit pattern, NaNs included
    keys = (0, 2**128 - 1, 2**127 + 12345)
    tokens = ((1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 2**40))
    sent = [BlockBatch(41, keys, tokens, kv, 2**62 + 1), BlockBatch(42, (), (), kv[:0], 5)]
    with ThreadPoolExecutor(1) as pool:
        got = pool.submit(lambda: [receiver.recv(), receiver.recv()])
        for batch in sent:
            sender.send(batch)
        first, empty = got.result(30)
    assert (first.transfer_id, first.keys, first.tokens, first.digest) == (
        41,
        keys,
        tokens,
        2**62 + 1,
    )
    assert first.kv.dtype == torch.bfloat16 and first.kv.shape == kv.shape
    assert torch.equal(first.kv.view(torch.uint8), kv.view(torch.uint8))
    assert (empty.transfer_id, empty.keys, empty.digest) == (42, (), 5)


def test_servers_with_other_block_shapes_fail_at_start_naming_the_address() -> None:
    other = (3, *SHAPE[1:])  # a model with another layer count
    t0 = time.monotonic()
    prefill, decode, port = open_pair((SHAPE, other), timeout=10.0)
    for side in (prefill, decode):
        with pytest.raises(KVPeerError, match=f"{HOST}:{port} holds other K/V"):
            side.result(30)
    assert time.monotonic() - t0 < 15.0


def test_a_peer_that_never_comes_is_an_error_naming_the_address_after_the_timeout() -> None:
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(KVPeerError, match=f"prefill server did not join .* at {HOST}:{port}"):
        KVChannel.open("decode", HOST, port, 2.0, SHAPE, torch.bfloat16)
    assert time.monotonic() - t0 < 10.0
