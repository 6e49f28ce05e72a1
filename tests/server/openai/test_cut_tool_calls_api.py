"""A tool call cut by the length limit never reaches `tool_calls` (chat completions, HTTP).

The fake engine writes a chosen answer (a Hermes tool call, as the fallback tool prompt teaches):
cut by `max_tokens`, the answer is the raw text in `content` with finish_reason "length", and
the stream, reassembled by the openai client, says the same; given room, the same answer is a
call. Oracle: the scripted answer's own bytes (the fake tokenizer is a byte per token).
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer

ANSWER = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Monaco"}}\n</tool_call>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
ASK = {
    "model": "fake-model",
    "messages": [{"role": "user", "content": "weather in Monaco?"}],
    "tools": TOOLS,
}


@pytest.fixture(scope="module")
def client():
    engine = lambda: FakeEngine(max_model_len=4096, num_blocks=4096, script=lambda _: ANSWER)  # noqa: E731
    with LiveServer(engine) as live:
        yield openai.OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0, timeout=30)


def streamed(client, **fields) -> tuple[str | None, list, str]:
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(**ASK, stream=True, **fields):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(call.index, ["", ""])
                entry[0] += call.function.name or ""
                entry[1] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return content or None, [tuple(c) for c in calls.values()], finish


@pytest.mark.parametrize("cut", [20, 40, len(ANSWER) - 15, len(ANSWER) - 1])
def test_a_cut_call_is_raw_content_with_finish_length_streamed_and_whole(client, cut):
    whole = client.chat.completions.create(**ASK, max_tokens=cut).choices[0]
    assert whole.finish_reason == "length"
    assert whole.message.tool_calls is None
    assert whole.message.content == ANSWER[:cut]
    assert streamed(client, max_tokens=cut) == (ANSWER[:cut], [], "length")


def test_with_room_the_same_answer_is_a_call(client):
    whole = client.chat.completions.create(**ASK, max_tokens=len(ANSWER) + 5).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content == "Let me look."
    (call,) = whole.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Monaco"},
    )
    content, calls, finish = streamed(client, max_tokens=len(ANSWER) + 5)
    assert (content, finish) == ("Let me look.", "tool_calls")
    assert [(n, json.loads(a)) for n, a in calls] == [("get_weather", {"city": "Monaco"})]
