"""Rank 0's side of the other ranks' processes: start them, watch them, stop them.

Contract:
- `start_ranks(model_path, config)` starts ranks 1..N-1 as `python -m
  engine.parallel.worker_main` processes (the same interpreter and environment), joins their
  process group as rank 0 (gloo on CPU, NCCL on CUDA, rendezvous on a free loopback port) and
  returns (WorkerSet, ParallelGroup). If a rank never joins (it died starting), the
  rendezvous fails after `RENDEZVOUS_TIMEOUT` and the ranks started are stopped.
- `WorkerSet.watch(on_failure)`: a daemon thread calls `on_failure(reason)` once when a rank's
  process exits while it was not asked to stop (rank 0 then fails /health and exits
  non-zero, see AsyncEngine.kill); it notices within `POLL_SECONDS`.
- `WorkerSet.stop(timeout)`: waits up to `timeout` for the ranks to exit (after the stop
  message, `ParallelRank.close`), then SIGTERM... SIGKILL what is left: no orphan process.
Each rank gets an equal share of the CPU cores as its thread count.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import timedelta

import torch

from engine.config import EngineConfig, resolve_device
from models.parallel import ParallelGroup, free_port, init_group

log = logging.getLogger("tgserve.engine")

POLL_SECONDS = 0.5
RENDEZVOUS_TIMEOUT = timedelta(minutes=2)


class WorkerSet:
    def __init__(self, procs: list[subprocess.Popen]) -> None:
        self.procs = procs
        self._stopping = False
        self._watcher: threading.Thread | None = None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def watch(self, on_failure: Callable[[str], None]) -> None:
        if self._watcher is not None:
            raise RuntimeError("WorkerSet.watch() was called twice")

        def loop() -> None:
            while not self._stopping:
                for rank, proc in enumerate(self.procs, start=1):
                    code = proc.poll()
                    if code is not None and not self._stopping:
                        reason = f"tensor-parallel rank {rank} (pid {proc.pid}) exited with {code}"
                        log.error("%s; the replica cannot go on", reason)
                        on_failure(reason)
                        return
                time.sleep(POLL_SECONDS)

        self._watcher = threading.Thread(target=loop, name="tgserve-ranks", daemon=True)
        self._watcher.start()

    def stop(self, timeout: float) -> None:
        self._stopping = True
        end = time.monotonic() + timeout
        for proc in self.procs:
            _wait(proc, max(0.0, end - time.monotonic()))
        for proc in self.procs:
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


def start_ranks(model_path: str, config: EngineConfig) -> tuple[WorkerSet, ParallelGroup]:
    world = config.tensor_parallel_size
    device = torch.device(resolve_device(config.device, torch.cuda.is_available()))
    port = free_port()
    threads = max(1, (os.cpu_count() or 1) // world)
    env = dict(os.environ)
    if device.type == "cpu":
        torch.set_num_threads(threads)  # rank 0 too: the ranks share the cores
        env["OMP_NUM_THREADS"] = str(threads)
    settings = json.dumps(asdict(config))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "engine.parallel.worker_main",
                "--rank",
                str(rank),
                "--world",
                str(world),
                "--port",
                str(port),
                "--model",
                model_path,
                "--config",
                settings,
                "--threads",
                str(threads),
            ],
            env=env,
        )
        for rank in range(1, world)
    ]
    workers = WorkerSet(procs)
    log.info("tensor parallel: started ranks 1..%d (pids %s)", world - 1, workers.pids)
    try:
        group = init_group(0, world, port, device, RENDEZVOUS_TIMEOUT)
    except BaseException:
        workers.stop(timeout=0.0)
        raise
    return workers, group
