"""AsyncEngine: the asyncio seam in front of the synchronous Engine.

Contract:
- Drives any `engine.api.EngineCore`. The sync step loop runs in ONE background thread; the
  event loop never runs a model step and never touches the engine's mutable state (only
  `new_request`, which validates and builds a request, changing nothing).
- Adds and aborts go through a thread-safe inbox, drained between steps, in arrival order. An
  idle loop thread is woken for an add by a callback queued on the event loop, so it starts
  stepping after the requests the event loop has already read (a burst's other requests,
  whose 429s are then decided without an engine step competing for the GIL and the cores);
  a busy loop thread finds the add at its next turn anyway.
- Each request owns one output slot holding the unread `RequestOutput` deltas merged into one
  (`RequestOutput.merge`): a slow reader never grows a queue.
- `generate()` validates and admits synchronously (raises `ValueError`, `Overloaded` or
  `EngineUnavailable` before anything is queued) and returns a `RequestStream`; awaiting
  `stream.admitted()` waits until the engine took the request (or re-raises why it refused:
  the engine's ValueError, or `Overloaded` for its QueueFullError).
  The stream ends after the finished output; closing or cancelling it early aborts the request.
- Admission bound, the one rule (`EngineConfig.max_in_flight`, the engine's own bound is the
  same number): admitted-but-unfinished requests (running + waiting + inbox) <= `max_pending`,
  decided here, under one lock, before anything is queued, so a burst of N requests with room
  for R gets exactly N - R `Overloaded`, at once, however it interleaves with engine steps.
  `refusal()` answers the same question without reserving (for a refusal before parsing).
  `Overloaded.retry_after` comes from the observed drain rate (engine/drain_rate.py).
- A deadline (a `time.monotonic()` value) aborts the request at the next step, even when queued.
- An exception in `step()` ends every in-flight request with finish_reason "error"; the loop
  goes on, and declares itself dead after `MAX_CONSECUTIVE_FAILURES` failing steps in a row,
  or at once when the exception is a `FatalEngineError`. A dead loop calls `on_dead(reason)`
  (from the loop thread) once: the server uses it to exit so an orchestrator restarts it.
- `is_healthy()` is False when the loop is dead or work is pending and no loop iteration
  completed for `stall_timeout` seconds.
- `kill(reason)`: an outside watchdog declares the engine dead (a tensor-parallel rank's
  process exited, reported by the engine's optional `watch_failures(callback)`, hooked up at
  `start`): /health fails at once, and the loop takes the fatal path above at its next turn.
- When the loop thread ends it calls the engine's optional `close()` (from that thread: the
  other tensor-parallel ranks are stopped there, after the drain).
- `shutdown(timeout)` stops admission, lets in-flight work finish for `timeout` seconds, aborts
  the rest (their streams end with finish_reason "abort") and stops the thread.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from engine.api import EngineCore, EngineInfo
from engine.drain_rate import DrainRate
from engine.errors import EngineUnavailable, FatalEngineError, Overloaded, QueueFullError
from engine.requests.outputs import RequestOutput, closing_output
from engine.requests.request import Request
from engine.requests.request_stream import OutputSlot, RequestStream
from engine.requests.sampling_params import SamplingParams
from engine.stats import EngineStats

logger = logging.getLogger(__name__)

MAX_CONSECUTIVE_FAILURES = 3
ABORT_GRACE_SECONDS = 5.0  # how long shutdown waits for the aborted requests to report back
GIL_SWITCH_INTERVAL_S = 0.001  # the most the event loop waits for the GIL (see `start`)


@dataclass(frozen=True)
class _Add:
    request: Request  # validated by the engine's new_request
    slot: OutputSlot
    deadline: float | None


@dataclass(frozen=True)
class _Abort:
    request_id: str | None  # None: abort everything in flight


@dataclass(frozen=True)
class _Kill:
    reason: str  # an outside watchdog found the engine dead


class AsyncEngine:
    def __init__(
        self,
        engine: EngineCore,
        max_pending: int,
        stall_timeout: float = 60.0,
        retry_after: float = 1.0,
        on_dead: Callable[[str], None] | None = None,
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending}")
        self.engine = engine
        self.max_pending = max_pending
        self.stall_timeout = stall_timeout
        self.retry_after = retry_after
        self._drain = DrainRate(default=retry_after)  # guarded by _cond
        self.on_dead = on_dead
        self.last_progress_time = time.monotonic()
        self._cond = threading.Condition()
        self._inbox: deque[_Add | _Abort | _Kill] = deque()  # bounded: adds are counted in _pending
        self._wake_scheduled = False  # a `_wake` of the loop thread is queued on the event loop
        self._pending = 0  # admitted and not yet finished; guarded by _cond
        self._accepting = True
        self._stopping = False
        self._dead_reason: str | None = None
        self._killed: str | None = None  # set by kill(), from any thread
        self._thread: threading.Thread | None = None
        # Owned by the loop thread only:
        self._slots: dict[str, OutputSlot] = {}
        self._deadlines: dict[str, float] = {}
        self._stats = engine.stats()

    # ---- event-loop side -------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("AsyncEngine.start() was called twice")
        # While the loop thread runs Python (scheduling, sampling), the event loop waits for
        # the GIL until the interpreter's switch interval (5 ms by default) passes: each 429 or
        # stream write would wait that long once per handoff. Never raised, only lowered.
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))
        self._thread = threading.Thread(target=self._run, name="tgserve-engine", daemon=True)
        self._thread.start()
        watch = getattr(self.engine, "watch_failures", None)
        if watch is not None:
            watch(self.kill)

    def kill(self, reason: str) -> None:
        """The engine is dead (any thread): unhealthy now; the loop ends at its next turn."""
        self._killed = reason
        self._post(_Kill(reason))

    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        deadline: float | None = None,
    ) -> RequestStream:
        request = self.engine.new_request(request_id, prompt_token_ids, params)  # ValueError
        loop = asyncio.get_running_loop()
        slot = OutputSlot(loop)
        with self._cond:  # checked under the lock the loop closes under: no add is stranded
            refusal = self._refusal()
            if refusal is not None:
                raise refusal
            self._pending += 1
            self._inbox.append(_Add(request, slot, deadline))
            wake = not self._wake_scheduled
            self._wake_scheduled = True
        if wake:  # after the requests the event loop already holds (module docstring)
            loop.call_soon(self._wake)
        return RequestStream(request_id, slot, self.abort)

    def _wake(self) -> None:
        with self._cond:
            self._wake_scheduled = False
            self._cond.notify()

    def refusal(self) -> Overloaded | EngineUnavailable | None:
        """Why `generate()` would refuse a request now, or None; reserves nothing. A caller can
        answer a refusal before it parses a request (the server's guard does, so a burst's
        429s cost no body parsing); a request it lets through is decided by `generate()`."""
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

    def abort(self, request_id: str) -> None:
        """Thread-safe; takes effect at the next step (the stream then ends with "abort")."""
        self._post(_Abort(request_id))

    def num_pending(self) -> int:
        with self._cond:
            return self._pending

    def stats(self) -> EngineStats:
        """The engine's stats as of the last loop iteration (a frozen snapshot)."""
        return self._stats

    @property
    def info(self) -> EngineInfo:
        return self.engine.info

    def is_healthy(self) -> bool:
        if self._dead_reason is not None or self._killed is not None:
            return False
        if self._thread is not None and not self._thread.is_alive() and not self._stopping:
            return False
        stalled = time.monotonic() - self.last_progress_time > self.stall_timeout
        return not (stalled and self.num_pending() > 0)

    async def shutdown(self, timeout: float) -> None:
        """Drain for `timeout` seconds, abort what is left, then stop the loop thread."""
        with self._cond:
            self._accepting = False
        if self._thread is None:
            return
        await self._wait_until_idle(timeout)
        if self.num_pending():
            logger.info("aborting %d request(s) still in flight after draining", self.num_pending())
            self._post(_Abort(None))
            await self._wait_until_idle(ABORT_GRACE_SECONDS)
        with self._cond:
            self._stopping = True
            self._cond.notify()
        await asyncio.to_thread(self._thread.join, ABORT_GRACE_SECONDS)

    async def _wait_until_idle(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while self.num_pending() and time.monotonic() < end and self._thread.is_alive():
            await asyncio.sleep(0.02)

    def _post(self, item: _Add | _Abort | _Kill) -> None:
        with self._cond:
            self._inbox.append(item)
            self._cond.notify()

    # ---- loop thread -----------------------------------------------------------------------

    def _run(self) -> None:
        failures, dead_reason = 0, None
        while True:
            with self._cond:
                while not (self._stopping or self._inbox or self.engine.has_unfinished_requests()):
                    self._cond.wait()
                if self._stopping:
                    break
                items = list(self._inbox)
                self._inbox.clear()
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

    def _close_engine(self) -> None:
        close = getattr(self.engine, "close", None)
        if close is None:
            return
        try:
            close()
        except Exception:
            logger.exception("closing the engine failed")

    def _close_out(self, dead_reason: str | None) -> None:
        """The loop ends: refuse adds still queued, end every open stream (nobody else will)."""
        with self._cond:
            self._dead_reason = dead_reason
            self._accepting = False
            items = list(self._inbox)
            self._inbox.clear()
        refusal = EngineUnavailable(dead_reason or "the server is shutting down")
        for item in items:
            if isinstance(item, _Add):
                self._release(1, drained=False)
                item.slot.admit(refusal)
        for request_id, slot in self._slots.items():
            slot.put(closing_output(request_id, slot.last, "abort", None))
        self._release(len(self._slots))
        self._slots.clear()

    def _apply(self, items: list[_Add | _Abort | _Kill]) -> None:
        for index, item in enumerate(items):
            if isinstance(item, _Kill):  # what came after it is refused by _close_out
                with self._cond:
                    self._inbox.extendleft(reversed(items[index + 1 :]))
                raise FatalEngineError(item.reason)
            if isinstance(item, _Add):
                self._add(item)
            else:
                targets = list(self._slots) if item.request_id is None else [item.request_id]
                for request_id in targets:
                    if request_id in self._slots:
                        self._abort_in_engine(request_id)

    def _add(self, item: _Add) -> None:
        try:
            self.engine.add(item.request)
        except QueueFullError as exc:  # only when max_pending exceeds the engine's own bound
            self._release(1, drained=False)
            with self._cond:
                retry = self._drain.refused(time.monotonic())
            item.slot.admit(Overloaded(str(exc), retry))
            return
        except Exception as exc:  # refused as invalid: the caller re-raises it
            self._release(1, drained=False)
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
            if output.finished:  # released before the final put: a client that has seen
                del self._slots[output.request_id]  # its last output never sees it pending
                self._deadlines.pop(output.request_id, None)
                self._release(1)
            slot.put(output)

    def _fail_in_flight(self, exc: Exception) -> None:
        message = f"the engine failed while generating ({type(exc).__name__}); please retry"
        for request_id, slot in list(self._slots.items()):
            slot.put(closing_output(request_id, slot.last, "error", message))
            self._abort_in_engine(request_id)
        self._release(len(self._slots))
        self._slots.clear()
        self._deadlines.clear()

    def _abort_in_engine(self, request_id: str) -> None:
        try:
            self.engine.abort_request(request_id)
        except Exception:  # best effort: the engine may be in a bad state after a failure
            logger.exception("aborting %s failed", request_id)

    def _release(self, count: int, drained: bool = True) -> None:
        """Frees `count` in-flight places; `drained`: their requests ran (the drain rate)."""
        if count:
            with self._cond:
                self._pending -= count
                if drained:
                    self._drain.released(time.monotonic(), count)

    def _refresh_stats(self) -> None:
        try:
            self._stats = self.engine.stats()
        except Exception:
            logger.exception("engine.stats() failed")
