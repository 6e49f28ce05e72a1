"""/metrics parses with prometheus_client's parser, and after a known set of requests every
family counts what the requests imply (oracle: the requests' own prompt lengths and max_tokens).
"""

from __future__ import annotations

import threading
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer, metric

FAMILIES = {
    "tgserve_num_requests_running": "gauge",
    "tgserve_num_requests_waiting": "gauge",
    "tgserve_kv_cache_blocks_used": "gauge",
    "tgserve_kv_cache_blocks_total": "gauge",
    "tgserve_prompt_tokens": "counter",
    "tgserve_generation_tokens": "counter",
    "tgserve_request_success": "counter",
    "tgserve_request_rejected": "counter",
    "tgserve_request_aborts": "counter",
    "tgserve_num_preemptions": "counter",
    "tgserve_prefix_cache_queries": "counter",
    "tgserve_prefix_cache_hits": "counter",
    "tgserve_time_to_first_token_seconds": "histogram",
    "tgserve_inter_token_latency_seconds": "histogram",
    "tgserve_e2e_request_latency_seconds": "histogram",
    "tgserve_request_queue_time_seconds": "histogram",
}


def test_metrics_parse_and_count_what_the_requests_imply():
    with LiveServer(lambda: FakeEngine(num_blocks=50)) as live:
        start = live.url
        for prompt, max_tokens in (("abc", 5), ("hello", 7)):
            body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
            assert httpx.post(start + "/v1/completions", json=body).status_code == 200
        assert (
            httpx.post(
                start + "/generate", json={"inputs": "EOS", "parameters": {"max_new_tokens": 9}}
            ).status_code
            == 200
        )
        httpx.post(start + "/v1/completions", json={"prompt": "x" * 500})  # too long: 400
        httpx.post(start + "/v1/completions", json={"prompt": "x", "model": "other"})  # 404
        text = httpx.get(start + "/metrics").text

    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert {name: families.get(name) for name in FAMILIES} == FAMILIES
    # prompts are BOS + bytes; the warm-up request adds one prompt token and one generated token
    assert metric(text, "tgserve_prompt_tokens_total") == 1 + 4 + 6 + 4
    assert metric(text, "tgserve_generation_tokens_total") == 1 + 5 + 7 + 4  # "EOS" stops at 4
    assert metric(text, "tgserve_request_success_total", {"finish_reason": "length"}) == 2
    assert metric(text, "tgserve_request_success_total", {"finish_reason": "stop"}) == 1
    assert metric(text, "tgserve_request_rejected_total", {"reason": "invalid"}) == 1
    assert metric(text, "tgserve_request_rejected_total", {"reason": "not_found"}) == 1
    assert metric(text, "tgserve_kv_cache_blocks_total") == 50
    assert metric(text, "tgserve_num_requests_running") == 0
    for name in ("time_to_first_token", "e2e_request_latency", "request_queue_time"):
        assert metric(text, f"tgserve_{name}_seconds_count") == 3
    assert metric(text, "tgserve_inter_token_latency_seconds_count") == (5 - 1) + (7 - 1) + (4 - 1)


def test_a_request_that_times_out_while_queued_adds_no_prompt_tokens():
    with LiveServer(lambda: FakeEngine(max_num_seqs=1, step_delay=0.01)) as live:
        long = {"prompt": "long", "max_tokens": 60, "temperature": 0}
        queued = {"prompt": "never scheduled", "max_tokens": 5, "temperature": 0, "timeout": 0.2}
        with httpx.Client(base_url=live.url, timeout=30) as client:
            worker = threading.Thread(
                target=client.post, args=("/v1/completions",), kwargs={"json": long}
            )
            worker.start()
            while metric(client.get("/metrics").text, "tgserve_num_requests_running") < 1:
                time.sleep(0.005)
            timed_out = client.post("/v1/completions", json=queued)
            worker.join(30)
            text = client.get("/metrics").text
    assert timed_out.json()["choices"][0]["finish_reason"] == "abort", timed_out.text
    # the warm-up's one prompt token (BOS) and BOS + "long": the queued prompt was never computed
    assert metric(text, "tgserve_prompt_tokens_total") == 1 + 5
