"""A rank > 0: `python -m engine.parallel.worker_main --rank R --master-addr A ...`, and the
loop every rank > 0 runs (`serve_rank`), in such a process or in a node's `tgserve serve`.

Contract: `serve_rank(members, config, model_path, threads)` takes a rank that has joined the
rendezvous (engine/parallel/membership.py, which gave it rank 0's engine config), starts its
heartbeat, joins the process group, builds its runner exactly as rank 0 does
(runner_factory.build_runner: the same files on its own host, its own shard), tells the group
it serves (the heartbeat's timeout drops from the init timeout to seconds), then runs every
step rank 0 broadcasts until the stop message, which it acknowledges; it returns exit code 0
after a stop, 1 on any failure (logged: rank 0 sees the closed connection, the exit or the
silent heartbeat). If rank 0 dies, the pending broadcast fails or the heartbeat finds its
store gone, and the process ends with code 1 and the reason logged. `main` is the process:
SIGINT and SIGTERM are ignored there (a terminal's Ctrl-C or a signal to the process group
reaches the node's first process, which stops its ranks itself).
"""

from __future__ import annotations

import argparse
import logging
import signal
from pathlib import Path

from engine.config import EngineConfig
from engine.parallel.cluster import Cluster
from engine.parallel.membership import Membership

log = logging.getLogger("tgserve.engine")


def serve_rank(members: Membership, config: EngineConfig, model_path: str, threads: int) -> int:
    import torch

    from engine.config import resolve_device
    from engine.runner_factory import build_runner
    from models.parallel import exit_rank, init_group

    rank, cluster = members.rank, members.cluster

    def lost(reason: str) -> None:
        log.error("rank %d: %s; ending this rank", rank, reason)
        exit_rank(1)

    members.start_heartbeat(lost)
    torch.set_num_threads(threads)
    device = torch.device(resolve_device(config.device, torch.cuda.is_available()))
    world = members.world
    local_rank = rank - cluster.ranks_on(cluster.node_of(rank, world), world)[0]  # its GPU
    try:
        group = init_group(
            rank,
            world,
            0,
            device,
            store=members.store,
            master_addr=cluster.master_addr,
            local_rank=local_rank,
        )
        runner = build_runner(Path(model_path), config, False, group).runner
        channel = runner.parallel.channel
        members.serving()  # start-up is over: the heartbeat's short timeout from here on
        while (step := channel.receive()) is not None:
            runner.run(step)
    except Exception:
        log.exception("rank %d failed; ending it (the group cannot go on)", rank)
        return 1
    members.mark_stopped()
    group.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tgserve-rank")
    for flag, kind in (
        ("--rank", int),
        ("--master-port", int),
        ("--nnodes", int),
        ("--node-rank", int),
        ("--threads", int),
        ("--init-timeout", float),
        ("--master-addr", str),
        ("--model", str),
    ):
        parser.add_argument(flag, type=kind, required=True)
    args = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(
        level="INFO", format=f"%(asctime)s %(levelname)s rank {args.rank}: %(message)s"
    )
    cluster = Cluster(
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        init_timeout_s=args.init_timeout,
    )
    try:
        members, config = Membership.join(cluster, args.rank)
    except Exception:
        log.exception("rank %d could not join the group", args.rank)
        return 1
    return serve_rank(members, config, args.model, args.threads)


if __name__ == "__main__":
    from models.parallel import exit_rank

    exit_rank(main())  # not sys.exit: see exit_rank
