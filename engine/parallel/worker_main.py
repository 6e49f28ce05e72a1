"""A tensor-parallel rank > 0: `python -m engine.parallel.worker_main --rank R ...`.

Contract: started by rank 0 (engine/parallel/workers.py) with the model path, the engine
config as JSON, the group's size and rendezvous port. It joins the group, builds its runner
exactly as rank 0 does (runner_factory.build_runner: same files, its own shard), then runs
every step rank 0 broadcasts until the stop message; exit code 0 after a stop, 1 on any
failure (rank 0 sees the closed connection or the exit). SIGINT and SIGTERM are ignored: a
terminal's Ctrl-C or a signal to the process group reaches rank 0, which drains and then
stops every rank itself; if rank 0 dies, the pending broadcast fails and this rank exits.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path

log = logging.getLogger("tgserve.engine")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tgserve-rank")
    for flag, kind in (("--rank", int), ("--world", int), ("--port", int), ("--threads", int)):
        parser.add_argument(flag, type=kind, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(
        level="INFO", format=f"%(asctime)s %(levelname)s rank {args.rank}: %(message)s"
    )
    import torch

    from engine.config import EngineConfig, resolve_device
    from engine.runner_factory import build_runner
    from models.parallel import init_group

    torch.set_num_threads(args.threads)
    config = EngineConfig(**json.loads(args.config))
    device = torch.device(resolve_device(config.device, torch.cuda.is_available()))
    group = init_group(args.rank, args.world, args.port, device)
    try:
        runner = build_runner(Path(args.model), config, False, group).runner
        channel = runner.parallel.channel
        while (step := channel.receive()) is not None:
            runner.run(step)
    except Exception:
        log.exception("rank %d failed", args.rank)
        return 1
    group.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
