"""Scheduler: which tokens of which sequences the next forward computes (pure Python, no torch).

Policy, every `schedule()`:
1. Aborts asked for since the last step take effect (waiting or running); their ids are reported
   in `SchedulerOutput.aborted` and their blocks are freed.
2. Running decodes first: one token per live sequence, higher priority first (a lower
   `SamplingParams.priority` value runs first, as vLLM's), within `max_num_batched_tokens`.
   With speculative decoding, a decode also carries the tokens proposed for its sequence after
   the last step (`take_proposals`, data the engine hands over; the scheduler calls nobody),
   cut to the budget left and dropped, before anyone is preempted, when the blocks for them
   are not free: its chunk then computes 1 + k rows.
3. Prefill: engine/scheduling/prefill_allotment.py shares the step's remaining budget
   (sized in tokens and time by engine/scheduling/prefill_budget.py) between running partial
   prefills and waiting requests, shortest remaining prefill first, the oldest (the anchor)
   always progressing, and a short prompt's first token never waiting for the middle of long
   prompts, whatever their `stream` setting; step_builder.py then places the running chunks
   and admits the waiting requests in that order, the anchor first; when one finds no blocks,
   nobody behind it is admitted in that step. A prompt longer than its share is chunked across
   steps. A sequence group (n > 1, beams) is scheduled as one unit and its sequences reach
   their sampling step together.
4. When a running request needs blocks and none are left, the running request with the lowest
   priority (the most recently admitted among equals) is preempted by recompute (blocks freed,
   `num_computed_tokens = 0` for all its sequences, back to waiting with its original arrival
   order, so it is the anchor soon), repeatedly, until the request fits or is itself the
   victim. No waiting request is admitted in a step that preempted.
5. Admission bound (the one rule, `EngineConfig.max_in_flight`): running + waiting requests
   never exceed `max_num_seqs + max_queued_requests`; `add_request` raises QueueFullError
   beyond it. AsyncEngine applies the same bound before queueing, so a server never meets it.

The update protocol between `schedule()` and the next one is in engine/scheduling/step_plan.py.
Here: the intake, the aborts, the endings and forks of sequences, and the stats; the queues are
request_queues.py, and items 2 to 4 of each step are step_builder.py.
"""

from __future__ import annotations

from engine.config import EngineConfig
from engine.errors import QueueFullError
from engine.requests.request import Request, RequestStatus, TokenSequence
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.decode_columns import DecodeColumns, KeptColumns
from engine.scheduling.request_queues import RequestQueues
from engine.scheduling.step_builder import StepBuilder
from engine.scheduling.step_cost import StepCostModel
from engine.scheduling.step_plan import (
    NO_PROPOSALS,
    Proposals,
    ScheduledChunk,
    SchedulerOutput,
    SchedulerStats,
)
from engine.types import FINISH_REASONS

