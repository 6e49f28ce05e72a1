"""EngineInbox: what the event loop hands the engine's loop thread, and the admission bound,
under one lock.

Contract (all methods thread-safe):
- Items are `AddItem` (a validated request, its output slot, its deadline), `AbortItem` (one
  request id, or None for everything in flight), `KillItem` (an outside watchdog found the
  engine dead) and `CallItem` (a function of the engine to run between steps, its result in
  a Future); the loop thread takes them all at once, in arrival order (`wait_for_items`).
- Admission bound, the one rule: admitted-but-unfinished requests <= `max_pending`. `admit`
  decides and queues in one locked section (raising the refusal, queueing nothing), so a
  burst of N requests with room for R gets exactly N - R `Overloaded`; `refusal()` answers the
  same question without reserving. Every admitted request is given back by `release` once it
  finished or was refused (`drained`: it ran, which feeds the drain rate behind
  `Overloaded.retry_after`, engine/drain_rate.py).
- An idle loop thread is woken for an add by `wake`, which `admit` asks its caller to queue on
  the event loop (it returns True for the first add since the last wake): the loop thread then
  starts after the requests the event loop already holds.
- `close(dead_reason)` refuses everything from then on and returns what was still queued;
  `stop()` ends `wait_for_items` (it returns None).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from engine.drain_rate import DrainRate
from engine.errors import EngineUnavailable, Overloaded
from engine.requests.request import Request
from engine.requests.request_stream import OutputSlot


@dataclass(frozen=True)
class AddItem:
    request: Request  # validated by the engine's new_request
    slot: OutputSlot
    deadline: float | None  # a time.monotonic() value


@dataclass(frozen=True)
class AbortItem:
    request_id: str | None  # None: abort everything in flight


@dataclass(frozen=True)
class KillItem:
    reason: str  # an outside watchdog found the engine dead


@dataclass(frozen=True)
class CallItem:
    fn: Callable[[Any], Any]  # called with the engine, on the loop thread, between steps
    result: Future

    def run(self, engine: Any) -> None:
        try:
            self.result.set_result(self.fn(engine))
        except Exception as exc:  # the caller's to handle, never the loop's
            self.result.set_exception(exc)


InboxItem = AddItem | AbortItem | KillItem | CallItem


class EngineInbox:
    def __init__(self, max_pending: int, retry_after: float) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending}")
        self.max_pending = max_pending
        self._cond = threading.Condition()
        self._items: deque[InboxItem] = deque()  # bounded: adds are counted in _pending
        self._drain = DrainRate(default=retry_after)
        self._pending = 0  # admitted and not yet finished
        self._wake_scheduled = False  # a `wake` is queued on the event loop
        self._accepting = True
        self._stopping = False
        self._dead_reason: str | None = None

    def admit(self, item: AddItem) -> bool:
        """Queues `item` or raises why not; True: the caller must queue `wake` (docstring)."""
        with self._cond:  # checked under the lock `close` takes: no add is stranded
            refusal = self._refusal()
            if refusal is not None:
                raise refusal
            self._pending += 1
            self._items.append(item)
            wake = not self._wake_scheduled
            self._wake_scheduled = True
        return wake

    def wake(self) -> None:
        with self._cond:
            self._wake_scheduled = False
            self._cond.notify()

    def refusal(self) -> Overloaded | EngineUnavailable | None:
        with self._cond:
            return self._refusal()

    def _refusal(self) -> Overloaded | EngineUnavailable | None:
        """Under `_cond`. An Overloaded counts as a refusal in the drain rate's Retry-After."""
        if self._dead_reason is not None:
            return EngineUnavailable(f"the engine has stopped: {self._dead_reason}")
        if not self._accepting:
            return EngineUnavailable("the server is shutting down")
        if self._pending >= self.max_pending:
            return Overloaded(
                f"the server has {self._pending} requests in flight (limit {self.max_pending})",
                self._drain.refused(time.monotonic()),
            )
        return None

    def post(self, item: AbortItem | KillItem | CallItem) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify()

    def put_back(self, items: list[InboxItem]) -> None:
        """Returns items the loop thread took but did not handle, ahead of any newer ones."""
        with self._cond:
            self._items.extendleft(reversed(items))

    def wait_for_items(self, has_work: Callable[[], bool]) -> list[InboxItem] | None:
        """Blocks until there are items or `has_work()`; every queued item, or None on stop."""
        with self._cond:
            while not (self._stopping or self._items or has_work()):
                self._cond.wait()
            if self._stopping:
                return None
            items = list(self._items)
            self._items.clear()
            return items

    def retry_after(self) -> float:
        """A refusal decided past admission (the engine's own bound): counted as one."""
        with self._cond:
            return self._drain.refused(time.monotonic())

    def release(self, count: int, drained: bool = True) -> None:
        """Frees `count` in-flight places; `drained`: their requests ran (the drain rate)."""
        if count:
            with self._cond:
                self._pending -= count
                if drained:
                    self._drain.released(time.monotonic(), count)

    def num_pending(self) -> int:
        with self._cond:
            return self._pending

    def num_queued_adds(self) -> int:
        """Requests admitted and not yet handed to the engine (the loop is mid-step)."""
        with self._cond:
            return sum(isinstance(item, AddItem) for item in self._items)

    def stop_accepting(self) -> None:
        with self._cond:
            self._accepting = False

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def close(self, dead_reason: str | None) -> list[InboxItem]:
        """Refuses all from now on (`dead_reason`: why the engine stopped, None on shutdown);
        returns the items still queued."""
        with self._cond:
            self._dead_reason = dead_reason
            self._accepting = False
            items = list(self._items)
            self._items.clear()
            return items

    @property
    def dead_reason(self) -> str | None:
        return self._dead_reason

    @property
    def stopping(self) -> bool:
        return self._stopping
