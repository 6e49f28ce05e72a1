"""Streams never send a chunk of empty text while the bytes of a UTF-8 character are held back:
the OpenAI routes skip such deltas unless they carry logprobs the client asked for or a
finish_reason. TGI streams keep one event per token (its protocol: every event names its token
and logprob), and their texts still join into `generated_text`. The fake model writes "€" one
byte per token after a prompt holding "€"; the oracle decodes its greedy tokens.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.fake_engine import FakeEngine, expected_greedy_text
from tests.server.live import LiveServer

PROMPT = "price in €:"


@pytest.fixture(scope="module")
def server():
    with LiveServer(FakeEngine) as live:
        yield live


def chunks(live: LiveServer, route: str, body: dict) -> list[dict]:
    with httpx.stream("POST", live.url + route, json=body, timeout=30) as response:
        lines = [line for line in response.iter_lines() if line]
    if lines[-1] == "data: [DONE]":  # the OpenAI routes end so; TGI streams end at the last event
        lines.pop()
    else:
        assert route == "/generate_stream"
    return [json.loads(line[6:]) for line in lines]


def test_completion_streams_send_no_empty_chunks_while_bytes_are_held_back(server):
    ids = server.state.tokenizer.encode(PROMPT, True)
    expected = expected_greedy_text(ids, 7)  # 7 bytes: two euros and a dangling byte
    assert expected == "€€"  # the dangling byte is dropped, not shown as U+FFFD
    body = {"model": "fake-model", "prompt": PROMPT, "max_tokens": 7, "temperature": 0}
    got = [c["choices"][0] for c in chunks(server, "/v1/completions", {**body, "stream": True})]
    assert all(c["text"] or c["finish_reason"] for c in got), got
    assert "".join(c["text"] for c in got) == expected
    assert len(got) <= 3  # a chunk per complete character, and the finish (7 tokens)
    whole = httpx.post(server.url + "/v1/completions", json=body).json()
    assert whole["choices"][0]["text"] == expected


def test_a_chunk_still_goes_out_when_it_carries_asked_for_logprobs(server):
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 0, "stream": True}
    got = [c["choices"][0] for c in chunks(server, "/v1/completions", body)]
    assert sum(len(c["logprobs"]["tokens"]) for c in got) == 6  # every token scored once
    assert any(not c["text"] for c in got)  # those chunks carry only logprobs
    assert all(c["text"] or c["logprobs"]["tokens"] or c["finish_reason"] for c in got)


def test_chat_streams_send_no_empty_deltas(server):
    messages = [{"role": "user", "content": PROMPT}]
    body = {"messages": messages, "max_tokens": 6, "temperature": 0, "stream": True}
    got = [c["choices"][0] for c in chunks(server, "/v1/chat/completions", body)]
    assert got[0]["delta"] == {"role": "assistant", "content": ""}
    rest = got[1:]
    assert all(c["delta"].get("content") or c["finish_reason"] for c in rest), rest
    assert "".join(c["delta"].get("content", "") for c in rest) == "€€"
    with_lp = chunks(server, "/v1/chat/completions", {**body, "logprobs": True})
    entries = [
        e for c in with_lp[1:] for e in (c["choices"][0]["logprobs"] or {}).get("content", [])
    ]
    assert len(entries) == 6


def test_tgi_streams_keep_one_event_per_token_and_join_into_the_text(server):
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 7}}
    events = chunks(server, "/generate_stream", body)
    assert len(events) == 7 and [e["token"]["id"] for e in events] == list("€€".encode()) + [0xE2]
    expected = expected_greedy_text(server.state.tokenizer.encode(PROMPT, True), 7)
    assert "".join(e["token"]["text"] for e in events) == events[-1]["generated_text"] == expected
