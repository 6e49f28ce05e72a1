"""A client that disconnects (streaming or not, running or still queued) aborts its request:
/metrics shows running and waiting back to 0 and the KV blocks freed long before the request
could have finished on its own.
"""

from __future__ import annotations

import logging
import time

import httpx
import pytest

from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer, metric

STEP = 0.02
LONG = {"prompt": "long", "max_tokens": 100, "temperature": 0}  # 100 steps = 2 s if not aborted
MODEL = {"model_name": "fake-model"}  # FakeEngine's name: the request metrics' label
ANTHROPIC = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100, "temperature": 0}
RESPONSES = {"input": "hi", "max_output_tokens": 100, "temperature": 0}


@pytest.fixture(scope="module")
def server():
    with LiveServer(lambda: FakeEngine(step_delay=STEP, max_num_seqs=1)) as live:
        yield live


def scrape(server) -> str:
    return httpx.get(server.url + "/metrics").text


def wait_idle(server, within: float) -> float:
    """Seconds until running, waiting and used blocks are all 0 (fails after `within`)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < within:
        text = scrape(server)
        names = (
            "tgserve_num_requests_running",
            "tgserve_num_requests_waiting",
            "tgserve_kv_cache_blocks_used",
        )
        if all(metric(text, name) == 0 for name in names):
            return time.monotonic() - t0
        time.sleep(0.02)
    raise AssertionError(f"the engine was still busy {within}s after the client left")


def wait_busy(server) -> None:
    t0 = time.monotonic()
    while metric(scrape(server), "tgserve_num_requests_running") == 0:
        assert time.monotonic() - t0 < 5
        time.sleep(0.01)


def test_closing_a_stream_aborts_the_request_and_frees_its_blocks(server):
    aborts_before = metric(scrape(server), "tgserve_request_aborts_total", MODEL)
    generated_before = metric(scrape(server), "tgserve_generation_tokens_total")
    with httpx.stream(
        "POST", server.url + "/v1/completions", json={**LONG, "stream": True}
    ) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        assert metric(scrape(server), "tgserve_kv_cache_blocks_used") > 0
    wait_idle(server, within=1.0)
    text = scrape(server)
    assert metric(text, "tgserve_generation_tokens_total") - generated_before < 60
    assert metric(text, "tgserve_request_aborts_total", MODEL) == aborts_before + 1


def test_a_client_leaving_a_non_streaming_request_aborts_it(server):
    generated_before = metric(scrape(server), "tgserve_generation_tokens_total")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=LONG, timeout=0.3)
    wait_idle(server, within=1.0)
    assert metric(scrape(server), "tgserve_generation_tokens_total") - generated_before < 60


def test_a_client_leaving_while_queued_is_removed_from_the_queue(server):
    with httpx.stream(
        "POST",
        server.url + "/generate_stream",
        json={"inputs": "run", "parameters": {"max_new_tokens": 40}},
    ) as running:
        lines = running.iter_lines()  # keep a reference: a dropped iterator closes the connection
        next(lines)
        wait_busy(server)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/generate", json={"inputs": "queued"}, timeout=0.2)
        # Gone while the first runs: polled, not slept for (a loaded host may take longer than
        # a fixed 0.1 s to notice the closed socket; a request left in the queue still fails).
        deadline = time.monotonic() + 5.0
        while metric(scrape(server), "tgserve_num_requests_waiting") != 0:
            assert time.monotonic() < deadline, "the departed client is still queued after 5 s"
            time.sleep(0.05)
        assert metric(scrape(server), "tgserve_num_requests_running") == 1
    wait_idle(server, within=1.0)


class RecordingEngine(FakeEngine):
    """A FakeEngine that remembers which requests were aborted, and which were added."""

    def __init__(self, **knobs) -> None:
        super().__init__(**knobs)
        self.added: list[str] = []
        self.aborted: list[str] = []

    def add(self, request) -> None:
        super().add(request)
        self.added.append(request.request_id)

    def abort_request(self, request_id: str) -> None:
        self.aborted.append(request_id)
        super().abort_request(request_id)


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/completions", {**LONG, "prompt": ["first", "second"]}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100, "temperature": 0},
        ),
        ("/generate", {"inputs": "long", "parameters": {"max_new_tokens": 100}}),
        ("/v1/messages", ANTHROPIC),
        ("/v1/responses", RESPONSES),
    ],
    ids=["completions, two prompts", "chat", "tgi", "anthropic", "responses"],
)
def test_a_non_streamed_disconnect_is_one_info_line_and_aborts_in_the_engine(route, body, caplog):
    engine = RecordingEngine(step_delay=STEP, max_num_seqs=2)
    uvicorn_logger = logging.getLogger("uvicorn")  # it does not propagate to the root logger
    uvicorn_logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="server")
    try:
        with LiveServer(lambda: engine) as live:
            warm_up = list(engine.added)
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(live.url + route, json=body, timeout=0.3)
            wait_idle(live, within=1.0)
    finally:
        uvicorn_logger.removeHandler(caplog.handler)
    added = [rid for rid in engine.added if rid not in warm_up]
    assert added and sorted(engine.aborted) == sorted(added)  # every one of its requests
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    said = [r.getMessage() for r in caplog.records if "disconnected" in r.getMessage()]
    assert said == [f"client disconnected from POST {route}: its request was aborted"]


@pytest.mark.parametrize(
    ("route", "body"), [("/v1/messages", ANTHROPIC), ("/v1/responses", RESPONSES)]
)
def test_closing_a_named_event_stream_aborts_in_the_engine_and_the_route_is_counted(route, body):
    engine = RecordingEngine(step_delay=STEP, max_num_seqs=2)
    with LiveServer(lambda: engine) as live:
        warm_up = list(engine.added)
        with httpx.stream("POST", live.url + route, json={**body, "stream": True}) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("event: ")
        wait_idle(live, within=1.0)
        labels = {"method": "POST", "route": route, "status": "200"}
        assert metric(scrape(live), "tgserve_http_requests_total", labels) == 1
    added = [rid for rid in engine.added if rid not in warm_up]
    assert len(added) == 1 and engine.aborted == added
