"""A node that does not hold rank 0: `tgserve serve --nnodes N --node-rank R ...` with R > 0
(or a process torchrun started with RANK > 0). It serves no HTTP: its ranks follow rank 0's
steps.

Contract: `serve_follower_node(model_path, cluster)` joins rank 0's rendezvous (waiting up to
`cluster.init_timeout_s` for it: the nodes may start in any order), takes rank 0's engine
config, starts the rest of this node's ranks as processes (engine/parallel/workers.py), runs
the node's first rank in this process (engine/parallel/worker_main.serve_rank) until rank 0's
stop message or the group's failure, then stops its other ranks; returns the exit code (0
after a stop, 1 with the reason logged otherwise). `model_path` is this host's copy of the
model (the same files as rank 0's); None: the default model. SIGTERM is logged and otherwise
ignored: an orchestrator stopping the group signals every machine at once, and rank 0 first
drains its in-flight requests, which need this node's ranks, then sends the stop.
"""

from __future__ import annotations

import logging
import signal

from engine.parallel.cluster import Cluster
from engine.parallel.membership import Membership, RendezvousError
from engine.parallel.worker_main import serve_rank
from engine.parallel.workers import WorkerSet, node_threads, spawn_ranks

log = logging.getLogger("tgserve.engine")

STOP_TIMEOUT_S = 10.0  # how long this node's other ranks get to exit after the stop


def serve_follower_node(model_path: str | None, cluster: Cluster) -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    if model_path is None:
        from models.default_model import default_model_path

        model_path = str(default_model_path())
    log.info(
        "node %d of %d: joining rank 0 at %s:%s (waiting up to %.0fs)",
        cluster.node_rank,
        cluster.nnodes,
        cluster.master_addr,
        cluster.master_port,
        cluster.init_timeout_s,
    )
    try:
        members, config = Membership.join(cluster)
    except (RendezvousError, ValueError) as exc:
        log.error("%s", exc)
        return 1
    world = config.parallel_world_size
    threads = node_threads(cluster, world)
    others = cluster.local_ranks(world)[1:]
    workers = WorkerSet(spawn_ranks(others, cluster, model_path, threads), None)
    log.info("node %d: ranks %s of %d", cluster.node_rank, cluster.local_ranks(world), world)
    try:
        code = serve_rank(members, config, model_path, threads)
    finally:
        workers.stop(timeout=STOP_TIMEOUT_S)
    log.info("node %d: %s", cluster.node_rank, "stopped" if code == 0 else "failed")
    return code


def _on_sigterm(signum: int, frame: object) -> None:
    log.info("SIGTERM: this node keeps serving until rank 0, which drains first, stops it")
