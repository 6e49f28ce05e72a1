"""Scheduler: which tokens of which sequences the next forward computes (pure Python, no torch).

Policy, every `schedule()`:
1. Aborts asked for since the last step take effect (waiting or running); their ids are reported
   in `SchedulerOutput.aborted` and their blocks are freed.
2. Running decodes first: one token per live sequence, higher priority first (a lower
   `SamplingParams.priority` value runs first, as vLLM's), within `max_num_batched_tokens`.
   With speculative decoding (`speculate_with(propose)`), a decode also carries the tokens
   `propose(request, seq)` guesses (cut to the budget left; dropped, before anyone is
   preempted, when the blocks for them are not free): its chunk then computes 1 + k rows.
3. Prefill: engine/scheduling/prefill_allotment.py shares the step's remaining budget
   (sized in tokens and time by engine/scheduling/prefill_budget.py) between running partial
   prefills and waiting requests, shortest remaining prefill first, the oldest (the anchor)
   always progressing, and a short prompt's first token never waiting for the middle of long
   prompts, whatever their `stream` setting; this module then places the running chunks and
   admits the waiting requests in that order, the anchor first; when one finds no blocks, nobody behind it is
   admitted in that step. A prompt longer than its share is chunked across steps. A sequence
   group (n > 1, beams) is scheduled as one unit and its sequences reach their sampling step
   together.
4. When a running request needs blocks and none are left, the running request with the lowest
   priority (the most recently admitted among equals) is preempted by recompute (blocks freed,
   `num_computed_tokens = 0` for all its sequences, back to waiting with its original arrival
   order, so it is the anchor soon), repeatedly, until the request fits or is itself the
   victim. No waiting request is admitted in a step that preempted.
5. Admission bound (the one rule, `EngineConfig.max_in_flight`): running + waiting requests
   never exceed `max_num_seqs + max_queued_requests`; `add_request` raises QueueFullError
   beyond it. AsyncEngine applies the same bound before queueing, so a server never meets it.

The update protocol between `schedule()` and the next one is in engine/scheduling/step_plan.py.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.errors import QueueFullError
from engine.requests.request import Request, RequestStatus, TokenSequence
from engine.scheduling.block_manager import BlockManager, PrefixMatch
from engine.scheduling.prefill_allotment import Allot, PrefillCandidates, allot_prefill
from engine.scheduling.prefill_budget import PrefillBudget
from engine.scheduling.step_cost import StepCostModel, chunk_pairs
from engine.scheduling.step_plan import (
    ScheduledChunk,
    SchedulerOutput,
    SchedulerStats,
    chunk_sizes,
)
from engine.types import FINISH_REASONS

__all__ = ["ScheduledChunk", "Scheduler", "SchedulerOutput", "SchedulerStats"]

# Speculative decoding: the tokens proposed after a running sequence's last one (may be none).
Propose = Callable[[Request, TokenSequence], tuple[int, ...]]


@dataclass
class _Plan:
    """What one request got in the step being built (undone if it is preempted later)."""

    chunks: list[ScheduledChunk]
    copies: list[tuple[int, int]]
    num_tokens: int


@dataclass
class _Step:
    budget: int
    plans: dict[str, _Plan] = field(default_factory=dict)
    preempted: list[str] = field(default_factory=list)
    decodes: set[str] = field(default_factory=set)  # request ids placed by the decode pass


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        block_manager: BlockManager,
        max_model_len: int,
        cost_model: StepCostModel | None = None,
    ) -> None:
        if block_manager.block_size != config.block_size:
            raise ValueError(
                f"block manager block_size {block_manager.block_size} != config {config.block_size}"
            )
        self.config = config
        self.block_manager = block_manager
        self.max_model_len = max_model_len
        # The step cost model the engine feeds with timed steps (None: no time target).
        self.cost_model = cost_model if cost_model is not None else StepCostModel()
        self._target_s = config.target_itl_ms / 1000 if config.target_itl_ms else None
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []  # admission order: among equals the last is preempted
        # No id registry here: the engine holds the one (request id -> its state and Request).
        self._pending_aborts: list[Request] = []
        self._arrival: dict[Request, int] = {}  # arrival order, kept across preemptions
        self._arrivals = itertools.count()
        self._num_preemptions = 0
        self._prefill_capacity = config.max_num_batched_tokens
        self._propose: Propose | None = None

    def speculate_with(self, propose: Propose | None) -> None:
        """Decodes carry `propose(request, seq)`'s tokens from the next step (None: none)."""
        self._propose = propose

    # ----- intake --------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queues a new request checked by `admission_check` (the engine does, once); raises
        QueueFullError when running + waiting requests are at `config.max_in_flight`."""
        rid = request.request_id
        if request.status is not RequestStatus.WAITING or request.seqs[0].num_computed_tokens:
            raise ValueError(f"request {rid!r} is not a fresh request")
        limit = self.config.max_in_flight
        if len(self._waiting) + len(self._running) >= limit:
            raise QueueFullError(
                f"the server has {limit} requests in flight (max_num_seqs "
                f"{self.config.max_num_seqs} + max_queued_requests "
                f"{self.config.max_queued_requests}); retry later"
            )
        self._waiting.append(request)
        self._arrival[request] = next(self._arrivals)

    def abort(self, request: Request) -> None:
        """Aborts at the next `schedule()`; finished or unknown requests are ignored."""
        self._pending_aborts.append(request)

    def has_work(self) -> bool:
        return bool(self._waiting or self._running or self._pending_aborts)

    # ----- the step ------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        aborted = self._apply_aborts()
        step = _Step(budget=self.config.max_num_batched_tokens)
        self._schedule_decodes(step)
        budget = self._prefill_budget(step)
        # the gauge: a prompt's chunk now, at least the anchor's floor
        left = budget.tokens_left
        self._prefill_capacity = max(budget.fit(0, left), budget.anchor_floor(0, left))
        self._schedule_prefills(step, budget)
        chunks = tuple(c for p in step.plans.values() for c in p.chunks)
        return SchedulerOutput(
            chunks=chunks,
            block_copies=tuple(c for p in step.plans.values() for c in p.copies),
            preempted=tuple(step.preempted),
            aborted=tuple(aborted),
            num_batched_tokens=sum(c.num_new_tokens for c in chunks),
            num_pairs=sum(chunk_pairs(c.start, c.num_new_tokens) for c in chunks),
            num_prefill_tokens=sum(
                p.num_tokens for rid, p in step.plans.items() if rid not in step.decodes
            ),
        )

    def _by_priority(self) -> list[Request]:
        return sorted(self._running, key=lambda r: r.params.priority)  # stable: admission order

    def _schedule_decodes(self, step: _Step) -> None:
        for request in self._by_priority():
            if request.status is not RequestStatus.RUNNING or request.request_id in step.plans:
                continue
            remaining = [s.num_uncomputed_tokens for s in request.live_seqs]
            if min(remaining) < 1:
                raise RuntimeError(
                    f"request {request.request_id!r} has a sequence with nothing to compute: "
                    "append the sampled token or finish the sequence before schedule()"
                )
            if max(remaining) == 1:
                sizes = chunk_sizes(remaining, step.budget)
                if sizes is not None:
                    proposals = self._proposals(request, step.budget - sum(sizes))
                    self._schedule_running(step, request, sizes, proposals)
                    step.decodes.add(request.request_id)

    def _proposals(self, request: Request, spare: int) -> list[tuple[int, ...]] | None:
        """Each live sequence's proposal, cut to the `spare` budget in order; None: none."""
        if self._propose is None:
            return None
        proposals = []
        for seq in request.live_seqs:
            proposal = self._propose(request, seq)[: max(spare, 0)]
            spare -= len(proposal)
            proposals.append(proposal)
        return proposals if any(proposals) else None

    def _schedule_running(
        self,
        step: _Step,
        request: Request,
        sizes: list[int],
        proposals: list[tuple[int, ...]] | None = None,
    ) -> None:
        bm = self.block_manager
        chunks = list(zip(request.live_seqs, sizes, strict=True))
        if proposals is not None:
            longer = [(s, n + len(p)) for (s, n), p in zip(chunks, proposals, strict=True)]
            if bm.blocks_to_append(longer) <= bm.num_free_blocks:
                chunks = longer
            else:  # speculation is the first thing to give up when blocks run short
                proposals = None
        while bm.blocks_to_append(chunks) > bm.num_free_blocks:
            victim = self._victim()
            self._preempt(victim, step)
            if victim is request:
                return
        copies = [c for s, n in chunks if n > 0 for c in bm.append(s, n)]
        self._add_plan(step, request, chunks, copies, proposals)

    def _victim(self) -> Request:
        """The lowest priority (highest value) running request; the latest admitted of those."""
        return max(reversed(self._running), key=lambda r: r.params.priority)

    def _prefill_budget(self, step: _Step) -> PrefillBudget:
        placed = [c for p in step.plans.values() for c in p.chunks]
        return PrefillBudget(
            tokens_left=step.budget,
            target_s=self._target_s,
            cost=self.cost_model,
            rows=sum(c.num_new_tokens for c in placed),
            pairs=sum(chunk_pairs(c.start, c.num_new_tokens) for c in placed),
            delivers=any(c.sample and c.request.params.streamed for c in placed),
        )

    def _schedule_prefills(self, step: _Step, budget: PrefillBudget) -> None:
        partials = [
            r
            for r in self._running
            if r.status is RequestStatus.RUNNING and r.request_id not in step.plans
        ]
        candidates = PrefillCandidates(
            partials=partials,
            waiting=[] if step.preempted else list(self._waiting),  # freed blocks: running first
            arrival=self._arrival,
            free_seats=self.config.max_num_seqs - sum(r.num_seq_slots for r in self._running),
            prefix_match=self._prefix_match,
        )
        allots = allot_prefill(candidates, budget)
        for allot in allots:
            if allot.matches is None and allot.request.status is RequestStatus.RUNNING:
                self._schedule_running(step, allot.request, allot.sizes)
        if step.preempted:
            return
        admits = [a for a in allots if a.matches is not None]
        admits.sort(key=lambda a: not a.is_anchor)  # the anchor picks blocks first
        for allot in admits:
            if not self._admit(step, allot):
                return  # nobody overtakes a request that waits for blocks

    def _admit(self, step: _Step, allot: Allot) -> bool:
        bm, request = self.block_manager, allot.request
        seqs = request.live_seqs
        # Matched again: the running chunks placed since phase 1 may have evicted cached blocks.
        matches = [self._prefix_match(request, s) for s in seqs]
        remaining = [s.num_tokens - m.num_tokens for s, m in zip(seqs, matches, strict=True)]
        sizes = chunk_sizes(remaining, sum(allot.sizes))
        if sizes is None:
            return False
        totals = [m.num_tokens + n for m, n in zip(matches, sizes, strict=True)]
        if bm.blocks_to_admit(matches, totals) > bm.num_free_blocks:
            return False
        bm.admit(seqs, matches, totals)
        for seq, match in zip(seqs, matches, strict=True):
            seq.num_computed_tokens = match.num_tokens
        if request.num_preemptions == 0:
            request.num_cached_prompt_tokens = min(m.num_tokens for m in matches)
        self._waiting.remove(request)
        request.status = RequestStatus.RUNNING
        self._running.append(request)
        self._add_plan(step, request, list(zip(seqs, sizes, strict=True)), [])
        return True

    def _prefix_match(self, request: Request, seq: TokenSequence) -> PrefixMatch:
        if request.params.prompt_logprobs is not None:  # every prompt row's logits are wanted
            return PrefixMatch((), 0, seq.num_tokens)
        return self.block_manager.match_prefix(seq.token_ids)

    def _add_plan(
        self,
        step: _Step,
        request: Request,
        chunks: list[tuple[TokenSequence, int]],
        copies: list[tuple[int, int]],
        proposals: list[tuple[int, ...]] | None = None,
    ) -> None:
        proposals = proposals or [()] * len(chunks)
        scheduled = [
            ScheduledChunk(
                request,
                s,
                s.num_computed_tokens,
                n,
                s.num_computed_tokens + n - len(p) == s.num_tokens,
                p,
            )
            for (s, n), p in zip(chunks, proposals, strict=True)
            if n > 0
        ]
        plan = _Plan(scheduled, copies, sum(n for _, n in chunks))
        step.plans[request.request_id] = plan
        step.budget -= plan.num_tokens

    def _preempt(self, victim: Request, step: _Step) -> None:
        plan = step.plans.pop(victim.request_id, None)
        if plan is not None:  # scheduled earlier in this step: its tokens go back to the budget
            step.budget += plan.num_tokens
        for seq in victim.live_seqs:
            self.block_manager.free(seq)
            seq.num_computed_tokens = 0
        self._running.remove(victim)
        victim.status = RequestStatus.WAITING
        victim.num_preemptions += 1
        self._num_preemptions += 1
        self._waiting.appendleft(victim)
        step.preempted.append(victim.request_id)

    def on_step_done(self, output: SchedulerOutput) -> None:
        """After the forward: the scheduled tokens are in the KV cache. Advances each chunk's
        `num_computed_tokens` and registers newly full blocks in the prefix cache. Chunks of
        requests finished in between are skipped. A proposal's rows are not counted: those the
        verification keeps are, by `accept_proposed`."""
        for chunk in output.chunks:
            seq = chunk.seq
            if chunk.request.status is not RequestStatus.RUNNING or seq.is_finished:
                continue
            if seq.num_computed_tokens != chunk.start:
                raise RuntimeError(f"seq {seq.seq_id}: on_step_done called twice for one output?")
            seq.num_computed_tokens += chunk.num_new_tokens - len(chunk.proposal)
            self.block_manager.mark_computed(seq)

    def accept_proposed(self, seq: TokenSequence) -> None:
        """The last appended token was a kept proposal whose K/V the step computed: it counts
        as computed (call it before appending the next token)."""
        if seq.num_computed_tokens != seq.num_tokens - 1:
            raise RuntimeError(f"seq {seq.seq_id}: no appended token awaits its K/V")
        seq.num_computed_tokens += 1

    def settle_proposed(self, seq: TokenSequence) -> None:
        """After a speculating sequence's verification: registers its newly full blocks in the
        prefix cache and frees the blocks only rejected tokens were written into."""
        if not seq.is_finished:
            self.block_manager.mark_computed(seq)
            self.block_manager.trim(seq)

    # ----- endings and forks ---------------------------------------------------------------
    def finish_seq(
        self,
        request: Request,
        seq: TokenSequence,
        reason: str,
        stop_reason: int | str | None = None,
    ) -> None:
        """Ends one sequence (frees its blocks); the request ends when its last one does."""
        if reason not in FINISH_REASONS:
            raise ValueError(f"finish reason must be one of {FINISH_REASONS}, got {reason!r}")
        seq.finish_reason, seq.stop_reason = reason, stop_reason
        self.block_manager.free(seq)
        if not request.live_seqs:
            self._retire(request)

    def finish(self, request: Request, reason: str) -> bool:
        """Ends every live sequence of a waiting or running request (e.g. "error"); False if
        it is already finished or was never added."""
        if reason not in FINISH_REASONS:
            raise ValueError(f"finish reason must be one of {FINISH_REASONS}, got {reason!r}")
        if request.is_finished or not self._holds(request):
            return False
        for seq in request.live_seqs:
            seq.finish_reason = reason
            self.block_manager.free(seq)
        self._retire(request)
        return True

    def _holds(self, request: Request) -> bool:
        queue = self._running if request.status is RequestStatus.RUNNING else self._waiting
        return any(r is request for r in queue)  # identity: O(queue), aborts are rare

    def fork_seq(self, request: Request, parent: TokenSequence) -> TokenSequence:
        """A new live sequence sharing the parent's tokens and blocks (n > 1, beams). Call it
        after `on_step_done` and before appending the parent's new token; a beam step forks
        the surviving parents first, then removes the dropped beams."""
        if request.status is not RequestStatus.RUNNING or parent not in request.seqs:
            raise RuntimeError("fork_seq needs a running request and one of its sequences")
        child = parent.clone(request.new_seq_id())
        self.block_manager.fork(parent, child)
        request.seqs.append(child)
        return child

    def remove_seq(self, request: Request, seq: TokenSequence) -> None:
        """Drops a sequence entirely (a pruned beam): blocks freed, gone from request.seqs.
        Removing the last live sequence finishes the request."""
        self.block_manager.free(seq)
        request.seqs.remove(seq)
        if not request.live_seqs:
            self._retire(request)

    def _retire(self, request: Request) -> None:
        if request.status is RequestStatus.RUNNING:
            self._running.remove(request)
        elif request.status is RequestStatus.WAITING:
            self._waiting.remove(request)
        self._arrival.pop(request, None)
        request.status = RequestStatus.FINISHED

    def _apply_aborts(self) -> list[str]:
        aborted = []
        for request in self._pending_aborts:
            if self.finish(request, "abort"):
                aborted.append(request.request_id)
        self._pending_aborts.clear()
        return aborted

    def stats(self) -> SchedulerStats:
        usage = self.block_manager.usage()
        return SchedulerStats(
            num_running=len(self._running),
            num_waiting=len(self._waiting),
            num_preemptions=self._num_preemptions,
            blocks=usage,
            prefill_capacity=self._prefill_capacity,
        )
