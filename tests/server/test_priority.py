"""`priority` (an extension on both route families; TGI's inside `parameters`): lower runs
first, as vLLM's. It reaches the engine's SamplingParams; a bad value is a 400 naming it on
/v1/* and a 422 in TGI's shape."""

from __future__ import annotations

import httpx
import pytest

from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer


class RecordingEngine(FakeEngine):
    def __init__(self) -> None:
        super().__init__()
        self.priorities: list[int] = []

    def add(self, request) -> None:
        self.priorities.append(request.params.priority)
        super().add(request)


@pytest.fixture(scope="module")
def live():
    engines: list[RecordingEngine] = []

    def factory() -> RecordingEngine:
        engines.append(RecordingEngine())
        return engines[-1]

    with LiveServer(factory) as server:
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
