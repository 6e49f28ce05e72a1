"""The steady decode step as columns (issue 38): while the running order stays the same list
(`RequestQueues.by_priority`, `SchedulerOutput.running_order`), a step's chunks are every
running request's one-token decode in that order, so the step is held as three columns (the
order, its sequences, each one's start) instead of one `ScheduledChunk` per row.

Contract:
- `KeptColumns.after(last, output, delivering, waiting)`: what a built step leaves for the
  next: a decodes-only step in a running order, its sequences and its count of streamed rows
  (`of`), or None when a request of it could change its sequences while it runs (n > 1,
  beams: never a plain row's) or someone waits.
- `place_kept(builder, kept) -> DecodeColumns | None` places the step's decodes when the
  running order is still `kept.order` (None: nothing kept), no request waits and none has proposals: per row the
  decode pass's checks (decode_pass.py: one uncomputed token, its last block its own or a
  free block to open), its blocks opened in the same order, its totals written to the
  builder. None when a row needs the general pass, which then runs from the start (a block a
  row opened here is found open there: the same blocks either way).
- `DecodeColumns` is a `Sequence[ScheduledChunk]` (chunk i built on demand: request i, seq i,
  start i, one token, sampled), so any reader of chunks reads it; the readers of every step
  (the scheduler's `on_step_done`, the landing in plain_rows.py, the overlapped loop's hold,
  `StepInputs` through `decode_inputs`, the carried inputs through `with_carried`) read the
  columns by index.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from engine.requests.request import Request, TokenSequence
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.request_queues import RequestQueues
from engine.scheduling.step_plan import Proposals, ScheduledChunk, SchedulerOutput


class DecodeColumns(Sequence[ScheduledChunk]):
    __slots__ = ("requests", "seqs", "starts", "carried")

    def __init__(
        self,
        requests: list[Request],
        seqs: list[TokenSequence],
        starts: list[int],
        carried: dict[int, int] | None = None,
    ) -> None:
        self.requests = requests  # the running order (not modified)
        self.seqs = seqs  # each request's one sequence
        self.starts = starts  # each one's num_computed_tokens before the step
        # row -> its input token, drawn by the step before (a chunk's `carried_input`; the
        # runner sets it: engine/carried_inputs.py)
        self.carried = carried or {}

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i):  # an int: its chunk; a slice: a tuple of them
        if isinstance(i, slice):
            return tuple(self[k] for k in range(*i.indices(len(self))))
        carried = self.carried.get(i) if self.carried else None
        return ScheduledChunk(self.requests[i], self.seqs[i], self.starts[i], 1, True, (), carried)

    def __iter__(self) -> Iterator[ScheduledChunk]:
        if self.carried:
            yield from (self[i] for i in range(len(self)))
            return
        for request, seq, start in zip(self.requests, self.seqs, self.starts, strict=True):
            yield ScheduledChunk(request, seq, start, 1, True)

    def with_carried(self, carried: dict[int, int]) -> DecodeColumns:
        """The same rows, row i's input `carried[i]` where given (the runner's resolve)."""
        return DecodeColumns(self.requests, self.seqs, self.starts, carried)

    def decode_inputs(self) -> tuple[list[int], list[int], list[Request]]:
        """Each row's input token, position and request: what a runner's step inputs read
        (engine/step_inputs.py), by index."""
        ids = [seq.token_ids[start] for seq, start in zip(self.seqs, self.starts, strict=True)]
        for i, token in self.carried.items():
            ids[i] = token
        return ids, self.starts, self.requests


@dataclass(frozen=True)
class KeptColumns:
    order: list[Request]
    seqs: list[TokenSequence]
    delivering: int  # rows of streamed requests

    @classmethod
    def of(
        cls, order: list[Request], chunks: Sequence[ScheduledChunk], delivering: int
    ) -> KeptColumns | None:
        for request in order:
            p = request.params
            if len(request.seqs) != 1 or p.use_beam_search or p.n > 1 or (p.best_of or 1) > 1:
                return None
        return cls(order, [c.seq for c in chunks], delivering)

    @classmethod
    def after(
        cls, last: KeptColumns | None, output: SchedulerOutput, delivering: int, waiting: bool
    ) -> KeptColumns | None:
        """What a built step leaves for the next: `last` again while its order stays (also
        when a row of it took the general pass), else the step's running order when every
        chunk is its decode and nobody waits (`delivering`: its streamed rows)."""
        order, chunks = output.running_order, output.chunks
        if type(chunks) is DecodeColumns or (last is not None and last.order is order):
            return last
        if order is None or not chunks or waiting:
            return None
        return cls.of(order, chunks, delivering)


class ColumnBuilder(Protocol):
    """What `place_kept` reads and moves of the step being built (step_builder.py)."""

    queues: RequestQueues
    block_manager: BlockManager
    proposals: Proposals
    budget: int
    decode_tokens: int
    inline_plans: int
    pairs: int
    delivering: int


def place_kept(builder: ColumnBuilder, kept: KeptColumns | None) -> DecodeColumns | None:
    if kept is None:
        return None
    queues, seqs = builder.queues, kept.seqs
    if queues.by_priority() is not kept.order or queues.waiting or builder.proposals.tokens:
        return None
    rows = len(seqs)
    if builder.budget < rows:
        return None
    bm = builder.block_manager
    block_size, refs = bm.block_size, bm.ref_counts
    starts: list[int] = []
    add = starts.append
    for seq in seqs:
        start = seq.num_computed_tokens
        if len(seq.token_ids) != start + 1:
            return None
        table = seq.block_table
        index = start // block_size
        if index < len(table):
            if refs[table[index]] != 1:
                return None
        elif index == len(table) and bm.num_free_blocks > 0:
            bm.append(seq, 1)  # the token opens a block
        else:
            return None
        add(start)
    builder.budget -= rows
    builder.decode_tokens += rows
    builder.inline_plans += rows
    builder.pairs += sum(starts) + rows  # chunk_pairs(start, 1) = start + 1
    builder.delivering += kept.delivering
    return DecodeColumns(kept.order, seqs, starts)
