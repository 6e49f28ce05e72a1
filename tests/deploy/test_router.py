"""Two tgserve replicas behind an off-the-shelf LLM router (sglang-router) on loopback.

The replicas serve a tiny random Llama with a real BPE tokenizer (tests/server/tiny_model.py),
each with its own engine and prefix cache, in this process; the router is the package's own
binary, started as a subprocess for each routing policy. Workload: 50 greedy completions, each
a long shared prefix (one of 3, ~150 tokens, about 9 KV blocks) plus a short unique question,
4 at a time. Each policy gets fresh prefixes, so the first phase's cache cannot help the second.

Oracles: every request answers 200 with its max_tokens; each replica's /metrics shows it served
requests; the prefix-cache hits summed over both replicas' /metrics (tokens found in the cache)
are higher under `cache_aware` than under `round_robin`, which sends every prefix to both
replicas and so computes it twice; and a routed answer equals the same request sent straight
to a replica (the router passes the response through unchanged).
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import httpx
import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from tests.server.live import LiveServer, free_port, metric
from tests.server.tiny_model import _CORPUS

REQUESTS, PREFIXES, CONCURRENCY, MAX_TOKENS = 50, 3, 4, 2
SENTENCES = sorted(set(_CORPUS))


def _workload(seed: int) -> list[str]:
    rng = random.Random(seed)
    prefixes = [
        f"Context {seed}-{i}: " + " ".join(rng.sample(SENTENCES, 3)) for i in range(PREFIXES)
    ]
    return [f"{rng.choice(prefixes)} Question {k}: what next?" for k in range(REQUESTS)]


@contextmanager
def _router(policy: str, workers: list[str]) -> Iterator[str]:
    port = free_port()
    command = [
        sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
        "--port", str(port), "--policy", policy, "--worker-urls", *workers,
        "--health-check-endpoint", "/ready", "--log-level", "warn",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the router never saw both replicas healthy"
            try:
                if httpx.get(url + "/readiness").json().get("healthy_workers") == len(workers):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(15)


async def _send_all(url: str, prompts: list[str]) -> list[httpx.Response]:
    gate = asyncio.Semaphore(CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:

        async def one(prompt: str) -> httpx.Response:
            async with gate:
                body = {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS}
                return await http.post("/v1/completions", json={**body, "temperature": 0})

        return await asyncio.gather(*(one(p) for p in prompts))


def _counts(replicas: list[LiveServer]) -> list[tuple[float, float]]:
    """(requests finished, prefix-cache hit tokens) of each replica, read from its /metrics."""
    counts = []
    for replica in replicas:
        text = httpx.get(replica.url + "/metrics").text
        try:  # the labelled sample appears with the first finished request
            labels = {"model_name": replica.state.model_names[0], "finish_reason": "length"}
            served = metric(text, "tgserve_request_success_total", labels)
        except KeyError:
            served = 0.0
        counts.append((served, metric(text, "tgserve_prefix_cache_hits_total")))
    return counts


@pytest.fixture(scope="module")
def replicas(tiny_model_folder) -> Iterator[list[LiveServer]]:
    config = EngineConfig(dtype="float32", kv_cache_memory_bytes=32 << 20, max_num_seqs=8)
    with ExitStack() as stack:
        yield [
            stack.enter_context(
                LiveServer(lambda: Engine.from_model(str(tiny_model_folder), config))
            )
            for _ in range(2)
        ]


def _run_phase(policy: str, seed: int, replicas: list[LiveServer]) -> tuple[list[float], float]:
    """Per-replica requests served and the total prefix-cache hits this phase added."""
    before = _counts(replicas)
    with _router(policy, [r.url for r in replicas]) as url:
        responses = asyncio.run(_send_all(url, _workload(seed)))
    for response in responses:
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == MAX_TOKENS
    after = _counts(replicas)
    served = [a[0] - b[0] for a, b in zip(after, before, strict=True)]
    hits = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    return served, hits


def test_cache_aware_routing_finds_more_prefix_hits_than_round_robin(replicas):
    rr_served, rr_hits = _run_phase("round_robin", seed=1, replicas=replicas)
    ca_served, ca_hits = _run_phase("cache_aware", seed=2, replicas=replicas)

    assert sum(rr_served) == sum(ca_served) == REQUESTS
    assert min(rr_served) > 0 and min(ca_served) > 0, (rr_served, ca_served)  # both replicas serve
    assert ca_hits > rr_hits, (ca_hits, rr_hits)


def test_a_routed_answer_equals_the_replica_answer(replicas):
    body = {"model": "tiny", "prompt": _workload(3)[0], "max_tokens": 8, "temperature": 0}
    direct = httpx.post(replicas[0].url + "/v1/completions", json=body, timeout=60).json()
    with _router("round_robin", [r.url for r in replicas]) as url:
        routed = [httpx.post(url + "/v1/completions", json=body, timeout=60).json() for _ in "ab"]
    assert [r["choices"][0]["text"] for r in routed] == [direct["choices"][0]["text"]] * 2
