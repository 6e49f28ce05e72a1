"""Admission: a burst beyond running + waiting gets 429 + Retry-After before any stream byte,
nothing hangs, and a per-request deadline removes a request even while it is still queued.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer, metric


@pytest.fixture(scope="module")
def server():
    factory = lambda: FakeEngine(step_delay=0.02, max_num_seqs=1, max_queued_requests=1)  # noqa: E731
    with LiveServer(factory, admission_limit=2) as live:
        yield live


def rejected_overloaded(server) -> float:
    text = httpx.get(server.url + "/metrics").text
    try:
        return metric(text, "tgserve_request_rejected_total", {"reason": "overloaded"})
    except KeyError:  # no rejection yet: the labelled sample does not exist
        return 0.0


async def burst(url: str, count: int, stream: bool) -> list[httpx.Response]:
    body = {"prompt": "burst", "max_tokens": 10, "temperature": 0, "stream": stream}
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def one() -> httpx.Response:
            async with client.stream("POST", "/v1/completions", json=body) as response:
                await response.aread()
                return response

        return await asyncio.gather(*(one() for _ in range(count)))


@pytest.mark.parametrize("stream", [False, True])
def test_a_burst_beyond_the_bound_gets_429_with_retry_after_and_nothing_hangs(server, stream):
    before = rejected_overloaded(server)
    t0 = time.monotonic()
    responses = asyncio.run(burst(server.url, 8, stream))
    assert time.monotonic() - t0 < 15
    codes = sorted(r.status_code for r in responses)
    assert codes.count(200) >= 1 and set(codes) == {200, 429}
    for response in responses:
        if response.status_code == 429:
            assert int(response.headers["retry-after"]) >= 1
            assert response.headers["content-type"].startswith(
                "application/json"
            )  # no stream began
            assert response.json()["error"]["type"] == "rate_limit_error"
        elif stream:
            assert response.text.endswith("data: [DONE]\n\n")
        else:
            assert response.json()["choices"][0]["finish_reason"] == "length"
    assert rejected_overloaded(server) - before == codes.count(429)
    assert metric(httpx.get(server.url + "/metrics").text, "tgserve_num_requests_running") == 0


def test_tgi_overload_is_429_in_tgi_shape():
    factory = lambda: FakeEngine(step_delay=0.05)  # noqa: E731
    with LiveServer(factory, admission_limit=1) as live:

        async def main():
            async with httpx.AsyncClient(base_url=live.url, timeout=30) as client:
                body = {"inputs": "x", "parameters": {"max_new_tokens": 8}}
                return await asyncio.gather(
                    *(client.post("/generate", json=body) for _ in range(3))
                )

        responses = asyncio.run(main())
    overloaded = [r for r in responses if r.status_code == 429]
    assert overloaded and all(r.json()["error_type"] == "overloaded" for r in overloaded)


def test_a_deadline_aborts_a_request_that_is_still_queued(server):
    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            long = asyncio.create_task(
                client.post(
                    "/v1/completions", json={"prompt": "long", "max_tokens": 60, "temperature": 0}
                )
            )
            await asyncio.sleep(0.2)  # the long request holds the only running slot
            t0 = time.monotonic()
            short = await client.post(
                "/v1/completions",
                json={"prompt": "late", "max_tokens": 5, "temperature": 0, "timeout": 0.2},
            )
            waited = time.monotonic() - t0
            return short, waited, await long

    short, waited, long = asyncio.run(main())
    assert short.status_code == 200
    assert short.json()["choices"][0]["finish_reason"] == "abort"
    assert short.json()["usage"]["completion_tokens"] == 0
    assert waited < 1.0  # well before the long request (60 x 20 ms) could free the slot
    assert long.json()["choices"][0]["finish_reason"] == "length"
