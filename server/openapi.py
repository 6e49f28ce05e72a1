"""The OpenAPI document served at GET /openapi.json.

Contract: `install_openapi(app, settings)` replaces FastAPI's generated document (the routes read
raw bodies, so FastAPI sees no body parameters) with one that declares, for every route, its
request body (the JSON Schema of the pydantic model the route parses with, all definitions under
`components.schemas`) and its responses: the 200 body (JSON and, for routes that can stream,
`text/event-stream`) and a `default` error body in the route family's own shape (OpenAI
`{"error": {...}}`, TGI `{"error", "error_type"}`). Schemas describe what the server promises,
loosely where the body is open-ended (extra fields are allowed everywhere). When API keys are
configured, operations outside `settings.public_routes` carry a bearer security requirement.
/openapi.json itself follows the same rule as any route: it needs the key unless it is listed in
`--public-routes`, and it answers 503 while the model loads.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from server.anthropic import protocol as anthropic
from server.errors import is_anthropic_path, is_tgi_path
from server.openai import protocol as oai
from server.responses import protocol as responses
from server.settings import Settings
from server.tgi import protocol as tgi

_REF = "#/components/schemas/{model}"

# (path, method) -> the model the route parses its body with
_BODIES: dict[tuple[str, str], type[BaseModel]] = {
    ("/v1/completions", "post"): oai.CompletionRequest,
    ("/v1/chat/completions", "post"): oai.ChatCompletionRequest,
    ("/v1/messages", "post"): anthropic.MessagesRequest,
    ("/v1/messages/count_tokens", "post"): anthropic.CountTokensRequest,
    ("/v1/responses", "post"): responses.ResponsesRequest,
    ("/tokenize", "post"): oai.TokenizeRequest,
    ("/detokenize", "post"): oai.DetokenizeRequest,
    ("/generate", "post"): tgi.TgiRequest,
    ("/generate_stream", "post"): tgi.TgiRequest,
    ("/", "post"): tgi.TgiRequest,
}


def _obj(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties}


_INT, _STR, _NUM = {"type": "integer"}, {"type": "string"}, {"type": "number"}
_NULL_STR = {"type": ["string", "null"]}
_NULL_INT = {"type": ["integer", "null"]}
_OPENAI_ERROR = _obj(
    ["error"],
    error=_obj(
        ["message", "type", "param", "code"],
        message=_STR,
        type=_STR,
        param=_NULL_STR,
        code=_NULL_STR,
    ),
)
_TGI_ERROR = _obj(["error", "error_type"], error=_STR, error_type=_STR)
_ANTHROPIC_ERROR = _obj(
    ["type", "error"],
    type={"const": "error"},
    error=_obj(["type", "message"], type=_STR, message=_STR),
)
_ANTHROPIC_MESSAGE = _obj(
    ["id", "type", "role", "model", "content", "stop_reason", "usage"],
    id=_STR,
    type={"const": "message"},
    role={"const": "assistant"},
    model=_STR,
    content={"type": "array", "items": _obj(["type"], type=_STR)},
    stop_reason=_NULL_STR,
    stop_sequence=_NULL_STR,
    usage=_obj(["input_tokens", "output_tokens"], input_tokens=_INT, output_tokens=_INT),
)
_USAGE = _obj(
    ["prompt_tokens", "completion_tokens", "total_tokens"],
    prompt_tokens=_INT,
    completion_tokens=_INT,
    total_tokens=_INT,
)
_FINISH = {"type": ["string", "null"]}
_TOOL_CALL = _obj(
    ["id", "type", "function"],
    id=_STR,
    type={"const": "function"},
    function=_obj(["name", "arguments"], name=_STR, arguments=_STR),
)
_MESSAGE = _obj(  # a chat answer: text, reasoning (reasoning models), tool calls (with tools)
    ["role", "content"],
    role={"const": "assistant"},
    content=_NULL_STR,
    reasoning_content=_NULL_STR,
    tool_calls={"type": "array", "items": _TOOL_CALL},
)


def _completion(choice_key: str) -> dict[str, Any]:
    choice = _obj(["index", "finish_reason"], index=_INT, finish_reason=_FINISH)
    choice["properties"][choice_key] = _MESSAGE if choice_key == "message" else _STR
    return _obj(
        ["id", "object", "created", "model", "choices", "usage"],
        id=_STR,
        object=_STR,
        created=_INT,
        model=_STR,
        choices={"type": "array", "items": choice},
        usage=_USAGE,
    )


_TGI_GENERATED = _obj(["generated_text"], generated_text=_STR, details={"type": "object"})
_STATUS = _obj(["status"], status=_STR)
_MODEL_CARD = _obj(["id", "object", "owned_by"], id=_STR)
_RESPONSE = _obj(
    ["id", "object", "created_at", "status", "model", "output"],
    id=_STR,
    object={"const": "response"},
    created_at=_INT,
    status=_STR,
    model=_STR,
    output={"type": "array", "items": _obj(["type"], type=_STR)},
)
_OK: dict[tuple[str, str], dict[str, Any]] = {  # the 200 JSON body of each route
    ("/v1/completions", "post"): _completion("text"),
    ("/v1/chat/completions", "post"): _completion("message"),
    ("/v1/models", "get"): _obj(
        ["object", "data"], object=_STR, data={"type": "array", "items": _MODEL_CARD}
    ),
    ("/v1/models/{model_id}", "get"): _MODEL_CARD,
    ("/tokenize", "post"): _obj(
        ["tokens", "count", "max_model_len"],
        tokens={"type": "array", "items": _INT},
        count=_INT,
        max_model_len=_INT,
    ),
    ("/detokenize", "post"): _obj(["prompt"], prompt=_STR),
    ("/v1/messages", "post"): _ANTHROPIC_MESSAGE,
    ("/v1/messages/count_tokens", "post"): _obj(["input_tokens"], input_tokens=_INT),
    ("/v1/responses", "post"): _RESPONSE,
    ("/v1/responses/{response_id}", "get"): _RESPONSE,
    ("/v1/responses/{response_id}", "delete"): _obj(
        ["id", "object", "deleted"], id=_STR, object=_STR, deleted={"type": "boolean"}
    ),
    ("/generate", "post"): _TGI_GENERATED,
    ("/", "post"): {"type": "array", "items": _TGI_GENERATED},
    ("/info", "get"): _obj(
        ["model_id", "max_total_tokens", "max_input_tokens"],
        model_id=_NULL_STR,
        max_total_tokens=_INT,
        max_input_tokens=_INT,
        vocab_size=_NULL_INT,
    ),
    ("/health", "get"): _STATUS,
    ("/ready", "get"): _STATUS,
    ("/version", "get"): _obj(["version"], version=_STR),
}
_STREAMING = frozenset(
    {
        ("/v1/completions", "post"),
        ("/v1/chat/completions", "post"),
        ("/generate_stream", "post"),
        ("/", "post"),
    }
)
_NAMED_EVENTS = frozenset({("/v1/messages", "post"), ("/v1/responses", "post")})
_NOT_READY = frozenset({("/health", "get"), ("/ready", "get")})  # 503 carries {"status"}


def _responses(path: str, method: str) -> dict[str, Any]:
    key = (path, method)
    content: dict[str, Any] = {}
    if key in _OK:
        content["application/json"] = {"schema": _OK[key]}
    if key in _NAMED_EVENTS:  # `event: <type>` lines: each event is read as {event, data}
        content["text/event-stream"] = {"schema": _obj(["data"], event=_STR, data=_STR)}
    elif key in _STREAMING:
        content["text/event-stream"] = {"schema": _STR}
    if path == "/metrics":
        content["text/plain"] = {"schema": _STR}
    error = _OPENAI_ERROR
    if is_tgi_path(path):
        error = _TGI_ERROR
    elif is_anthropic_path(path):
        error = _ANTHROPIC_ERROR
    responses: dict[str, Any] = {
        "200": {"description": "OK", "content": content},
        "default": {
            "description": "An error, in the route family's shape",
            "content": {"application/json": {"schema": error}},
        },
    }
    if key in _NOT_READY:
        responses["503"] = {
            "description": "Unhealthy, loading or draining",
            "content": {"application/json": {"schema": _STATUS}},
        }
    return responses


def _request_body(model: type[BaseModel], components: dict[str, Any]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template=_REF)
    components.update(schema.pop("$defs", {}))
    components[model.__name__] = schema
    ref = {"$ref": _REF.format(model=model.__name__)}
    return {"required": True, "content": {"application/json": {"schema": ref}}}


def build_document(app: FastAPI, settings: Settings) -> dict[str, Any]:
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components: dict[str, Any] = {}
    for path, item in doc.get("paths", {}).items():
        for method, operation in item.items():
            model = _BODIES.get((path, method))
            if model is not None:
                operation["requestBody"] = _request_body(model, components)
            operation["responses"] = _responses(path, method)
            if settings.api_key:
                public = path in settings.public_routes
                operation["security"] = [] if public else [{"bearer": []}]
    doc["components"] = {"schemas": components}
    if settings.api_key:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return doc


def install_openapi(app: FastAPI, settings: Settings) -> None:
    """Serve `build_document` (built once, on first request) as the app's OpenAPI document."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_document(app, settings)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
