"""The sampling plan of a step: what a step asks of the runner's sampling (one `Draw` per
sampled row, speculated positions, beam asks, prompt-logprob asks) and which of the runner's
answers belong to which sequences (`StepPlan`), built before the forward. Host data only.

Contract: `plan_sampling(states, eos_token_ids, sched, grammar, released, carried) ->
(StepSampling, StepPlan)`: per sampled sequence one `Draw` (engine/sampling/step_io.py; a
parallel group's children to be forked on their first token get theirs, keyed by the sequence
ids the fork will give them), per speculating sequence one draw per scored position and a
`Speculated`, per beam group a `BeamAsk` (decoding/beam_search.py), per chunk that asked for
prompt logprobs a `PromptAsk`; `grammar` the step's pending grammar masks, `released` the
requests that ended since the last step (the runner drops their generators), `carried` the
inputs the previous step's draws give (`StepSampling.carried`). A one-sequence request's draw
is reused from step to step while its row stays the same (`RequestState.last_draw`).
`plan_steady(sched, draws, released, carried, eos_token_ids, grammar)` is the plan of a
decode step whose rows are those of a plain step planned before (`SchedulerOutput.
running_order`, the same object): that step's `draws` again, no pass over the rows (issue 38's
columnar steady state; step_update.py keeps them). step_update.py applies the answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.decoding.parallel_sampling import children_to_fork
from engine.grammar.host_mask import PendingHostMask
from engine.request_state import RequestState
from engine.requests.request import TokenSequence
from engine.sampling.step_io import Draw, PromptAsk, Speculated, StepSampling
from engine.scheduling.scheduler import ScheduledChunk, SchedulerOutput
from engine.speculative.verification import ScoredProposal, position_rows


@dataclass
class StepPlan:
    """Which answers of the runner belong to which sequences (indices into `StepSampling`)."""

    ordinary: list[tuple[ScheduledChunk, int, list[int]]] = field(default_factory=list)
    forking: list[int] = field(default_factory=list)  # `ordinary` indices that fork their group
    scored: list[tuple[ScoredProposal, int, int]] = field(default_factory=list)  # (, spec, draw)
    beams: list[tuple[str, list[tuple[TokenSequence, int]]]] = field(default_factory=list)
    prompt: list[tuple[ScheduledChunk, int]] = field(default_factory=list)  # (chunk, its index)
    # Every chunk of the step is a sampled one-sequence row with its own draw (no prompt
    # logprobs, forks, proposals or beams): the steady state, which step_update.py applies
    # in one pass over `chunks`, chunk i's draw and logits row both i.
    plain: bool = False
    chunks: Sequence[ScheduledChunk] = ()  # the step's (a plain plan's rows; maybe columns)
    # Made by `plan_steady`: its rows are the step before's, whose update noted each row's
    # news (a first schedule, a preemption: a request preempted since left the order).
    steady: bool = False

    def rows(self) -> list[tuple[ScheduledChunk, int, list[int]]]:
        """`ordinary`, also for a plain plan made by `plan_steady` (which leaves it empty)."""
        if self.plain and not self.ordinary:
            self.ordinary = [(chunk, i, [i]) for i, chunk in enumerate(self.chunks)]
        return self.ordinary


def plan_sampling(
    states: dict[str, RequestState],
    eos_token_ids: Sequence[int],
    sched: SchedulerOutput,
    grammar: PendingHostMask | None = None,
    released: Sequence[str] = (),
    carried: Sequence[tuple[int, int]] = (),
) -> tuple[StepSampling, StepPlan]:
    plan = StepPlan()
    ordinary = plan.ordinary
    draws: list[Draw] = []
    speculated: list[Speculated] = []
    beams = []
    prompt = []
    groups: dict[str, list[tuple[TokenSequence, int]]] = {}
    row = 0  # the first logits row of the chunk (as sched.sampled_rows() counts them)
    plain = True  # so far, every chunk a plain row (StepPlan.plain)
    # The steady state: every chunk a sampled one-token decode without a proposal, which asks
    # no prompt logprobs (a decode's rows are past the prompt), so those checks are skipped.
    decodes = sched.decodes_only
    for i, chunk in enumerate(sched.chunks):
        request = chunk.request
        state = states[request.request_id]
        if not decodes:
            if request.params.prompt_logprobs is not None and (ask := _prompt_ask(state, chunk, i)):
                plan.prompt.append((chunk, i))
                prompt.append(ask)
                plain = False
            if not chunk.sample:
                plain = False
                continue
        if state.plain and (decodes or not chunk.proposal):  # the common row: its own draw
            # The last step's draw again when its row is the same (a Draw names its row and
            # holds a live view of the sequence's ids, nothing else moves).
            draw = state.last_draw
            if draw is None or draw.row != row:
                draw = state.last_draw = _draw(state, chunk.seq.seq_id, chunk.seq, row)
            ordinary.append((chunk, row, [len(draws)]))
            draws.append(draw)
            row += 1
            continue
        plain = False
        if request.params.use_beam_search:
            groups.setdefault(request.request_id, []).append((chunk.seq, row))
        elif chunk.proposal:
            first = _draw(state, chunk.seq.seq_id, chunk.seq, row)
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
            plan.ordinary.append((chunk, row, list(range(len(draws), len(draws) + len(seq_ids)))))
            draws += [_draw(state, seq_id, chunk.seq, row) for seq_id in seq_ids]
        row += chunk.num_sampled_rows
    for rid, group in groups.items():
        state = states[rid]
        seqs, rows = [seq for seq, _ in group], [row for _, row in group]
        plan.beams.append((rid, group))
        beams.append(state.beam.ask(rid, seqs, rows, state.request.params, state.seed_key(0)))
    plan.plain = plain
    plan.chunks = sched.chunks
    sampling = StepSampling(
        draws=tuple(draws),
        speculated=tuple(speculated),
        beams=tuple(beams),
        prompt_logprobs=tuple(prompt),
        grammar=grammar,
        eos_token_ids=tuple(eos_token_ids),
        released=tuple(released),
        carried=tuple(carried),
    )
    return sampling, plan


def plan_steady(
    sched: SchedulerOutput,
    draws: tuple[Draw, ...],
    released: Sequence[str],
    carried: Sequence[tuple[int, int]],
    eos_token_ids: Sequence[int],
    grammar: PendingHostMask | None = None,
) -> tuple[StepSampling, StepPlan]:
    """The plan of `sched` when its rows are, in order, those of a plain step whose draws were
    `draws` (a `Draw` names its row and holds a live view of its sequence's ids: nothing in
    it moves while the row stays)."""
    sampling = StepSampling(
        draws=draws,
        grammar=grammar,
        eos_token_ids=tuple(eos_token_ids),
        released=tuple(released),
        carried=tuple(carried),
    )
    return sampling, StepPlan(plain=True, chunks=sched.chunks, steady=True)


def _prompt_ask(state: RequestState, chunk: ScheduledChunk, index: int) -> PromptAsk | None:
    return state.prompt_ask(chunk, index) if state.wants_prompt_logprobs(chunk) else None


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
