"""One id per HTTP request, from the client's `X-Request-Id` or made here, shared by the response,
the engine and the logs.

Contract: `RequestIdMiddleware` (pure ASGI: streams pass through unbuffered) reads
`X-Request-Id`. A value outside `VALID_ID` (1-128 characters of letters, digits and
`-_.:+=@`: no `/`, as ids appear in paths such as /v1/responses/{id}) is refused with a 400 naming the header, in the route family's error shape. Each
request then gets `RequestId(echo, unique)`, kept in the ASGI scope's state (`request_id(request)`
reads it): `echo` is the client's value, or, when it sent none, a fresh hex id; `unique` is what
the server names the request by: the fresh id, or the client's value plus `-` and 8 random hex
digits, so two clients sending the same value never share an engine id (the engine refuses a
duplicate). Every response carries `X-Request-Id: <echo>`. The OpenAI routes answer with
`id` = their prefix + `unique` (`chatcmpl-<unique>`), and that same string is the engine's
request id (with `-<i>` per prompt when a request holds several), so the id a client sees is
the one in the engine's log lines and in its trace. While a request is handled, `CURRENT` holds
its `unique` id and `RequestIdLogFilter` (installed on the log handler by `tgserve serve`) opens
each log line written for it with `[request <unique>]`.
"""

from __future__ import annotations

import contextvars
import logging
import re
import uuid
from dataclasses import dataclass

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import ApiError, error_response

HEADER = "X-Request-Id"
VALID_ID = re.compile(r"[A-Za-z0-9_.:+=@-]{1,128}")
CURRENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
_SCOPE_KEY = "tgserve_request_id"


@dataclass(frozen=True)
class RequestId:
    echo: str  # sent back in X-Request-Id: the client's own value, or the one made here
    unique: str  # the server's name for the request: engine ids, response ids, logs


def new_request_id(given: str | None) -> RequestId:
    fresh = uuid.uuid4().hex
    if given is None:
        return RequestId(fresh, fresh)
    return RequestId(given, f"{given}-{fresh[:8]}")


def request_id(request: Request) -> RequestId:
    """The id the middleware gave `request` (a fresh one outside it, as in unit tests)."""
    found = request.scope.get("state", {}).get(_SCOPE_KEY)
    return found if found is not None else new_request_id(None)


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = _header(scope)
        if given is not None and not VALID_ID.fullmatch(given):
            error = ApiError(
                400,
                f"the {HEADER} header must be 1 to 128 letters, digits or -_.:+=@",
                param=HEADER,
            )
            return await error_response(scope["path"], error)(scope, receive, send)
        rid = new_request_id(given)
        scope.setdefault("state", {})[_SCOPE_KEY] = rid
        echo = (HEADER.lower().encode(), rid.echo.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), echo]
            await send(message)

        token = CURRENT.set(rid.unique)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            CURRENT.reset(token)


def _header(scope: Scope) -> str | None:
    wanted = HEADER.lower().encode()
    for name, value in scope["headers"]:
        if name.lower() == wanted:
            return value.decode("latin-1")
    return None


class RequestIdLogFilter(logging.Filter):
    """Sets `record.request` to "[request <id>] " inside a request's handling, else ""."""

    def filter(self, record: logging.LogRecord) -> bool:
        current = CURRENT.get()
        record.request = f"[request {current}] " if current else ""
        return True
