"""/v1/messages and /v1/messages/count_tokens through the official `anthropic` client.

The fake engine writes a chosen answer per prompt (tests/server/scripted_model.py): a Hermes
tool call when the tools are in the prompt (the fallback tool prompt teaches that format), a
sentence once a tool result is there, a `<think>` block when asked to think. Oracles: the scripted answers themselves, the
fake tokenizer's chat template (a byte per token) for token counts, and, for streams, the
non-streamed answer of the same request as the anthropic client reassembles the events.
"""

from __future__ import annotations

import anthropic
import httpx
import pytest

from tests.server.fake_engine import FakeEngine, FakeTokenizer
from tests.server.live import LiveServer
from tests.server.scripted_model import ANSWER, CALL, HELLO, SUNNY, THOUGHT, script

TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def live():
    engine = lambda: FakeEngine(max_model_len=4096, num_blocks=4096, script=script)  # noqa: E731
    with LiveServer(engine) as server:
        yield server


@pytest.fixture(scope="module")
def client(live):
    return anthropic.Anthropic(base_url=live.url, api_key="x", max_retries=0, timeout=30)


def prompt_tokens(turns: list[dict]) -> int:
    return len(FakeTokenizer().apply_chat_template(turns).encode())


def blocks(message) -> list[dict]:
    out = []
    for block in message.content:
        data = block.model_dump(exclude_none=True)
        data.pop("id", None)  # tool_use ids are fresh per answer
        out.append(data)
    return out


def test_text_answer_with_usage(client):
    hi = [{"role": "user", "content": "hi"}]
    message = client.messages.create(model="fake-model", max_tokens=100, messages=hi)
    assert blocks(message) == [{"type": "text", "text": HELLO}]
    assert (message.role, message.stop_reason, message.stop_sequence) == (
        "assistant",
        "end_turn",
        None,
    )
    assert message.usage.input_tokens == prompt_tokens(hi)
    assert message.usage.output_tokens == len(HELLO) + 1  # the text's bytes and the EOS


def test_system_and_count_tokens_agree_with_the_template(client):
    turns = [
        {"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]}
    ]
    count = client.messages.count_tokens(model="fake-model", system="Be brief.", messages=turns)
    expected = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert count.input_tokens == prompt_tokens(expected)
    message = client.messages.create(
        model="fake-model", max_tokens=50, system="Be brief.", messages=turns
    )
    assert message.usage.input_tokens == count.input_tokens


def test_stop_sequences_and_max_tokens_end_the_answer(client):
    hi = [{"role": "user", "content": "hi"}]
    stopped = client.messages.create(
        model="fake-model", max_tokens=100, messages=hi, stop_sequences=["zz", "from"]
    )
    assert blocks(stopped) == [{"type": "text", "text": HELLO[: HELLO.index("from")]}]
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "from")
    cut = client.messages.create(model="fake-model", max_tokens=5, messages=hi)
    assert blocks(cut) == [{"type": "text", "text": HELLO[:5]}]
    assert cut.stop_reason == "max_tokens"


def test_tool_use_round_trip(client):
    first = client.messages.create(model="fake-model", max_tokens=200, messages=ASK, tools=TOOLS)
    assert first.stop_reason == "tool_use"
    (call,) = first.content
    assert (call.type, call.name, call.input) == ("tool_use", "get_weather", {"city": "Paris"})
    assert call.id.startswith("toolu_")
    history = [
        *ASK,
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}],
        },
    ]
    second = client.messages.create(
        model="fake-model", max_tokens=200, messages=history, tools=TOOLS
    )
    assert blocks(second) == [{"type": "text", "text": SUNNY}]
    assert second.stop_reason == "end_turn"


def test_a_tool_call_cut_by_max_tokens_stays_text(client):
    cut = client.messages.create(model="fake-model", max_tokens=40, messages=ASK, tools=TOOLS)
    assert blocks(cut) == [{"type": "text", "text": CALL[:40]}]
    assert cut.stop_reason == "max_tokens"


@pytest.mark.parametrize(
    "fields",
    [
        {"messages": [{"role": "user", "content": "hi"}]},
        {"messages": ASK, "tools": TOOLS},
        {"messages": ASK, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "get_weather"}},
        {
            "messages": [{"role": "user", "content": "think"}],
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        },
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6},
    ],
    ids=["text", "tool", "forced-tool", "thinking", "cut"],
)
def test_the_stream_reassembles_to_the_whole_message(client, fields):
    body = {"model": "fake-model", "max_tokens": 300, **fields}
    whole = client.messages.create(**body)
    with client.messages.stream(**body) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert blocks(streamed) == blocks(whole)
    assert (streamed.stop_reason, streamed.usage.output_tokens) == (
        whole.stop_reason,
        whole.usage.output_tokens,
    )
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"


def test_thinking_is_read_into_a_thinking_block(client):
    message = client.messages.create(
        model="fake-model",
        max_tokens=300,
        messages=[{"role": "user", "content": "think"}],
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    assert [
        (b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in message.content
    ] == [
        ("thinking", THOUGHT),
        ("text", ANSWER),
    ]


BAD = [
    ({"messages": ASK}, "max_tokens"),
    (
        {
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}],
        },
        "messages.0.content",
    ),
    ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
    ({"max_tokens": 0, "messages": ASK}, "max_tokens"),
    (
        {
            "max_tokens": 5,
            "messages": ASK,
            "tools": [{"type": "web_search_20250305", "name": "web_search", "input_schema": {}}],
        },
        "tools.0.type",
    ),
    (
        {
            "max_tokens": 5,
            "messages": ASK,
            "tools": TOOLS,
            "tool_choice": {"type": "tool", "name": "nope"},
        },
        "tool_choice.name",
    ),
    (
        {
            "max_tokens": 5,
            "messages": ASK,
            "tools": [{"name": "a b", "input_schema": {"type": "object"}}],
        },
        "tools.0.name",
    ),
    ({"max_tokens": 5, "messages": ASK, "stop_sequences": ["x" * 1000]}, "stop_sequences"),
    ({"max_tokens": 5, "messages": ASK, "mcp_servers": [{"url": "x"}]}, "mcp_servers"),
]


@pytest.mark.parametrize(("fields", "field"), BAD)
def test_bad_input_is_a_400_in_anthropics_shape_naming_the_field(live, fields, field):
    response = httpx.post(
        live.url + "/v1/messages", json={"model": "fake-model", **fields}, timeout=30
    )
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert field in body["error"]["message"]


def test_an_unknown_model_is_a_not_found_error(client):
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="nope", max_tokens=5, messages=ASK)
    assert missing.value.body["error"]["type"] == "not_found_error"


def test_the_key_is_accepted_as_x_api_key():
    with LiveServer(FakeEngine, api_key=("k",)) as live:
        good = anthropic.Anthropic(base_url=live.url, api_key="k", max_retries=0)
        hi = [{"role": "user", "content": "hi"}]
        assert good.messages.create(model="fake-model", max_tokens=3, messages=hi).content
        bad = anthropic.Anthropic(base_url=live.url, api_key="wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as refused:
            bad.messages.create(model="fake-model", max_tokens=3, messages=hi)
        assert refused.value.body["error"]["type"] == "authentication_error"
