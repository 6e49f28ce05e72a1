"""RequestQueues: the scheduler's waiting queue and running list, and the moves between them
(pure Python).

Contract: a request is in exactly one of `waiting` (a deque, oldest first; a preempted request
goes back to its front) and `running` (admission order, so among equal priorities the last one
admitted is the first preempted), from `add` until `retire`, which marks it FINISHED.
`arrival` numbers requests in the order they were added, kept across preemptions (the prefill
allotment's anchor is the oldest); `num_preemptions` counts every preemption so far.
"""

from __future__ import annotations

import itertools
from collections import deque

from engine.requests.request import Request, RequestStatus


class RequestQueues:
    def __init__(self) -> None:
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.arrival: dict[Request, int] = {}
        self.num_preemptions = 0
        self._arrivals = itertools.count()
        self._by_priority: list[Request] | None = None  # `running` sorted, until it changes

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, request: Request) -> None:
        self.waiting.append(request)
        self.arrival[request] = next(self._arrivals)

    def start(self, request: Request) -> None:
        """Admitted: from waiting to running."""
        self.waiting.remove(request)
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        self._by_priority = None

    def preempt(self, request: Request) -> None:
        """Preempted by recompute: from running back to the front of waiting."""
        self.running.remove(request)
        self._by_priority = None
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def retire(self, request: Request) -> None:
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
            self._by_priority = None
        elif request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        self.arrival.pop(request, None)
        request.status = RequestStatus.FINISHED

    def holds(self, request: Request) -> bool:
        queue = self.running if request.status is RequestStatus.RUNNING else self.waiting
        return any(r is request for r in queue)  # identity: O(queue), aborts are rare

    def by_priority(self) -> list[Request]:
        """Running requests, a lower `priority` value first; stable: admission order. Sorted
        again only after `running` changed (not every step); the caller does not modify it."""
        if self._by_priority is None:
            self._by_priority = sorted(self.running, key=lambda r: r.params.priority)
        return self._by_priority

    def victim(self) -> Request:
        """The lowest priority (highest value) running request; the latest admitted of those."""
        return max(reversed(self.running), key=lambda r: r.params.priority)

    @property
    def running_seq_slots(self) -> int:
        return sum(r.num_seq_slots for r in self.running)
