"""A client that disconnects (streaming or not, running or still queued) aborts its request:
/metrics shows running and waiting back to 0 and the KV blocks freed long before the request
could have finished on its own.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer, metric

STEP = 0.02
LONG = {"prompt": "long", "max_tokens": 100, "temperature": 0}  # 100 steps = 2 s if not aborted
MODEL = {"model_name": "fake-model"}  # FakeEngine's name: the request metrics' label


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
        time.sleep(0.1)
        assert (
            metric(scrape(server), "tgserve_num_requests_waiting") == 0
        )  # gone while the first runs
        assert metric(scrape(server), "tgserve_num_requests_running") == 1
    wait_idle(server, within=1.0)
