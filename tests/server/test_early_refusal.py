"""The guard answers 429 on the generation routes while the engine is full, before the body is
read: a body nobody could parse still gets the 429 (in the route's own error shape, with
Retry-After, counted as "overloaded"), while the other routes and, once there is room again,
the same body get their ordinary answers. Every POST route that starts generation is gated.
"""

from __future__ import annotations

import time
from contextlib import ExitStack

import httpx
import pytest

from server.app import API_ROUTERS, ServerState
from server.guard import GENERATION_ROUTES
from server.settings import Settings
from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer, metric

NOT_JSON = b"{this is not json"
HEADERS = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server():
    def factory() -> FakeEngine:
        return FakeEngine(max_model_len=512, step_delay=0.02, max_num_seqs=1, max_queued_requests=1)

    with LiveServer(factory, admission_limit=2) as live:
        yield live


def overloaded(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    try:
        return metric(text, "tgserve_request_rejected_total", {"reason": "overloaded"})
    except KeyError:
        return 0.0


def fill(client: httpx.Client, stack: ExitStack) -> None:
    """Two long streams: the server's whole room (admission_limit 2), until they are closed."""
    body = {"prompt": "fill", "max_tokens": 400, "temperature": 0, "stream": True}
    for _ in range(2):
        response = stack.enter_context(client.stream("POST", "/v1/completions", json=body))
        assert response.status_code == 200  # headers sent: admitted


def wait_for_room(server) -> None:
    end = time.monotonic() + 10
    while server.state.engine.refusal() is not None:
        assert time.monotonic() < end, "the closed streams never left the engine"
        time.sleep(0.02)


def test_a_full_server_refuses_every_generation_route_before_reading_the_body(server):
    before = overloaded(server.url)
    with httpx.Client(base_url=server.url, timeout=30) as client, ExitStack() as stack:
        fill(client, stack)
        for path in sorted(GENERATION_ROUTES):
            response = client.post(path, content=NOT_JSON, headers=HEADERS)
            assert response.status_code == 429, path
            assert int(response.headers["retry-after"]) >= 1
            body = response.json()
            if path.startswith("/v1/messages"):  # Anthropic's shape
                assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
            elif path.startswith("/v1/"):
                assert body["error"]["code"] == "overloaded"
            else:  # TGI routes: their own shape
                assert set(body) == {"error", "error_type"}
        # Not a generation route: parsed and answered as usual while full.
        assert client.post("/tokenize", content=NOT_JSON, headers=HEADERS).status_code == 400
        assert client.get("/v1/models").status_code == 200
    assert overloaded(server.url) - before == len(GENERATION_ROUTES)
    wait_for_room(server)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        response = client.post("/v1/completions", content=NOT_JSON, headers=HEADERS)
        assert response.status_code == 400  # room again: the body is read and refused as such


def test_every_post_route_that_generates_is_gated():
    state = ServerState(Settings(), FakeEngine, admission_limit=4)
    posts = {
        route.path
        for build_router in API_ROUTERS  # every API's routes, as create_app adds them
        for route in build_router(state).routes
        if "POST" in route.methods
    }
    not_generating = {"/tokenize", "/detokenize", "/v1/messages/count_tokens"}
    assert posts - not_generating == GENERATION_ROUTES
