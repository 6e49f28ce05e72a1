"""StepChannel: rank 0 sends each step's packed inputs to the other ranks in ONE broadcast.

Contract: rank 0 calls `send(step)` before running a step and `send_stop()` once at the end;
every other rank calls `receive()`, which returns the step's `StepInputs`, or None for stop.
The broadcast buffer has a fixed capacity (every rank holds the same one): its first element
is the payload's length, so a step fits in one broadcast. A step larger than the buffer
(rare: the capacity is sized from the engine's limits) is announced by a negative length,
`-new_capacity`; every rank then grows its buffer and a second broadcast carries the step.
"""

from __future__ import annotations

import torch

from engine.step_inputs import StepInputs
from models.parallel import ParallelGroup

_STOP = 0  # payload length 0: no more steps


class StepChannel:
    def __init__(self, group: ParallelGroup, capacity: int) -> None:
        self.group = group
        self.buffer = torch.zeros(max(capacity, 64), dtype=torch.int64, device=group.device)

    def send(self, step: StepInputs) -> None:
        payload = step.pack()
        n = payload.numel()
        if n + 1 > self.buffer.numel():
            grown = 2 * (n + 1)
            self.buffer[0] = -grown
            self.group.broadcast(self.buffer)
            self.buffer = torch.zeros(grown, dtype=torch.int64, device=self.group.device)
        self.buffer[0] = n
        self.buffer[1 : n + 1] = payload.to(self.buffer.device)
        self.group.broadcast(self.buffer)

    def send_stop(self) -> None:
        self.buffer[0] = _STOP
        self.group.broadcast(self.buffer)

    def receive(self) -> StepInputs | None:
        self.group.broadcast(self.buffer)
        n = int(self.buffer[0])
        if n < 0:  # the step did not fit: grow, then the step comes in a second broadcast
            self.buffer = torch.zeros(-n, dtype=torch.int64, device=self.group.device)
            self.group.broadcast(self.buffer)
            n = int(self.buffer[0])
        if n == _STOP:
            return None
        return StepInputs.unpack(self.buffer[1 : n + 1].cpu())


def step_capacity(max_num_batched_tokens: int, max_num_seqs: int, max_blocks_per_seq: int) -> int:
    """Elements a packed step of the engine's largest shape needs (header + rows + tables)."""
    chunks = max_num_seqs
    return 8 + 3 * max_num_batched_tokens + chunks * (4 + max_blocks_per_seq) + 2 * chunks + chunks
