"""Per-request plumbing between the engine thread and the event loop.

`OutputSlot` holds one request's unread output deltas merged into one (`RequestOutput.merge`,
so a slow reader never grows a queue) and wakes its reader through the loop;
`RequestStream` is the async iterator a route consumes, aborting its request when closed early.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

from engine.requests.outputs import RequestOutput


class OutputSlot:
    """One request's mailbox: its unread outputs merged into one, plus an asyncio wake-up.

    Written by the loop thread (`admit`, `put`), read on the event loop (`get`).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._event = asyncio.Event()
        self._lock = threading.Lock()
        self._newest: RequestOutput | None = None
        self._admitted = False
        self._refusal: Exception | None = None
        self.last: RequestOutput | None = None  # loop thread only: the last output put

    def admit(self, refusal: Exception | None) -> None:
        with self._lock:
            self._admitted, self._refusal = True, refusal
        self._wake()

    def put(self, output: RequestOutput) -> None:
        self.last = output
        with self._lock:
            unread = self._newest
            self._newest = output if unread is None else unread.merge(output)
        self._wake()

    def _wake(self) -> None:
        # RuntimeError: the event loop is closed, so nobody is waiting any more
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait_admitted(self) -> None:
        while True:
            with self._lock:
                admitted, refusal = self._admitted, self._refusal
            if refusal is not None:
                raise refusal
            if admitted:
                return
            self._event.clear()  # no await since the check: a wake-up cannot be lost
            await self._event.wait()

    async def get(self) -> RequestOutput:
        while True:
            with self._lock:
                output, self._newest = self._newest, None
                refusal = self._refusal
            if output is not None:
                return output
            if refusal is not None:
                raise refusal
            self._event.clear()
            await self._event.wait()


class RequestStream:
    """Async iterator over one request's outputs (deltas); ends after the finished one.

    Closing it (or cancelling the task iterating it, or dropping it) before the end aborts
    the request.
    """

    def __init__(self, request_id: str, slot: OutputSlot, abort: Callable[[str], None]) -> None:
        self.request_id = request_id
        self._slot = slot
        self._abort = abort
        self._done = False

    async def admitted(self) -> None:
        """Returns once the engine took the request; re-raises its refusal otherwise."""
        try:
            await self._slot.wait_admitted()
        except BaseException:
            self.close()
            raise

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        try:
            output = await self._slot.get()
        except BaseException:  # cancelled (client gone) or refused
            self.close()
            raise
        if output.finished:
            self._done = True
        return output

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._abort(self.request_id)

    async def aclose(self) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: nothing left to abort
            self.close()
