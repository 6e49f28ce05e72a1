"""StepUpdate: what a step asks of the runner's sampling, and how the runner's answer becomes
request state (the engine's `update_from_output`, as nano-vllm's `scheduler.postprocess` and
vLLM v1's are). Host data both ways: no tensor reaches this floor (issue 38).

Contract:
- `plan(sched, grammar, released, carried) -> (StepSampling, StepPlan)` runs before the forward of
  `sched`: per sampled sequence one `Draw` (engine/sampling/step_io.py; a parallel group's
  children to be forked on their first token get theirs, keyed by the sequence ids the fork
  will give them), per speculating sequence one draw per scored position and a `Speculated`,
  per beam group a `BeamAsk` (decoding/beam_search.py), per chunk that asked for prompt
  logprobs a `PromptAsk`; `grammar` the step's pending grammar masks, `released` the requests
  that ended since the last step (the runner drops their generators).
- `apply(sched, plan, output, scheduled_at, held)` runs after it and returns the
  `RequestState`s that moved, in the order they first moved (`held`: the overlapped loop held
  the step, each sampled token replaces its sequence's placeholder; the rows of requests that
  had ended before the update are discarded, engine/step_pipeline.py): prompt logprobs recorded; parallel groups forked;
  each sampled token appended with its logprobs, then detokenized and checked against the stop
  criteria and the grammar (a sequence that ends is finished in the scheduler, its blocks
  freed); each speculating sequence's accepted tokens committed token by token
  (engine/speculative/verification.py) and counted in `speculator.counters`; one beam-search
  step per beam group.
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
from dataclasses import dataclass, field
from functools import partial

from engine.decoding.parallel_sampling import children_to_fork, sample_targets
from engine.decoding.stop_checker import finish_after_token
from engine.grammar.host_mask import PendingHostMask
from engine.request_state import RequestState
from engine.requests.request import TokenSequence
from engine.sampling.step_io import BeamCandidate, Draw, Speculated, StepOutput, StepSampling
from engine.scheduling.scheduler import ScheduledChunk, Scheduler, SchedulerOutput
from engine.speculative.speculator import Speculator
from engine.speculative.verification import ScoredProposal, commit, position_rows
from engine.types import TokenLogprob

log = logging.getLogger("tgserve.engine")


@dataclass
class StepPlan:
    """Which answers of the runner belong to which sequences (indices into `StepSampling`)."""

    ordinary: list[tuple[ScheduledChunk, int, list[int]]] = field(default_factory=list)
    forking: list[int] = field(default_factory=list)  # `ordinary` indices that fork their group
    scored: list[tuple[ScoredProposal, int, int]] = field(default_factory=list)  # (, spec, draw)
    beams: list[tuple[str, list[tuple[TokenSequence, int]]]] = field(default_factory=list)
    prompt: list[tuple[ScheduledChunk, int]] = field(default_factory=list)  # (chunk, its index)


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

    # ----- before the forward ---------------------------------------------------------------
    def plan(
        self,
        sched: SchedulerOutput,
        grammar: PendingHostMask | None = None,
        released: Sequence[str] = (),
        carried: Sequence[tuple[int, int]] = (),
    ) -> tuple[StepSampling, StepPlan]:
        plan = StepPlan()
        draws: list[Draw] = []
        speculated: list[Speculated] = []
        beams = []
        prompt = []
        groups: dict[str, list[tuple[TokenSequence, int]]] = {}
        row = 0  # the first logits row of the chunk (as sched.sampled_rows() counts them)
        for i, chunk in enumerate(sched.chunks):
            request = chunk.request
            state = self.states[request.request_id]
            asks = request.params.prompt_logprobs is not None  # most rows: nothing asked
            if asks and state.wants_prompt_logprobs(chunk) and (ask := state.prompt_ask(chunk, i)):
                plan.prompt.append((chunk, i))
                prompt.append(ask)
            if not chunk.sample:
                continue
            if state.plain and not chunk.proposal:  # the common row: one draw, its own
                plan.ordinary.append((chunk, row, [len(draws)]))
                draws.append(self._own_draw(state, chunk.seq, row))
            elif request.params.use_beam_search:
                groups.setdefault(request.request_id, []).append((chunk.seq, row))
            elif chunk.proposal:
                first = self._draw(state, chunk.seq.seq_id, chunk.seq, row)
                scored = ScoredProposal(request, chunk.seq, row, chunk.proposal)
                plan.scored.append((scored, len(speculated), len(draws)))
                speculated.append(
                    Speculated(request.request_id, len(draws), chunk.proposal, first.seed)
                )
                draws += position_rows(first, chunk.proposal)
            else:  # a parallel group's sequence (and on its first token, its children's)
                seq_ids = [chunk.seq.seq_id, *children_to_fork(chunk)]
                if len(seq_ids) > 1:
                    plan.forking.append(len(plan.ordinary))
                plan.ordinary.append(
                    (chunk, row, list(range(len(draws), len(draws) + len(seq_ids))))
                )
                draws += [self._draw(state, seq_id, chunk.seq, row) for seq_id in seq_ids]
            row += chunk.num_sampled_rows
        for rid, group in groups.items():
            state = self.states[rid]
            seqs, rows = [seq for seq, _ in group], [row for _, row in group]
            plan.beams.append((rid, group))
            beams.append(state.beam.ask(rid, seqs, rows, state.request.params, state.seed_key(0)))
        sampling = StepSampling(
            draws=tuple(draws),
            speculated=tuple(speculated),
            beams=tuple(beams),
            prompt_logprobs=tuple(prompt),
            grammar=grammar,
            eos_token_ids=self.eos_token_ids,
            released=tuple(released),
            carried=tuple(carried),
        )
        return sampling, plan

    def _own_draw(self, state: RequestState, seq: TokenSequence, row: int) -> Draw:
        """A one-sequence request's draw: the last step's again when its row is the same (a
        Draw names its row and holds a live view of the sequence's ids, nothing else moves)."""
        if state.last_draw is None or state.last_draw.row != row:
            state.last_draw = self._draw(state, seq.seq_id, seq, row)
        return state.last_draw

    @staticmethod
    def _draw(state: RequestState, seq_id: int, seq: TokenSequence, row: int) -> Draw:
        params = state.row_params
        return Draw(
            row=row,
            owner=state.request.request_id,
            params=params,
            # Only the repetition penalty reads the prompt: skip copying it every step otherwise.
            prompt_token_ids=seq.prompt_token_ids if params.repetition_penalty != 1.0 else (),
            output_token_ids=seq.output_view(),
            seed=state.seed_key(seq_id),
        )

    # ----- after it -------------------------------------------------------------------------
    def apply(
        self,
        sched: SchedulerOutput,
        plan: StepPlan,
        out: StepOutput,
        scheduled_at: float,
        held: bool = False,
    ) -> list[RequestState]:
        moved: dict[str, RequestState] = {}
        # Requests that ended before this update (the overlapped loop scheduled this step
        # before it learned that the previous step's token ended them): their rows are
        # discarded, never emitted. `held`: this step's tokens replace placeholders.
        ended = {c.request.request_id for c in sched.chunks if c.request.is_finished}
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
        for k in plan.forking:
            chunk, row, _ = plan.ordinary[k]
            rid = chunk.request.request_id
            if rid not in ended and self.states[rid].error is None:
                forks[k] = [t.seq for t in sample_targets(self.scheduler, chunk, row)]
        tokens, logprobs = out.tokens, out.logprobs
        for k, (chunk, _, indices) in enumerate(plan.ordinary):
            rid = chunk.request.request_id
            if rid in ended:
                continue
            state = self.states[rid]
            if len(indices) == 1:  # the common row: its own sequence
                seqs: Sequence[TokenSequence] = (chunk.seq,)
            elif (seqs := forks.get(k)) is None:  # the group failed before its fork
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
            if chunk.request.request_id in ended:
                continue
            state = self.states[chunk.request.request_id]
            state.note_chunk(chunk, scheduled_at)
            if state.mark_scheduled(scheduled_at):  # counted once, at first scheduling (as vLLM)
                self.prompt_tokens_total += len(state.request.input_token_ids)
            if chunk.sample or state.error is not None:
                moved[chunk.request.request_id] = state
        return list(moved.values())

    def _isolated(self, state: RequestState, work: Callable[..., None], *args: object) -> None:
        """Runs one request's share of the update, `work(*args)`; if it raises, that request
        alone fails. A request that already failed in this step does nothing more."""
        if state.error is not None:
            return
        try:
            work(*args)
        except Exception as exc:
            log.exception("request %s failed in its step update", state.request.request_id)
            self._fail_alone(
                state, f"internal error while sampling this request: {type(exc).__name__}"
            )

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
        detokenizer = state.detokenizer(seq.seq_id) if state.tokenizer is not None else None
        finish = finish_after_token(state.criteria, detokenizer, token, seq.num_output_tokens)
        reason, stop_reason = (finish.reason, finish.stop_reason) if finish else (None, None)
        # A grammar that is complete and allows nothing more ends the sequence: "stop" (also
        # when that happens on the last allowed token).
        if state.grammar is not None and reason in (None, "length") and state.grammar.advance(seq):
            reason, stop_reason = "stop", None
        if reason is not None:
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
