"""Tool calls from the default model (SmolLM2-135M-Instruct) through the official openai client.

SmolLM2's chat template knows nothing of tools, so the server shows them in a Hermes-style
system prompt; `tool_choice="required"` and a named function are enforced by a grammar, so the
answer always holds calls. Oracles: each call's arguments validate (jsonschema) against the
function's own parameters schema; the stream, reassembled by the client's stream helper,
equals the non-streamed answer of the same greedy request.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from engine import Engine, EngineConfig
from tests.server.live import LiveServer

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
ALARM = {
    "type": "object",
    "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}},
    "required": ["hour"],
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city now",
            "parameters": WEATHER,
        },
    },
    {
        "type": "function",
        "function": {"name": "set_alarm", "description": "Set an alarm", "parameters": ALARM},
    },
]
SCHEMAS = {"get_weather": WEATHER, "set_alarm": ALARM}
MESSAGES = [{"role": "user", "content": "What is the weather like in Paris today?"}]
CHOICES = ["required", {"type": "function", "function": {"name": "set_alarm"}}]


@pytest.fixture(scope="module")
def client():
    config = EngineConfig(kv_cache_memory_bytes=64 * 1024**2, max_model_len=2048)
    with LiveServer(lambda: Engine.from_model(None, config), admission_limit=8) as live:
        yield openai.OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0, timeout=300)


def ask(client, choice, **extra):
    return client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice=choice,
        temperature=0,
        max_tokens=200,
        **extra,
    )


@pytest.mark.parametrize("choice", CHOICES, ids=["required", "named"])
def test_enforced_tool_choice_returns_calls_valid_for_the_schema(client, choice):
    answer = ask(client, choice)
    choice_ = answer.choices[0]
    assert choice_.finish_reason == "tool_calls"
    calls = choice_.message.tool_calls
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    if isinstance(choice, dict):
        assert [c.function.name for c in calls] == ["set_alarm"]


@pytest.mark.parametrize("choice", CHOICES, ids=["required", "named"])
def test_streamed_tool_calls_reassemble_to_the_non_streamed_answer(client, choice):
    whole = ask(client, choice).choices[0]
    with client.chat.completions.stream(
        model=client.models.list().data[0].id,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice=choice,
        temperature=0,
        max_tokens=200,
    ) as stream:
        chunks = [event.chunk for event in stream if event.type == "chunk"]
        streamed = stream.get_final_completion().choices[0]
    assert streamed.finish_reason == whole.finish_reason == "tool_calls"
    assert streamed.message.content == whole.message.content
    got = [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls]
    assert got == [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    # each call's first delta carries its id, type and name; its arguments follow in fragments
    firsts = {}
    for chunk in chunks:
        for delta in chunk.choices[0].delta.tool_calls or []:
            if delta.index not in firsts:
                firsts[delta.index] = delta
                assert delta.id and delta.type == "function" and delta.function.name
                assert delta.function.arguments == ""
            else:
                assert delta.id is None and delta.function.name is None
    assert len(firsts) == len(got)
