"""One request id end to end: the id a client sees is the engine's, `X-Request-Id` is honoured
(validated, bounded), echoed, and names the request in the log lines written for it.

Oracles: the ids the engine itself was given (a FakeEngine that records `add`), the response
headers and bodies the client reads, the engine loop's own deadline log line, and log records
captured while a request is handled.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re

import httpx
import pytest

from server.request_id import RequestIdLogFilter, RequestIdMiddleware
from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer


class RecordingEngine(FakeEngine):
    """The fake engine, keeping every request id it was given."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.ids: list[str] = []

    def add(self, request) -> None:
        self.ids.append(request.request_id)
        super().add(request)


@pytest.fixture(scope="module")
def live():
    engines: list[RecordingEngine] = []

    def factory() -> RecordingEngine:
        engines.append(RecordingEngine(step_delay=0.01))
        return engines[-1]

    with LiveServer(factory) as server:
        server.engine = engines[0]
        yield server


def completion(live, headers=None, **body):
    body = {"prompt": "hi", "max_tokens": 2, **body}
    return httpx.post(live.url + "/v1/completions", json=body, headers=headers or {})


def test_without_a_header_the_id_is_made_echoed_and_the_engines(live):
    response = completion(live)
    echoed = response.headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", echoed)
    assert response.json()["id"] == "cmpl-" + echoed
    assert live.engine.ids[-1] == "cmpl-" + echoed


def test_a_clients_id_is_echoed_and_names_the_engine_request(live):
    response = completion(live, {"X-Request-Id": "trace:42.a"})
    assert response.headers["x-request-id"] == "trace:42.a"
    body_id = response.json()["id"]
    assert re.fullmatch(r"cmpl-trace:42\.a-[0-9a-f]{8}", body_id)
    assert live.engine.ids[-1] == body_id


def test_every_chunk_of_a_stream_carries_the_engines_id(live):
    headers = {"X-Request-Id": "stream-1"}
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    with httpx.stream("POST", live.url + "/v1/chat/completions", json=body, headers=headers) as r:
        assert r.headers["x-request-id"] == "stream-1"
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: {")]
    ids = {json.loads(line)["id"] for line in lines}
    assert ids == {live.engine.ids[-1]} and ids.pop().startswith("chatcmpl-stream-1-")


def test_several_prompts_are_numbered_under_the_requests_id(live):
    response = completion(live, prompt=["a", "b"])
    assert live.engine.ids[-2:] == [response.json()["id"] + "-0", response.json()["id"] + "-1"]


def test_tgi_and_anthropic_requests_go_to_the_engine_under_their_id(live):
    tgi = httpx.post(live.url + "/generate", json={"inputs": "hi"}, headers={"X-Request-Id": "t"})
    assert tgi.headers["x-request-id"] == "t" and re.fullmatch(
        r"t-[0-9a-f]{8}", live.engine.ids[-1]
    )
    body = {"model": "fake-model", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
    message = httpx.post(live.url + "/v1/messages", json=body, headers={"X-Request-Id": "m"})
    assert message.status_code == 200
    assert message.json()["id"] == live.engine.ids[-1] and message.json()["id"].startswith("msg_m-")
    body = {"model": "fake-model", "max_output_tokens": 2, "input": "x"}
    answer = httpx.post(live.url + "/v1/responses", json=body, headers={"X-Request-Id": "r"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["id"] == live.engine.ids[-1] and answer.json()["id"].startswith("resp_r-")
    stored = httpx.get(live.url + "/v1/responses/" + answer.json()["id"])
    assert stored.status_code == 200  # the id is usable in the path


def test_clients_sending_the_same_id_at_once_both_get_answers(live):
    async def both() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=live.url) as client:
            body = {"prompt": "hi", "max_tokens": 8}
            headers = {"X-Request-Id": "same"}
            return await asyncio.gather(
                *(client.post("/v1/completions", json=body, headers=headers) for _ in range(2))
            )

    first, second = asyncio.run(both())
    assert first.status_code == second.status_code == 200
    assert first.json()["id"] != second.json()["id"]


@pytest.mark.parametrize("bad", ["", "a" * 129, "has space", "semi;colon", "a/b", "é"])
def test_a_bad_header_is_a_400_naming_it_in_each_familys_shape(live, bad):
    headers = [("X-Request-Id", bad.encode("utf-8"))]
    response = httpx.post(live.url + "/v1/completions", json={"prompt": "hi"}, headers=headers)
    assert response.status_code == 400 and response.json()["error"]["param"] == "X-Request-Id"
    tgi = httpx.post(live.url + "/generate", json={"inputs": "hi"}, headers=headers)
    assert tgi.status_code == 422 and "X-Request-Id" in tgi.json()["error"]


def test_the_longest_id_accepted_is_128_characters(live):
    assert completion(live, {"X-Request-Id": "a" * 128}).status_code == 200


def test_refusals_before_any_route_carry_the_id_too():
    with LiveServer(FakeEngine, api_key=("k",)) as live:
        refused = completion(live, {"X-Request-Id": "who"})
        assert refused.status_code == 401 and refused.headers["x-request-id"] == "who"


def test_the_engines_deadline_log_line_names_the_id_the_client_got(caplog):
    caplog.set_level(logging.INFO)
    with LiveServer(lambda: FakeEngine(step_delay=0.05)) as live:
        response = completion(live, {"X-Request-Id": "late"}, max_tokens=100, timeout=0.2)
    client_id = response.json()["id"]
    lines = [r.getMessage() for r in caplog.records if "deadline" in r.getMessage()]
    assert any(client_id in line for line in lines), lines


def test_log_lines_written_while_a_request_is_handled_name_it():
    records: list[str] = []
    handler = logging.Handler()
    handler.addFilter(RequestIdLogFilter())
    handler.emit = lambda record: records.append(record.request + record.getMessage())
    logger = logging.getLogger("tgserve.test_request_id")
    logger.addHandler(handler)

    async def inner(scope, receive, send):
        logger.warning("inside")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def call() -> list[dict]:
        sent: list[dict] = []

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "path": "/x", "headers": [(b"x-request-id", b"abc")]}
        await RequestIdMiddleware(inner)(scope, None, send)
        return sent

    try:
        sent = asyncio.run(call())
        logger.warning("outside")
    finally:
        logger.removeHandler(handler)
    assert (b"x-request-id", b"abc") in sent[0]["headers"]
    assert re.fullmatch(r"\[request abc-[0-9a-f]{8}\] inside", records[0])
    assert records[1] == "outside"
