"""Tools on /v1/chat/completions over HTTP (fake engine): bad tools and tool choices are 400s
naming the field, good ones are accepted and answered, and /openapi.json documents the fields.

Oracle: the OpenAI error shape and the field each rule is about (hand-written per case).
"""

from __future__ import annotations

import httpx
import pytest

from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer

MESSAGES = [{"role": "user", "content": "hi"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def tool(**function) -> dict:
    return {"type": "function", "function": function}


BAD = [
    ({"tools": []}, "tools", "at least one"),
    ({"tools": [{"type": "function", "function": {}}]}, "tools.0.function.name", "required"),
    ({"tools": [tool(name="a b")]}, "tools.0.function.name", "letters"),
    ({"tools": [tool(name="x" * 65)]}, "tools.0.function.name", "64"),
    ({"tools": [tool(name="f", parameters=[1])]}, "tools.0.function.parameters", ""),
    (
        {"tools": [tool(name="f", parameters={"type": "array"})]},
        "tools.0.function.parameters",
        "object",
    ),
    ({"tools": [tool(name="f"), tool(name="f")]}, "tools.1.function.name", "unique"),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools.0.type", ""),
    ({"tool_choice": "required"}, "tool_choice", "only allowed when tools"),
    ({"tool_choice": "auto"}, "tool_choice", "only allowed when tools"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice", ""),
    (
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice",
        "'nope'",
    ),
    (
        {"messages": [{"role": "assistant", "tool_calls": [{"type": "function"}]}]},
        "messages.0.tool_calls.0.function",
        "required",
    ),
]


@pytest.fixture(scope="module")
def server():
    with LiveServer(lambda: FakeEngine(max_model_len=2048, num_blocks=1024)) as live:
        yield live


def chat(server, **fields) -> httpx.Response:
    body = {"messages": MESSAGES, "max_tokens": 4, **fields}
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)


@pytest.mark.parametrize(("fields", "param", "words"), BAD)
def test_bad_tools_are_a_400_naming_the_field(server, fields, param, words):
    response = chat(server, **fields)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert words in error["message"]


@pytest.mark.parametrize(
    "choice", ["auto", "none", None, {"type": "function", "function": {"name": "get_weather"}}]
)
def test_good_tools_are_answered(server, choice):
    fields = {"tools": [WEATHER], "parallel_tool_calls": False}
    if choice is not None:
        fields["tool_choice"] = choice
    response = chat(server, **fields)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["role"] == "assistant"


def test_a_streamed_beam_search_read_into_tool_calls_is_a_400_naming_the_field(server):
    beams = {"use_beam_search": True, "n": 2, "stream": True}
    response = chat(server, tools=[WEATHER], **beams)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "use_beam_search"
    assert "stream" in response.json()["error"]["message"]
    allowed = [
        {"tools": [WEATHER], **beams, "stream": False},  # not streamed
        {"tools": [WEATHER], **beams, "tool_choice": "none"},  # no calls to read
        beams,  # no tools (and this model does not reason)
    ]
    for fields in allowed:
        assert chat(server, **fields).status_code == 200, fields


def test_a_history_with_calls_and_tool_answers_is_accepted(server):
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]
    response = chat(server, messages=messages, tools=[WEATHER])
    assert response.status_code == 200, response.text
    tokenized = httpx.post(server.url + "/tokenize", json={"messages": messages}).json()
    assert tokenized["count"] > 0


def test_openapi_documents_tools_and_the_answer_fields(server):
    doc = httpx.get(server.url + "/openapi.json").json()
    schemas = doc["components"]["schemas"]
    request = schemas["ChatCompletionRequest"]["properties"]
    assert {"tools", "tool_choice", "parallel_tool_calls"} <= set(request)
    assert {"tool_calls", "tool_call_id"} <= set(schemas["ChatMessage"]["properties"])
    ok = doc["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]
    choice = ok["content"]["application/json"]["schema"]["properties"]["choices"]["items"]
    message = choice["properties"]["message"]["properties"]
    assert {"content", "tool_calls", "reasoning_content"} <= set(message)
