"""The tensor-parallel process group: how ranks meet, and the three collectives the model
code uses.

Contract: `init_group(rank, world, port, device)` joins a torch.distributed group on loopback
(gloo on CPU, NCCL on CUDA; rank 0 hosts the rendezvous at `port`, see `free_port`), or
through a `store` the caller opened at `master_addr` (ranks on several hosts: gloo then binds
to the interface that reaches `master_addr`, see `bind_gloo_towards`), and returns a `ParallelGroup`: `all_reduce(t)` sums in place over the ranks (a row-parallel
layer's partial products, the vocabulary-parallel embedding), `gather_columns(t, width)` puts
every rank's [R, <= width] block side by side on every rank, `broadcast(t)` copies rank 0's
tensor to all, `all_reduce_min(n)` agrees on the smallest of an int. Every rank must call the same collectives in the same order. A dead peer makes
a pending collective raise (gloo sees the closed connection), never hang silently.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import struct
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# A collective waits at most this long for the slowest rank (a long prefill chunk included).
COLLECTIVE_TIMEOUT = timedelta(minutes=5)


def free_port() -> int:
    """A TCP port free on loopback now, for rank 0's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class ParallelGroup:
    rank: int
    world: int
    device: torch.device
    pg: Any  # torch.distributed.ProcessGroup

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, group=self.pg)
        return t

    def gather_columns(self, t: torch.Tensor, width: int) -> torch.Tensor:
        """t [R, w <= width] on each rank -> [R, world * width], rank r's block at r * width
        (a narrower block is zero-padded to `width`; the caller trims the padding)."""
        if t.shape[1] < width:
            t = torch.cat((t, t.new_zeros(t.shape[0], width - t.shape[1])), dim=1)
        parts = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(parts, t.contiguous(), group=self.pg)
        return torch.cat(parts, dim=1)

    def all_reduce_min(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.pg)
        return int(t.item())

    def broadcast(self, t: torch.Tensor) -> torch.Tensor:
        dist.broadcast(t, src=0, group=self.pg)
        return t

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def bind_gloo_towards(master_addr: str) -> None:
    """Makes gloo listen on the interface this host reaches `master_addr` through.

    Why: gloo binds by default to the address the host name resolves to, and falls back to
    loopback; on a host whose name resolves elsewhere (a network namespace, a container with a
    foreign /etc/hosts) the other hosts could never connect. gloo reads its interface from
    GLOO_SOCKET_IFNAME when the group is made, so it is set here, unless already given.
    """
    if "GLOO_SOCKET_IFNAME" in os.environ:
        return
    local = address_towards(master_addr)
    if local.startswith("127."):
        return  # one host: gloo's default (loopback) reaches every rank
    for _, name in socket.if_nameindex():
        if _ipv4_of(name) == local:
            os.environ["GLOO_SOCKET_IFNAME"] = name
            return


def address_towards(master_addr: str) -> str:
    """This host's IPv4 address on the route to `master_addr` (its own address if it is one
    of this host's: what the other hosts reach this one at)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((master_addr, 9))  # UDP: picks the route, sends nothing
        return probe.getsockname()[0]


def _ipv4_of(interface: str) -> str | None:
    siocgifaddr = 0x8915  # Linux: an interface's IPv4 address
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(
                s.fileno(), siocgifaddr, struct.pack("256s", interface[:15].encode())
            )
        except OSError:  # no IPv4 address on it
            return None
    return socket.inet_ntoa(packed[20:24])


def exit_rank(code: int) -> None:
    """Ends a rank's process now, skipping the interpreter's finalization (never returns).

    Why: a gloo worker thread may still hold the last collective's work, whose tensors came
    from Python, when the main thread finishes. If it releases them while the interpreter is
    finalizing, it must take the GIL, which a finalizing interpreter refuses by ending the
    thread, and std::terminate aborts the process (SIGABRT; seen in about 1 run in 10 of the
    TP tests on a busy 2-core host). Everything a rank reports has gone out by then (the step
    channel is synchronous); logs and stdio are flushed here.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def init_group(
    rank: int,
    world: int,
    port: int,
    device: torch.device,
    rendezvous_timeout: timedelta = COLLECTIVE_TIMEOUT,
    *,
    store: dist.Store | None = None,
    master_addr: str = "127.0.0.1",
    local_rank: int | None = None,
) -> ParallelGroup:
    """Joins the group; rank 0 waits at most `rendezvous_timeout` for the others to arrive.
    `local_rank`: the rank's index on its own host (its CUDA device; default `rank`)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        device = torch.device("cuda", rank if local_rank is None else local_rank)
        torch.cuda.set_device(device)
    else:
        bind_gloo_towards(master_addr)
    if store is None:
        store = dist.TCPStore(
            master_addr, port, world, is_master=rank == 0, timeout=rendezvous_timeout
        )
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT
    )
    return ParallelGroup(rank, world, device, dist.group.WORLD)
