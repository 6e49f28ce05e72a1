"""The OpenAI routes through the official `openai` client and raw SSE, on the fake engine.

Oracle: the fake engine's greedy output is a closed formula (`expected_greedy_text`) of the
prompt token ids, and its tokenizer is bytes (BOS + UTF-8 bytes for completions, the chat
template's text for chat), so every expected text is computed independently of the server.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.server.fake_engine import BOS, FakeEngine, FakeTokenizer, expected_greedy_text
from tests.server.live import LiveServer


@pytest.fixture(scope="module")
def server():
    with LiveServer(FakeEngine) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=20)


def completion_ids(text: str) -> list[int]:
    return [BOS, *text.encode()]


def chat_ids(user: str) -> list[int]:
    return list(FakeTokenizer().apply_chat_template([{"role": "user", "content": user}]).encode())


def sse_events(response: httpx.Response) -> list[str]:
    """The data fields of an SSE body, checking the `data: ...\\n\\n` framing on the way."""
    body = response.read().decode()
    assert body.endswith("\n\n")
    events = body.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: ") :] for e in events]


def test_completion_text_usage_and_finish_reason_match_the_oracle(client):
    result = client.completions.create(
        model="fake-model", prompt="Hello", max_tokens=9, temperature=0
    )
    assert result.choices[0].text == expected_greedy_text(completion_ids("Hello"), 9)
    assert result.choices[0].finish_reason == "length"
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (6, 9)
    assert result.usage.total_tokens == 15


def test_streamed_completion_equals_non_streamed_and_ends_with_one_finish_then_done(server, client):
    body = {"model": "fake-model", "prompt": "stream me", "max_tokens": 17, "temperature": 0}
    whole = client.completions.create(**body).choices[0].text
    with httpx.stream(
        "POST", server.url + "/v1/completions", json={**body, "stream": True}
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole
    finishes = [
        c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]
    ]
    assert finishes == ["length"] and chunks[-1]["choices"][0]["finish_reason"] == "length"
    streamed = "".join(c.choices[0].text for c in client.completions.create(**body, stream=True))
    assert streamed == whole


def test_streamed_chat_equals_non_streamed_with_role_first_and_usage_last(client):
    messages = [{"role": "user", "content": "Tell me"}]
    whole = client.chat.completions.create(
        model="fake-model", messages=messages, max_tokens=11, temperature=0
    )
    assert whole.choices[0].message.content == expected_greedy_text(chat_ids("Tell me"), 11)
    assert whole.choices[0].message.role == "assistant"
    chunks = list(
        client.chat.completions.create(
            model="fake-model",
            messages=messages,
            max_tokens=11,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == whole.choices[0].message.content
    )
    assert [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 11
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens == len(chat_ids("Tell me"))


def test_n_samples_and_several_prompts_get_their_own_choice_indices(client):
    # Seeded sampling (greedy n > 1 is refused): each prompt's request draws the same samples.
    body = {"model": "fake-model", "prompt": ["ab", "cd"], "n": 2, "max_tokens": 5, "seed": 11}
    result = client.completions.create(**body)
    by_index = {c.index: c.text for c in result.choices}
    assert sorted(by_index) == [0, 1, 2, 3]
    assert all(len(text) == 5 for text in by_index.values())
    assert by_index[0] != by_index[1] and (by_index[0], by_index[1]) == (by_index[2], by_index[3])
    assert result.usage.completion_tokens == 20
    streamed: dict[int, str] = {}
    finishes: dict[int, int] = {}
    for chunk in client.completions.create(**body, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
            finishes[choice.index] = finishes.get(choice.index, 0) + bool(choice.finish_reason)
    assert streamed == by_index and set(finishes.values()) == {1}


def test_greedy_n_gives_n_identical_choices_and_beam_search_is_served(client):
    # as OpenAI answers: every choice is the one greedy sequence, and usage counts each
    want = expected_greedy_text(completion_ids("ab"), 6)
    result = client.completions.create(
        model="fake-model", prompt=["ab", "ab"], n=3, max_tokens=6, temperature=0
    )
    assert sorted((c.index, c.text) for c in result.choices) == [(i, want) for i in range(6)]
    assert result.usage.completion_tokens == 36
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0}
    whole = client.chat.completions.create(model="fake-model", n=2, **chat)
    texts = [c.message.content for c in whole.choices]
    assert texts == [expected_greedy_text(chat_ids("hi"), 5)] * 2
    streamed: dict[int, str] = {}
    for chunk in client.chat.completions.create(model="fake-model", n=2, stream=True, **chat):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
    assert streamed == {0: texts[0], 1: texts[1]}
    with pytest.raises(openai.BadRequestError) as refused:  # best_of beyond n: still the same
        client.completions.create(model="fake-model", prompt="ab", n=2, best_of=3, temperature=0)
    assert refused.value.body["param"] == "best_of"
    beams = client.completions.create(
        model="fake-model",
        prompt="ab",
        n=2,
        max_tokens=4,
        temperature=0,
        extra_body={"use_beam_search": True},
    )
    assert sorted(c.index for c in beams.choices) == [0, 1]


def test_token_id_prompts_are_accepted(client):
    ids = [72, 105]
    result = client.completions.create(
        model="fake-model", prompt=[ids, ids], max_tokens=4, temperature=0
    )
    assert [c.text for c in result.choices] == [expected_greedy_text(ids, 4)] * 2


def test_completion_logprobs_have_openai_shape_and_consistent_offsets(client):
    result = client.completions.create(
        model="fake-model", prompt="lp", max_tokens=6, temperature=0, logprobs=2
    )
    choice = result.choices[0]
    lp = choice.logprobs
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert top[token] == logprob and len(top) >= 2


def test_echo_prepends_the_prompt_and_scores_its_tokens(client):
    result = client.completions.create(
        model="fake-model", prompt="echo", max_tokens=3, temperature=0, echo=True, logprobs=1
    )
    choice = result.choices[0]
    assert choice.text == "echo" + expected_greedy_text(completion_ids("echo"), 3)
    assert choice.logprobs.token_logprobs[0] is None  # the first prompt token has no context
    assert len(choice.logprobs.tokens) == len(completion_ids("echo")) + 3


def test_chat_logprobs_list_tokens_with_bytes_and_top_alternatives(client):
    result = client.chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": "x"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = result.choices[0].logprobs.content
    assert "".join(t.token for t in content) == result.choices[0].message.content
    for item in content:
        assert bytes(item.bytes) == item.token.encode()
        assert (
            len(item.top_logprobs) == 3
            and item.top_logprobs[0].logprob >= item.top_logprobs[-1].logprob
        )


def test_stop_string_ends_with_finish_reason_stop_and_is_removed(client):
    full = expected_greedy_text(completion_ids("stop"), 12)
    stop = full[3:5]
    result = client.completions.create(
        model="fake-model", prompt="stop", max_tokens=12, temperature=0, stop=[stop]
    )
    assert result.choices[0].finish_reason == "stop"
    assert result.choices[0].text == full[: full.index(stop)]


def test_models_lists_the_served_name_with_its_context_length(server):
    data = httpx.get(server.url + "/v1/models").json()["data"]
    assert [(m["id"], m["max_model_len"]) for m in data] == [("fake-model", 128)]


def test_tokenize_and_detokenize_round_trip(server):
    tokens = httpx.post(server.url + "/tokenize", json={"prompt": "héllo"}).json()
    assert tokens["tokens"] == completion_ids("héllo") and tokens["count"] == len(tokens["tokens"])
    text = httpx.post(server.url + "/detokenize", json={"tokens": tokens["tokens"][1:]}).json()
    assert text == {"prompt": "héllo"}
    chat = httpx.post(
        server.url + "/tokenize", json={"messages": [{"role": "user", "content": "x"}]}
    ).json()
    assert chat["tokens"] == chat_ids("x")


def test_token_ids_outside_the_vocabulary_are_a_400_even_with_echo(server):
    body = {"model": "fake-model", "prompt": [65, 99999], "max_tokens": 2, "echo": True}
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=20)
    assert response.status_code == 400
    error = response.json()["error"]
    assert "99999" in error["message"] and error["type"] == "invalid_request_error"
    ok = httpx.post(server.url + "/v1/completions", json={**body, "prompt": [65, 66]}, timeout=20)
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"].startswith("AB")
