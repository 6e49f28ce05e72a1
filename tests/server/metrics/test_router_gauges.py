"""The gauges routers scrape (vLLM's names, with --vllm-compatible-metrics) carry tgserve's own
queue and KV-cache figures, and are absent without the option.

Oracle: tgserve's own gauges in the same scrape, taken while the engine is frozen with one
request running and one waiting (max_num_seqs=1); KV usage must be blocks used / blocks total,
a fraction, and fall back to 0 with the queue once both requests are done.
"""

from __future__ import annotations

import threading
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer, metric


def test_router_gauges_repeat_the_queue_and_kv_usage_as_a_fraction():
    engine = FakeEngine(max_num_seqs=1, num_blocks=40, step_delay=0.005)
    with (
        LiveServer(lambda: engine, vllm_compatible_metrics=True) as live,
        httpx.Client(base_url=live.url, timeout=30) as client,
    ):
        body = {"prompt": "a longer prompt", "max_tokens": 40, "temperature": 0}
        workers = [
            threading.Thread(target=client.post, args=("/v1/completions",), kwargs={"json": body})
            for _ in range(2)
        ]
        for worker in workers:
            worker.start()
        # Freeze the engine (the stats snapshot stays put while we read it) until a snapshot
        # shows one request running and one waiting: both can still be waiting when the
        # second arrives before the first is scheduled (seen under load).
        deadline = time.monotonic() + 20
        while True:
            engine.stall.set()
            time.sleep(0.05)
            busy = client.get("/metrics").text
            running = metric(busy, "tgserve_num_requests_running")
            if running == metric(busy, "tgserve_num_requests_waiting") == 1:
                break
            engine.stall.clear()
            assert time.monotonic() < deadline, "never one request running and one waiting"
            time.sleep(0.005)
        engine.stall.clear()
        for worker in workers:
            worker.join(30)
        idle = client.get("/metrics").text

    assert metric(busy, "vllm:num_requests_waiting") == metric(busy, "tgserve_num_requests_waiting")
    assert metric(busy, "vllm:num_requests_waiting") == 1
    assert metric(busy, "vllm:num_requests_running") == 1
    used = metric(busy, "tgserve_kv_cache_blocks_used")
    assert used > 0
    for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
        assert metric(busy, name) == used / 40
        assert metric(idle, name) == 0
    assert (
        metric(idle, "vllm:num_requests_waiting") == metric(idle, "vllm:num_requests_running") == 0
    )


def test_router_gauges_are_off_by_default():
    with LiveServer(FakeEngine) as live:
        text = httpx.get(live.url + "/metrics").text
    assert metric(text, "tgserve_num_requests_waiting") == 0  # the engine's gauges are there
    for family in text_string_to_metric_families(text):
        assert not family.name.startswith("vllm:"), family.name
