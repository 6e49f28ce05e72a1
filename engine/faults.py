"""Faults on cue (tests only): after a step's update, the engine applies each moved request's
`SamplingParams.fault` (`FaultSpec`, engine/requests/fault_spec.py).

Contract: `apply_faults(scheduler, moved)` fails the requests whose `fail_after_tokens` is due
(finish_reason "error", blocks freed; the others are untouched) and raises `FatalEngineError`
for one whose `kill_engine_after_tokens` is due; it returns `moved`. A request counts the most
tokens any of its sequences has generated; one already finished is left alone.
"""

from __future__ import annotations

from engine.request_state import RequestState
from engine.scheduling.scheduler import Scheduler


def apply_faults(scheduler: Scheduler, moved: list[RequestState]) -> list[RequestState]:
    for state in moved:
        request = state.request
        fault = request.params.fault
        if fault is None or request.is_finished:
            continue
        due = fault.due(max(seq.num_output_tokens for seq in request.seqs))
        if due == "kill":
            raise fault.kill_error(request.request_id)
        if due == "fail":
            state.fail(scheduler, fault.error_message())  # the others are untouched
    return moved
