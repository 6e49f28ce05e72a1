"""The guard: pure ASGI middleware (it must not buffer streams) that answers before any route.

Contract: 431 (with `Connection: close`) when the request carries more than `max_headers`
header fields or more than `max_header_bytes` of header names and values together; 413 when the
body is larger than `max_body_bytes` (Content-Length, or counted while reading), 401 without a
valid `Authorization: Bearer` or `x-api-key` key (constant-time comparison; never logged), 503
while loading or draining, and, on a POST to a generation route (`GENERATION_ROUTES`), 429 +
Retry-After while the engine has no room (server/admission.py `early_refusal`: the in-flight
rule's own answer, checked before the body is read; requests let through are decided again
when they are admitted). `settings.public_routes` skip auth; only the operational routes
(/health, /ready, /metrics, /version) also skip readiness, so a route made public still answers 503 +
Retry-After while the model loads. Static files (GET / HEAD of the playground page at / and of
anything under `STATIC_PREFIX`: the playground's and the docs pages' files) hold no API data:
they skip auth and readiness, so the page loads and asks for the key.
Every refusal is counted in the metrics by reason. A request let through runs with its client's
identity (the API key it matched) and trust (`--priority-keys`) in server/fair_share.py's
context variables, for fair admission.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.admission import early_refusal
from server.errors import ApiError, error_response, rejection_reason
from server.fair_share import CLIENT, TRUSTED
from server.settings import Settings
from server.sleep import ROUTES as SLEEP_ROUTES
from server.state import ServerState

OPERATIONAL_ROUTES = frozenset(
    {"/health", "/ready", "/metrics", "/version"}
)  # answered while loading
STATIC_PREFIX = "/static/"  # files of the package (server/playground.py, server/docs_ui.py)
# The routes that start generation: refused here (429) while the engine is full, before their
# body is read or parsed, so a burst's refusals cost the event loop almost nothing.
GENERATION_ROUTES = frozenset(
    {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/messages",
        "/v1/responses",
        "/generate",
        "/generate_stream",
        "/",
    }
)


class Guard:
    """Pure ASGI middleware (it must not buffer streams): body limit, auth, readiness."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state
        self.keys = [key.encode() for key in state.settings.api_key]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        error = _header_error(scope["headers"], self.state.settings) or self._refusal(scope)
        if error is not None:
            self.state.metrics.reject(rejection_reason(error.status))
            return await error_response(scope["path"], error)(scope, receive, send)
        client, trusted = self._identity(scope)
        CLIENT.set(client)  # for fair admission (server/fair_share.py), in this request's task
        TRUSTED.set(trusted)
        await self.app(scope, _limited(receive, self.state.settings.max_body_bytes), send)

    def _identity(self, scope: Scope) -> tuple[str | None, bool]:
        """("key:N" for the N-th API key, or None without one; whether it may set priority < 0)."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        scheme, _, token = headers.get("authorization", "").partition(" ")
        given = token if scheme.lower() == "bearer" else headers.get("x-api-key", "")
        found = None
        for index, key in enumerate(self.keys):  # no early exit, as in `_known`
            if hmac.compare_digest(given.strip().encode(), key):
                found = index
        trusted_keys = self.state.settings.priority_keys
        trusted = "*" in trusted_keys or (
            found is not None and self.state.settings.api_key[found] in trusted_keys
        )
        return (None if found is None else f"key:{found}"), trusted

    def _refusal(self, scope: Scope) -> ApiError | None:
        """413, 401 or 503 when this request must be answered before any route; else None."""
        path, state = scope["path"], self.state
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        limit = state.settings.max_body_bytes
        if _content_length(headers) > limit:
            return ApiError(
                413, f"the request body is larger than {limit} bytes", code="request_too_large"
            )
        if scope["method"] in ("GET", "HEAD") and (path == "/" or path.startswith(STATIC_PREFIX)):
            return None
        public = path in state.settings.public_routes
        if not public and self.keys and not self._authorized(headers):
            return ApiError(
                401,
                "a valid API key is needed: 'Authorization: Bearer <key>' (or 'x-api-key: <key>')",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if path in OPERATIONAL_ROUTES or path in SLEEP_ROUTES:  # wake_up answers while asleep
            return None
        error = state.readiness_error()
        generation = scope["method"] == "POST" and path in GENERATION_ROUTES
        if error is None and generation and state.engine is not None:  # ready: it is loaded
            error = early_refusal(state.engine)
        return error

    def _authorized(self, headers: dict[str, str]) -> bool:
        """A key as `Authorization: Bearer <key>`, or as `x-api-key` (Anthropic's clients)."""
        scheme, _, token = headers.get("authorization", "").partition(" ")
        bearer = self._known(token.strip()) and scheme.lower() == "bearer"
        return self._known(headers.get("x-api-key", "").strip()) | bearer

    def _known(self, given: str) -> bool:
        matched = False
        for key in self.keys:  # no early exit: the time taken does not depend on which key
            matched |= hmac.compare_digest(given.encode(), key)
        return matched


def _header_error(raw: list[tuple[bytes, bytes]], settings: Settings) -> ApiError | None:
    """431 past the header count or size limit; the connection is closed after the answer."""
    size = sum(len(name) + len(value) for name, value in raw)
    if len(raw) <= settings.max_headers and size <= settings.max_header_bytes:
        return None
    if len(raw) > settings.max_headers:
        what = f"{len(raw)} header fields (at most {settings.max_headers} are accepted)"
    else:
        what = f"{size} bytes of headers (at most {settings.max_header_bytes} are accepted)"
    return ApiError(
        431,
        f"the request carries {what}",
        code="request_header_fields_too_large",
        headers={"Connection": "close"},
    )


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
