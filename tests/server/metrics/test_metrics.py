"""/metrics parses with prometheus_client's parser, and after a known set of requests every
family counts what the requests imply (oracle: the requests' own prompt lengths and max_tokens,
the HTTP statuses the client saw). `promtool check metrics` (Debian's prometheus package,
installed where missing) finds nothing to object to in the default output; with
--vllm-compatible-metrics, only the router gauges' vLLM names.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter

import httpx
from prometheus_client.parser import text_string_to_metric_families

from engine import warm_up_requests
from tests.debian_tools import debian_tool
from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer, metric

MODEL = {"model_name": "fake-model"}  # FakeEngine's name

FAMILIES = {
    "tgserve_num_requests_running": "gauge",
    "tgserve_num_requests_waiting": "gauge",
    "tgserve_kv_cache_blocks_used": "gauge",
    "tgserve_kv_cache_blocks": "gauge",
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
    "tgserve_request_prompt_tokens": "histogram",
    "tgserve_request_generation_tokens": "histogram",
    "tgserve_http_requests": "counter",
    "tgserve_http_request_duration_seconds": "histogram",
}


def _known_traffic(url: str) -> tuple[str, Counter]:
    """Sends a known set of requests; returns /metrics after them and the statuses seen by
    (method, route template)."""
    seen: Counter = Counter()
    with httpx.Client(base_url=url, timeout=30) as client:

        def send(method: str, path: str, route: str, **kwargs) -> httpx.Response:
            response = client.request(method, path, **kwargs)
            seen[(method, route, str(response.status_code))] += 1
            return response

        for prompt, max_tokens in (("abc", 5), ("hello", 7)):
            body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
            assert send("POST", "/v1/completions", "/v1/completions", json=body).status_code == 200
        tgi = {"inputs": "EOS", "parameters": {"max_new_tokens": 9}}
        assert send("POST", "/generate", "/generate", json=tgi).status_code == 200
        too_long = {"prompt": "x" * 500}
        assert send("POST", "/v1/completions", "/v1/completions", json=too_long).status_code == 400
        other = {"prompt": "x", "model": "other"}
        assert send("POST", "/v1/completions", "/v1/completions", json=other).status_code == 404
        assert send("GET", "/v1/completions", "/v1/completions").status_code == 405
        assert send("GET", "/no/such/route", "unmatched").status_code == 404
        return client.get("/metrics").text, seen


def test_metrics_parse_and_count_what_the_requests_imply():
    with LiveServer(lambda: FakeEngine(num_blocks=50)) as live:
        text, seen = _known_traffic(live.url)

    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert {name: families.get(name) for name in FAMILIES} == FAMILIES
    # prompts are BOS + bytes; the engine counts the warm-up's tokens too (engine/warm_up.py)
    warm_up = warm_up_requests(FakeEngine(num_blocks=50).info)
    warm_prompt = sum(len(prompt) for _, prompt, _ in warm_up)
    warm_out = sum(params.max_tokens for _, _, params in warm_up)
    assert metric(text, "tgserve_prompt_tokens_total") == warm_prompt + 4 + 6 + 4
    assert metric(text, "tgserve_generation_tokens_total") == warm_out + 5 + 7 + 4  # "EOS": 4
    length, stop = {**MODEL, "finish_reason": "length"}, {**MODEL, "finish_reason": "stop"}
    assert metric(text, "tgserve_request_success_total", length) == 2
    assert metric(text, "tgserve_request_success_total", stop) == 1
    assert metric(text, "tgserve_request_aborts_total", MODEL) == 0
    assert metric(text, "tgserve_request_rejected_total", {"reason": "invalid"}) == 1
    assert metric(text, "tgserve_request_rejected_total", {"reason": "not_found"}) == 1
    assert metric(text, "tgserve_kv_cache_blocks") == 50
    assert metric(text, "tgserve_num_requests_running") == 0
    for name in ("time_to_first_token", "e2e_request_latency", "request_queue_time"):
        assert metric(text, f"tgserve_{name}_seconds_count", MODEL) == 3
    assert metric(text, "tgserve_inter_token_latency_seconds_count", MODEL) == 4 + 6 + 3
    # the three requests' lengths: prompts BOS + bytes, outputs as counted above
    assert metric(text, "tgserve_request_prompt_tokens_sum", MODEL) == 4 + 6 + 4
    assert metric(text, "tgserve_request_generation_tokens_sum", MODEL) == 5 + 7 + 4
    assert metric(text, "tgserve_request_generation_tokens_bucket", {**MODEL, "le": "5.0"}) == 2
    for (method, route, status), count in seen.items():
        labels = {"method": method, "route": route, "status": status}
        assert metric(text, "tgserve_http_requests_total", labels) == count, labels
        assert metric(text, "tgserve_http_request_duration_seconds_count", labels) == count


def test_answers_the_guard_gives_before_routing_count_under_their_route():
    with LiveServer(FakeEngine, api_key=("secret",)) as live:
        body = {"prompt": "abc", "max_tokens": 2}
        assert httpx.post(live.url + "/v1/completions", json=body).status_code == 401
        assert httpx.get(live.url + "/openapi.json").status_code == 401
        assert httpx.get(live.url + "/nowhere").status_code == 401
        text = httpx.get(live.url + "/metrics").text
    for method, route in (("POST", "/v1/completions"), ("GET", "/openapi.json")):
        labels = {"method": method, "route": route, "status": "401"}
        assert metric(text, "tgserve_http_requests_total", labels) == 1
    unmatched = {"method": "GET", "route": "unmatched", "status": "401"}
    assert metric(text, "tgserve_http_requests_total", unmatched) == 1


def _promtool(promtool: str, text: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )


def test_promtool_finds_nothing_to_object_to_in_the_default_metrics():
    promtool = debian_tool("promtool", "prometheus")
    with LiveServer(lambda: FakeEngine(num_blocks=50)) as live:
        text, _ = _known_traffic(live.url)
    assert "vllm:" not in text  # the router gauges are opt-in (--vllm-compatible-metrics)
    lint = _promtool(promtool, text)
    assert lint.returncode == 0 and not lint.stdout + lint.stderr, lint


def test_promtool_objects_only_to_the_opt_in_router_gauges_names():
    promtool = debian_tool("promtool", "prometheus")
    with LiveServer(lambda: FakeEngine(num_blocks=50), vllm_compatible_metrics=True) as live:
        text, _ = _known_traffic(live.url)
    lint = _promtool(promtool, text)
    problems = (lint.stdout + lint.stderr).splitlines()
    # vLLM's names, which routers and the Gateway API Inference Extension read as they are
    router_names = {"vllm:num_requests_waiting", "vllm:num_requests_running"}
    router_names |= {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}
    assert set(problems) == {f"{name} metric names should not contain ':'" for name in router_names}


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
    # the warm-up's prompts and BOS + "long": the queued prompt was never computed
    warm_up = warm_up_requests(FakeEngine(max_num_seqs=1).info)
    assert metric(text, "tgserve_prompt_tokens_total") == sum(len(p) for _, p, _ in warm_up) + 5
