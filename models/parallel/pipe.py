"""The pipeline's process groups and its point-to-point links between stages.

Contract: ranks are numbered stage-major: rank = stage * tp + t, so stage s holds ranks
[s * tp, (s + 1) * tp) (a node of a multi-node group holds whole stages when the node count
divides the stage count: tensor parallel inside a machine, pipeline across machines).
`init_pipeline(world, tp, stages)` is called by every rank of the world group (it creates
every stage's tensor-parallel group, in the same order on all) and returns the rank's `Pipe`:
its stage, its stage's `tensor` group (the one its sharded layers all-reduce over; `world`
stays the group the step is broadcast on), and the links:
- `send_next(t, tag)` / `recv_prev(shape, dtype, tag)`: hidden states from rank r to r + tp
  (the same tensor-parallel index of the next stage);
- `send_first(t, tag)` / `recv_last(shape, dtype, tag)`: the last stage's output back to
  stage 0 (rank t of the last stage to rank t).
Sends and receives are asynchronous (torch.distributed isend / irecv: gloo on CPU, NCCL on
CUDA) and return a handle whose `wait()` completes them; the shapes are never sent: every
rank knows them from the step. A dead peer makes `wait()` raise (the closed connection).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from models.parallel.group import ParallelGroup


@dataclass(frozen=True)
class Pipe:
    stage: int
    stages: int
    world: ParallelGroup  # every rank: the step's broadcast
    tensor: ParallelGroup  # this stage's ranks: the sharded layers' collectives

    @property
    def tp(self) -> int:
        return self.tensor.world

    def send_next(self, t: torch.Tensor, tag: int) -> dist.Work:
        return dist.isend(t.contiguous(), self.world.rank + self.tp, tag=tag)

    def recv_prev(self, shape: tuple[int, ...], dtype: torch.dtype, tag: int) -> _Received:
        return self._recv(shape, dtype, self.world.rank - self.tp, tag)

    def send_first(self, t: torch.Tensor, tag: int) -> dist.Work:
        return dist.isend(t.contiguous(), self.tensor.rank, tag=tag)

    def recv_last(self, shape: tuple[int, ...], dtype: torch.dtype, tag: int) -> _Received:
        return self._recv(shape, dtype, (self.stages - 1) * self.tp + self.tensor.rank, tag)

    def _recv(self, shape: tuple[int, ...], dtype: torch.dtype, src: int, tag: int) -> _Received:
        buffer = torch.empty(shape, dtype=dtype, device=self.world.device)
        return _Received(buffer, dist.irecv(buffer, src, tag=tag))


@dataclass(frozen=True)
class _Received:
    tensor: torch.Tensor
    work: dist.Work

    def wait(self) -> torch.Tensor:
        self.work.wait()
        return self.tensor


def init_pipeline(world: ParallelGroup, tp: int, stages: int) -> Pipe:
    if tp * stages != world.world:
        raise ValueError(f"{stages} stages of {tp} ranks do not make a group of {world.world}")
    stage = world.rank // tp
    mine = world
    for s in range(stages):  # every rank creates every group, in the same order
        ranks = list(range(s * tp, (s + 1) * tp))
        pg = dist.new_group(ranks) if tp < world.world else world.pg
        if s == stage:
            mine = ParallelGroup(world.rank - s * tp, tp, world.device, pg)
    return Pipe(stage, stages, world, mine)
