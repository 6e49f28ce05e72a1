"""EngineLoop: the one thread that steps the engine, between steps applying what the inbox
holds, and hands each request's outputs to its slot.

Contract (`run()` is the thread's body; everything else here is the loop thread's own):
- Each turn takes every inbox item in arrival order (engine/engine_inbox.py): adds go to the
  engine (`EngineCore.add`; a refusal there is handed to the request's slot: `Overloaded` for
  the engine's QueueFullError, the engine's own error otherwise), aborts take effect at the
  next step; then requests past their deadline are aborted, and one step runs if there is
  work. Outputs go to their slots; a finished one frees its place (`EngineInbox.release`)
  before its final put, so a client that has seen its last output never sees it pending.
- An exception in a turn ends every in-flight request with finish_reason "error"; the loop
  goes on, and stops after `MAX_CONSECUTIVE_FAILURES` failing turns in a row, or at once for a
  `FatalEngineError` (a `KillItem` raises one). Stopping, it refuses the adds still queued,
  ends every open stream with "abort", calls the engine's optional `close()` (the other
  tensor-parallel ranks stop there) and, when it died, `on_dead(reason)` once.
- `last_progress_time` (time.monotonic) is when the loop last woke or finished a turn;
  `stats` the engine's stats after the last turn. `live_stats(queued)` is the one method
  another thread may call: the engine's stats read now (a step may last seconds: a scrape
  during it must see the requests it runs, issue 39), with `queued` admitted adds the loop has
  not taken yet counted as waiting; the last turn's if the read fails.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from engine.api import EngineCore
from engine.engine_inbox import AbortItem, AddItem, CallItem, EngineInbox, InboxItem, KillItem
from engine.errors import EngineUnavailable, FatalEngineError, Overloaded, QueueFullError
from engine.requests.outputs import RequestOutput, closing_output
from engine.requests.request_stream import OutputSlot
from engine.stats import EngineStats

logger = logging.getLogger(__name__)

MAX_CONSECUTIVE_FAILURES = 3


class EngineLoop:
    def __init__(
        self, engine: EngineCore, inbox: EngineInbox, on_dead: Callable[[str], None] | None
    ) -> None:
        self.engine = engine
        self.inbox = inbox
        self.on_dead = on_dead
        self.last_progress_time = time.monotonic()
        self.stats: EngineStats = engine.stats()
        self._slots: dict[str, OutputSlot] = {}
        self._deadlines: dict[str, float] = {}

    def run(self) -> None:
        failures, dead_reason = 0, None
        while True:
            items = self.inbox.wait_for_items(self.engine.has_unfinished_requests)
            if items is None:
                break
            self.last_progress_time = time.monotonic()  # woke up: a stall is counted from here
            try:
                self._apply(items)
                self._expire_deadlines()
                if self.engine.has_unfinished_requests():
                    self._dispatch(self.engine.step())
                failures = 0
            except Exception as exc:  # the engine failed; the loop itself goes on
                failures += 1
                logger.exception("engine step failed (%d in a row)", failures)
                self._fail_in_flight(exc)
                if isinstance(exc, FatalEngineError) or failures >= MAX_CONSECUTIVE_FAILURES:
                    dead_reason = (
                        str(exc)
                        if isinstance(exc, FatalEngineError)
                        else f"{failures} engine steps failed in a row"
                    )
                    logger.error("engine loop stops: %s", dead_reason)
                    break
            self._refresh_stats()
            self.last_progress_time = time.monotonic()
        self._close_out(dead_reason)
        self._close_engine()
        if dead_reason is not None and self.on_dead is not None:
            self.on_dead(dead_reason)

    def _apply(self, items: list[InboxItem]) -> None:
        for index, item in enumerate(items):
            if isinstance(item, KillItem):  # what came after it is refused by _close_out
                self.inbox.put_back(items[index + 1 :])
                raise FatalEngineError(item.reason)
            if isinstance(item, AddItem):
                self._add(item)
            elif isinstance(item, CallItem):  # between steps: no forward reads or writes K/V
                item.run(self.engine)
            elif isinstance(item, AbortItem):
                targets = list(self._slots) if item.request_id is None else [item.request_id]
                for request_id in targets:
                    if request_id in self._slots:
                        self._abort_in_engine(request_id)

    def _add(self, item: AddItem) -> None:
        try:
            self.engine.add(item.request)
        except QueueFullError as exc:  # only when max_pending exceeds the engine's own bound
            self.inbox.release(1, drained=False)
            item.slot.admit(Overloaded(str(exc), self.inbox.retry_after()))
            return
        except Exception as exc:  # refused as invalid: the caller re-raises it
            self.inbox.release(1, drained=False)
            item.slot.admit(exc)
            return
        request_id = item.request.request_id
        self._slots[request_id] = item.slot
        if item.deadline is not None:
            self._deadlines[request_id] = item.deadline
        item.slot.admit(None)

    def _expire_deadlines(self) -> None:
        now = time.monotonic()
        for request_id, deadline in list(self._deadlines.items()):
            if now >= deadline:
                logger.info("request %s passed its deadline; aborting it", request_id)
                del self._deadlines[request_id]
                self._abort_in_engine(request_id)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            slot = self._slots.get(output.request_id)
            if slot is None:  # already failed or unknown: nobody is listening
                continue
            if output.finished:  # released before the final put (module docstring)
                del self._slots[output.request_id]
                self._deadlines.pop(output.request_id, None)
                self.inbox.release(1)
            slot.put(output)

    def _fail_in_flight(self, exc: Exception) -> None:
        message = f"the engine failed while generating ({type(exc).__name__}); please retry"
        for request_id, slot in list(self._slots.items()):
            slot.put(closing_output(request_id, slot.last, "error", message))
            self._abort_in_engine(request_id)
        self.inbox.release(len(self._slots))
        self._slots.clear()
        self._deadlines.clear()

    def _abort_in_engine(self, request_id: str) -> None:
        try:
            self.engine.abort_request(request_id)
        except Exception:  # best effort: the engine may be in a bad state after a failure
            logger.exception("aborting %s failed", request_id)

    def _close_out(self, dead_reason: str | None) -> None:
        """The loop ends: refuse adds still queued, end every open stream (nobody else will)."""
        refusal = EngineUnavailable(dead_reason or "the server is shutting down")
        for item in self.inbox.close(dead_reason):
            if isinstance(item, AddItem):
                self.inbox.release(1, drained=False)
                item.slot.admit(refusal)
            elif isinstance(item, CallItem):
                item.result.set_exception(refusal)
        for request_id, slot in self._slots.items():
            slot.put(closing_output(request_id, slot.last, "abort", None))
        self.inbox.release(len(self._slots))
        self._slots.clear()

    def _close_engine(self) -> None:
        close = getattr(self.engine, "close", None)
        if close is None:
            return
        try:
            close()
        except Exception:
            logger.exception("closing the engine failed")

    def live_stats(self, queued: int = 0) -> EngineStats:
        """From any thread: the engine's counts are plain sizes, read without the loop's help."""
        try:
            stats = self.engine.stats()
        except Exception:  # mid-update on the loop's thread: the last turn's figures
            stats = self.stats
        return dataclasses.replace(stats, num_waiting=stats.num_waiting + queued)

    def _refresh_stats(self) -> None:
        try:
            self.stats = self.engine.stats()
        except Exception:
            logger.exception("engine.stats() failed")
