"""SSE keep-alive: while a stream waits (here: the engine loop is stalled, as behind a long queue),
every streaming route sends `: keep-alive` comments at the configured interval, and the stream
still ends with the answer it would have given (the comments are invisible to SSE clients).

Oracle: the fake engine's greedy text (`expected_greedy_text`) of each route's prompt.
"""

from __future__ import annotations

import json

import httpx
import pytest

from server.streaming import SSE_KEEPALIVE
from tests.server.fake_engine import BOS, FakeEngine, FakeTokenizer, expected_greedy_text
from tests.server.live import LiveServer

CHAT_PROMPT = FakeTokenizer().apply_chat_template([{"role": "user", "content": "hi"}])
ROUTES = {
    "/v1/completions": (
        {"prompt": "hi", "max_tokens": 6, "temperature": 0, "stream": True},
        [BOS, *b"hi"],
        lambda event: event["choices"][0]["text"] if event["choices"] else "",
    ),
    "/v1/chat/completions": (
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 6,
            "temperature": 0,
            "stream": True,
        },
        list(CHAT_PROMPT.encode()),
        lambda event: event["choices"][0]["delta"].get("content") or "",
    ),
    "/generate_stream": (
        {"inputs": "hi", "parameters": {"max_new_tokens": 6}},
        [BOS, *b"hi"],
        lambda event: event["token"]["text"],
    ),
    "/v1/messages": (
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 6,
            "temperature": 0,
            "stream": True,
        },
        list(CHAT_PROMPT.encode()),
        lambda event: event.get("delta", {}).get("text", ""),
    ),
    "/v1/responses": (
        {"input": "hi", "max_output_tokens": 6, "temperature": 0, "stream": True},
        list(CHAT_PROMPT.encode()),
        lambda event: event["delta"] if event["type"] == "response.output_text.delta" else "",
    ),
}


@pytest.fixture(scope="module")
def live():
    engine = FakeEngine()
    with LiveServer(lambda: engine, sse_keepalive=0.02) as server:
        yield server, engine


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_a_waiting_stream_gets_keepalive_comments_then_its_answer(live, path):
    server, engine = live
    body, prompt, text_of = ROUTES[path]
    engine.stall.set()  # the loop blocks in its next step: the request waits
    comments, texts = 0, []
    try:
        with httpx.stream("POST", server.url + path, json=body, timeout=30) as response:
            assert response.status_code == 200
            for block in _events(response):
                if block + b"\n\n" == SSE_KEEPALIVE:
                    comments += 1
                    engine.stall.clear()  # seen one: let the request run
                    continue
                data = block.split(b"\n")[-1].removeprefix(b"data:").strip()  # after any event:
                if data != b"[DONE]":
                    texts.append(text_of(json.loads(data)))
    finally:
        engine.stall.clear()
    assert comments >= 1
    assert "".join(texts) == expected_greedy_text(prompt, 6)


def _events(response: httpx.Response):
    buffer = b""
    for chunk in response.iter_bytes():
        buffer += chunk
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            yield block
