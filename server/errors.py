"""HTTP errors: one exception type, rendered in the shape of the route family that raised it.

Contract: handlers raise `ApiError(status, message, param=..., code=...)`; `error_response(path,
error)` renders it as `{"error": {"message", "type", "param", "code"}}` on OpenAI-style routes
and `{"error", "error_type"}` on TGI routes (where invalid input is 422, as TGI does) and
`{"type": "error", "error": {"type", "message"}}` on Anthropic's (/v1/messages...; the message
opens with the field, as that shape has no `param`). Bodies
never carry tracebacks, exception reprs or file paths: unexpected exceptions become a generic
500 and are logged server-side only. FastAPI's bare 422 never escapes: bodies are parsed by
the routes (`read_body`: 415 unless the body is declared as JSON, then `parse_body`) and any
stray validation error is turned into a 400. A client gone while sending its body
(`ClientDisconnected`) is an info line and a 499 nobody reads, never a 500.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

logger = logging.getLogger(__name__)

TGI_PATHS = frozenset({"/", "/generate", "/generate_stream", "/info"})
ANTHROPIC_PREFIX = "/v1/messages"  # Anthropic's routes: its error shape
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    503: "overloaded_error",
}
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    503: "service_unavailable_error",
}
_TGI_TYPES = {
    400: "validation",
    401: "authentication",
    404: "not_found",
    413: "validation",
    415: "validation",
    429: "overloaded",
    431: "validation",
    503: "unhealthy",
}
_REJECTION_REASONS = {
    400: "invalid",
    401: "unauthorized",
    404: "not_found",
    405: "not_found",
    413: "body_too_large",
    415: "unsupported_media_type",
    429: "overloaded",
    431: "headers_too_large",
    503: "unavailable",
}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})

ModelT = TypeVar("ModelT", bound=BaseModel)


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})


class ClientDisconnected(Exception):
    """The client went away before the response; its request was aborted."""


def rejection_reason(status: int) -> str:
    """The metrics label of a refused request."""
    return _REJECTION_REASONS.get(status, "error")


def is_tgi_path(path: str) -> bool:
    return path in TGI_PATHS


def is_anthropic_path(path: str) -> bool:
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


def error_response(path: str, error: ApiError) -> JSONResponse:
    if is_tgi_path(path):
        status = 422 if error.status == 400 else error.status
        body: dict[str, Any] = {
            "error": error.message,
            "error_type": _TGI_TYPES.get(error.status, "generation"),
        }
    elif is_anthropic_path(path):
        status = error.status
        message = error.message
        if error.param and error.param not in message:  # its shape has no param: say it
            message = f"{error.param}: {message}"
        error_type = _ANTHROPIC_TYPES.get(error.status, "api_error")
        body = {"type": "error", "error": {"type": error_type, "message": message}}
    else:
        status = error.status
        body = {
            "error": {
                "message": error.message,
                "type": _OPENAI_TYPES.get(error.status, "server_error"),
                "param": error.param,
                "code": error.code,
            }
        }
    return JSONResponse(body, status_code=status, headers=error.headers)


def validation_error(exc: ValidationError) -> ApiError:
    """The first problem of a pydantic error, as a 400 that names the field."""
    first = exc.errors(include_url=False, include_input=False)[0]
    if first["type"] == "json_invalid":
        return ApiError(
            400, f"the request body is not valid JSON ({first['msg']})", code="invalid_json"
        )
    if first["type"] == "model_type" and not first["loc"]:
        return ApiError(400, "the request body must be a JSON object", code="invalid_json")
    path = [str(p) for p in first["loc"] if isinstance(p, int) or _is_field(p)]
    param = ".".join(path) or None
    where = f"'{param}'" if param else "the request"
    if len(path) < len(first["loc"]):  # a union: say what each accepted type wanted
        depth = next(i for i, p in enumerate(first["loc"]) if not _is_field_or_index(p))
        prefix = first["loc"][: max(depth, 1)]  # the union's own field
        head = ".".join(str(p) for p in prefix)
        wanted = dict.fromkeys(
            e["msg"]
            for e in exc.errors(include_url=False)
            if tuple(e["loc"][: len(prefix)]) == tuple(prefix)
        )
        return ApiError(400, f"invalid value for '{head}': " + "; or ".join(wanted), param=head)
    return ApiError(400, f"invalid value for {where}: {first['msg']}", param=param)


def _is_field_or_index(part: object) -> bool:
    return isinstance(part, int) or _is_field(part)


def _is_field(part: object) -> bool:
    return (
        isinstance(part, str) and bool(_IDENTIFIER.match(part)) and part.lower() not in _TYPE_TAGS
    )


def is_json_media_type(content_type: str) -> bool:
    """application/json or application/*+json, with any parameters (e.g. charset)."""
    media = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


async def read_body(request: Request, model: type[ModelT]) -> ModelT:
    """The body parsed as `model`; 415 when it is not declared as JSON (before reading it)."""
    content_type = request.headers.get("content-type", "")
    if not is_json_media_type(content_type):
        given = f"'{content_type}'" if content_type else "no Content-Type"
        raise ApiError(
            415,
            f"the request body must be JSON sent as 'Content-Type: application/json', got {given}",
            code="unsupported_media_type",
        )
    try:
        body = await request.body()
    except ClientDisconnect:  # gone while sending its body: an info line, never a 500
        raise ClientDisconnected() from None
    return parse_body(model, body)


def parse_body(model: type[ModelT], body: bytes) -> ModelT:
    try:
        return model.model_validate_json(body or b"null", strict=True)
    except ValidationError as exc:
        raise validation_error(exc) from None


def install_error_handlers(app: FastAPI, on_rejection: Callable[[str], None]) -> None:
    """`on_rejection(reason)` is told about every ApiError a route raised."""

    async def on_api_error(request: Request, exc: ApiError) -> Response:
        on_rejection(rejection_reason(exc.status))
        return error_response(request.url.path, exc)

    async def on_http_exception(request: Request, exc: StarletteHTTPException) -> Response:
        messages = {
            404: f"no route {request.url.path}",
            405: f"method {request.method} is not allowed here",
        }
        message = messages.get(exc.status_code, str(exc.detail))
        return error_response(
            request.url.path, ApiError(exc.status_code, message, headers=exc.headers)
        )

    async def on_request_validation(request: Request, exc: Exception) -> Response:
        return error_response(request.url.path, ApiError(400, "invalid request"))

    async def on_disconnect(request: Request, exc: Exception) -> Response:
        logger.info(
            "client disconnected from %s %s: its request was aborted",
            request.method,
            request.url.path,
        )
        return Response(status_code=499)  # nobody reads it; the request is already aborted

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(request.url.path, ApiError(500, "internal server error"))

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(StarletteHTTPException, on_http_exception)
    app.add_exception_handler(RequestValidationError, on_request_validation)
    app.add_exception_handler(ClientDisconnected, on_disconnect)
    app.add_exception_handler(Exception, on_unexpected)
