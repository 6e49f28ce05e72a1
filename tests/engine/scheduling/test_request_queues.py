"""RequestQueues (engine/scheduling/request_queues.py): every request is in exactly one queue
from `add` to `retire`; a preempted request goes back to the front of the waiting queue and
keeps its arrival number; the victim is the lowest priority, the latest admitted among equals.
Hand-worked on four requests."""

from __future__ import annotations

from engine.requests.request import Request, RequestStatus
from engine.requests.sampling_params import SamplingParams
from engine.scheduling.request_queues import RequestQueues


def _request(rid: str, priority: int = 0) -> Request:
    return Request(rid, (1, 2, 3), SamplingParams(max_tokens=4, priority=priority))


def _ids(requests) -> list[str]:
    return [r.request_id for r in requests]


def test_requests_move_between_the_queues_and_keep_their_arrival() -> None:
    queues = RequestQueues()
    a, b, c, d = _request("a"), _request("b", priority=1), _request("c"), _request("d", -1)
    for request in (a, b, c, d):
        queues.add(request)
    assert len(queues) == 4 and _ids(queues.waiting) == ["a", "b", "c", "d"]
    for request in (a, b, c):
        queues.start(request)
    assert _ids(queues.running) == ["a", "b", "c"] and _ids(queues.waiting) == ["d"]
    assert a.status is RequestStatus.RUNNING and queues.running_seq_slots == 3
    assert _ids(queues.by_priority()) == ["a", "c", "b"]  # lower value first, then admission
    assert queues.victim() is b  # the lowest priority
    queues.preempt(b)
    assert queues.victim() is c  # equals: the latest admitted
    queues.preempt(c)
    assert _ids(queues.waiting) == ["c", "b", "d"] and queues.num_preemptions == 2
    assert (b.num_preemptions, c.num_preemptions) == (1, 1)
    assert [queues.arrival[r] for r in (a, b, c, d)] == [0, 1, 2, 3]  # kept across preemption
    assert queues.holds(c) and queues.holds(a) and not queues.holds(_request("x"))
    queues.retire(c)
    queues.retire(a)
    assert c.is_finished and a.is_finished and not queues.holds(c)
    assert _ids(queues.waiting) == ["b", "d"] and queues.running == [] and len(queues) == 2
    assert set(queues.arrival) == {b, d}
