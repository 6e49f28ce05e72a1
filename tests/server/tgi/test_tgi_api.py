"""The TGI routes through huggingface_hub's InferenceClient (it posts to `/`) and raw HTTP,
and the same client's chat API (`chat_completion` and its alias `chat.completions.create`),
which posts to /v1/chat/completions with the placeholder model name "dummy".

Oracle: the fake engine's greedy formula on BOS + the input's UTF-8 bytes (TGI routes) or on
the fake tokenizer's chat template (chat); streamed text must add up to the whole one.
"""

from __future__ import annotations

import json

import httpx
import pytest
from huggingface_hub.errors import HfHubHTTPError

from tests.server.fake_engine import BOS, EOS, FakeEngine, FakeTokenizer, expected_greedy_text
from tests.server.live import LiveServer, inference_client


def ids_of(text: str) -> list[int]:
    return [BOS, *text.encode()]


@pytest.fixture(scope="module")
def server():
    with LiveServer(FakeEngine) as live:
        yield live


@pytest.fixture
def client(server, monkeypatch):
    return inference_client(server.url, monkeypatch)


def test_inference_client_text_generation_returns_the_generated_text_only(client):
    text = client.text_generation("Hi there", max_new_tokens=7)
    assert text == expected_greedy_text(ids_of("Hi there"), 7)


def test_inference_client_details_name_tokens_and_finish_reason(client):
    out = client.text_generation("Hi", max_new_tokens=5, details=True)
    assert out.generated_text == expected_greedy_text(ids_of("Hi"), 5)
    assert out.details.finish_reason == "length" and out.details.generated_tokens == 5
    assert "".join(t.text for t in out.details.tokens) == out.generated_text
    assert [t.id for t in out.details.tokens] == [ord(c) for c in out.generated_text]


def test_inference_client_stream_concatenates_to_the_non_streamed_text(client):
    whole = client.text_generation("stream", max_new_tokens=9)
    assert "".join(client.text_generation("stream", max_new_tokens=9, stream=True)) == whole
    events = list(client.text_generation("stream", max_new_tokens=9, stream=True, details=True))
    assert [e.details is not None for e in events] == [False] * (len(events) - 1) + [True]
    assert events[-1].generated_text == whole and events[-1].details.finish_reason == "length"
    assert events[-1].details.input_length == len(ids_of("stream"))
    assert [e.index for e in events] == list(range(1, len(events) + 1))


def test_generate_and_compat_route_share_one_answer_and_full_text_is_optional(server):
    body = {"inputs": "abc", "parameters": {"max_new_tokens": 4}}
    generated = httpx.post(server.url + "/generate", json=body).json()
    assert generated == {"generated_text": expected_greedy_text(ids_of("abc"), 4)}
    assert httpx.post(server.url + "/", json=body).json() == [generated]
    full = {"inputs": "abc", "parameters": {"max_new_tokens": 4, "return_full_text": True}}
    assert (
        httpx.post(server.url + "/generate", json=full).json()["generated_text"]
        == "abc" + generated["generated_text"]
    )


def test_eos_and_stop_sequences_map_to_tgi_finish_reasons(server):
    eos = httpx.post(
        server.url + "/generate", json={"inputs": "EOS", "parameters": {"details": True}}
    ).json()
    assert eos["details"]["finish_reason"] == "eos_token"
    assert eos["details"]["tokens"][-1] == {
        "id": EOS,
        "text": "</s>",
        "logprob": -0.5,
        "special": True,
    }
    full = expected_greedy_text(ids_of("seq"), 10)
    body = {
        "inputs": "seq",
        "parameters": {"max_new_tokens": 10, "stop": [full[4:6]], "details": True},
    }
    stopped = httpx.post(server.url + "/generate", json=body).json()
    assert stopped["details"]["finish_reason"] == "stop_sequence"
    assert stopped["generated_text"] == full[: full.index(full[4:6])]


def test_generate_stream_events_carry_final_text_only_at_the_end(server):
    body = {"inputs": "ev", "parameters": {"max_new_tokens": 6, "decoder_input_details": True}}
    with httpx.stream("POST", server.url + "/generate_stream", json=body) as response:
        raw = response.read().decode()
    events = [json.loads(e[len("data:") :]) for e in raw.split("\n\n") if e]
    assert [e["generated_text"] for e in events[:-1]] == [None] * 5
    assert events[-1]["generated_text"] == expected_greedy_text(ids_of("ev"), 6)
    assert "".join(e["token"]["text"] for e in events) == events[-1]["generated_text"]


def test_decoder_input_details_return_the_prompt_tokens(server):
    body = {
        "inputs": "pf",
        "parameters": {"max_new_tokens": 2, "details": True, "decoder_input_details": True},
    }
    details = httpx.post(server.url + "/generate", json=body).json()["details"]
    assert [p["id"] for p in details["prefill"]] == ids_of("pf")
    assert details["prefill"][0]["logprob"] is None


def test_info_describes_the_model_and_limits(server):
    info = httpx.get(server.url + "/info").json()
    assert info["model_id"] == "fake-model" and info["max_total_tokens"] == 128
    assert info["max_input_tokens"] < info["max_total_tokens"]
    assert info["vocab_size"] == server.state.tokenizer.vocab_size  # the ids a prompt may hold


CHAT = [{"role": "user", "content": "Tell me"}]


def chat_ids(messages: list[dict]) -> list[int]:
    return list(FakeTokenizer().apply_chat_template(messages).encode())


def test_chat_completion_answers_as_the_served_model(client):
    answer = client.chat_completion(CHAT, max_tokens=11, temperature=0)
    assert answer.choices[0].message.content == expected_greedy_text(chat_ids(CHAT), 11)
    assert answer.choices[0].finish_reason == "length"
    assert answer.model == "fake-model"
    assert answer.usage.prompt_tokens == len(chat_ids(CHAT))
    assert answer.usage.completion_tokens == 11


def test_streamed_chat_completion_adds_up_to_the_whole_answer(client):
    whole = client.chat_completion(CHAT, max_tokens=9, temperature=0)
    chunks = list(client.chat_completion(CHAT, max_tokens=9, temperature=0, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_the_openai_style_alias_gives_the_same_answers(client):
    messages = [{"role": "system", "content": "Be brief"}, *CHAT]
    expected = expected_greedy_text(chat_ids(messages), 7)
    answer = client.chat.completions.create(messages=messages, max_tokens=7, temperature=0)
    assert answer.choices[0].message.content == expected
    stream = client.chat.completions.create(
        messages=messages, max_tokens=7, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected


def test_a_model_name_the_server_does_not_serve_is_still_a_404(client):
    with pytest.raises(HfHubHTTPError) as refused:
        client.chat_completion(CHAT, model="another-model", max_tokens=3)
    assert refused.value.response.status_code == 404
