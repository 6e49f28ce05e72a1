"""The decode pass of a step: the running requests' decodes placed first, higher priority first
(the scheduler's policy, item 2), into the `StepBuilder` being built.

Contract: `place_decodes(builder)` visits `builder.queues.by_priority()` once. The common decode
(one live sequence, one token, no proposal, going into the last block of its table, which it
alone holds, or into a fresh block while one is free: no copy, no preemption) is placed here,
inline, its plan its own `ScheduledChunk`, the builder's running totals (`budget`,
`decode_tokens`, `inline_plans`, `pairs`, `delivering`) kept in locals and written back before any other
request's decode goes through `builder.schedule_decode` (the general path, which may preempt
and reads the totals) and at the end. Why inline: the pass runs per row per step, and the
calls and attribute writes of the general path cost most of a decode step's host time
(issue 38). A request preempted earlier in the pass (no longer running) is skipped.
"""

from __future__ import annotations

from typing import Protocol

from engine.requests.request import Request, RequestStatus
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.request_queues import RequestQueues
from engine.scheduling.step_plan import Proposals, ScheduledChunk


class BuilderTotals(Protocol):
    """What the pass reads and moves of the step being built (step_builder.py's StepBuilder:
    a Protocol here, so this module does not import the class that calls it)."""

    queues: RequestQueues
    block_manager: BlockManager
    proposals: Proposals
    plans: dict[str, object]  # request id -> its plan (a decode placed here: its chunk)
    budget: int
    decode_tokens: int
    inline_plans: int  # plans that are their own chunk
    pairs: int
    delivering: int

    def schedule_decode(self, request: Request) -> None: ...


def place_decodes(builder: BuilderTotals) -> None:
    bm, plans, running = builder.block_manager, builder.plans, RequestStatus.RUNNING
    block_size, refs = bm.block_size, bm.ref_counts
    proposals = builder.proposals if builder.proposals.tokens else None
    budget, pairs, delivering = builder.budget, 0, 0
    for request in builder.queues.by_priority():
        if request.status is not running:
            continue
        seqs = request.seqs
        if len(seqs) == 1 and budget > 0:
            seq = seqs[0]
            start, table = seq.num_computed_tokens, seq.block_table
            index = start // block_size
            if len(seq.token_ids) == start + 1 and not (proposals and proposals.get(seq)):
                if index < len(table):
                    fits = refs[table[index]] == 1
                elif fits := (index == len(table) and bm.num_free_blocks > 0):
                    bm.append(seq, 1)  # the token opens a block
                if fits:
                    budget -= 1
                    pairs += start + 1  # chunk_pairs(start, 1)
                    delivering += request.params.streamed
                    plans[request.request_id] = ScheduledChunk(request, seq, start, 1, True)
                    continue
        _write_back(builder, budget, pairs, delivering)
        pairs = delivering = 0
        builder.schedule_decode(request)
        budget = builder.budget
    _write_back(builder, budget, pairs, delivering)


def _write_back(builder: BuilderTotals, budget: int, pairs: int, delivering: int) -> None:
    """The totals of the decodes placed inline since the last write-back (one row each)."""
    builder.decode_tokens += builder.budget - budget
    builder.inline_plans += builder.budget - budget
    builder.budget = budget
    builder.pairs += pairs
    builder.delivering += delivering
