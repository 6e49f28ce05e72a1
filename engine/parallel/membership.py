"""Membership: who is in a parallel group, through the rendezvous store every rank reaches.

Contract (the store is a torch.distributed TCPStore at the cluster's master address; rank 0
hosts it unless torchrun's agent does):
- rank 0: `Membership.lead(cluster, world, config)` opens the store, publishes the engine
  config (every other rank builds its runner from it: one set of settings per group) and the
  address of its liveness listener (engine/parallel/liveness.py);
  `await_joined(alive)` waits until every rank checked in, and raises `RendezvousError`
  naming the nodes (and their ranks) still missing after `cluster.init_timeout_s` (or at once,
  naming the rank, when `alive()` reports a local rank's process dead or `gone()` a rank);
  `gone()` names a rank whose process ended (its liveness connection closed: at once);
  `stale()` names a rank whose heartbeat stopped (None while all beat) for
  `HEARTBEAT_TIMEOUT_S` once that rank said it serves, for the init timeout before (a loaded
  host may starve a starting rank's beats for seconds); `await_stopped(timeout)` waits for
  every live rank's acknowledgement of the stop message (one whose process ended sends none);
  `close()` ends the liveness listener.
- rank > 0: `Membership.join(cluster, rank)` connects (retrying until the init timeout: start
  order is free), reads the config, opens its liveness connection and checks in;
  `start_heartbeat()` beats every `HEARTBEAT_S` from a daemon thread, and calls
  `on_lost(reason)` (the rank then exits 1) if rank 0's store is gone or has not answered a
  beat for the init timeout while starting, `HEARTBEAT_TIMEOUT_S` once `serving()` said its
  runner is built (rank 0 died or is cut off: nothing would ever send a step again);
  `mark_stopped()` acknowledges the stop message (after it the heartbeat's failure is none).
- Test-only fault: a rank whose number is in `FAULT_EXIT_AFTER_JOIN` (an environment
  variable, comma-separated ranks) ends its process with code 3 right after checking in.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import timedelta

import torch.distributed as dist

from engine.config import EngineConfig
from engine.lora_config import LoraConfig
from engine.parallel.cluster import Cluster
from engine.parallel.liveness import LivenessServer, hold
from engine.speculative.config import SpeculativeConfig
from models.parallel.group import address_towards

log = logging.getLogger("tgserve.engine")

HEARTBEAT_S = 1.0
HEARTBEAT_TIMEOUT_S = 10.0  # a rank silent this long is gone (a step's wait is not silence)
_CONFIG = "tgserve/config"
_LIVENESS = "tgserve/liveness"  # host:port of rank 0's liveness listener
FAULT_EXIT_AFTER_JOIN = "TGSERVE_FAULT_EXIT_AFTER_JOIN"


class RendezvousError(RuntimeError):
    """The group could not be formed: which nodes or ranks are missing, and why."""


class Membership:
    def __init__(self, store: dist.Store, cluster: Cluster, world: int, rank: int) -> None:
        self.store = store
        # Heartbeats go through a connection of their own: one client runs one request at a
        # time, and torch.distributed's init waits on `store` (for the slowest rank's address)
        # for as long as that rank takes: beats sent behind it stopped for as long.
        self.beats = _open_store(cluster, is_master=False)
        self.cluster = cluster
        self.world = world
        self.rank = rank
        self._stopping = False
        self._seen: dict[int, tuple[int, float]] = {}  # rank -> (last beat, when it changed)
        self._silence_limit = cluster.init_timeout_s  # HEARTBEAT_TIMEOUT_S once serving
        self._serving: set[int] = set()  # on rank 0: the ranks past their start-up
        self.liveness: LivenessServer | None = None  # rank 0's listener
        self._link: socket.socket | None = None  # a rank > 0's connection to it: kept open

    @property
    def address(self) -> str:
        return f"{self.cluster.master_addr}:{self.cluster.master_port}"

    # ----- rank 0 ---------------------------------------------------------------------------
    @classmethod
    def lead(cls, cluster: Cluster, world: int, config: EngineConfig) -> Membership:
        store = _open_store(cluster, is_master=not cluster.agent_store)
        host = address_towards(cluster.master_addr)  # loopback when every rank is here
        liveness = LivenessServer(host)
        store.set(_LIVENESS, f"{host}:{liveness.port}")
        store.set(_CONFIG, json.dumps({"nnodes": cluster.nnodes, "engine": asdict(config)}))
        members = cls(store, cluster, world, 0)
        members.liveness = liveness
        return members

    def await_joined(self, alive: Callable[[], str | None] = lambda: None) -> None:
        deadline = time.monotonic() + self.cluster.init_timeout_s
        while missing := [r for r in range(1, self.world) if not self.store.check([_joined(r)])]:
            if (dead := alive() or self.gone()) is not None:
                raise RendezvousError(f"{dead} before the group was formed")
            if time.monotonic() > deadline:
                raise RendezvousError(self._missing_message(missing))
            time.sleep(0.1)
        hosts = {r: self.store.get(_joined(r)).decode() for r in range(1, self.world)}
        log.info("every rank joined the group at %s: %s", self.address, hosts)

    def _missing_message(self, missing: list[int]) -> str:
        by_node: dict[int, list[int]] = {}
        for rank in missing:
            by_node.setdefault(self.cluster.node_of(rank, self.world), []).append(rank)
        names = "; ".join(
            f"node {node} (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})"
            for node, ranks in sorted(by_node.items())
        )
        c = self.cluster
        hint = (
            f"start each with `tgserve serve --nnodes {c.nnodes} --node-rank N --master-addr "
            f"{c.master_addr} --master-port {c.master_port}`, check that it reaches "
            f"{self.address}, or raise --dist-init-timeout"
        )
        if set(by_node) == {0}:  # only this machine's own ranks: their processes are stuck
            hint = "see their log lines above"
        return (
            f"the parallel group at {self.address} is incomplete after "
            f"{c.init_timeout_s:.0f}s: {names} never joined; {hint}"
        )

    def gone(self) -> str | None:
        for rank in self.liveness.closed() if self.liveness is not None else []:
            node = self.cluster.node_of(rank, self.world)
            return f"node {node} (rank {rank}) closed its connection to rank 0: its process ended"
        return None

    def stale(self) -> str | None:
        now = time.monotonic()
        for rank in range(1, self.world):
            if rank not in self._serving and self.beats.check([_serving(rank)]):
                self._serving.add(rank)
            limit = HEARTBEAT_TIMEOUT_S if rank in self._serving else self.cluster.init_timeout_s
            beat = self.beats.add(_beat(rank), 0)
            last, since = self._seen.get(rank, (-1, now))
            if beat != last:
                self._seen[rank] = (beat, now)
            elif now - since > limit:
                node = self.cluster.node_of(rank, self.world)
                return (
                    f"node {node} (rank {rank}) stopped answering: no heartbeat for "
                    f"{now - since:.1f}s"
                )
        return None

    def await_stopped(self, timeout: float) -> None:
        ended = set(self.liveness.closed() if self.liveness is not None else [])
        keys = [_stopped(r) for r in range(1, self.world) if r not in ended]  # the ended: none
        if not keys:
            return
        self.store.set_timeout(timedelta(seconds=max(timeout, 0.1)))
        self.store.wait(keys)

    def close(self) -> None:
        if self.liveness is not None:
            self.liveness.close()

    # ----- ranks > 0 ------------------------------------------------------------------------
    @classmethod
    def join(cls, cluster: Cluster, rank: int | None = None) -> tuple[Membership, EngineConfig]:
        """`rank` None: the first of this node's ranks (known once rank 0's config is read)."""
        try:
            store = _open_store(cluster, is_master=False)
            published = json.loads(store.get(_CONFIG))
        except (RuntimeError, dist.DistError) as exc:
            raise RendezvousError(
                f"node {cluster.node_rank} could not reach rank 0's rendezvous at {cluster.master_addr}:"
                f"{cluster.master_port} within {cluster.init_timeout_s:.0f}s ({exc}); is the "
                "node with --node-rank 0 started, and its --master-port open to this host?"
            ) from None
        if published["nnodes"] != cluster.nnodes:
            raise RendezvousError(
                f"this node was started with --nnodes {cluster.nnodes}, rank 0 with "
                f"{published['nnodes']}: every node must be given the same"
            )
        config = config_from_dict(published["engine"])
        world = config.parallel_world_size
        cluster.check_world(world)
        if rank is None:
            rank = cluster.local_ranks(world)[0]
        members = cls(store, cluster, world, rank)
        host, port = store.get(_LIVENESS).decode().rsplit(":", 1)
        try:  # before checking in: once in, its end is seen at once
            members._link = hold(host, int(port), rank, cluster.init_timeout_s)
        except OSError as exc:
            raise RendezvousError(
                f"rank {rank} could not connect to rank 0's liveness port {host}:{port} ({exc}); "
                "the nodes must reach each other on any TCP port (gloo needs that too)"
            ) from None
        store.set(_joined(rank), f"node {cluster.node_rank} on {socket.gethostname()}")
        if str(rank) in os.environ.get(FAULT_EXIT_AFTER_JOIN, "").split(","):
            log.error(
                "rank %d: %s asks this rank to end after joining", rank, FAULT_EXIT_AFTER_JOIN
            )
            os._exit(3)
        return members, config

    def start_heartbeat(self, on_lost: Callable[[str], None]) -> None:
        answered = [time.monotonic()]  # when rank 0's store last took a beat

        def beat() -> None:
            while not self._stopping:
                try:
                    self.beats.add(_beat(self.rank), 1)
                except Exception as exc:  # the store's host (rank 0) is gone
                    if not self._stopping:
                        on_lost(f"lost rank 0's rendezvous at {self.address} ({exc})")
                    return
                answered[0] = time.monotonic()
                time.sleep(HEARTBEAT_S)

        def watch() -> None:  # a cut-off link closes nothing: a beat just never returns
            while not self._stopping:
                silent = time.monotonic() - answered[0]
                if silent > self._silence_limit:
                    on_lost(f"rank 0's rendezvous at {self.address} silent for {silent:.0f}s")
                    return
                time.sleep(HEARTBEAT_S)

        self.beats.set_timeout(timedelta(seconds=self._silence_limit))
        for target in (beat, watch):
            threading.Thread(target=target, name="tgserve-heartbeat", daemon=True).start()

    def serving(self) -> None:
        """Start-up is over (the runner is built): rank 0's silence now ends this rank after
        `HEARTBEAT_TIMEOUT_S`, not the init timeout."""
        self._silence_limit = HEARTBEAT_TIMEOUT_S
        self.beats.set_timeout(timedelta(seconds=HEARTBEAT_TIMEOUT_S))
        self.beats.set(_serving(self.rank), "1")

    def mark_stopped(self) -> None:
        self._stopping = True
        self.store.set(_stopped(self.rank), "1")


def config_from_dict(values: dict) -> EngineConfig:
    """An EngineConfig from its `asdict` form (the nested speculative and LoRA configs
    included: every rank builds its part of the adapters' bank)."""
    if isinstance(values.get("speculative"), dict):
        values = {**values, "speculative": SpeculativeConfig(**values["speculative"])}
    if isinstance(values.get("lora"), dict):
        values = {**values, "lora": LoraConfig(**values["lora"])}
    return EngineConfig(**values)


def _open_store(cluster: Cluster, is_master: bool) -> dist.TCPStore:
    # A client retries connecting until the timeout: a rank may start before rank 0.
    return dist.TCPStore(
        cluster.master_addr,
        cluster.master_port,
        is_master=is_master,
        timeout=timedelta(seconds=cluster.init_timeout_s),
        wait_for_workers=False,
    )


def _joined(rank: int) -> str:
    return f"tgserve/joined/{rank}"


def _beat(rank: int) -> str:
    return f"tgserve/beat/{rank}"


def _serving(rank: int) -> str:
    return f"tgserve/serving/{rank}"


def _stopped(rank: int) -> str:
    return f"tgserve/stopped/{rank}"
