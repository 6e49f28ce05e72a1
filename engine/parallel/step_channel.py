"""StepChannel: rank 0 sends each step's packed inputs to the other ranks in ONE broadcast.

Contract: rank 0 calls `send(step)` before running a step and `send_stop()` once at the end;
every other rank calls `receive()`, which returns the step's `StepInputs`, or None for stop.
The broadcast buffer has a fixed capacity (every rank holds the same one): its first element
is the payload's length, so a step fits in one broadcast. A step larger than the buffer
(rare: the capacity is sized from the engine's limits) is announced by a negative length,
`-new_capacity`; every rank then grows its buffer and a second broadcast carries the step.
A LoRA adapter's load into a bank slot (`send_load(slot, name, path)`, rank 0, between steps)
is announced by the length `_LOAD` (-1: a grow is at least -4) and its payload [slot, nbytes,
utf-8 bytes of name NUL path]; `receive()` hands it to `on_load(slot, name, path)` (the
rank's runner sets it) and waits for the next message, so every rank writes the same slot
before the step that reads it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.step_inputs import StepInputs
from models.parallel import ParallelGroup

_STOP = 0  # payload length 0: no more steps
_LOAD = -1  # an adapter load (a grow announces -2 * (n + 1) <= -4)


class StepChannel:
    def __init__(self, group: ParallelGroup, capacity: int) -> None:
        self.group = group
        self.buffer = torch.zeros(max(capacity, 64), dtype=torch.int64, device=group.device)
        self.on_load: Callable[[int, str, str], None] | None = None

    def send(self, step: StepInputs) -> None:
        payload = step.pack()
        self._send(payload.numel(), payload)

    def send_load(self, slot: int, name: str, path: str) -> None:
        text = list(f"{name}\0{path}".encode())
        self._send(_LOAD, torch.tensor([slot, len(text), *text], dtype=torch.int64))

    def _send(self, header: int, payload: torch.Tensor) -> None:
        n = payload.numel()
        if n + 1 > self.buffer.numel():
            grown = 2 * (n + 1)
            self.buffer[0] = -grown
            self.group.broadcast(self.buffer)
            self.buffer = torch.zeros(grown, dtype=torch.int64, device=self.group.device)
        self.buffer[0] = header
        self.buffer[1 : n + 1] = payload.to(self.buffer.device)
        self.group.broadcast(self.buffer)

    def send_stop(self) -> None:
        self.buffer[0] = _STOP
        self.group.broadcast(self.buffer)

    def receive(self) -> StepInputs | None:
        while True:
            self.group.broadcast(self.buffer)
            n = int(self.buffer[0])
            if n == _LOAD:
                self._load()
            elif n < 0:  # it did not fit: grow, then it comes in the next broadcast
                self.buffer = torch.zeros(-n, dtype=torch.int64, device=self.group.device)
            elif n == _STOP:
                return None
            else:
                return StepInputs.unpack(self.buffer[1 : n + 1].cpu())

    def _load(self) -> None:
        slot, size = (int(v) for v in self.buffer[1:3])
        name, path = bytes(self.buffer[3 : 3 + size].tolist()).decode().split("\0", 1)
        if self.on_load is None:
            raise RuntimeError("an adapter load reached a rank without a LoRA bank")
        self.on_load(slot, name, path)


def step_capacity(max_num_batched_tokens: int, max_num_seqs: int, max_blocks_per_seq: int) -> int:
    """Elements a packed step of the engine's largest shape needs (header + rows + tables)."""
    chunks = max_num_seqs
    return 8 + 3 * max_num_batched_tokens + chunks * (4 + max_blocks_per_seq) + 2 * chunks + chunks
