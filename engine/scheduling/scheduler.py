"""Scheduler: which tokens of which sequences the next forward computes (pure Python, no torch).

Policy, every `schedule()`:
1. Aborts asked for since the last step take effect (waiting or running); their ids are reported
   in `SchedulerOutput.aborted` and their blocks are freed.
2. A budget of `max_num_batched_tokens` is handed out: running decodes first (one token per live
   sequence), then running partial prefills, then waiting requests in FIFO order, bounded by
   `max_num_seqs` sequences. A prompt longer than the budget left is chunked across steps, so it
   never stalls the running streams. A sequence group (n > 1, beams) is scheduled as one unit and
   its sequences reach their sampling step together.
3. When a running request needs blocks and none are left, the most recently admitted running
   request is preempted by recompute (blocks freed, `num_computed_tokens = 0` for all its
   sequences, back to the FRONT of the waiting queue), repeatedly, until the request fits or is
   itself the victim. No waiting request is admitted in a step that preempted.

The update protocol between `schedule()` and the next one is in engine/scheduling/step_plan.py.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.requests.outputs import FINISH_REASONS
from engine.requests.request import Request, RequestStatus, TokenSequence
from engine.scheduling.block_manager import BlockManager, PrefixMatch
from engine.scheduling.step_plan import (
    QueueFullError,
    ScheduledChunk,
    SchedulerOutput,
    SchedulerStats,
    chunk_sizes,
)

__all__ = ["QueueFullError", "ScheduledChunk", "Scheduler", "SchedulerOutput", "SchedulerStats"]


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


class Scheduler:
    def __init__(
        self, config: EngineConfig, block_manager: BlockManager, max_model_len: int
    ) -> None:
        if block_manager.block_size != config.block_size:
            raise ValueError(
                f"block manager block_size {block_manager.block_size} != config {config.block_size}"
            )
        self.config = config
        self.block_manager = block_manager
        self.max_model_len = max_model_len
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []  # admission order: the last is preempted first
        # No id registry here: the engine holds the one (request id -> its state and Request).
        self._pending_aborts: list[Request] = []
        self._num_preemptions = 0

    # ----- intake --------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queues a new request checked by `admission_check` (the engine does, once);
        raises QueueFullError if the waiting queue is at `max_queued_requests`."""
        rid = request.request_id
        if request.status is not RequestStatus.WAITING or request.seqs[0].num_computed_tokens:
            raise ValueError(f"request {rid!r} is not a fresh request")
        if len(self._waiting) >= self.config.max_queued_requests:
            raise QueueFullError(
                f"the waiting queue is full ({self.config.max_queued_requests} requests); "
                "retry later"
            )
        self._waiting.append(request)

    def abort(self, request: Request) -> None:
        """Aborts at the next `schedule()`; finished or unknown requests are ignored."""
        self._pending_aborts.append(request)

    def has_work(self) -> bool:
        return bool(self._waiting or self._running or self._pending_aborts)

    # ----- the step ------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        aborted = self._apply_aborts()
        step = _Step(budget=self.config.max_num_batched_tokens)
        self._schedule_running(step, decode_pass=True)
        self._schedule_running(step, decode_pass=False)
        if not step.preempted:  # else the freed blocks go to the running requests first
            self._admit_waiting(step)
        chunks = tuple(c for p in step.plans.values() for c in p.chunks)
        return SchedulerOutput(
            chunks=chunks,
            block_copies=tuple(c for p in step.plans.values() for c in p.copies),
            preempted=tuple(step.preempted),
            aborted=tuple(aborted),
            num_batched_tokens=sum(c.num_new_tokens for c in chunks),
        )

    def _schedule_running(self, step: _Step, decode_pass: bool) -> None:
        bm = self.block_manager
        for request in list(self._running):
            if request.status is not RequestStatus.RUNNING or request.request_id in step.plans:
                continue
            seqs = request.live_seqs
            remaining = [s.num_uncomputed_tokens for s in seqs]
            if min(remaining) < 1:
                raise RuntimeError(
                    f"request {request.request_id!r} has a sequence with nothing to compute: "
                    "append the sampled token or finish the sequence before schedule()"
                )
            if (max(remaining) == 1) != decode_pass:
                continue
            sizes = chunk_sizes(remaining, step.budget)
            if sizes is None:
                continue
            chunks = list(zip(seqs, sizes, strict=True))
            while bm.blocks_to_append(chunks) > bm.num_free_blocks:
                victim = self._running[-1]
                self._preempt(victim, step)
                if victim is request:
                    break
            if request.status is RequestStatus.RUNNING:
                copies = [c for s, n in chunks if n > 0 for c in bm.append(s, n)]
                self._add_plan(step, request, chunks, copies)

    def _admit_waiting(self, step: _Step) -> None:
        bm = self.block_manager
        num_seqs = sum(r.num_seq_slots for r in self._running)
        while self._waiting and step.budget > 0:
            request = self._waiting[0]
            if num_seqs + request.num_seq_slots > self.config.max_num_seqs:
                return
            seqs = request.live_seqs
            matches = [self._prefix_match(request, s) for s in seqs]
            remaining = [s.num_tokens - m.num_tokens for s, m in zip(seqs, matches, strict=True)]
            sizes = chunk_sizes(remaining, step.budget)
            if sizes is None:
                return
            totals = [m.num_tokens + n for m, n in zip(matches, sizes, strict=True)]
            if bm.blocks_to_admit(matches, totals) > bm.num_free_blocks:
                return  # strict FIFO: the head waits for blocks, nobody overtakes it
            bm.admit(seqs, matches, totals)
            for seq, match in zip(seqs, matches, strict=True):
                seq.num_computed_tokens = match.num_tokens
            if request.num_preemptions == 0:
                request.num_cached_prompt_tokens = min(m.num_tokens for m in matches)
            self._waiting.popleft()
            request.status = RequestStatus.RUNNING
            self._running.append(request)
            num_seqs += request.num_seq_slots
            self._add_plan(step, request, list(zip(seqs, sizes, strict=True)), [])

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
    ) -> None:
        scheduled = [
            ScheduledChunk(
                request, s, s.num_computed_tokens, n, s.num_computed_tokens + n == s.num_tokens
            )
            for s, n in chunks
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
        requests finished in between are skipped."""
        for chunk in output.chunks:
            seq = chunk.seq
            if chunk.request.status is not RequestStatus.RUNNING or seq.is_finished:
                continue
            if seq.num_computed_tokens != chunk.start:
                raise RuntimeError(f"seq {seq.seq_id}: on_step_done called twice for one output?")
            seq.num_computed_tokens += chunk.num_new_tokens
            self.block_manager.mark_computed(seq)

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
        )
