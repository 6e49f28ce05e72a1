"""ParallelRank: a model runner's place in a tensor-parallel group, and on rank 0 the group's
lifetime.

Contract: a frozen bundle of the process group, the rank's shard layout (which heads, KV
heads, columns and vocabulary rows it holds), the step channel rank 0 broadcasts on, and on
rank 0 the other ranks' processes (`workers`, engine/parallel/workers.py). On rank 0:
`watch_failures(on_failure)` calls `on_failure(reason)` once when another rank's process exits
on its own; `close()` tells the other ranks to stop, waits for their processes (terminated if
they do not exit) and leaves the group. Both do nothing on the other ranks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.parallel.step_channel import StepChannel
from models.parallel import ParallelGroup, ShardLayout

STOP_TIMEOUT_S = 10.0  # how long rank 0 waits for the other ranks to exit before terminating


@dataclass(frozen=True)
class ParallelRank:
    group: ParallelGroup
    layout: ShardLayout
    channel: StepChannel
    workers: Any = None  # WorkerSet on rank 0, None on the others

    @property
    def is_driver(self) -> bool:
        """Rank 0 schedules, samples and broadcasts; the others follow its steps."""
        return self.group.rank == 0

    def watch_failures(self, on_failure: Callable[[str], None]) -> None:
        if self.workers is not None:
            self.workers.watch(on_failure)

    def close(self) -> None:
        if self.workers is None:
            return
        # A rank may be gone already: the processes are stopped below anyway.
        with contextlib.suppress(Exception):
            self.channel.send_stop()
        self.workers.stop(timeout=STOP_TIMEOUT_S)
        self.group.close()
