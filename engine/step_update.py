"""StepUpdate: what a step asks of the runner's sampling, and how the runner's answer becomes
request state (the engine's `update_from_output`, as nano-vllm's `scheduler.postprocess` and
vLLM v1's are). Host data both ways: no tensor reaches this floor (issue 38).

Contract:
- `plan(sched, grammar, released, carried) -> (StepSampling, StepPlan)` runs before the forward of
  `sched` (engine/sampling_plan.py says what it asks). A plain step's draws are kept with its
  `running_order`: the next step with that same order takes them again (`plan_steady`).
- `apply(sched, plan, output, scheduled_at, held)` runs after it and returns the
  `RequestState`s that moved, in the order they first moved (`held`: the overlapped loop held
  the step, each sampled token replaces its sequence's placeholder; the rows of requests that
  had ended before the update are discarded, engine/step_pipeline.py): prompt logprobs recorded;
  parallel groups forked; each sampled token appended with its logprobs, then detokenized and checked against the stop
  criteria and the grammar (a sequence that ends is finished in the scheduler, its blocks
  freed); each speculating sequence's accepted tokens committed token by token
  (engine/speculative/verification.py) and counted in `speculator.counters`; one beam-search
  step per beam group. A one-sequence row's append and stop checks run inline (`_land`: the
  calls of the general path cost most of a decode row's update, issue 38).
Failure isolation: a request the runner names in `output.failed` (its grammar mask could not be
made, its draws or beam candidates raised: the runner redid the batch's draws one request at a
time, generators put back, engine/sampling/step_sampler.py) fails alone ("error", blocks freed,
`RequestState.error` saying what broke), and so does one whose share of the update here (its
prompt logprobs, its tokens' append, stop and grammar checks, its beam step, its speculative
commit) raises. `scheduled_at` (when the step was scheduled, before its forward) is a
request's first-scheduled time. It counts the prompt tokens of requests scheduled for the first
time and every generated token (`prompt_tokens_total`, `generation_tokens_total`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial

from engine.decoding.parallel_sampling import sample_targets
from engine.decoding.stop_checker import finish_after_token
from engine.grammar.host_mask import PendingHostMask
from engine.plain_rows import land_plain_rows
from engine.request_state import RequestState
from engine.requests.request import PLACEHOLDER, RequestStatus, TokenSequence
from engine.sampling.step_io import BeamCandidate, Draw, StepOutput, StepSampling
from engine.sampling_plan import StepPlan, plan_sampling, plan_steady
from engine.scheduling.scheduler import ScheduledChunk, Scheduler, SchedulerOutput
from engine.speculative.speculator import Speculator
from engine.speculative.verification import ScoredProposal, commit
from engine.types import TokenLogprob

log = logging.getLogger("tgserve.engine")


class StepUpdate:
    def __init__(
        self,
        states: dict[str, RequestState],
        scheduler: Scheduler,
        eos_token_ids: tuple[int, ...],
        speculator: Speculator | None = None,
    ) -> None:
        self.states = states  # the engine's live requests (shared, not copied)
        self.scheduler = scheduler
        self.eos_token_ids = tuple(eos_token_ids)
        self.speculator = speculator
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        # The last plain decode step's running order and draws (sampling_plan.plan_steady).
        self._steady: tuple[list, tuple[Draw, ...]] | None = None

    # ----- before the forward ---------------------------------------------------------------
    def plan(
        self,
        sched: SchedulerOutput,
        grammar: PendingHostMask | None = None,
        released: Sequence[str] = (),
        carried: Sequence[tuple[int, int]] = (),
    ) -> tuple[StepSampling, StepPlan]:
        """The step's `StepSampling` and which answers go where (sampling_plan.py)."""
        order, steady = sched.running_order, self._steady
        if order is not None and steady is not None and steady[0] is order:
            return plan_steady(sched, steady[1], released, carried, self.eos_token_ids, grammar)
        sampling, plan = plan_sampling(
            self.states, self.eos_token_ids, sched, grammar, released, carried
        )
        self._steady = (order, sampling.draws) if order is not None and plan.plain else None
        return sampling, plan

    # ----- after it -------------------------------------------------------------------------
    def apply(
        self,
        sched: SchedulerOutput,
        plan: StepPlan,
        out: StepOutput,
        scheduled_at: float,
        held: bool = False,
    ) -> list[RequestState]:
        if plan.plain and not out.failed:  # the steady state: one pass (plain_rows.py)
            return land_plain_rows(self, plan, out, scheduled_at, held)
        moved: dict[str, RequestState] = {}
        # Requests that ended before this update (the overlapped loop scheduled this step
        # before it learned that the previous step's token ended them): their rows are
        # discarded, never emitted. `held`: this step's tokens replace placeholders.
        finished = RequestStatus.FINISHED  # (`is_finished`, without a call per row)
        ended = {c.request.request_id for c in sched.chunks if c.request.status is finished}
        for chunk, index in plan.prompt:
            state = self.states[chunk.request.request_id]
            entries = out.prompt_logprobs.get(index)
            if entries is not None:
                self._isolated(state, partial(state.record_prompt_logprobs, chunk, entries))
            moved[state.request.request_id] = state
        for rid, message in out.failed.items():
            if rid not in ended and (state := self.states[rid]).error is None:
                self._fail_alone(state, message)
        forks: dict[int, list[TokenSequence]] = {}  # forks first, as before any token lands
        ordinary = plan.rows()
        for k in plan.forking:
            chunk, row, _ = ordinary[k]
            rid = chunk.request.request_id
            if rid not in ended and self.states[rid].error is None:
                forks[k] = [t.seq for t in sample_targets(self.scheduler, chunk, row)]
        tokens, logprobs = out.tokens, out.logprobs
        states = self.states
        for k, (chunk, _, indices) in enumerate(ordinary):
            rid = chunk.request.request_id
            if rid in ended:
                continue
            state = states[rid]
            if len(indices) == 1:  # the common row, its own sequence: no call to isolate it
                if state.error is None:
                    i = indices[0]
                    try:
                        self._land(state, chunk.seq, chunk.seq_len, tokens[i], logprobs[i], held)
                    except Exception as exc:
                        self._failed_row(state, exc)
                continue
            if (seqs := forks.get(k)) is None:  # the group failed before its fork
                continue
            for seq, i in zip(seqs, indices, strict=True):
                if held:  # the overlapped loop held the step: the token takes its placeholder
                    self._isolated(
                        state, self._put, state, seq, tokens[i], logprobs[i], chunk.seq_len
                    )
                else:
                    self._isolated(state, self._append, state, seq, tokens[i], logprobs[i])
        for scored, spec, first in plan.scored:
            state = self.states[scored.request.request_id]
            accepted = out.accepted[spec]
            entries = out.logprobs[first : first + len(accepted)]
            self._isolated(state, partial(self._commit, state, scored, accepted, entries))
        for (rid, group), candidates in zip(plan.beams, out.beams, strict=True):
            state = self.states[rid]
            self._isolated(state, partial(self._beam_step, state, group, candidates))
        for chunk in sched.chunks:  # prefill chunks that did not sample yet still started
            request = chunk.request
            rid = request.request_id
            if rid in ended:
                continue
            state = states[rid]
            self._note(state, chunk, scheduled_at)
            if chunk.sample or state.error is not None:
                moved[rid] = state
        return list(moved.values())

    def _note(self, state: RequestState, chunk: ScheduledChunk, scheduled_at: float) -> None:
        """A chunk's news for its request's timings and events: a decode of a request that has
        run before (most rows) has none; a preemption or a prompt chunk does."""
        request = chunk.request
        if (
            state.first_scheduled_time is None
            or request.num_preemptions > state.preemptions_seen
            or chunk.start < chunk.seq.num_prompt_tokens
        ):
            state.note_chunk(chunk, scheduled_at)
            if state.mark_scheduled(scheduled_at):  # counted once, when first scheduled
                self.prompt_tokens_total += len(request.input_token_ids)

    def _isolated(self, state: RequestState, work: Callable[..., None], *args: object) -> None:
        """Runs one request's share of the update, `work(*args)`; if it raises, that request
        alone fails. A request that already failed in this step does nothing more."""
        if state.error is not None:
            return
        try:
            work(*args)
        except Exception as exc:
            self._failed_row(state, exc)

    def _failed_row(self, state: RequestState, exc: Exception) -> None:
        log.exception("request %s failed in its step update", state.request.request_id)
        self._fail_alone(state, f"internal error while sampling this request: {type(exc).__name__}")

    def _fail_alone(self, state: RequestState, message: str) -> None:
        if state.request.is_finished:
            state.error = message  # ended in the same breath: the error still shows
        else:
            state.fail(self.scheduler, message)

    def _commit(
        self,
        state: RequestState,
        s: ScoredProposal,
        accepted: Sequence[int],
        entries: Sequence[TokenLogprob | None],
    ) -> None:
        append = partial(self._append, state, s.seq)
        counts = commit(s, accepted, entries, self.scheduler, append)
        self.speculator.counters.record(*counts)

    def _land(
        self,
        state: RequestState,
        seq: TokenSequence,
        at: int,
        token: int,
        entry: TokenLogprob | None,
        held: bool,
    ) -> None:
        """`_put` (held) or `_append` of a one-sequence row (`at`: its chunk's `seq_len`, where
        a held token's placeholder is), its stop checks inline: per row per step, so the calls
        and the lookups the general path makes are what it costs."""
        logprob = entry.logprob if entry is not None else 0.0
        ids = seq.token_ids  # `put_token` / `append_token` inline, their checks first
        if held:  # its placeholder, at the chunk's seq_len
            if ids[at] != PLACEHOLDER:
                seq.put_token(at, token, logprob, entry)  # raises: no placeholder there
            ids[at] = token
        elif seq.num_computed_tokens == len(ids):
            ids.append(token)
        else:
            seq.append_token(token, logprob, entry)  # raises: the step is not done
        seq.cumulative_logprob += logprob
        if entry is not None:
            seq.logprobs.append(entry)
        self.generation_tokens_total += 1
        if state.first_token_time is None:
            state.mark_token(time.time())
        if (stops := state.token_stops) is None:  # text or a grammar may end it too
            self._check_stops(state, seq, token)
            return
        ending, min_tokens, max_tokens = stops
        generated = len(seq.token_ids) - seq.num_prompt_tokens
        if token in ending and generated > min_tokens:
            stop_reason = token if token in state.criteria.stop_token_ids else None
            self._finish(state, seq, "stop", stop_reason)
        elif generated >= max_tokens:
            self._finish(state, seq, "length", None)

    def _put(self, state: RequestState, seq: TokenSequence, token: int, entry, at: int) -> None:
        """`_append` for a token whose place the overlapped loop held (its placeholder)."""
        seq.put_token(at, token, entry.logprob if entry is not None else 0.0, entry)
        self._landed(state, seq, token)

    def _append(
        self, state: RequestState, seq: TokenSequence, token: int, entry: TokenLogprob | None
    ) -> None:
        seq.append_token(token, entry.logprob if entry is not None else 0.0, entry)
        self._landed(state, seq, token)

    def _landed(self, state: RequestState, seq: TokenSequence, token: int) -> None:
        """A sampled token is in its sequence: counted, detokenized, the stops checked."""
        self.generation_tokens_total += 1
        if state.first_token_time is None:
            state.mark_token(time.time())
        self._check_stops(state, seq, token)

    def _check_stops(self, state: RequestState, seq: TokenSequence, token: int) -> None:
        """Detokenizes the token and ends the sequence if a stop criterion or its grammar says so."""
        detokenizer = state.detokenizer(seq.seq_id) if state.tokenizer is not None else None
        finish = finish_after_token(state.criteria, detokenizer, token, seq.num_output_tokens)
        reason, stop_reason = (finish.reason, finish.stop_reason) if finish else (None, None)
        # A grammar that is complete and allows nothing more ends the sequence: "stop" (also
        # when that happens on the last allowed token).
        if state.grammar is not None and reason in (None, "length") and state.grammar.advance(seq):
            reason, stop_reason = "stop", None
        if reason is not None:
            self._finish(state, seq, reason, stop_reason)

    def _finish(
        self, state: RequestState, seq: TokenSequence, reason: str, stop_reason: int | str | None
    ) -> None:
        self.scheduler.finish_seq(state.request, seq, reason, stop_reason)
        if state.request.is_finished:
            state.mark_finished(time.time())

    def _beam_step(
        self,
        state: RequestState,
        group: list[tuple[TokenSequence, int]],
        candidates: Sequence[BeamCandidate],
    ) -> None:
        beams = [seq for seq, _ in group]
        moved = state.beam.step(self.scheduler, state.request, beams, candidates)
        if state.grammar is not None:
            state.grammar.follow_beams(moved, state.request.live_seqs)
        self.generation_tokens_total += len(group)
        state.mark_token(time.time())
        if state.request.is_finished:
            state.mark_finished(time.time())