__all__ = ["ScheduledChunk", "Scheduler", "SchedulerOutput", "SchedulerStats"]


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
        # No id registry here: the engine holds the one (request id -> its state and Request).
        self._queues = RequestQueues()
        self._pending_aborts: list[Request] = []
        self._prefill_capacity = config.max_num_batched_tokens
        self._proposals = NO_PROPOSALS
        self._kept: KeptColumns | None = None  # the last steady step's order as columns

    def take_proposals(self, proposals: Proposals) -> None:
        """Speculative decoding's proposals made after a step, replacing the last ones: a
        decode of a sequence still as long as when they were made carries its proposal."""
        self._proposals = proposals

    # ----- intake --------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queues a new request checked by `admission_check` (the engine does, once); raises
        QueueFullError when running + waiting requests are at `config.max_in_flight`."""
        rid = request.request_id
        if request.status is not RequestStatus.WAITING or request.seqs[0].num_computed_tokens:
            raise ValueError(f"request {rid!r} is not a fresh request")
        limit = self.config.max_in_flight
        if len(self._queues) >= limit:
            raise QueueFullError(
                f"the server has {limit} requests in flight (max_num_seqs "
                f"{self.config.max_num_seqs} + max_queued_requests "
                f"{self.config.max_queued_requests}); retry later"
            )
        self._queues.add(request)
        for seq in request.seqs:  # K/V tiers: its prefix may be read from disk meanwhile
            self.block_manager.prefetch(seq, request.lora_key)

    def abort(self, request: Request) -> None:
        """Aborts at the next `schedule()`; finished or unknown requests are ignored."""
        self._pending_aborts.append(request)

    def has_pending_aborts(self) -> bool:
        return bool(self._pending_aborts)

    def has_work(self) -> bool:
        return bool(len(self._queues) or self._pending_aborts)

    # ----- the step ------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        aborted = tuple(self._apply_aborts())
        step = StepBuilder(
            self._queues,
            self.block_manager,
            self.config,
            self.cost_model,
            self._target_s,
            self._proposals,
            self._kept,
        ).build(aborted)
        self._prefill_capacity = step.prefill_capacity
        self._kept = step.kept
        return step.output

    def on_step_done(self, output: SchedulerOutput) -> None:
        """After the forward: the scheduled tokens are in the KV cache. Advances each chunk's
        `num_computed_tokens` and registers newly full blocks in the prefix cache. Chunks of
        requests finished in between are skipped. A proposal's rows are not counted: those the
        verification keeps are, by `accept_proposed`. A steady step's columns are read by
        index (decode_columns.py)."""
        bm = self.block_manager
        mark_computed, block_size = bm.mark_computed, bm.block_size
        caching, running = bm.enable_prefix_caching, RequestStatus.RUNNING
        chunks = output.chunks
        if type(chunks) is DecodeColumns:  # the steady step's columns: each row start + 1
            for request, seq, start in zip(
                chunks.requests, chunks.seqs, chunks.starts, strict=True
            ):
                if request.status is not running or seq.finish_reason is not None:
                    continue
                if seq.num_computed_tokens != start:
                    raise RuntimeError(f"seq {seq.seq_id}: on_step_done called twice?")
                seq.num_computed_tokens = start + 1
                if caching and (start + 1) % block_size == 0:  # the token filled its block
                    mark_computed(seq)
            return
        one = output.decodes_only  # every chunk one token, no proposal: its start + 1
        for chunk in chunks:
            seq, start = chunk.seq, chunk.start
            if chunk.request.status is not running or seq.finish_reason is not None:
                continue
            if seq.num_computed_tokens != start:
                raise RuntimeError(f"seq {seq.seq_id}: on_step_done called twice for one output?")
            computed = seq.num_computed_tokens = (
                start + 1 if one else start + chunk.num_new_tokens - len(chunk.proposal)
            )
            # Only a block that filled up is news to the prefix cache: the blocks before
            # `start` were registered when they filled (a decode fills one in block_size).
            if caching and computed // block_size != start // block_size:
                mark_computed(seq)

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
            self.block_manager.free(seq, keep=self.block_manager.blocks_for(seq.num_tokens))

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
            self._queues.retire(request)

    def finish(self, request: Request, reason: str) -> bool:
        """Ends every live sequence of a waiting or running request (e.g. "error"); False if
        it is already finished or was never added."""
        if reason not in FINISH_REASONS:
            raise ValueError(f"finish reason must be one of {FINISH_REASONS}, got {reason!r}")
        if request.is_finished or not self._queues.holds(request):
            return False
        for seq in request.live_seqs:
            seq.finish_reason = reason
            self.block_manager.free(seq)
        self._queues.retire(request)
        return True

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
            self._queues.retire(request)

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
            num_running=len(self._queues.running),
            num_waiting=len(self._queues.waiting),
            num_preemptions=self._queues.num_preemptions,
            blocks=usage,
            prefill_capacity=self._prefill_capacity,
        )
