"""Structured outputs over HTTP: OpenAI `response_format`, the `guided_*` fields on both OpenAI
routes, TGI `parameters.grammar`; bad constraints are a 400 (TGI: 422) naming the field, before
any stream byte.

Oracles: `jsonschema` / `re.fullmatch` / the choice list on the outputs of a tiny random model
(which on its own produces no JSON). The official `openai` client's `parse` on the default model
is in test_default_model.py.
"""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest

from engine import Engine, EngineConfig
from tests.server.live import LiveServer, inference_client

SCHEMA = {
    "type": "object",
    "properties": {
        "word": {"type": "string", "maxLength": 5},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["word", "n"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Hello world"}]


@pytest.fixture(scope="module")
def server(tiny_model_folder):
    config = EngineConfig(
        dtype="float32", kv_cache_memory_bytes=4_000_000, block_size=4, max_num_seqs=8
    )
    factory = lambda: Engine.from_model(str(tiny_model_folder), config)  # noqa: E731
    with LiveServer(factory, admission_limit=16) as live:
        yield live


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def _chat(server, **fields) -> httpx.Response:
    body = {"messages": MESSAGES, "max_tokens": 120, "temperature": 1.0, "seed": 3, **fields}
    return _post(server, "/v1/chat/completions", body)


def _completion(server, **fields) -> httpx.Response:
    body = {"prompt": "Hello world", "max_tokens": 120, "temperature": 1.0, "seed": 3, **fields}
    return _post(server, "/v1/completions", body)


def test_response_format_json_schema_and_json_object(server):
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True},
    }
    r = _chat(server, response_format=fmt)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
    r = _chat(server, response_format={"type": "json_object"}, max_tokens=60)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].startswith("{")
    r = _chat(server, response_format={"type": "text"}, max_tokens=5)
    assert r.status_code == 200


def test_inference_client_json_schema_is_the_same_constraint_as_the_openai_form(
    server, monkeypatch
):
    # InferenceClient rewrites a json_schema response_format into TGI's {"type": "json_object",
    # "value": schema}: the seeded answer must be the one the OpenAI form gets
    client = inference_client(server.url, monkeypatch, timeout=120)
    fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}}
    answer = client.chat_completion(
        MESSAGES, response_format=fmt, max_tokens=120, temperature=1.0, seed=3
    )
    text = answer.choices[0].message.content
    assert text == _chat(server, response_format=fmt).json()["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("route", [_chat, _completion])
def test_guided_fields_on_both_routes(server, route):
    r = route(server, guided_json=SCHEMA)
    assert r.status_code == 200, r.text
    text = _text(r)
    jsonschema.validate(json.loads(text), SCHEMA)
    r = route(server, guided_json=json.dumps(SCHEMA))  # a schema given as JSON text
    jsonschema.validate(json.loads(_text(r)), SCHEMA)
    r = route(server, guided_regex=r"[a-f]{3}-[0-9]{2}")
    assert re.fullmatch(r"[a-f]{3}-[0-9]{2}", _text(r))
    r = route(server, guided_choice=["red", "green", "blue"])
    assert _text(r) in ("red", "green", "blue")
    r = route(server, guided_grammar='start: "ab" | "cd" NUM\nNUM: /[0-9]/')
    assert re.fullmatch(r"ab|cd[0-9]", _text(r))


def _text(r: httpx.Response) -> str:
    choice = r.json()["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def test_a_streamed_constrained_answer_equals_the_whole_one(server):
    whole = _text(_chat(server, guided_json=SCHEMA))
    body = {"messages": MESSAGES, "max_tokens": 120, "temperature": 1.0, "seed": 3}
    body |= {"guided_json": SCHEMA, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as r:
        events = [e[len("data: ") :] for e in r.read().decode().split("\n\n") if e]
    assert events[-1] == "[DONE]"
    deltas = [json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1]]
    assert "".join(deltas) == whole


def test_tgi_grammar_json_and_regex(server):
    params = {"max_new_tokens": 120, "do_sample": True, "seed": 4}
    grammar = {"type": "json", "value": SCHEMA}
    r = _post(server, "/generate", {"inputs": "Hello", "parameters": params | {"grammar": grammar}})
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["generated_text"]), SCHEMA)
    grammar = {"type": "regex", "value": "(yes|no)"}
    r = _post(server, "/generate", {"inputs": "Hello", "parameters": params | {"grammar": grammar}})
    assert r.json()["generated_text"] in ("yes", "no")


BAD_OPENAI = [
    ({"guided_json": {"type": "strin"}}, "guided_json", "strin"),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"guided_regex": "a(b"}, "guided_regex", "regex"),
    ({"guided_choice": []}, "guided_choice", "at least one"),
    ({"guided_grammar": "start: nowhere"}, "guided_grammar", "grammar"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "at most one"),
]
BAD_CHAT = [
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": 3}},
            }
        },
        "response_format",
        "JSON schema",
    ),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema object"),
    ({"response_format": {"type": "yaml"}}, "response_format.type", "json_schema"),
    (
        {"response_format": {"type": "json_object"}, "guided_regex": "a"},
        "guided_regex",
        "at most one",
    ),
]


@pytest.mark.parametrize(
    ("route", "fields", "param", "words"),
    [(_chat, *case) for case in BAD_OPENAI + BAD_CHAT] + [(_completion, *c) for c in BAD_OPENAI],
)
@pytest.mark.parametrize("stream", [False, True])
def test_a_bad_constraint_is_a_400_naming_the_field(server, route, fields, param, words, stream):
    r = route(server, stream=stream, **fields)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/json")  # not a stream
    error = r.json()["error"]
    assert error["param"] == param
    assert words in error["message"]


@pytest.mark.parametrize(
    "grammar",
    [
        {"type": "json", "value": {"type": "strin"}},
        {"type": "regex", "value": "a(b"},
        {"type": "yaml", "value": "x"},
    ],
)
def test_a_bad_tgi_grammar_is_a_422(server, grammar):
    r = _post(server, "/generate", {"inputs": "Hello", "parameters": {"grammar": grammar}})
    assert r.status_code == 422, r.text
    assert "grammar" in r.json()["error"]
