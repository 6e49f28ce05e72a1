"""The OpenAPI document served at GET /openapi.json.

Contract: `install_openapi(app, settings)` replaces FastAPI's generated document (the routes read
raw bodies, so FastAPI sees no body parameters) with one that declares, for every route, its
request body (the JSON Schema of the pydantic model the route parses with, all definitions under
`components.schemas`) and its responses: the 200 body (JSON and, for routes that can stream,
`text/event-stream`) and a `default` error body in the route family's own shape (OpenAI
`{"error": {...}}`, TGI `{"error", "error_type"}`; server/openapi_shapes.py). Every field is
described (request fields by their docstrings in each API's protocol.py, with units and
bounds); each operation carries its API family's tag (`TAGS`, `tag_of`); the main routes carry
request examples (server/openapi_examples.py); the test-only `fault` field is listed only when
the server runs with --enable-fault-injection. When API keys are configured, operations outside
`settings.public_routes` carry a bearer security requirement.
/openapi.json itself follows the same rule as any route: it needs the key unless it is listed in
`--public-routes`, and it answers 503 while the model loads.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from server import openapi_shapes as shapes
from server.anthropic import protocol as anthropic
from server.errors import is_anthropic_path, is_tgi_path
from server.openai import protocol as oai
from server.openapi_examples import EXAMPLES
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
# Each route's API family, by path: the tag it is listed under.
TAGS = {
    "OpenAI": "OpenAI-compatible: completions, chat completions, Responses, models.",
    "Anthropic": "Anthropic Messages API.",
    "TGI": "Hugging Face text-generation-inference API.",
    "Tokenizer": "vLLM-style tokenize / detokenize.",
    "Operations": "Probes, metrics and version.",
}
_OPERATIONS = frozenset({"/health", "/ready", "/metrics", "/version"})
_PARAMETERS = {  # path parameters' descriptions
    "model_id": "A served model's name, as /v1/models lists it.",
    "response_id": "A stored response's id (resp_...), as POST /v1/responses returned it.",
}


def tag_of(path: str) -> str:
    if path in _OPERATIONS:
        return "Operations"
    if path in ("/tokenize", "/detokenize"):
        return "Tokenizer"
    if is_tgi_path(path):
        return "TGI"
    return "Anthropic" if is_anthropic_path(path) else "OpenAI"


def _responses(path: str, method: str) -> dict[str, Any]:
    key = (path, method)
    content: dict[str, Any] = {}
    if key in shapes.OK:
        content["application/json"] = {"schema": shapes.OK[key]}
    if key in _NAMED_EVENTS or key in _STREAMING:  # each event read as {event?, data}
        content["text/event-stream"] = {"schema": shapes.EVENT}
    if path == "/metrics":
        text = "Prometheus text exposition format (tgserve_* and process_* metrics)."
        content["text/plain"] = {"schema": {**shapes.STR, "description": text}}
    family = "tgi" if is_tgi_path(path) else "anthropic" if is_anthropic_path(path) else "openai"
    error = shapes.ERRORS[family]
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
            "content": {"application/json": {"schema": shapes.STATUS}},
        }
    return responses


def _request_body(
    model: type[BaseModel], components: dict[str, Any], faults: bool
) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template=_REF)
    components.update(schema.pop("$defs", {}))
    components[model.__name__] = schema
    if not faults:  # the test-only field is for servers started with --enable-fault-injection
        for component in components.values():
            component.get("properties", {}).pop("fault", None)
        components.pop("FaultFields", None)
    ref = {"$ref": _REF.format(model=model.__name__)}
    return {"required": True, "content": {"application/json": {"schema": ref}}}


def build_document(app: FastAPI, settings: Settings) -> dict[str, Any]:
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components: dict[str, Any] = {}
    faults = settings.enable_fault_injection
    for path, item in doc.get("paths", {}).items():
        for method, operation in item.items():
            model = _BODIES.get((path, method))
            if model is not None:
                operation["requestBody"] = _request_body(model, components, faults)
                if (path, method) in EXAMPLES:
                    content = operation["requestBody"]["content"]["application/json"]
                    content["examples"] = EXAMPLES[(path, method)]
            operation["responses"] = _responses(path, method)
            operation["tags"] = [tag_of(path)]
            for parameter in operation.get("parameters", []):
                parameter["description"] = _PARAMETERS[parameter["name"]]
            if settings.api_key:
                public = path in settings.public_routes
                operation["security"] = [] if public else [{"bearer": []}]
    doc["components"] = {"schemas": components}
    doc["tags"] = [{"name": name, "description": text} for name, text in TAGS.items()]
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
