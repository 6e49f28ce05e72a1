"""The ranks' processes seen from the process that started them: start, watch, stop.

Contract:
- `start_ranks(model_path, config, cluster)` (rank 0): opens the rendezvous
  (engine/parallel/membership.py: the config published for every rank), starts the other ranks
  of its own node as `python -m engine.parallel.worker_main` processes (the same interpreter
  and environment), waits for every rank of every node to check in (`RendezvousError` naming
  the missing nodes after `cluster.init_timeout_s`; at once when a rank's process dies
  starting), joins the process group (gloo on CPU, NCCL on CUDA) and returns
  (WorkerSet, ParallelGroup). On any failure the ranks it started are stopped. Joining the
  process group cannot be interrupted (it waits out the collective timeout, minutes, for a
  rank that is gone), so it runs under `WorkerSet.guard_start`: a thread that ends this
  process, the reason logged, as soon as a rank's process ends or its heartbeat stops, or
  when the group has not formed within the init timeout.
- `spawn_ranks(ranks, cluster, model_path, threads)`: those processes alone (a node other than
  rank 0's starts the rest of its ranks with it).
- `WorkerSet.watch(on_failure)`: a daemon thread calls `on_failure(reason)` once when a local
  rank's process exits while it was not asked to stop (a local process, or any rank's
  liveness connection closing: engine/parallel/liveness.py), or a rank's heartbeat stops (a
  node cut off; rank 0 then fails /health and exits non-zero, see AsyncEngine.kill);
  it notices within `POLL_SECONDS` (a heartbeat: `HEARTBEAT_TIMEOUT_S`). If the group is not
  being stopped `STUCK_GRACE_S` later (the engine's step waits in a collective on a peer cut
  off without a closed connection, which gloo would wait out for minutes), it ends the
  process itself (`exit_process(1)`, the reason logged).
- `WorkerSet.stop(timeout)`: waits up to `timeout` for the local ranks to exit and every rank
  to acknowledge the stop message (`ParallelRank.close` sends it), then SIGTERM... SIGKILL
  what is left here: no orphan process.
Each rank of a node gets an equal share of its CPU cores as its thread count.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import torch

from engine.config import EngineConfig, resolve_device
from engine.parallel.cluster import LOOPBACK, Cluster
from engine.parallel.membership import Membership
from models.parallel import ParallelGroup, exit_rank, free_port, init_group

log = logging.getLogger("tgserve.engine")

POLL_SECONDS = 0.5
# After a failure, how long the engine gets to end its loop and stop the group before this
# process ends itself: a step waiting in a collective on a peer that is cut off (no closed
# connection to see) would otherwise wait out the collective timeout (minutes), unhealthy.
STUCK_GRACE_S = 10.0


class WorkerSet:
    def __init__(
        self,
        procs: dict[int, subprocess.Popen],
        members: Membership | None,
        exit_process: Callable[[int], None] = exit_rank,
    ) -> None:
        self.procs = procs  # rank -> its process, for the ranks this process started
        self.members = members
        self._exit = exit_process
        self._stopping = False
        self._watcher: threading.Thread | None = None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]

    def dead(self) -> str | None:
        for rank, proc in self.procs.items():
            if (code := proc.poll()) is not None:
                return f"tensor-parallel rank {rank} (pid {proc.pid}) exited with {code}"
        return self.members.gone() if self.members is not None else None

    def _failure(self) -> str | None:
        reason = self.dead()
        if reason is None and self.members is not None:
            with contextlib.suppress(Exception):  # the store is closing: stopping
                reason = self.members.stale()
        return reason

    @contextlib.contextmanager
    def guard_start(self, timeout: float) -> Iterator[None]:
        formed = threading.Event()

        def loop() -> None:
            deadline = time.monotonic() + timeout
            while not formed.wait(POLL_SECONDS):
                reason = self._failure()
                if reason is None and time.monotonic() > deadline:
                    reason = f"the process group did not form within {timeout:g}s"
                if reason is not None and not formed.is_set():
                    log.error(
                        "%s while the parallel group was forming; ending this process", reason
                    )
                    for proc in self.procs.values():
                        proc.kill()
                    self._exit(1)
                    return

        threading.Thread(target=loop, name="tgserve-group-start", daemon=True).start()
        try:
            yield
        finally:
            formed.set()

    def watch(self, on_failure: Callable[[str], None]) -> None:
        if self._watcher is not None:
            raise RuntimeError("WorkerSet.watch() was called twice")

        def loop() -> None:
            while not self._stopping:
                reason = self._failure()
                if reason is not None and not self._stopping:
                    log.error("%s; the replica cannot go on", reason)
                    on_failure(reason)
                    self._end_if_stuck(reason)
                    return
                time.sleep(POLL_SECONDS)

        self._watcher = threading.Thread(target=loop, name="tgserve-ranks", daemon=True)
        self._watcher.start()

    def _end_if_stuck(self, reason: str) -> None:
        deadline = time.monotonic() + STUCK_GRACE_S
        while not self._stopping and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        if not self._stopping:
            log.error(
                "the engine is still inside a step %.0fs after: %s (a collective waits on a "
                "peer that is cut off); ending this process",
                STUCK_GRACE_S,
                reason,
            )
            self._exit(1)

    def stop(self, timeout: float) -> None:
        self._stopping = True
        end = time.monotonic() + timeout
        for proc in self.procs.values():
            _wait(proc, max(0.0, end - time.monotonic()))
        if self.members is not None and timeout > 0:
            try:
                self.members.await_stopped(max(0.1, end - time.monotonic()))
            except Exception as exc:  # a rank on another node already gone, or stuck
                log.warning("not every rank acknowledged the stop: %s", exc)
        if self.members is not None:
            self.members.close()
        for proc in self.procs.values():
            if proc.poll() is None:
                log.warning("rank pid %d did not stop in %.0fs; terminating it", proc.pid, timeout)
                proc.terminate()
                if not _wait(proc, 5.0):
                    proc.kill()
                    proc.wait()


def _wait(proc: subprocess.Popen, timeout: float) -> bool:
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def node_threads(cluster: Cluster, world: int) -> int:
    """Each rank of this node (torchrun's too) gets an equal share of its cores."""
    return max(1, (os.cpu_count() or 1) // len(cluster.ranks_on(cluster.node_rank, world)))


def spawn_ranks(
    ranks: list[int], cluster: Cluster, model_path: str, threads: int
) -> dict[int, subprocess.Popen]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    flags = {
        "--master-addr": cluster.master_addr,
        "--master-port": cluster.master_port,
        "--nnodes": cluster.nnodes,
        "--node-rank": cluster.node_rank,
        "--init-timeout": cluster.init_timeout_s,
        "--model": model_path,
        "--threads": threads,
    }
    argv = [sys.executable, "-m", "engine.parallel.worker_main"]
    argv += [str(x) for item in flags.items() for x in item]
    return {rank: subprocess.Popen([*argv, "--rank", str(rank)], env=env) for rank in ranks}


def start_ranks(
    model_path: str, config: EngineConfig, cluster: Cluster | None = None
) -> tuple[WorkerSet, ParallelGroup]:
    world = config.parallel_world_size
    cluster = cluster or Cluster()
    if cluster.master_port is None:  # one node: a free loopback port
        cluster = replace(cluster, master_addr=LOOPBACK, master_port=free_port())
    cluster.check_world(world)
    device = torch.device(resolve_device(config.device, torch.cuda.is_available()))
    threads = node_threads(cluster, world)
    if device.type == "cpu":
        torch.set_num_threads(threads)  # rank 0 too: the node's ranks share its cores
    members = Membership.lead(cluster, world, config)
    local = cluster.local_ranks(world)[1:]
    workers = WorkerSet(spawn_ranks(local, cluster, model_path, threads), members)
    if local:
        log.info("tensor parallel: started ranks %s (pids %s)", local, workers.pids)
    if cluster.nnodes > 1:
        log.info(
            "waiting up to %.0fs for %d node(s) to join at %s",
            cluster.init_timeout_s,
            cluster.nnodes - 1,
            members.address,
        )
    try:
        members.await_joined(workers.dead)
        with workers.guard_start(cluster.init_timeout_s):
            group = init_group(
                0, world, 0, device, store=members.store, master_addr=cluster.master_addr
            )
    except BaseException:
        workers.stop(timeout=0.0)
        raise
    return workers, group
