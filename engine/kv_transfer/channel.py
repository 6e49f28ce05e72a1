"""KVChannel: the two-rank gloo group between a prefill server (rank 0) and a decode server
(rank 1), and the wire format of a `BlockBatch` on it.

Contract: `KVChannel.open(role, host, port, timeout_s, block_shape, dtype)`: the decode server
hosts the rendezvous (a TCPStore on `port`, every interface) at `host`, the address the
prefill server reaches it by; each side waits at most `timeout_s` for the other, then raises
`KVPeerError` naming the address. The group is its own (`ProcessGroupGloo` over the store),
never torch.distributed's default group, so a server's tensor-parallel group is untouched.
Both sides then swap their block shape and dtype: a mismatch (another model's K/V) is a
`KVPeerError` at start-up. `send(batch)` (prefill) and `recv()` (decode) move one batch: a
header `[transfer_id, n, digest]` (int64), then, when n > 0, the keys (uint8 [n, 16]), the
tokens (int64 [n, block_size]) and the K/V bytes (uint8: bit-exact whatever the dtype). One
thread sends, one receives. A peer that dies makes a pending `send` / `recv` raise
(`KVPeerError`: gloo sees the closed connection); an idle `recv` waits for the next batch.
"""

from __future__ import annotations

import logging
import math
from datetime import timedelta

import torch
import torch.distributed as dist

from engine.kv_transfer.blocks import BlockBatch
from engine.kv_transfer.errors import KVPeerError
from models.parallel.group import bind_gloo_towards

log = logging.getLogger("tgserve.engine")
PREFILL_RANK, DECODE_RANK = 0, 1
IDLE_TIMEOUT = timedelta(days=30)  # a recv waits this long for the next batch: "forever"
# uint8: blocks of K and V rows of two layouts (engine/kv_tiers/block_layout.py)
_DTYPES = (
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.int8,
    torch.uint8,
)


class KVChannel:
    def __init__(self, pg, peer: str, block_shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self._pg = pg
        self.peer = peer  # "host:port" of the rendezvous, for messages
        self.block_shape = block_shape  # [layers, 2, block_size, kv_heads, head_dim]
        self.dtype = dtype
        self.block_bytes = math.prod(block_shape) * torch.empty((), dtype=dtype).element_size()

    @classmethod
    def open(
        cls,
        role: str,
        host: str,
        port: int,
        timeout_s: float,
        block_shape: tuple[int, ...],
        dtype: torch.dtype,
    ) -> KVChannel:
        peer = f"{host}:{port}"
        rank = DECODE_RANK if role == "decode" else PREFILL_RANK
        if role == "prefill":
            bind_gloo_towards(host)  # gloo listens where the decode host reaches us
        timeout = timedelta(seconds=timeout_s)
        try:
            store = dist.TCPStore(host, port, 2, is_master=rank == DECODE_RANK, timeout=timeout)
            store = dist.PrefixStore("tgserve-kv", store)
            pg = dist.ProcessGroupGloo(store, rank, 2, IDLE_TIMEOUT)
        except (RuntimeError, OSError) as exc:  # DistStoreError is a RuntimeError
            other = "prefill" if role == "decode" else "decode"
            raise KVPeerError(
                f"the {other} server did not join the K/V transfer group at {peer} within "
                f"{timeout_s:g}s ({type(exc).__name__})"
            ) from None
        channel = cls(pg, peer, tuple(block_shape), dtype)
        channel._check_peer(timeout)
        return channel

    def _check_peer(self, timeout: timedelta) -> None:
        mine = torch.tensor([*self.block_shape, _DTYPES.index(self.dtype)], dtype=torch.int64)
        theirs = torch.empty_like(mine)
        other = 1 - self._pg.rank()
        sent = self._pg.send([mine], other, 0)  # both posted first: a send waits for its recv
        received = self._pg.recv([theirs], other, 0)
        self._wait(received, timeout)
        self._wait(sent, timeout)
        if not torch.equal(mine, theirs):
            raise KVPeerError(
                f"the K/V transfer peer at {self.peer} holds other K/V: block shape and dtype "
                f"{theirs.tolist()} here {mine.tolist()} (serve the same model and --dtype)"
            )

    def send(self, batch: BlockBatch) -> None:
        n = len(batch.keys)
        header = torch.tensor([batch.transfer_id, n, batch.digest], dtype=torch.int64)
        self._wait(self._pg.send([header], DECODE_RANK, 0))
        if n == 0:
            return
        keys = torch.tensor([list(k.to_bytes(16, "little")) for k in batch.keys], dtype=torch.uint8)
        tokens = torch.tensor(batch.tokens, dtype=torch.int64)
        kv = batch.kv.contiguous().view(torch.uint8).reshape(-1)
        for part in (keys, tokens, kv):
            self._wait(self._pg.send([part], DECODE_RANK, 0))

    def recv(self) -> BlockBatch:
        header = torch.empty(3, dtype=torch.int64)
        self._wait(self._pg.recv([header], PREFILL_RANK, 0))
        transfer_id, n, digest = header.tolist()
        if n == 0:
            return BlockBatch(transfer_id, (), (), torch.empty(0, dtype=self.dtype), digest)
        keys = torch.empty((n, 16), dtype=torch.uint8)
        tokens = torch.empty((n, self.block_shape[2]), dtype=torch.int64)
        kv = torch.empty(n * self.block_bytes, dtype=torch.uint8)
        for part in (keys, tokens, kv):
            self._wait(self._pg.recv([part], PREFILL_RANK, 0))
        return BlockBatch(
            transfer_id,
            tuple(int.from_bytes(bytes(row), "little") for row in keys.tolist()),
            tuple(tuple(row) for row in tokens.tolist()),
            kv.view(self.dtype).reshape(n, *self.block_shape),
            digest,
        )

    def _wait(self, work, timeout: timedelta | None = None) -> None:
        try:
            work.wait() if timeout is None else work.wait(timeout)
        except RuntimeError as exc:  # gloo: "Connection closed by peer", a timeout
            log.warning("K/V transfer to or from %s failed: %s", self.peer, exc)
            raise KVPeerError(f"the K/V transfer peer at {self.peer} is gone") from None
