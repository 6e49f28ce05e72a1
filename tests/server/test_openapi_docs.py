"""The API documented by its schema: /openapi.json describes every field of every route, lists
each route under its API family's tag, gives examples the routes answer, and shows the test-only
`fault` field only on a server started with --enable-fault-injection.

Oracles: the document walked from each route (request body, every response content, path
parameters; `$ref`s followed into components), so a route added later is covered without
editing this test; the live server, which answers every example with a 200.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer

FAMILIES = {
    "/v1/chat/completions": "OpenAI",
    "/v1/responses": "OpenAI",
    "/v1/messages": "Anthropic",
    "/generate": "TGI",
    "/": "TGI",
    "/tokenize": "Tokenizer",
    "/health": "Operations",
    "/version": "Operations",
}


@pytest.fixture(scope="module")
def live():
    engine = lambda: FakeEngine(max_model_len=2048, num_blocks=2048)  # noqa: E731 - tools' prompt
    with LiveServer(engine) as server:
        server.doc = httpx.get(server.url + "/openapi.json").json()
        yield server


def _undescribed(doc: dict[str, Any], schema: Any, where: str, seen: frozenset[str]) -> list[str]:
    """Every property under `schema` without a description (`$ref`s followed once per path)."""
    if not isinstance(schema, dict):
        return []
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        if name in seen:
            return []
        return _undescribed(doc, doc["components"]["schemas"][name], name, seen | {name})
    found: list[str] = []
    nested = [schema.get("items"), schema.get("additionalProperties")]
    nested += [s for key in ("anyOf", "oneOf", "allOf") for s in schema.get(key, [])]
    for sub in nested:
        found += _undescribed(doc, sub, where, seen)
    for name, prop in schema.get("properties", {}).items():
        if not prop.get("description", "").strip():
            found.append(f"{where}.{name}")
        found += _undescribed(doc, prop, f"{where}.{name}", seen)
    return found


def _operations(doc: dict[str, Any]):
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            yield path, method, operation


def test_every_field_of_every_route_has_a_description(live):
    doc, missing, covered = live.doc, [], set()
    for path, method, operation in _operations(doc):
        where = f"{method.upper()} {path}"
        body = operation.get("requestBody", {}).get("content", {})
        schemas = [c["schema"] for c in body.values()]
        for response in operation["responses"].values():
            assert response.get("description"), where
            schemas += [c["schema"] for c in response.get("content", {}).values()]
        for schema in schemas:
            missing += _undescribed(doc, schema, where, frozenset())
        for parameter in operation.get("parameters", []):
            if not parameter.get("description"):
                missing.append(f"{where} parameter {parameter['name']}")
        covered.add(path)
    assert missing == []
    assert covered == set(doc["paths"]) and len(covered) >= 18  # every route the app serves


def test_the_described_fields_say_their_bounds_and_units(live):
    fields = live.doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert "[0, 100]" in fields["temperature"]["description"]
    assert "Seconds" in fields["timeout"]["description"]
    assert "1 to 16" in fields["n"]["description"]


def test_each_route_is_listed_under_its_api_familys_tag(live):
    doc = live.doc
    names = {tag["name"] for tag in doc["tags"]}
    assert all(tag.get("description") for tag in doc["tags"])
    for path, method, operation in _operations(doc):
        (tag,) = operation["tags"]
        assert tag in names, (method, path)
    for path, family in FAMILIES.items():
        for operation in doc["paths"][path].values():
            assert operation["tags"] == [family], path


def test_every_example_is_answered_by_its_route(live):
    examples = 0
    for path, method, operation in _operations(live.doc):
        content = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
        for name, example in content.get("examples", {}).items():
            assert example["summary"], name
            response = httpx.request(method, live.url + path, json=example["value"], timeout=30)
            assert response.status_code == 200, (path, name, response.text)
            examples += 1
    main = ("/v1/chat/completions", "/v1/completions", "/generate", "/v1/messages")
    for path in main:
        assert live.doc["paths"][path]["post"]["requestBody"]["content"]["application/json"][
            "examples"
        ], path
    assert examples >= 10


def _fault_fields(doc: dict[str, Any]) -> list[str]:
    text = json.dumps(doc["components"])
    names = [
        n for n, s in doc["components"]["schemas"].items() if "fault" in s.get("properties", {})
    ]
    return names + (["FaultFields"] if '"FaultFields"' in text else [])


def test_the_fault_field_is_shown_only_with_fault_injection(live):
    assert _fault_fields(live.doc) == []
    with LiveServer(FakeEngine, enable_fault_injection=True) as server:
        doc = httpx.get(server.url + "/openapi.json").json()
    found = _fault_fields(doc)
    assert {"CompletionRequest", "ChatCompletionRequest", "TgiParameters", "FaultFields"} <= set(
        found
    )
