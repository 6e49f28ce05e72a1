"""Connection hygiene: uvicorn's HTTP/1.1 protocol (h11) with the limits it lacks, so slow or
many clients cannot hold the server's sockets, file descriptors or tasks.

Contract: `uvicorn_options(settings)` is what `uvicorn.Config` gets (serve.py; the tests' live
server too): the protocol class `connection_protocol(settings)` builds, and the keep-alive
timeout. Each connection:
- is refused at once, with a `503` + `Retry-After` + `Connection: close` written before any
  byte is read, while `max_connections` others are open (`--max-connections`; by default also
  kept below the process's open-file limit, `connection_cap`);
- must send its whole request line and headers within `--header-timeout` seconds of opening
  (or of its previous response, on a kept-alive connection), else `408` and closed: headers are
  read before the API key is checked, so this holds for clients without a key too;
- must send its whole body within `--body-timeout` seconds of its headers, else `408` (or, once
  a response has begun, just closed); the route sees a disconnect (an info line, never a 500);
  a 408 is followed by a lingering close: FIN after the response, then what the client still
  sends is read and dropped until it closes or `LINGER_S` pass (closing a socket with unread
  bytes sends a reset, which can discard the 408 before the client has read it);
- is closed after `--max-requests-per-connection` responses, and after `--keep-alive-timeout`
  idle seconds between requests (uvicorn's own timer).
Refusals and timeouts call `on_refusal(reason)` ("connections", "header_timeout",
"body_timeout"): the server counts them on `tgserve_request_rejected_total{reason}`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from server.settings import Settings

logger = logging.getLogger("tgserve.connections")
FD_RESERVE = 128  # descriptors kept for the model files, logs, pipes and the engine
LINGER_S = 2.0  # how long a connection answered 408 is drained before it is closed


def connection_cap(requested: int) -> int:
    """`requested`, lowered to fit under the open-file limit (with a reserve) if it must be."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft - FD_RESERVE >= requested:
        return requested
    return max(1, soft - FD_RESERVE)


def uvicorn_options(
    settings: Settings, on_refusal: Callable[[str], None] = lambda reason: None
) -> dict[str, Any]:
    return {
        "http": connection_protocol(settings, on_refusal),
        "timeout_keep_alive": settings.keep_alive_timeout,
    }


def connection_protocol(
    settings: Settings, on_refusal: Callable[[str], None] = lambda reason: None
) -> type[H11Protocol]:
    """An H11Protocol class with these settings' limits (see the module docstring)."""
    cap = connection_cap(settings.max_connections)
    if cap < settings.max_connections:
        logger.warning(
            "--max-connections %d is above what the open-file limit allows; using %d",
            settings.max_connections,
            cap,
        )

    class GuardedH11Protocol(_Guarded):
        max_connections = cap
        header_timeout = settings.header_timeout
        body_timeout = settings.body_timeout
        max_requests = settings.max_requests_per_connection
        refused = staticmethod(on_refusal)

    return GuardedH11Protocol


class _Guarded(H11Protocol):
    max_connections: int
    header_timeout: float
    body_timeout: float
    max_requests: int
    refused: Callable[[str], None]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._lingering = False  # answered 408: its bytes are dropped until it closes
        self._served = 0
        self._deadline: asyncio.TimerHandle | None = None
        if len(self.connections) > self.max_connections:
            self._refuse(503, "too many open connections; retry later", "connections")
            return
        self._arm(self.header_timeout, "header_timeout")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # after a 408: read so the close stays a FIN, and dropped
            return
        super().data_received(data)

    def handle_events(self) -> None:
        before = self.conn.their_state
        super().handle_events()
        after = self.conn.their_state
        started = before is h11.IDLE and after is not h11.IDLE and self.cycle is not None
        if started and self._served + 1 >= self.max_requests:  # closed after its response
            self.cycle.keep_alive = False
        if before is h11.IDLE and after is h11.SEND_BODY:  # headers in, the body to come
            self._arm(self.body_timeout, "body_timeout")
        elif after is not h11.IDLE and after is not h11.SEND_BODY:  # the request is all in
            self._disarm()

    def on_response_complete(self) -> None:
        self._served += 1
        super().on_response_complete()
        if not self.transport.is_closing():  # the next request's headers, in time
            self._arm(self.timeout_keep_alive + self.header_timeout, "header_timeout")

    def _arm(self, seconds: float, reason: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._too_slow, reason)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self, reason: str) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and cycle.more_body:
            cycle.disconnected = True  # the route's receive() sees a disconnect
            cycle.message_event.set()
            if cycle.response_started:
                self.refused(reason)
                self.transport.close()
                return
        what = "headers" if reason == "header_timeout" else "body"
        self._refuse(408, f"the request's {what} did not arrive in time", reason)

    def _refuse(self, status: int, message: str, reason: str) -> None:
        """A whole response written raw (h11 has no request to answer), then closed."""
        self.refused(reason)
        body = json.dumps({"error": {"message": message, "type": "request_error"}}).encode()
        phrase = {408: "Request Timeout", 503: "Service Unavailable"}[status]
        head = (
            f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\nretry-after: 1\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        if status == 408 and self.transport.can_write_eof():  # the lingering close (above)
            self._lingering = True
            self.transport.write_eof()
            self.transport.resume_reading()  # drained even if flow control had paused it
            self._deadline = self.loop.call_later(LINGER_S, self.transport.close)
            return
        self.transport.close()
