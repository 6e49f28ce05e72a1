"""The load gauges are read when /metrics is scraped, not left from the last loop turn (issue
39, item 8): a router scraping during a long step must not see an idle server.

The real engine on the tiny model, its forward held at a gate: while four requests sit inside
one step, a scrape must count all of them (running, with KV blocks in use, or waiting: those
the loop has not taken yet); two more sent then count too. The oracle is the number
of requests the test itself has in flight. Released, everything finishes and the gauges read 0.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.server.live import LiveServer, metric

BODY = {"prompt": "Hello world", "max_tokens": 3, "temperature": 0, "ignore_eos": True}


def gated_engine(folder, gate: threading.Event):
    """The tiny engine whose forward waits while `gate` is clear."""
    from engine import Engine, EngineConfig

    engine = Engine.from_model(str(folder), EngineConfig(dtype="float32", max_num_seqs=8))
    execute = engine.runner.execute

    def held(*args, **kwargs):
        assert gate.wait(60), "the test never opened the gate"
        return execute(*args, **kwargs)

    engine.runner.execute = held
    return engine


RUNNING, WAITING = "tgserve_num_requests_running", "tgserve_num_requests_waiting"


def wait_for(client: httpx.Client, in_flight: int) -> str:
    """Scrapes until running + waiting counts `in_flight` requests, at least one running (20 s
    at most: stale gauges never get there); returns that scrape."""
    deadline = time.monotonic() + 20
    while True:
        text = client.get("/metrics").text
        running, waiting = metric(text, RUNNING), metric(text, WAITING)
        if running + waiting == in_flight and (running >= 1 or in_flight == 0):
            return text
        if time.monotonic() > deadline:
            pytest.fail(f"{running} running + {waiting} waiting, not the {in_flight} in flight")
        time.sleep(0.02)


def test_a_scrape_during_a_long_step_counts_the_requests_it_runs(tiny_model_folder):
    gate = threading.Event()
    gate.set()  # the warm-up runs through
    with (
        LiveServer(lambda: gated_engine(tiny_model_folder, gate), admission_limit=16) as live,
        httpx.Client(base_url=live.url, timeout=60) as client,
    ):
        gate.clear()
        send = [
            threading.Thread(target=client.post, args=("/v1/completions",), kwargs={"json": BODY})
            for _ in range(6)
        ]
        for thread in send[:4]:
            thread.start()
        busy = wait_for(client, 4)  # one step holds the first (and any that came with it)
        assert metric(busy, "tgserve_kv_cache_blocks_used") > 0
        for thread in send[4:]:  # the loop is inside the step: these wait in its inbox
            thread.start()
        wait_for(client, 6)
        gate.set()
        for thread in send:
            thread.join(60)
        idle = wait_for(client, 0)
        assert metric(idle, "tgserve_kv_cache_blocks_used") == 0
