"""The one admission rule through HTTP: a burst of N simultaneous requests on an idle server
with room for max_num_seqs + max_queued_requests = R gets exactly N - R answers 429 (streaming
or not, JSON with Retry-After, before any stream byte) and R complete, however the arrivals
interleave with engine steps. The engine is held inside a step while the burst lands, so no
admitted request can finish and free its place: the count is exact, not a matter of timing.
"""

from __future__ import annotations

import asyncio

import httpx

from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer, metric

RUNNING, QUEUED, BURST = 4, 4, 40


async def burst(url: str, engine: FakeEngine) -> tuple[list[httpx.Response], int]:
    limits = httpx.Limits(max_connections=BURST + 4)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def one(i: int) -> httpx.Response:
            body = {"prompt": f"burst {i}", "max_tokens": 8, "temperature": 0, "stream": i % 2 == 0}
            async with client.stream("POST", "/v1/completions", json=body) as response:
                await response.aread()
                return response

        engine.stall.set()  # the engine loop blocks in its next step: nothing finishes
        tasks = [asyncio.create_task(one(i)) for i in range(BURST)]
        for _ in range(2000):
            if sum(t.done() for t in tasks) >= BURST - RUNNING - QUEUED:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # any wrongly refused request would have answered by now
        answered_while_stalled = sum(t.done() for t in tasks)
        engine.stall.clear()
        return list(await asyncio.gather(*tasks)), answered_while_stalled


def test_a_burst_gets_exactly_n_minus_running_plus_queued_429s():
    engines: list[FakeEngine] = []

    def factory() -> FakeEngine:
        engines.append(
            FakeEngine(max_num_seqs=RUNNING, max_queued_requests=QUEUED, step_delay=0.005)
        )
        return engines[-1]

    with LiveServer(factory, admission_limit=RUNNING + QUEUED) as live:
        responses, answered_while_stalled = asyncio.run(burst(live.url, engines[0]))
        text = httpx.get(live.url + "/metrics").text
    codes = [r.status_code for r in responses]
    assert codes.count(429) == BURST - (RUNNING + QUEUED) == answered_while_stalled
    assert codes.count(200) == RUNNING + QUEUED
    for i, response in enumerate(responses):
        if response.status_code == 429:
            assert response.headers["content-type"].startswith("application/json")
            assert int(response.headers["retry-after"]) >= 1
            assert response.json()["error"]["code"] == "overloaded"
        elif i % 2 == 0:
            assert response.text.endswith("data: [DONE]\n\n")
        else:
            assert response.json()["choices"][0]["finish_reason"] == "length"
    assert metric(text, "tgserve_request_rejected_total", {"reason": "overloaded"}) == codes.count(
        429
    )


def test_the_server_admits_what_the_engine_config_admits():
    from engine import EngineConfig

    config = EngineConfig(max_num_seqs=RUNNING, max_queued_requests=QUEUED)
    assert config.max_in_flight == RUNNING + QUEUED  # serve.py passes it as the admission limit
