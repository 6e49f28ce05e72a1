"""/v1/responses through the official `openai` client, on the fake engine's scripted model.

Oracles: the scripted answers (tests.server.scripted_model.py), the fake tokenizer's chat
template (a byte per token) for the prompt the conversation renders to, and, for streams, the
non-streamed response of the same request as the client's `responses.stream` helper
reassembles the events.
"""

from __future__ import annotations

import json

import httpx
import openai
import pydantic
import pytest

from tests.server.fake_engine import FakeEngine, FakeTokenizer
from tests.server.live import LiveServer
from tests.server.scripted_model import (
    ANSWER,
    CALL,
    CITY_JSON,
    HELLO,
    SUNNY,
    THOUGHT,
    WEATHER_TOOL,
    script,
)

ASK = "Weather in Paris?"


@pytest.fixture(scope="module")
def live():
    engine = lambda: FakeEngine(max_model_len=4096, num_blocks=4096, script=script)  # noqa: E731
    with LiveServer(engine, responses_store_size=4) as server:
        yield server


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0, timeout=30)


def prompt_tokens(turns: list[dict]) -> int:
    return len(FakeTokenizer().apply_chat_template(turns).encode())


def shape(response) -> list[tuple]:
    """The output items without their fresh ids."""
    out = []
    for item in response.output:
        if item.type == "message":
            out.append(("message", "".join(part.text for part in item.content)))
        elif item.type == "function_call":
            out.append(("function_call", item.name, json.loads(item.arguments)))
        else:
            out.append((item.type, "".join(part.text for part in item.content or ())))
    return out


def test_text_from_a_string_input_with_instructions(client):
    response = client.responses.create(model="fake-model", input="hi", instructions="Be brief.")
    assert response.output_text == HELLO and response.status == "completed"
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert response.usage.input_tokens == prompt_tokens(turns)
    assert response.usage.output_tokens == len(HELLO) + 1  # the text's bytes and the EOS


def test_input_items_render_as_the_conversation(client):
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "h"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"role": "user", "content": "hi"},
    ]
    response = client.responses.create(model="fake-model", input=items)
    turns = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "h"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "hi"},
    ]
    assert response.usage.input_tokens == prompt_tokens(turns)


def test_max_output_tokens_makes_an_incomplete_response(client):
    response = client.responses.create(model="fake-model", input="hi", max_output_tokens=5)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == HELLO[:5]


def test_a_function_call_round_trip(client):
    first = client.responses.create(model="fake-model", input=ASK, tools=[WEATHER_TOOL])
    assert shape(first) == [("function_call", "get_weather", {"city": "Paris"})]
    call = first.output[0]
    follow = [
        {"role": "user", "content": ASK},
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]
    second = client.responses.create(model="fake-model", input=follow, tools=[WEATHER_TOOL])
    assert second.output_text == SUNNY


def test_previous_response_id_continues_a_stored_response(client):
    first = client.responses.create(model="fake-model", input=ASK, tools=[WEATHER_TOOL])
    call = first.output[0]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    second = client.responses.create(
        model="fake-model", input=[output], previous_response_id=first.id, tools=[WEATHER_TOOL]
    )
    assert second.output_text == SUNNY and second.previous_response_id == first.id
    assert client.responses.retrieve(first.id).output[0].call_id == call.call_id


def test_the_store_keeps_the_most_recently_used_and_deletes_on_request(client):
    kept = client.responses.create(model="fake-model", input="hi")
    unstored = client.responses.create(model="fake-model", input="hi", store=False)
    others = [client.responses.create(model="fake-model", input="hi") for _ in range(3)]
    client.responses.retrieve(kept.id)  # a use: `kept` is now the most recent
    newest = client.responses.create(model="fake-model", input="hi")  # evicts others[0]
    assert client.responses.retrieve(kept.id).id == kept.id
    assert client.responses.retrieve(newest.id).output_text == HELLO
    for gone in (unstored.id, others[0].id):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(gone)
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.retrieve(kept.id)
    assert missing.value.body["param"] == "response_id"
    with pytest.raises(openai.NotFoundError) as unknown:
        client.responses.create(model="fake-model", input="hi", previous_response_id=kept.id)
    assert unknown.value.body["param"] == "previous_response_id"


class City(pydantic.BaseModel):
    name: str
    country: str


def test_json_schema_text_format_parses(client):
    parsed = client.responses.parse(model="fake-model", input="JSON please", text_format=City)
    assert parsed.output_parsed == City(name="Paris", country="France")
    loose = client.responses.create(
        model="fake-model", input="JSON please", text={"format": {"type": "json_object"}}
    )
    assert json.loads(loose.output_text) == json.loads(CITY_JSON)


def test_reasoning_is_an_output_item(client):
    response = client.responses.create(
        model="fake-model", input="think", reasoning={"effort": "low"}
    )
    assert shape(response) == [("reasoning", THOUGHT), ("message", ANSWER)]


STREAMED = [
    {"input": "hi"},
    {"input": ASK, "tools": [WEATHER_TOOL]},
    {"input": "think", "reasoning": {"effort": "low"}},
    {
        "input": ASK,
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "function", "name": "get_weather"},
    },
]


@pytest.mark.parametrize("fields", STREAMED, ids=["text", "tool", "reasoning", "forced"])
def test_the_stream_helper_reassembles_the_whole_response(client, fields):
    whole = client.responses.create(model="fake-model", **fields)
    with client.responses.stream(model="fake-model", **fields) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_response()
    assert shape(streamed) == shape(whole)
    assert streamed.usage.output_tokens == whole.usage.output_tokens
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    delta = (
        "response.function_call_arguments.delta"
        if "tools" in fields
        else "response.output_text.delta"
    )
    assert delta in kinds


def test_a_call_cut_by_max_output_tokens_stays_text(client):
    response = client.responses.create(
        model="fake-model", input=ASK, tools=[WEATHER_TOOL], max_output_tokens=40
    )
    assert shape(response) == [("message", CALL[:40])] and response.status == "incomplete"


BAD = [
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"input": "hi", "background": True}, "background"),
    ({"input": "hi", "prompt": {"id": "p"}}, "prompt"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input.0.call_id"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input.0.type"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "input.0.content.0.type",
    ),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    (
        {
            "input": "hi",
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "function", "name": "nope"},
        },
        "tool_choice",
    ),
    ({"input": "hi", "temperature": "hot"}, "temperature"),
    ({"input": 3}, "input"),
]


@pytest.mark.parametrize(("fields", "param"), BAD)
def test_bad_input_is_a_400_naming_the_field(live, fields, param):
    response = httpx.post(
        live.url + "/v1/responses", json={"model": "fake-model", **fields}, timeout=30
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
