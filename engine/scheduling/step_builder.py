"""StepBuilder: one `schedule()`'s work after the aborts, placing chunks into a token budget
(pure Python; the policy is the scheduler's docstring, items 2 to 4).

Contract: `StepBuilder(queues, block_manager, config, cost_model, target_s, proposals,
kept).build(aborted)` places running decodes first (higher priority first: decode_pass.py;
as columns while the order is the one the last step `kept`: decode_columns.py), then the
prefill chunks the allotment (prefill_allotment.py, sized by prefill_budget.py) gives running
partial prefills and waiting requests, admitting waiting requests in that order, the anchor
first, until one finds no blocks. Blocks are appended or admitted as chunks are placed
(copy-on-write pairs collected); a request that needs blocks none can give preempts the
lowest-priority running request by recompute, repeatedly, until it fits or is itself the
victim, and no waiting request is admitted in a step that preempted. It returns a
`StepResult`: the `SchedulerOutput` (with the ids the scheduler `aborted` before), the
prefill chunk a prompt could get now (a gauge), and the next step's columns (`kept`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.requests.request import Request, RequestStatus, TokenSequence
from engine.scheduling.block_manager import BlockManager, PrefixMatch
from engine.scheduling.decode_columns import KeptColumns, place_kept
from engine.scheduling.decode_pass import place_decodes
from engine.scheduling.prefill_allotment import Allot, PrefillCandidates, allot_prefill
from engine.scheduling.prefill_budget import PrefillBudget
from engine.scheduling.request_queues import RequestQueues
from engine.scheduling.step_cost import StepCostModel, chunk_pairs
from engine.scheduling.step_plan import (
    NO_PROPOSALS,
    Proposals,
    ScheduledChunk,
    SchedulerOutput,
    chunk_sizes,
)


@dataclass(slots=True)  # one per running request per step: slots make it cheap to build
class _Plan:
    """What one request got in the step being built (undone if it is preempted later)."""

    chunks: list[ScheduledChunk]
    copies: list[tuple[int, int]]
    num_tokens: int
    decode: bool = False  # placed by the decode pass


@dataclass(frozen=True)
class StepResult:
    output: SchedulerOutput
    prefill_capacity: int  # tokens a prompt's chunk could get now, at least the anchor's floor
    kept: KeptColumns | None = None  # the next step's columns while the order stays


@dataclass
class StepBuilder:
    queues: RequestQueues
    block_manager: BlockManager
    config: EngineConfig
    cost_model: StepCostModel
    target_s: float | None  # the step-time target (None: budget in tokens only)
    proposals: Proposals = NO_PROPOSALS  # speculative decoding's, for decodes
    kept: KeptColumns | None = None  # the last step's running order, for columns
    budget: int = field(init=False)
    plans: dict[str, _Plan | ScheduledChunk] = field(default_factory=dict, init=False)
    preempted: list[str] = field(default_factory=list, init=False)
    # Running totals of the placed chunks, kept as they are placed and taken back (rows are
    # the token budget spent): no per-step sums over every row (issue 38's host time).
    pairs: int = field(default=0, init=False)  # query x key pairs (step_cost.chunk_pairs)
    delivering: int = field(default=0, init=False)  # sampled chunks of streamed requests
    decode_tokens: int = field(default=0, init=False)  # rows of the decode pass's plans
    inline_plans: int = field(default=0, init=False)  # plans that are their chunk (decode_pass)

    def __post_init__(self) -> None:
        self.budget = self.config.max_num_batched_tokens

    def build(self, aborted: tuple[str, ...]) -> StepResult:
        order = self.queues.by_priority()
        columns = place_kept(self, self.kept)  # the order the last step kept (decode_columns.py)
        if columns is None:
            place_decodes(self)  # decode_pass.py
        budget = self._prefill_budget()
        left = budget.tokens_left
        capacity = max(budget.fit(0, left), budget.anchor_floor(0, left))
        decodes_only, chunks, copies = True, columns, ()  # all decode, none waits: no prefill
        if columns is None:
            self._schedule_prefills(budget)
            decodes_only = self.inline_plans == len(self.plans)  # every plan a chunk in place
            if decodes_only:
                chunks, copies = tuple(self.plans.values()), ()
                # Every running request decoded, in that order (none left the list meanwhile).
                if len(chunks) != len(order) or self.queues.by_priority() is not order:
                    order = None
            else:
                chunks, copies = self._chunks_and_copies()
        rows = self.config.max_num_batched_tokens - self.budget
        output = SchedulerOutput(
            chunks=chunks,
            block_copies=copies,
            preempted=tuple(self.preempted),
            aborted=aborted,
            num_batched_tokens=rows,
            num_pairs=self.pairs,
            num_prefill_tokens=rows - self.decode_tokens,
            decodes_only=decodes_only,
            running_order=order if decodes_only else None,
        )
        kept = KeptColumns.after(self.kept, output, self.delivering, bool(self.queues.waiting))
        return StepResult(output, capacity, kept)

    def _chunks_and_copies(self) -> tuple[tuple[ScheduledChunk, ...], tuple[tuple[int, int], ...]]:
        """The placed chunks in plan order, and their plans' block copies."""
        chunks: list[ScheduledChunk] = []
        copies: list[tuple[int, int]] = []
        for plan in self.plans.values():
            if type(plan) is ScheduledChunk:  # a decode in place's plan is its chunk
                chunks.append(plan)
                continue
            chunks += plan.chunks
            if plan.copies:
                copies += plan.copies
        return tuple(chunks), tuple(copies)

    def _count(self, chunks: Iterable[ScheduledChunk], sign: int) -> None:
        """Adds placed chunks to the running totals (`sign` 1), or takes them back (-1)."""
        for c in chunks:
            self.pairs += sign * chunk_pairs(c.start, c.num_new_tokens)
            if c.sample and c.request.params.streamed:
                self.delivering += sign

    def schedule_decode(self, request: Request) -> None:
        """A running request's decode that decode_pass.py does not place inline (several
        sequences, a proposal, a shared last block, no free block; it may preempt)."""
        remaining = [s.num_uncomputed_tokens for s in request.live_seqs]
        if min(remaining) < 1:
            raise RuntimeError(
                f"request {request.request_id!r} has a sequence with nothing to compute: "
                "append the sampled token or finish the sequence before schedule()"
            )
        if max(remaining) == 1:
            sizes = chunk_sizes(remaining, self.budget)
            if sizes is not None:
                proposals = self._proposals(request, self.budget - sum(sizes))
                self._schedule_running(request, sizes, proposals)
                if (plan := self.plans.get(request.request_id)) is not None:
                    plan.decode = True
                    self.decode_tokens += plan.num_tokens

    def _proposals(self, request: Request, spare: int) -> list[tuple[int, ...]] | None:
        """Each live sequence's proposal, cut to the `spare` budget in order; None: none."""
        if not self.proposals.tokens:
            return None
        proposals = []
        for seq in request.live_seqs:
            proposal = self.proposals.get(seq)[: max(spare, 0)]
            spare -= len(proposal)
            proposals.append(proposal)
        return proposals if any(proposals) else None

    def _schedule_running(
        self,
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
            victim = self.queues.victim()
            self._preempt(victim)
            if victim is request:
                return
        copies = [c for s, n in chunks if n > 0 for c in bm.append(s, n)]
        self._add_plan(request, chunks, copies, proposals)

    def _prefill_budget(self) -> PrefillBudget:
        return PrefillBudget(
            tokens_left=self.budget,
            target_s=self.target_s,
            cost=self.cost_model,
            rows=self.config.max_num_batched_tokens - self.budget,
            pairs=self.pairs,
            delivers=self.delivering > 0,
        )

    def _schedule_prefills(self, budget: PrefillBudget) -> None:
        queues = self.queues
        # Every running request placed by the decodes (the steady state): no list to build.
        placed_all = len(self.plans) == len(queues.running)
        partials = [
            r
            for r in ([] if placed_all else queues.running)
            if r.status is RequestStatus.RUNNING and r.request_id not in self.plans
        ]
        # After a preemption nobody: its freed blocks go to the running first.
        waiting = [] if self.preempted else self._admissible(queues.waiting)
        candidates = PrefillCandidates(
            partials=partials,
            waiting=waiting,
            arrival=queues.arrival,
            # Seats matter to the waiting only (an O(running) sum: skipped without them).
            free_seats=self.config.max_num_seqs - queues.running_seq_slots if waiting else 0,
            prefix_match=self._prefix_match,
        )
        allots = allot_prefill(candidates, budget)
        for allot in allots:
            if allot.matches is None and allot.request.status is RequestStatus.RUNNING:
                self._schedule_running(allot.request, allot.sizes)
        if self.preempted:
            return
        admits = [a for a in allots if a.matches is not None]
        admits.sort(key=lambda a: not a.is_anchor)  # the anchor picks blocks first
        for allot in admits:
            if not self._admit(allot):
                return  # nobody overtakes a request that waits for blocks

    def _admissible(self, waiting: Iterable[Request]) -> list[Request]:
        """The waiting requests but those whose prefix a K/V tier is still reading from disk."""
        if self.block_manager.tiers is None:
            return list(waiting)
        loading = self.block_manager.tiers.is_loading
        return [r for r in waiting if not any(loading(s) for s in r.seqs)]

    def _admit(self, allot: Allot) -> bool:
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
        self.queues.start(request)
        self._add_plan(request, list(zip(seqs, sizes, strict=True)), [])
        return True

    def _prefix_match(self, request: Request, seq: TokenSequence) -> PrefixMatch:
        if request.params.prompt_logprobs is not None:  # every prompt row's logits are wanted
            return PrefixMatch((), 0, seq.num_tokens, root=request.lora_key)
        match = self.block_manager.match_prefix(seq.token_ids, request.lora_key)
        if match.num_tokens < seq.decoder_start:  # an encoder's K/V: reused whole or not at all
            return PrefixMatch((), 0, seq.num_tokens, root=request.lora_key)
        return match

    def _add_plan(
        self,
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
        self.plans[request.request_id] = plan
        self.budget -= plan.num_tokens
        self._count(scheduled, 1)

    def _preempt(self, victim: Request) -> None:
        plan = self.plans.pop(victim.request_id, None)
        if type(plan) is ScheduledChunk:  # a decode in place
            plan = _Plan([plan], [], 1, True)
            self.inline_plans -= 1
        if plan is not None:  # scheduled earlier in this step: its tokens go back to the budget
            self.budget += plan.num_tokens
            self._count(plan.chunks, -1)
            if plan.decode:
                self.decode_tokens -= plan.num_tokens
        for seq in victim.live_seqs:
            self.block_manager.free(seq)
            seq.num_computed_tokens = 0
        self.queues.preempt(victim)
        self.preempted.append(victim.request_id)
