"""Server-sent events and client-disconnect handling: the one place responses are streamed.

Contract:
- `sse(data)` frames one event as `data: <json>\\n\\n` (`sse_event(name, data)`: after an
  `event: <name>` line); `SSE_DONE` is `data: [DONE]\\n\\n`;
  `sse_error(message)` is an engine error mid-stream in the OpenAI error shape (code
  "engine_error", as the non-streamed 500 of `final_output`).
- `EventStreamResponse(events, keepalive)` streams an async iterator of already framed bytes
  while it watches the connection: when the client disconnects, the task pulling `events` is
  cancelled, so the generator's cleanup (closing its RequestStream) aborts the engine request at
  once, even while the request is still queued and produces nothing to write. While nothing
  was sent for `keepalive` seconds (> 0; a queued request, a long prefill), a task of its own
  sends the SSE comment `: keep-alive` (SSE_KEEPALIVE), which clients ignore and proxies count
  as traffic.
- `run_until_disconnect(receive, awaitable)` does the same for non-streaming responses:
  it raises `ClientDisconnected` after cancelling the work when the client goes away first.
- `final_output(stream)` drains a stream and returns its finished output, or raises a 500
  ApiError when the engine ended it with an error.
- `merge_streams(streams)` interleaves several request streams (several prompts in one
  completion request) with back-pressure, so a slow reader still never grows a queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any, TypeVar

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from engine import OutputAccumulator, RequestOutput
from server.errors import ApiError, ClientDisconnected

T = TypeVar("T")
SSE_DONE = b"data: [DONE]\n\n"
SSE_KEEPALIVE = b": keep-alive\n\n"  # a comment line: every SSE client skips it
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy buffering


def sse(data: Any) -> bytes:
    return (
        b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"
    )


def sse_event(event: str, data: Any) -> bytes:
    """A named event (`event: <name>` before its data), as Anthropic's and the Responses API's
    streams are framed."""
    return b"event: " + event.encode() + b"\n" + sse(data)


def sse_error(message: str) -> bytes:
    """An engine error mid-stream, as one event in the OpenAI error shape (as vLLM sends it)."""
    error = {"message": message, "type": "server_error", "param": None, "code": "engine_error"}
    return sse({"error": error})


class EventStreamResponse(Response):
    def __init__(
        self,
        events: AsyncIterator[bytes],
        keepalive: float = 0.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        """`keepalive`: seconds without an event before a keep-alive comment (0: never)."""
        # no Response.__init__: it would declare a Content-Length for an empty body
        self.status_code = 200
        self.background = None
        self._events = events
        self._keepalive = keepalive
        merged = {
            **SSE_HEADERS,
            **(headers or {}),
            "content-type": "text/event-stream; charset=utf-8",
        }
        self.raw_headers = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in merged.items()
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        sender = _Sender(send)
        async with anyio.create_task_group() as group:

            async def pump() -> None:
                try:
                    async for chunk in self._events:
                        await sender.send(chunk)
                    await sender.send(b"", last=True)
                except OSError:  # the transport broke mid-write: the client is gone
                    pass
                finally:
                    with contextlib.suppress(Exception):
                        await self._events.aclose()  # type: ignore[attr-defined]
                group.cancel_scope.cancel()

            async def watch() -> None:
                await _wait_for_disconnect(receive)
                group.cancel_scope.cancel()

            group.start_soon(pump)
            group.start_soon(watch)
            if self._keepalive > 0:
                group.start_soon(sender.keep_alive, self._keepalive)


class _Sender:
    """The body's writer: events and keep-alive comments, one message at a time (a lock), none
    after the last. The keep-alive task wakes once per interval, so an event costs no timer."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._lock = asyncio.Lock()  # no checkpoint when free: an event costs no loop turn
        self._clock = asyncio.get_running_loop().time
        self._last = self._clock()
        self._done = False

    async def send(self, body: bytes, last: bool = False) -> None:
        async with self._lock:
            if self._done:
                return
            self._done = last
            await self._send({"type": "http.response.body", "body": body, "more_body": not last})
            self._last = self._clock()

    async def keep_alive(self, interval: float) -> None:
        with contextlib.suppress(OSError):  # the client is gone: the watcher ends the response
            while not self._done:
                wait = self._last + interval - self._clock()
                if wait > 0:
                    await asyncio.sleep(wait)
                else:
                    await self.send(SSE_KEEPALIVE)


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def run_until_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """`work`'s result, or `ClientDisconnected` once `work` is cancelled because the client left.
    The disconnect is told by the watcher, never by how `work` ended: a cancelled
    `asyncio.gather` ends with a CancelledError *exception*, not in the cancelled state."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    if task.done() and not task.cancelled() and task.exception() is None:
        return task.result()  # finished first (or together with the disconnect): answer it
    if watcher.done() and not watcher.cancelled():
        raise ClientDisconnected()
    return task.result()  # the work's own error (or the caller's cancellation)


async def final_output(stream: AsyncIterator[RequestOutput]) -> RequestOutput:
    """Drains a stream of deltas into its whole finished output (offsets 0)."""
    whole = OutputAccumulator()
    last = None
    async with _closing(stream) as outputs:  # cancelled here: the stream aborts its request
        async for output in outputs:
            whole.add(output)
            last = output
    if last is None or last.error is not None:
        raise ApiError(
            500, last.error if last else "the request ended without output", code="engine_error"
        )
    return whole.result()


@contextlib.asynccontextmanager
async def _closing(stream: AsyncIterator[T]) -> AsyncIterator[AsyncIterator[T]]:
    try:
        yield stream
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()


async def merge_streams(streams: Sequence[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Yields (stream index, item) as items arrive; ends when every stream has ended."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    end = object()
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue(maxsize=len(streams))

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                await queue.put((index, item))  # waits while the reader is behind
        except Exception as exc:  # handed to the reader, which re-raises it
            await queue.put((index, exc))
            return
        await queue.put((index, end))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            index, item = await queue.get()
            if item is end:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
