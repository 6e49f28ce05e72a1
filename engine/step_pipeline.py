"""StepPipeline: `Engine.step()`, synchronous or overlapped (`EngineConfig.async_scheduling`,
issue 38).

Contract: `StepPipeline(engine, overlapped)`; `step()` returns the `RequestOutput`s of the
requests that moved (engine.py's contract); `busy` is true while a step or outputs are held
back (the engine still has work).
- Synchronous: schedule -> launch (plan the sampling, submit the step) -> wait -> update ->
  outputs, in one call.
- Overlapped: a step's outputs are built while the next step runs and returned by the next
  call. And a step whose sampled rows may all go on without their tokens (`deferrable`) is
  held: the call returns with it in flight, the scheduler counting its K/V as computed and
  each of its sampled sequences ending in PLACEHOLDER (engine/requests/request.py). The next
  call schedules and submits the following step first, its inputs taking the held step's
  tokens on the runner's side (`StepSampling.carried`, engine/carried_inputs.py), and only
  then waits for the held step and applies it: each placeholder becomes its token and the stop
  criteria are checked; a sequence that ended there has its row of the step in flight
  discarded (step_update.py), never emitted, so tokens, text and usage are the synchronous
  loop's. It waits where the data needs it: a step with a row of a grammar, beam, n > 1,
  speculated, prompt-logprobs, penalised or min_tokens-banning request, or that preempted, or
  whose every row draws its last token (max_tokens), is not held; with an abort pending, the held step is applied before scheduling (the request
  ends after the tokens it has). A failed held step ends its requests ("error") without
  their placeholders; a FatalEngineError from the runner (parallel ranks out of step) is
  raised, as the synchronous loop raises it.
- The steady state (issue 38): while the running order stays (`SchedulerOutput.running_order`),
  a held step's rows are carried chunk i <- draw i without a pass over them, and the hold
  checks that every row passed at the step before are not made again (`_deferrable`); the
  step's rows are read as columns (engine/scheduling/decode_columns.py), no chunk built.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Any

from engine.errors import FatalEngineError
from engine.faults import apply_faults
from engine.request_state import RequestState
from engine.requests.outputs import RequestOutput
from engine.requests.request import PLACEHOLDER, RequestStatus, TokenSequence
from engine.sampling_plan import StepPlan
from engine.scheduling.decode_columns import DecodeColumns
from engine.scheduling.scheduler import SchedulerOutput
from engine.step_launch import Launched, launch
from engine.tier_hooks import schedule_step

log = logging.getLogger("tgserve.engine")


@dataclass(frozen=True)
class _Held:
    """A step in flight whose sampled sequences end in a placeholder."""

    sched: SchedulerOutput
    step: Launched
    scheduled_at: float
    launched_at: float  # perf_counter
    draws: dict[TokenSequence, tuple[int, int]]  # its placeholder's index, its draw's index

    def carried(self, sched: SchedulerOutput) -> tuple[tuple[int, int], ...]:
        """(chunk index, draw index) of the chunks of `sched` whose last input is one of
        this step's tokens. When both steps decode the same running order (a plain step:
        chunk i is draw i), every chunk i carries draw i: no pass over the rows."""
        if sched.running_order is not None and self.sched.running_order is sched.running_order:
            return _diagonal(len(sched.chunks))
        out, draws = [], self.draws
        for i, chunk in enumerate(sched.chunks):
            found = draws.get(chunk.seq)
            if found is not None and chunk.start <= found[0] < chunk.start + chunk.num_new_tokens:
                out.append((i, found[1]))
        return tuple(out)

    def drop_placeholders(self) -> None:
        for seq, (index, _) in self.draws.items():
            if len(seq.token_ids) == index + 1 and seq.token_ids[index] == PLACEHOLDER:
                seq.token_ids.pop()


@functools.lru_cache(maxsize=8)
def _diagonal(n: int) -> tuple[tuple[int, int], ...]:
    return tuple((i, i) for i in range(n))


def _steady_draws(plan: StepPlan) -> dict | None:
    """`_holdable`'s draws for a steady plan whose rows all passed its checks at the step
    before (StepPipeline._deferrable): the rows but those ended since; None when every row's
    token is its last."""
    finished, draws, goes_on = RequestStatus.FINISHED, {}, False
    chunks = plan.chunks
    if type(chunks) is DecodeColumns:  # (decode_columns.py: no chunk built)
        rows = zip(chunks.requests, chunks.seqs, strict=True)
    else:
        rows = ((c.request, c.seq) for c in chunks)
    for i, (request, seq) in enumerate(rows):
        if request.status is finished:
            continue
        n = len(seq.token_ids)
        draws[seq] = (n, i)
        goes_on = goes_on or n - seq.num_prompt_tokens + 1 < request.params.max_tokens
    return draws if goes_on else None


class StepPipeline:
    def __init__(self, engine: Any, overlapped: bool) -> None:
        self.engine = engine  # the Engine whose step this is (engine.py imports this module)
        self.overlapped = overlapped
        self._lagging: list[RequestState] = []  # moved, outputs not yet built
        self._held: _Held | None = None
        # The running order (SchedulerOutput.running_order) whose every row last passed the
        # checks of `_holdable`: they hold while the order does (none is ever undone while
        # the request runs; a request that fails or is preempted leaves the order).
        self._deferrable: list | None = None

    @property
    def busy(self) -> bool:
        return self._held is not None or bool(self._lagging)

    def step(self) -> list[RequestOutput]:
        e = self.engine
        start = time.perf_counter()
        outputs = []
        if self._held is not None and e.scheduler.has_pending_aborts():
            outputs += self._apply_held(self._take_held())
        sched = schedule_step(e.scheduler, e.runner, e._idle)  # tier_hooks.py
        scheduled_at = time.time()  # a request's queue time ends here, before its forward runs
        e._num_steps += 1
        # An aborted request's final output holds what it had not sent yet.
        outputs += [e._pop(rid).output() for rid in sched.aborted if rid in e._states]
        earlier = [s for s in self._lagging if s.request.request_id in e._states]
        self._lagging = []
        if sched.preempted:  # by recompute: they resume from the waiting queue
            log.debug("preempted %s (KV cache full)", ", ".join(sched.preempted))
        held = self._take_held()
        if sched.is_empty:
            return outputs + e._emit(earlier) + self._apply_held(held)
        try:
            released, e._released = e._released, []
            carried = held.carried(sched) if held is not None else ()
            grammars = e.grammars if e.num_structured else None  # (no pass over the rows)
            step = launch(e.runner, e.updater, grammars, e._states, sched, released, carried)
        except FatalEngineError:  # e.g. parallel ranks out of step: no later step can be right
            raise
        except Exception as exc:  # a failed forward ends its requests, never the engine
            log.exception("engine step failed")
            return outputs + e._emit(earlier) + self._apply_held(held) + e._fail(sched, exc)
        outputs += e._emit(earlier) + self._apply_held(held)  # while the step runs
        try:
            if (draws := self._holdable(sched, step.plan)) is not None:
                self._hold(sched, step, scheduled_at, draws)
                return outputs
            out = step.wait(e.scheduler, sched)
            moved = e.updater.apply(sched, step.plan, out, scheduled_at)
            e._propose()
        except FatalEngineError:
            raise
        except Exception as exc:
            log.exception("engine step failed")
            return outputs + e._fail(sched, exc)
        e._timings.record(sched, time.perf_counter() - start)  # what a stream's ITL sees
        if e.num_faulty:  # tests' params.fault
            moved = apply_faults(e.scheduler, moved)
        if self.overlapped:
            self._lagging = moved
            return outputs
        return outputs + e._emit(moved)

    def _take_held(self) -> _Held | None:
        held, self._held = self._held, None
        return held

    def _holdable(self, sched: SchedulerOutput, plan: StepPlan) -> dict | None:
        """The draws of a step that may be held, each sampled sequence's (placeholder index,
        draw index); None when it may not. One pass over the step's ordinary rows: every
        sampled row is one unless the step speculates or has beams, which are never held."""
        e = self.engine
        if not self.overlapped or e.speculator is not None or sched.preempted:
            return None
        if plan.scored or plan.beams:
            return None
        order = sched.running_order
        if plan.steady and order is not None and order is self._deferrable:
            return _steady_draws(plan)
        self._deferrable = None
        goes_on = False  # not when every row's token is its last (max_tokens): waste
        states, finished, draws = e._states, RequestStatus.FINISHED, {}
        # (draw index, chunk): a plain plan's chunk i is draw i; else the first draw of each.
        rows = enumerate(plan.chunks) if plan.plain else ((d[0], c) for c, _, d in plan.ordinary)
        for i, c in rows:
            request = c.request
            if request.status is finished:
                continue
            # May this row's step run on before its token is on the host? Only if nothing
            # between its sampling and the next step reads the token's value (the sampler
            # reads a sequence's ids for penalties and its length for min_tokens bans).
            state, ids = states.get(request.request_id), c.seq.token_ids
            generated = len(ids) - c.seq.num_prompt_tokens
            if (
                state is None
                or not state.may_defer  # no grammar, beams, forks, prompt logprobs or penalties
                or state.error is not None
                or generated < request.params.min_tokens
            ):
                return None
            goes_on = goes_on or generated + 1 < state.criteria.max_tokens
            draws[c.seq] = (len(ids), i)
        self._deferrable = order  # every row passed: they pass again while the order holds
        return draws if goes_on else None

    def _hold(
        self, sched: SchedulerOutput, step: Launched, scheduled_at: float, draws: dict
    ) -> None:
        """The step stays in flight: its K/V counts as computed (the device computes it before
        any later step reads it) and each sampled sequence gets a placeholder."""
        self.engine.scheduler.on_step_done(sched)
        for seq in draws:
            seq.token_ids.append(PLACEHOLDER)
        self._held = _Held(sched, step, scheduled_at, time.perf_counter(), draws)

    def _apply_held(self, held: _Held | None) -> list[RequestOutput]:
        """Waits for a held step, puts its tokens in their places, and emits what moved."""
        if held is None:
            return []
        e = self.engine
        try:
            out = held.step.result()
            moved = e.updater.apply(held.sched, held.step.plan, out, held.scheduled_at, True)
        except FatalEngineError:
            raise
        except Exception as exc:
            log.exception("engine step failed")
            held.drop_placeholders()
            return e._fail(held.sched, exc)
        e._timings.record(held.sched, time.perf_counter() - held.launched_at)
        return e._emit(apply_faults(e.scheduler, moved) if e.num_faulty else moved)
