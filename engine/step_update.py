"""StepUpdate: a step's logits become tokens, and tokens become request state (the engine's
`update_from_output`, as nano-vllm's `scheduler.postprocess` and vLLM v1's are).

Contract: `update_from_output(sched, logits, grammar, scheduled_at)` runs after the forward of
`sched` and returns the `RequestState`s that moved, in the order they first moved:
- prompt logprobs of the chunks that asked for every row (`logits.all_rows`);
- one sampled token per sampled sequence (parallel groups fork on their first token), appended
  with its logprobs, then detokenized and checked against the stop criteria and the grammar:
  a sequence that ends is finished in the scheduler (its blocks freed);
- one beam-search step per beam group (decoding/beam_search.py);
- speculative decoding: a chunk with a proposal has one row per scored position; all of them
  are sampled in the same sampler call as the other rows, then verified and committed token by
  token (engine/speculative/verification.py), and counted in `speculator.counters`.
Failure isolation: one request's share of the update (its prompt logprobs, its tokens' append,
stop and grammar checks, its beam step, its speculative commit) raising fails that request
alone ("error", blocks freed, `RequestState.error` saying what broke); the batched sampler call
raising is redone one request at a time from the same logits (the forward never runs again),
seeded generators first put back where they were, so only the rows that raise alone fail and
the others get the tokens they get in any batch.
Rows of `logits.sampling` (and of the grammar masks) follow the chunks with `sample=True` in
order, `chunk.num_sampled_rows` each (`SchedulerOutput.sampled_rows`). `scheduled_at` (when
the step was scheduled, before its forward) is a request's first-scheduled time. It counts
the prompt tokens of requests scheduled for the first time and every generated token
(`prompt_tokens_total`, `generation_tokens_total`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial

import torch

from engine.decoding.parallel_sampling import SampleTarget, sample_targets
from engine.decoding.stop_checker import finish_after_token
from engine.host_transfer import to_device
from engine.request_state import RequestState
from engine.requests.request import TokenSequence
from engine.runner import StepLogits
from engine.sampling.sampler import Sampler
from engine.sampling.sampling_batch import SamplingRow
from engine.sampling.token_mask import TokenMask
from engine.scheduling.scheduler import Scheduler, SchedulerOutput
from engine.speculative.speculator import Speculator
from engine.speculative.verification import ScoredProposal, commit, position_rows
from engine.types import TokenLogprob

log = logging.getLogger("tgserve.engine")


class StepUpdate:
    def __init__(
        self,
        states: dict[str, RequestState],
        scheduler: Scheduler,
        sampler: Sampler,
        beam_generator: torch.Generator,
        speculator: Speculator | None = None,
    ) -> None:
        self.states = states  # the engine's live requests (shared, not copied)
        self.scheduler = scheduler
        self.sampler = sampler
        self.beam_generator = beam_generator  # unseeded beam groups draw from it
        self.speculator = speculator
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    def update_from_output(
        self,
        sched: SchedulerOutput,
        logits: StepLogits,
        grammar: TokenMask | None,
        scheduled_at: float,
    ) -> list[RequestState]:
        moved: dict[str, RequestState] = {}
        for i, rows in logits.all_rows.items():
            state = self.states[sched.chunks[i].request.request_id]
            self._isolated(state, partial(state.record_prompt_logprobs, sched.chunks[i], rows))
            moved[state.request.request_id] = state
        targets: list[SampleTarget] = []
        scored: list[ScoredProposal] = []
        beam_groups: dict[str, list[tuple[TokenSequence, int]]] = {}
        failed = frozenset(grammar.failed) if grammar is not None else frozenset()
        for row, chunk in sched.sampled_rows():
            state = self.states[chunk.request.request_id]
            if row in failed and state.error is None:  # its grammar's mask could not be made
                self._fail_alone(state, "internal error while computing this request's grammar")
            if state.error is not None:
                continue
            if chunk.request.params.use_beam_search:
                beam_groups.setdefault(chunk.request.request_id, []).append((chunk.seq, row))
            elif chunk.proposal:
                scored.append(ScoredProposal(chunk.request, chunk.seq, row, chunk.proposal))
            else:
                targets += sample_targets(self.scheduler, chunk, row)
        self._sample(targets, scored, logits.sampling, grammar)
        for rid, group in beam_groups.items():
            state = self.states[rid]
            self._isolated(state, partial(self._beam_step, state, group, logits.sampling, grammar))
        for chunk in sched.chunks:  # prefill chunks that did not sample yet still started
            state = self.states[chunk.request.request_id]
            state.note_chunk(chunk, scheduled_at)
            if state.mark_scheduled(scheduled_at):  # counted once, at first scheduling (as vLLM)
                self.prompt_tokens_total += len(state.request.input_token_ids)
            if chunk.sample or state.error is not None:
                moved[chunk.request.request_id] = state
        return list(moved.values())

    def _isolated(self, state: RequestState, work: Callable[[], None]) -> None:
        """Runs one request's share of the update; if it raises, that request alone fails.
        A request that already failed in this step does nothing more."""
        if state.error is not None:
            return
        try:
            work()
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

    def _sample(
        self,
        targets: list[SampleTarget],
        scored: list[ScoredProposal],
        logits: torch.Tensor,
        grammar: TokenMask | None,
    ) -> None:
        """One sampler call for the ordinary targets and every speculated position; if it
        raises, the same again one request's rows at a time, so only the raising ones fail."""
        if not targets and not scored:
            return
        try:
            self._sample_together(targets, scored, logits, grammar, isolate=True)
        except _DrawFailed as failed:
            log.exception("a step's batched sampling failed; sampling it request by request")
            for generator, state in failed.generators:  # the draws that happened are undone
                generator.set_state(state)
            for t in targets:
                alone = partial(self._sample_together, [t], [], logits, grammar)
                self._isolated(self.states[t.request.request_id], alone)
            for s in scored:
                alone = partial(self._sample_together, [], [s], logits, grammar)
                self._isolated(self.states[s.request.request_id], alone)

    def _sample_together(
        self,
        targets: list[SampleTarget],
        scored: list[ScoredProposal],
        logits: torch.Tensor,
        grammar: TokenMask | None,
        isolate: bool = False,
    ) -> None:
        """`isolate`: the draw raising is a `_DrawFailed` (with the generators' states from
        before it), and each request's commit runs `_isolated`."""
        targets = [t for t in targets if self.states[t.request.request_id].error is None]
        scored = [s for s in scored if self.states[s.request.request_id].error is None]
        target_rows = [t.row for t in targets]
        rows = [self._sampling_row(t) for t in targets]
        rewinds: list[tuple[torch.Generator, torch.Tensor] | None] = []
        for s in scored:
            row = self._sampling_row(SampleTarget(s.request, s.seq, s.first_row))
            target_rows += s.rows
            rows += position_rows(row, s.proposal)
            drawn = row.generator is not None and not row.params.greedy
            rewinds.append((row.generator, row.generator.get_state()) if drawn else None)
        if not rows:
            return
        # Seeded draws (the speculated ones are in `rewinds` already): put back on a failure.
        before = [r for r in rewinds if r is not None] if isolate else []
        if isolate:
            before += [
                (row.generator, row.generator.get_state())
                for row in rows[: len(targets)]
                if row.generator is not None and not row.params.greedy
            ]
        try:
            if target_rows != list(range(logits.shape[0])):  # forks reuse a row
                logits = logits[to_device(target_rows, torch.int64, logits.device)]
            result = self.sampler(
                logits, rows, grammar.select(target_rows) if grammar is not None else None
            )
        except Exception as exc:
            if isolate:
                raise _DrawFailed(before) from exc
            raise
        tokens, entries = result.token_ids, result.logprobs
        run = self._isolated if isolate else _run
        for target, token, entry in zip(targets, tokens, entries, strict=False):
            state = self.states[target.request.request_id]
            run(state, partial(self._append, state, target.seq, token, entry))
        start = len(targets)
        for s, rewind_from in zip(scored, rewinds, strict=True):
            end = start + len(s.rows)
            state = self.states[s.request.request_id]
            commit_it = partial(
                self._commit, state, s, tokens[start:end], entries[start:end], rewind_from
            )
            run(state, commit_it)
            start = end

    def _commit(
        self,
        state: RequestState,
        s: ScoredProposal,
        tokens: tuple[int, ...],
        entries: tuple[TokenLogprob | None, ...],
        rewind_from: tuple[torch.Generator, torch.Tensor] | None,
    ) -> None:
        append = partial(self._append, state, s.seq)
        counts = commit(s, tokens, entries, self.scheduler, append, rewind_from)
        self.speculator.counters.record(*counts)

    def _sampling_row(self, target: SampleTarget) -> SamplingRow:
        seq, state = target.seq, self.states[target.request.request_id]
        params = state.row_params
        return SamplingRow(
            params=params,
            # Only the repetition penalty reads the prompt: skip copying it every step otherwise.
            prompt_token_ids=seq.prompt_token_ids if params.repetition_penalty != 1.0 else (),
            output_token_ids=seq.output_view(),
            generator=state.generator(seq.seq_id),
        )

    def _append(
        self, state: RequestState, seq: TokenSequence, token: int, entry: TokenLogprob | None
    ) -> None:
        seq.append_token(token, entry.logprob if entry is not None else 0.0, entry)
        self.generation_tokens_total += 1
        state.mark_token(time.time())
        finish = finish_after_token(
            state.criteria, state.detokenizer(seq.seq_id), token, seq.num_output_tokens
        )
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
        logits: torch.Tensor,
        grammar: TokenMask | None,
    ) -> None:
        rows = [row for _, row in group]
        generator = state.generator(0)  # beam sampling draws once per group and step
        if generator is None:
            generator = self.beam_generator
        beams = [seq for seq, _ in group]
        mask = grammar.select(rows) if grammar is not None else None
        logits = logits[to_device(rows, torch.int64, logits.device)]
        moved = state.beam.step(self.scheduler, state.request, beams, logits, generator, mask)
        if state.grammar is not None:
            state.grammar.follow_beams(moved, state.request.live_seqs)
        self.generation_tokens_total += len(group)
        state.mark_token(time.time())
        if state.request.is_finished:
            state.mark_finished(time.time())


def _run(_state: RequestState, work: Callable[[], None]) -> None:
    work()


class _DrawFailed(Exception):
    """The batched sampler call raised; `generators`: (generator, state before the call)."""

    def __init__(self, generators: list[tuple[torch.Generator, torch.Tensor]]) -> None:
        super().__init__("the step's batched sampling failed")
        self.generators = generators
