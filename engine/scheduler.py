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

Update protocol (what `Engine.step()` does with a `SchedulerOutput`):
    out = scheduler.schedule()
    runner: apply `out.block_copies` (copy block src -> dst in every layer's K and V),
        then one forward over `out.chunks`; a chunk computes tokens
        `seq.token_ids[start:start + num_new_tokens]` at positions start.. with
        `seq.block_table`; rows of chunks with `sample=True` produce logits (their last row).
    scheduler.on_step_done(out)       # advances num_computed_tokens, registers cached blocks
    for each chunk with sample=True:  # in this order, per sampled sequence:
        seq.append_token(token, logprob)          # after on_step_done, never before
        if it stops: scheduler.finish_seq(request, seq, reason, stop_reason)
    forks / beam pruning (issue #4), between steps only:
        child = scheduler.fork_seq(request, parent); scheduler.remove_seq(request, seq)
    emit outputs; for ids in out.aborted emit final "abort" outputs (the engine holds the Request).
Every running sequence must have an uncomputed token at the next `schedule()`: either a token
was appended or the sequence was finished/removed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.block_manager import BlockManager, BlockUsage, PrefixMatch
from engine.config import EngineConfig
from engine.outputs import FINISH_REASONS
from engine.request import Request, RequestStatus, Sequence
from engine.sampling_params import SamplingParams


class QueueFullError(ValueError):
    """The waiting queue is at max_queued_requests (the server answers 429)."""


@dataclass(frozen=True)
class ScheduledChunk:
    request: Request
    seq: Sequence
    start: int  # num_computed_tokens before this step = position of the first new token
    num_new_tokens: int
    sample: bool  # reaches the end of the known tokens: the runner returns its last row's logits

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids[self.start : self.start + self.num_new_tokens]

    @property
    def seq_len(self) -> int:
        """Context length once this chunk is in the cache (what attention looks at)."""
        return self.start + self.num_new_tokens


@dataclass(frozen=True)
class SchedulerOutput:
    chunks: tuple[ScheduledChunk, ...]  # decodes first, then prefill chunks
    # (src, dst) block copies to apply before the forward. No block is both a src and a dst
    # in one step, so they may be applied all at once.
    block_copies: tuple[tuple[int, int], ...]
    preempted: tuple[str, ...]  # request ids sent back to waiting this step
    aborted: tuple[str, ...]  # request ids removed by abort this step
    num_batched_tokens: int

    @property
    def is_empty(self) -> bool:
        return not self.chunks


@dataclass(frozen=True)
class SchedulerStats:
    num_running: int  # requests
    num_waiting: int
    num_running_seqs: int
    num_preemptions: int  # cumulative
    blocks: BlockUsage


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
        self._requests: dict[str, Request] = {}
        self._pending_aborts: list[str] = []
        self._num_preemptions = 0

    # ----- intake --------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queues a new request checked by `check_admissible` (the engine does, once);
        raises QueueFullError if the waiting queue is at `max_queued_requests`."""
        rid = request.request_id
        if rid in self._requests:
            raise ValueError(f"request id {rid!r} is already in use; ids must be unique")
        if request.status is not RequestStatus.WAITING or request.seqs[0].num_computed_tokens:
            raise ValueError(f"request {rid!r} is not a fresh request")
        if len(self._waiting) >= self.config.max_queued_requests:
            raise QueueFullError(
                f"the waiting queue is full ({self.config.max_queued_requests} requests); "
                "retry later"
            )
        self._requests[rid] = request
        self._waiting.append(request)

    def check_admissible(
        self, prompt_len: int, params: SamplingParams, rid: str = "request"
    ) -> None:
        """Raises ValueError when a request of this shape could never run on this engine."""
        max_tokens = params.max_tokens
        if max_tokens is None:
            raise ValueError("max_tokens must be resolved before admission (Engine.new_request)")
        if prompt_len + max_tokens > self.max_model_len:
            raise ValueError(
                f"request {rid!r}: prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) "
                f"exceeds the maximum context length {self.max_model_len}; shorten the prompt "
                "or lower max_tokens"
            )
        width = params.num_sequences
        if width > self.config.max_num_seqs:
            raise ValueError(
                f"request {rid!r} runs {width} sequences but max_num_seqs is "
                f"{self.config.max_num_seqs}; lower n / best_of"
            )
        # Worst case: after a preemption every sequence recomputes into blocks of its own.
        need = width * self.block_manager.blocks_for(prompt_len + max_tokens - 1)
        if need > self.block_manager.num_blocks:
            raise ValueError(
                f"request {rid!r} needs up to {need} KV blocks but the cache has "
                f"{self.block_manager.num_blocks}; shorten the prompt, lower max_tokens or n, "
                "or give the KV cache more memory"
            )

    def abort(self, request_id: str) -> None:
        """Aborts at the next `schedule()`; unknown or finished ids are ignored."""
        self._pending_aborts.append(request_id)

    def has_work(self) -> bool:
        return bool(self._waiting or self._running or self._pending_aborts)

    def get_request(self, request_id: str) -> Request | None:
        return self._requests.get(request_id)

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
            sizes = _chunk_sizes(remaining, step.budget)
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
            sizes = _chunk_sizes(remaining, step.budget)
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

    def _prefix_match(self, request: Request, seq: Sequence) -> PrefixMatch:
        if request.params.prompt_logprobs is not None:  # every prompt row's logits are wanted
            return PrefixMatch((), 0, seq.num_tokens)
        return self.block_manager.match_prefix(seq.token_ids)

    def _add_plan(
        self,
        step: _Step,
        request: Request,
        chunks: list[tuple[Sequence, int]],
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
        self, request: Request, seq: Sequence, reason: str, stop_reason: int | str | None = None
    ) -> None:
        """Ends one sequence (frees its blocks); the request ends when its last one does."""
        if reason not in FINISH_REASONS:
            raise ValueError(f"finish reason must be one of {FINISH_REASONS}, got {reason!r}")
        seq.finish_reason, seq.stop_reason = reason, stop_reason
        self.block_manager.free(seq)
        if not request.live_seqs:
            self._retire(request)

    def finish(self, request_id: str, reason: str) -> Request | None:
        """Ends every live sequence of a waiting or running request (e.g. "error"); returns
        the request, or None if the id is unknown or already finished."""
        if reason not in FINISH_REASONS:
            raise ValueError(f"finish reason must be one of {FINISH_REASONS}, got {reason!r}")
        request = self._requests.get(request_id)
        if request is None:
            return None
        for seq in request.live_seqs:
            seq.finish_reason = reason
            self.block_manager.free(seq)
        self._retire(request)
        return request

    def fork_seq(self, request: Request, parent: Sequence) -> Sequence:
        """A new live sequence sharing the parent's tokens and blocks (n > 1, beams). Call it
        after `on_step_done` and before appending the parent's new token; a beam step forks
        the surviving parents first, then removes the dropped beams."""
        if request.status is not RequestStatus.RUNNING or parent not in request.seqs:
            raise RuntimeError("fork_seq needs a running request and one of its sequences")
        child = parent.clone(request.new_seq_id())
        self.block_manager.fork(parent, child)
        request.seqs.append(child)
        return child

    def remove_seq(self, request: Request, seq: Sequence) -> None:
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
        self._requests.pop(request.request_id, None)

    def _apply_aborts(self) -> list[str]:
        aborted = []
        for rid in self._pending_aborts:
            if self.finish(rid, "abort") is not None:
                aborted.append(rid)
        self._pending_aborts.clear()
        return aborted

    def stats(self) -> SchedulerStats:
        usage = self.block_manager.usage()
        return SchedulerStats(
            num_running=len(self._running),
            num_waiting=len(self._waiting),
            num_running_seqs=sum(len(r.live_seqs) for r in self._running),
            num_preemptions=self._num_preemptions,
            blocks=usage,
        )


def _chunk_sizes(remaining: list[int], budget: int) -> list[int] | None:
    """Tokens per sequence of one group this step. All of them if they fit (every sequence
    samples); else chunks that stop short of every sequence's end, so the group's sequences
    still sample in the same step. None when nothing can be scheduled."""
    if sum(remaining) <= budget:
        return list(remaining)
    sizes = []
    for r in remaining:
        take = min(r - 1, budget)
        sizes.append(take)
        budget -= take
    return sizes if any(sizes) else None
