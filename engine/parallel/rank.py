"""ParallelRank: what a model runner needs to know about its place in a tensor-parallel group.

Contract: a frozen bundle of the process group, the rank's shard layout (which heads, KV
heads, columns and vocabulary rows it holds), the step channel rank 0 broadcasts on, and on
rank 0 the other ranks' processes (`workers`, engine/parallel/workers.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.parallel.step_channel import StepChannel
from models.parallel import ParallelGroup, ShardLayout


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
