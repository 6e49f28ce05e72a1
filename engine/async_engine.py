"""AsyncEngine: the asyncio seam in front of the synchronous Engine.

Contract:
- Drives any `engine.api.EngineCore`. The sync step loop runs in ONE background thread
  (engine/engine_loop.py); the event loop never runs a model step and never touches the
  engine's mutable state (only `new_request`, which validates and builds a request, changing
  nothing).
- Adds and aborts go through a thread-safe inbox (engine/engine_inbox.py), drained between
  steps, in arrival order. An
  idle loop thread is woken for an add by a callback queued on the event loop, so it starts
  stepping after the requests the event loop has already read (a burst's other requests,
  whose 429s are then decided without an engine step competing for the GIL and the cores);
  a busy loop thread finds the add at its next turn anyway.
- Each request owns one output slot holding the unread `RequestOutput` deltas merged into one
  (`RequestOutput.merge`): a slow reader never grows a queue.
- `generate()` validates and admits synchronously (raises `ValueError`, `Overloaded` or
  `EngineUnavailable` before anything is queued) and returns a `RequestStream`. It is
  `submit(new_request(...))`: `new_request` (validation, grammar compilation included) may run
  on any thread, so a server runs a request whose validation cost the client chooses (a
  grammar) on a worker, and only `submit` on the event loop. Awaiting
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
- `call(fn)` runs `fn(engine)` on the loop thread between steps and awaits its result (the K/V
  export of a prefill server, engine/kv_transfer/link.py).
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
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from engine.api import EngineCore, EngineInfo
from engine.engine_inbox import AbortItem, AddItem, CallItem, EngineInbox, KillItem
from engine.engine_loop import EngineLoop
from engine.errors import EngineUnavailable, Overloaded
from engine.lora_adapters import LoraAdapters
from engine.requests.request import Request
from engine.requests.request_stream import OutputSlot, RequestStream
from engine.requests.sampling_params import SamplingParams
from engine.stats import EngineStats

logger = logging.getLogger(__name__)

ABORT_GRACE_SECONDS = 5.0  # how long shutdown waits for the aborted requests to report back
GIL_SWITCH_INTERVAL_S = 0.001  # the most the event loop waits for the GIL (see `start`)


class AsyncEngine:
    def __init__(
        self,
        engine: EngineCore,
        max_pending: int,
        stall_timeout: float = 60.0,
        retry_after: float = 1.0,
        on_dead: Callable[[str], None] | None = None,
    ) -> None:
        self.engine = engine
        self.stall_timeout = stall_timeout
        self._inbox = EngineInbox(max_pending, retry_after)
        self._loop = EngineLoop(engine, self._inbox, on_dead)
        self._killed: str | None = None  # set by kill(), from any thread
        self._thread: threading.Thread | None = None

    @property
    def max_pending(self) -> int:
        return self._inbox.max_pending

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("AsyncEngine.start() was called twice")
        # While the loop thread runs Python (scheduling, sampling), the event loop waits for
        # the GIL until the interpreter's switch interval (5 ms by default) passes: each 429 or
        # stream write would wait that long once per handoff. Never raised, only lowered.
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))
        self._thread = threading.Thread(target=self._loop.run, name="tgserve-engine", daemon=True)
        self._thread.start()
        watch = getattr(self.engine, "watch_failures", None)
        if watch is not None:
            watch(self.kill)

    def kill(self, reason: str) -> None:
        """The engine is dead (any thread): unhealthy now; the loop ends at its next turn."""
        self._killed = reason
        self._inbox.post(KillItem(reason))

    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        deadline: float | None = None,
    ) -> RequestStream:
        return self.submit(self.new_request(request_id, prompt_token_ids, params), deadline)

    def new_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> Request:
        """Validates and builds a request (ValueError); changes nothing: any thread may call it."""
        return self.engine.new_request(request_id, prompt_token_ids, params)

    def submit(self, request: Request, deadline: float | None = None) -> RequestStream:
        """Admits a request `new_request` built (Overloaded / EngineUnavailable); on the loop."""
        request_id = request.request_id
        loop = asyncio.get_running_loop()
        slot = OutputSlot(loop)
        if self._inbox.admit(AddItem(request, slot, deadline)):
            loop.call_soon(self._inbox.wake)  # after the requests the event loop already holds
        return RequestStream(request_id, slot, self.abort)

    async def call(self, fn: Callable[[Any], Any]) -> Any:
        """`fn(engine)` on the loop thread between steps (no forward in flight: the K/V pool is
        still), its result or its exception; EngineUnavailable once the loop has stopped."""
        refusal = self._inbox.refusal()
        if isinstance(refusal, EngineUnavailable):
            raise refusal
        result: Future = Future()
        self._inbox.post(CallItem(fn, result))
        return await asyncio.wrap_future(result)

    @property
    def kv_link(self) -> Any:
        """A prefill or decode server's K/V link (engine/kv_transfer/link.py), or None."""
        return getattr(self.engine, "kv_link", None)

    def refusal(self) -> Overloaded | EngineUnavailable | None:
        """Why `generate()` would refuse a request now, or None; reserves nothing. A caller can
        answer a refusal before it parses a request (the server's guard does, so a burst's
        429s cost no body parsing); a request it lets through is decided by `generate()`."""
        return self._inbox.refusal()

    def abort(self, request_id: str) -> None:
        """Thread-safe; takes effect at the next step (the stream then ends with "abort")."""
        self._inbox.post(AbortItem(request_id))

    def num_pending(self) -> int:
        return self._inbox.num_pending()

    def stats(self) -> EngineStats:
        """The engine's stats now (a frozen snapshot read at call time, also mid-step), with
        the requests admitted but not yet handed to the engine counted as waiting."""
        return self._loop.live_stats(self._inbox.num_queued_adds())

    @property
    def info(self) -> EngineInfo:
        return self.engine.info

    @property
    def adapters(self) -> LoraAdapters | None:
        """The engine's LoRA adapters by name (engine/lora_adapters.py: thread-safe), or None
        for an engine without (the tests' fake one)."""
        return getattr(getattr(self.engine, "intake", None), "adapters", None)

    def is_healthy(self) -> bool:
        if self._inbox.dead_reason is not None or self._killed is not None:
            return False
        if self._thread is not None and not self._thread.is_alive() and not self._inbox.stopping:
            return False
        stalled = time.monotonic() - self._loop.last_progress_time > self.stall_timeout
        return not (stalled and self.num_pending() > 0)

    async def shutdown(self, timeout: float) -> None:
        """Drain for `timeout` seconds, abort what is left, then stop the loop thread."""
        self._inbox.stop_accepting()
        if self._thread is None:
            return
        await self._wait_until_idle(timeout)
        if self.num_pending():
            logger.info("aborting %d request(s) still in flight after draining", self.num_pending())
            self._inbox.post(AbortItem(None))
            await self._wait_until_idle(ABORT_GRACE_SECONDS)
        self._inbox.stop()
        await asyncio.to_thread(self._thread.join, ABORT_GRACE_SECONDS)

    async def _wait_until_idle(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while self.num_pending() and time.monotonic() < end and self._thread.is_alive():
            await asyncio.sleep(0.02)
