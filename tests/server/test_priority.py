"""Scheduling hints reach the engine's SamplingParams from every route. `priority` (an
extension on both route families; TGI's inside `parameters`): lower runs first, as vLLM's; a bad
value is a 400 naming it on /v1/* and a 422 in TGI's shape. `streamed`: whether the client reads
tokens as they come (stream true, /generate_stream), so the step-time target protects them."""

from __future__ import annotations

import httpx
import pytest

from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer


class RecordingEngine(FakeEngine):
    """Records the priority and `streamed` of every request it is given."""

    def __init__(self, **fake_engine_args) -> None:
        super().__init__(**fake_engine_args)
        self.priorities: list[int] = []
        self.streamed: list[bool] = []

    def add(self, request) -> None:
        self.priorities.append(request.params.priority)
        self.streamed.append(request.params.streamed)
        super().add(request)


@pytest.fixture(scope="module")
def live():
    engines: list[RecordingEngine] = []

    def factory() -> RecordingEngine:
        engines.append(RecordingEngine())
        return engines[-1]

    with LiveServer(factory, priority_keys=("*",)) as server:  # every client may go first
        yield server, engines[0]


def test_priority_reaches_the_engine_from_every_route(live):
    server, engine = live
    calls = [
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "priority": -5}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "priority": 7},
        ),
        ("/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 2, "priority": 3}}),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
    ]
    for path, body in calls:
        before = len(engine.priorities)
        response = httpx.post(server.url + path, json=body, timeout=30)
        assert response.status_code == 200, response.text
        assert engine.priorities[before:] == [
            body.get("priority", body.get("parameters", {}).get("priority", 0))
        ]


def test_only_streamed_requests_are_marked_streamed(live):
    server, engine = live
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    tgi = {"inputs": "hi", "parameters": {"max_new_tokens": 2}}
    calls = [
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2}, False),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "stream": True}, True),
        ("/v1/chat/completions", chat, False),
        ("/v1/chat/completions", {**chat, "stream": True}, True),
        ("/generate", tgi, False),
        ("/generate_stream", tgi, True),
    ]
    for path, body, streamed in calls:
        before = len(engine.streamed)
        with httpx.stream("POST", server.url + path, json=body, timeout=30) as response:
            assert response.status_code == 200, response.read()
            response.read()
        assert engine.streamed[before:] == [streamed], (path, body)


@pytest.mark.parametrize("value", [2**40, "high", 1.5])
def test_a_bad_priority_is_a_400_naming_it(live, value):
    server, _ = live
    response = httpx.post(
        server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "priority": value}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "priority"


def test_a_bad_tgi_priority_is_a_422_in_tgi_shape(live):
    server, _ = live
    body = {"inputs": "hi", "parameters": {"max_new_tokens": 2, "priority": 2**40}}
    response = httpx.post(server.url + "/generate", json=body)
    assert response.status_code == 422
    assert "priority" in response.json()["error"]
