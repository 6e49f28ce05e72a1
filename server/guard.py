"""The guard: pure ASGI middleware (it must not buffer streams) that answers before any route.

Contract: 413 when the body is larger than `max_body_bytes` (Content-Length, or counted while
reading), 401 without a valid `Authorization: Bearer` key (constant-time comparison; the key is
never logged), 503 while loading or draining. `settings.public_routes` skip auth and readiness.
Every refusal is counted in the metrics by reason.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import ApiError, error_response, rejection_reason
from server.state import ServerState


class Guard:
    """Pure ASGI middleware (it must not buffer streams): body limit, auth, readiness."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state
        self.keys = [key.encode() for key in state.settings.api_key]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, state = scope["path"], self.state
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        limit = state.settings.max_body_bytes
        error = None
        if _content_length(headers) > limit:
            error = ApiError(
                413, f"the request body is larger than {limit} bytes", code="request_too_large"
            )
        elif path not in state.settings.public_routes:
            if self.keys and not self._authorized(headers.get("authorization", "")):
                error = ApiError(
                    401,
                    "a valid API key is needed: 'Authorization: Bearer <key>'",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
            elif state.draining:
                error = ApiError(503, "the server is shutting down", code="draining")
            elif not state.ready:
                error = ApiError(
                    503,
                    "the model is still loading; retry shortly",
                    code="not_ready",
                    headers={"Retry-After": "5"},
                )
        if error is not None:
            state.metrics.reject(rejection_reason(error.status))
            return await error_response(path, error)(scope, receive, send)
        await self.app(scope, _limited(receive, limit), send)

    def _authorized(self, header: str) -> bool:
        scheme, _, token = header.partition(" ")
        given = token.strip().encode()
        matched = False
        for key in self.keys:  # no early exit: the time taken does not depend on which key
            matched |= hmac.compare_digest(given, key)
        return matched and scheme.lower() == "bearer"


def _content_length(headers: dict[str, str]) -> int:
    try:
        return int(headers.get("content-length", "0"))
    except ValueError:
        return 0  # malformed: the streamed byte count still enforces the limit


def _limited(receive: Receive, limit: int) -> Receive:
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:  # raised inside the route: the error handlers render and count it
                raise ApiError(
                    413, f"the request body is larger than {limit} bytes", code="request_too_large"
                )
        return message

    return wrapped
