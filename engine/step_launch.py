"""Launching a step: its sampling plan and grammar masks, handed to the runner, and the wait.

Contract: `launch(runner, updater, grammars, states, sched, released, carried) -> Launched`
plans the step's sampling (step_update.py; `carried`: the inputs the previous step's draws
give, `StepSampling.carried`), starts its grammar masks and submits the step to the runner
(`Runner.submit`: a runner whose device works on its own returns at once); `Launched.wait(
scheduler, sched)` is the step's `StepOutput` once the runner has it, after which the
scheduler counts the step done (`on_step_done`; `result()`: the output alone). The grammar masks are waited for even when the
forward fails: their matchers are the engine's again afterwards.
`start_grammar_masks(grammars, states, sched)` starts computing, on the grammar
engine's worker thread, the allowed-token masks of the step's sampled rows whose request is
under a grammar (a speculated row: one mask per scored position,
engine/speculative/speculator.py's `grammar_jobs`), and returns the pending mask the runner
waits for after its forward (engine/grammar/grammar_masker.py); None when no row needs one or
the engine has no grammars. A row whose matcher raises here is named in the mask as failed:
its request fails alone, the step goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from engine.grammar.grammar_engine import GrammarEngine
from engine.grammar.grammar_masker import PendingMask
from engine.request_state import RequestState
from engine.runner import PendingStep, Runner
from engine.sampling.step_io import StepOutput
from engine.sampling_plan import StepPlan
from engine.scheduling.scheduler import Scheduler, SchedulerOutput
from engine.speculative.speculator import grammar_jobs
from engine.step_update import StepUpdate

log = logging.getLogger("tgserve.engine")


def start_grammar_masks(
    grammars: GrammarEngine | None, states: dict[str, RequestState], sched: SchedulerOutput
) -> PendingMask | None:
    if grammars is None:
        return None
    jobs, failed = [], []
    for row, chunk in sched.sampled_rows():
        try:
            if (matchers := states[chunk.request.request_id].grammar) is not None:
                jobs += grammar_jobs(matchers.matcher(chunk.seq), chunk.proposal, row)
        except Exception:
            log.exception("the grammar of request %s failed", chunk.request.request_id)
            failed += range(row, row + len(chunk.proposal) + 1)
    return grammars.start_masks(jobs, failed) if jobs or failed else None


@dataclass(frozen=True)
class Launched:
    plan: StepPlan
    pending: PendingStep
    masks: PendingMask | None

    def wait(self, scheduler: Scheduler, sched: SchedulerOutput) -> StepOutput:
        out = self.result()
        scheduler.on_step_done(sched)
        return out

    def result(self) -> StepOutput:
        """The output alone (a held step was counted done when it was held)."""
        try:
            return self.pending.result()
        finally:
            if self.masks is not None:
                self.masks.result()


def launch(
    runner: Runner,
    updater: StepUpdate,
    grammars: GrammarEngine | None,
    states: dict[str, RequestState],
    sched: SchedulerOutput,
    released: Sequence[str],
    carried: Sequence[tuple[int, int]] = (),
) -> Launched:
    masks = start_grammar_masks(grammars, states, sched)
    sampling, plan = updater.plan(sched, masks, released, carried)
    try:
        return Launched(plan, runner.submit(sched.chunks, sched.block_copies, sampling), masks)
    except BaseException:
        if masks is not None:
            masks.result()
        raise
