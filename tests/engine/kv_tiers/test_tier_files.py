"""The tiers' storage on its own: the block file format (every check that keeps a bad file from
being served), the disk tier's byte bound, LRU order and restart, and the RAM tier's bound.

Oracles: the tensor written (bit-for-bit equality after a round trip), hand-made damage (a
flipped payload byte, a cut file, a header naming another namespace, key or tokens) and
hand-worked LRU orders.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from array import array

import pytest
import torch

from engine.kv_tiers.block_file import encode_block, read_block_file, write_block_file
from engine.kv_tiers.disk_tier import DiskTier
from engine.kv_tiers.keys import TierNamespace, chained_block_hash
from engine.kv_tiers.ram_tier import RamTier

SHAPE = (2, 2, 4, 1, 8)  # [layers, K/V, block_size, kv_heads, head_dim]
NS = TierNamespace("model-a", "tok", "float32", "torch.float32", "cpu kernels", "1.0")
TOKENS = (5, 6, 7, 8)


def block(seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed)).to(dtype)


def read(path, namespace=NS, key=1, tokens=TOKENS, dtype=torch.float32):
    return read_block_file(path, namespace.digest, key, tokens, SHAPE, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_block_file_round_trips_bit_for_bit(tmp_path, dtype) -> None:
    kv = block(0, dtype)
    write_block_file(tmp_path / "b.kvb", encode_block(NS.digest, 1, TOKENS, kv))
    got, why = read(tmp_path / "b.kvb", dtype=dtype)
    assert why == "" and got is not None
    assert torch.equal(got.view(torch.uint8), kv.view(torch.uint8))
    assert [p.name for p in tmp_path.iterdir()] == ["b.kvb"]  # no temporary left behind


def test_damaged_or_stale_files_are_refused(tmp_path) -> None:
    data = encode_block(NS.digest, 1, TOKENS, block(0))
    path = tmp_path / "b.kvb"
    flipped = bytearray(data)
    flipped[-5] ^= 0x10  # one payload bit
    cases = {
        "checksum": bytes(flipped),
        "truncated payload": data[:-3],
        "truncated header": data[:20],
        "not a K/V block file": b"garbage" + data[7:],
    }
    for expected, content in cases.items():
        path.write_bytes(content)
        got, why = read(path)
        assert got is None and expected in why, (expected, why)
    path.write_bytes(data)
    other = TierNamespace("model-b", "tok", "float32", "torch.float32", "cpu kernels", "1.0")
    newer = dataclasses.replace(NS, version="2.0")
    assert read(path, namespace=other)[1] == "stale (other namespace)"
    assert read(path, namespace=newer)[1] == "stale (other namespace)"
    assert read(path, key=2)[1] == "stale (other key)"
    assert read(path, tokens=(5, 6, 7, 9))[1] == "stale (other tokens)"
    assert read(path, dtype=torch.bfloat16)[0] is None
    assert read(path)[1] == ""


def test_chained_hash_covers_the_prefix_and_is_stable() -> None:
    a = chained_block_hash(None, (1, 2))
    assert a == chained_block_hash(None, (1, 2))
    assert chained_block_hash(a, (3, 4)) != chained_block_hash(
        chained_block_hash(None, (1, 9)), (3, 4)
    )
    assert chained_block_hash(0, (1, 2)) != a  # a zero parent is not "no parent"
    # Fixed by the algorithm, not the process: a file written by another process keeps its key.
    digest = hashlib.blake2b(bytes(16) + b"\x00" + array("q", (1, 2)).tobytes(), digest_size=16)
    assert a == int.from_bytes(digest.digest(), "little")


def test_disk_tier_evicts_least_recently_used_and_survives_a_restart(tmp_path) -> None:
    size = len(encode_block(NS.digest, 1, TOKENS, block(0)))
    disk = DiskTier(str(tmp_path), limit_bytes=3 * size)
    for key in (1, 2, 3):
        disk.write(NS, key, TOKENS, block(key))
    assert disk.read(NS, 1, TOKENS, SHAPE, torch.float32) is not None  # 1 is now the newest
    disk.write(NS, 4, TOKENS, block(4))  # over the bound: 2, the least recently used, goes
    assert [disk.has(NS, k) for k in (1, 2, 3, 4)] == [True, False, True, True]
    assert disk.bytes_held == 3 * size and len(list(tmp_path.iterdir())) == 3
    # Modification times carry the order into the next process's scan (1 s apart, to be sure).
    for age, key in enumerate((4, 1, 3)):
        path = tmp_path / (NS.file_stem(key) + ".kvb")
        os.utime(path, (1000 + age, 1000 + age))
    again = DiskTier(str(tmp_path), limit_bytes=3 * size)
    got = again.read(NS, 3, TOKENS, SHAPE, torch.float32)
    assert got is not None and torch.equal(got, block(3))
    again.write(NS, 5, TOKENS, block(5))  # evicts 4, the oldest by the scan
    assert [again.has(NS, k) for k in (1, 3, 4, 5)] == [True, True, False, True]
    smaller = DiskTier(str(tmp_path), limit_bytes=2 * size)  # a lower bound applies at start
    assert smaller.bytes_held == 2 * size and not smaller.has(NS, 1)


def test_disk_tier_removes_a_file_that_fails_its_checks(tmp_path) -> None:
    disk = DiskTier(str(tmp_path), limit_bytes=1 << 20)
    disk.write(NS, 1, TOKENS, block(1))
    path = tmp_path / (NS.file_stem(1) + ".kvb")
    path.write_bytes(path.read_bytes()[:-1])
    assert disk.read(NS, 1, TOKENS, SHAPE, torch.float32) is None
    assert disk.rejected == 1 and not path.exists() and not disk.has(NS, 1)
    assert disk.bytes_held == 0


def test_ram_tier_bound_and_lru_order() -> None:
    nbytes = block(0).numel() * 4
    ram = RamTier(limit_bytes=2 * nbytes)
    ram.put(1, TOKENS, block(1))
    ram.put(2, TOKENS, block(2))
    assert ram.get(1, TOKENS) is not None  # 1 is now the newest
    ram.put(3, TOKENS, block(3))
    assert ram.lru_keys() == [1, 3] and ram.bytes_held == 2 * nbytes
    assert ram.get(3, (0, 0, 0, 0)) is None  # another block's tokens: a miss
    ram.put(9, TOKENS, torch.zeros(3 * block(0).numel()))  # larger than the bound: not kept
    assert ram.lru_keys() == [1, 3]


def test_queued_disk_writes_are_bounded_and_a_failing_disk_costs_only_the_tier(tmp_path) -> None:
    """While the disk is stuck, writes queue up to the RAM tier's bound and the rest are
    skipped (they stay in RAM); a write that fails is logged, and flush still returns."""
    import threading

    from engine.kv_tiers.config import KVTierConfig
    from engine.kv_tiers.moves import TierMoves
    from engine.kv_tiers.tier_store import TierStore

    pool = [(torch.randn(8, 4, 1, 8), torch.randn(8, 4, 1, 8)) for _ in range(2)]  # 8 blocks
    nbytes = block(0).numel() * 4
    store = TierStore(KVTierConfig(3 * nbytes, str(tmp_path)), NS, pool)
    gate, calls = threading.Event(), []

    def stuck_write(namespace, key, tokens, kv) -> None:
        calls.append(key)
        gate.wait(10)
        if key == 2:
            raise OSError(28, "No space left on device")

    store.disk.write = stuck_write
    saves = tuple((b, b + 1, TOKENS) for b in range(6))
    store.transfer(pool, TierMoves(saves=saves))
    assert store.skipped_writes == 3  # three blocks' bytes fill the queue's bound
    assert store.ram.lru_keys() == [4, 5, 6]  # the RAM tier keeps its own LRU bound
    gate.set()
    store.flush()  # the failed write (key 2) is logged, not raised
    assert sorted(calls) == [1, 2, 3]
    got = store.ram.get(6, TOKENS)
    assert got is not None and torch.equal(got.kv[1, 0], pool[1][0][5])  # layer 1, K, block 5
