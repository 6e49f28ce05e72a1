"""Speculation reaches the scheduler as data (engine/scheduling/step_plan.Proposals), handed
over after a step, never through a callback: a decode carries the proposal made for its
sequence at its current length, cut to the budget; one made before the sequence moved on is
ignored. Oracle: hand-worked steps on a one-request scheduler."""

from __future__ import annotations

import dataclasses

from engine.config import EngineConfig
from engine.requests.request import Request
from engine.requests.sampling_params import SamplingParams
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.scheduler import Scheduler
from engine.scheduling.step_builder import StepBuilder
from engine.scheduling.step_plan import Proposals


def _running(budget: int = 64) -> tuple[Scheduler, Request]:
    config = EngineConfig(block_size=4, max_num_batched_tokens=budget, max_num_seqs=2)
    sched = Scheduler(config, BlockManager(32, 4, False), 128)
    request = Request("r", [1, 2, 3, 4, 5], SamplingParams(max_tokens=20))
    sched.add_request(request)
    while request.seqs[0].num_uncomputed_tokens:  # the prompt, in chunks of the budget
        sched.on_step_done(sched.schedule())
    request.seqs[0].append_token(6)
    return sched, request


def test_a_decode_carries_the_proposal_made_for_its_length():
    sched, request = _running()
    seq = request.seqs[0]
    sched.take_proposals(Proposals.of({seq: (7, 8, 9)}))
    (chunk,) = sched.schedule().chunks
    assert chunk.proposal == (7, 8, 9) and chunk.num_new_tokens == 4
    assert chunk.input_ids == [6, 7, 8, 9]


def test_the_proposal_is_cut_to_the_budget_left():
    sched, request = _running(budget=3)
    sched.take_proposals(Proposals.of({request.seqs[0]: (7, 8, 9)}))
    (chunk,) = sched.schedule().chunks
    assert chunk.proposal == (7, 8)  # one row for the known token, two left


def test_a_proposal_for_a_shorter_sequence_is_ignored():
    sched, request = _running()
    seq = request.seqs[0]
    stale = Proposals.of({seq: (7, 8, 9)})
    out = sched.schedule()  # a plain decode of 6
    sched.on_step_done(out)
    seq.append_token(7)
    sched.take_proposals(stale)  # made when the sequence had one token fewer
    (chunk,) = sched.schedule().chunks
    assert chunk.proposal == () and chunk.num_new_tokens == 1


def test_the_scheduler_takes_no_callable():
    """No callback into the engine (or anyone): what the scheduler and a step builder hold is
    data (issue 38; this fails if a proposer function is handed down again)."""
    sched, request = _running()
    sched.take_proposals(Proposals.of({request.seqs[0]: (7,)}))
    sched.schedule()
    assert [name for name, v in vars(sched).items() if callable(v)] == []
    annotations = [str(f.type) for f in dataclasses.fields(StepBuilder)]
    assert not [a for a in annotations if "Callable" in a or a in {"Propose", "Propose | None"}]
