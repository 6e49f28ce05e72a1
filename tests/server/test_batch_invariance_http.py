"""Same request, same answer through HTTP (issue #14): on the default model in the default
dtype (`auto`: float32, the default model's GGUF blocks served as stored), 12 greedy and seeded
completions sent at once into a KV cache that holds about three of them (so the engine
preempts) return exactly the text and logprobs each returns when it is sent alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

from engine import Engine, EngineConfig
from tests.devices import default_model_here
from tests.server.live import LiveServer, metric

TOPICS = ["the sea", "a lighthouse", "winter", "a small robot", "the moon", "bread"]
# SmolLM2-135M in float32: 30 layers x K and V x 3 KV heads x 64 x 4 bytes = 45 KiB a token;
# 16 MiB hold ~360 tokens: about three of the requests below at their full length.
KV_BYTES = 16 * 2**20


def bodies() -> list[dict]:
    out = []
    for i in range(12):
        prompt = f"Write a short poem about {TOPICS[i % len(TOPICS)]}."
        if i % 3 == 0:  # some share a long prefix: prefix-cache hits beside recomputation
            prompt = "You are a careful poet who writes in plain words. " * 3 + prompt
        seeded = i % 2 == 1
        out.append(
            {
                "prompt": prompt,
                "max_tokens": 80,
                "ignore_eos": True,
                "temperature": 0.8 if seeded else 0.0,
                "seed": 100 + i if seeded else None,
                "logprobs": 2,
            }
        )
    return out


@pytest.fixture(scope="module")
def server():
    config = EngineConfig(kv_cache_memory_bytes=KV_BYTES, max_model_len=1024, dtype="auto")
    engines: list[Engine] = []

    def build() -> Engine:
        engines.append(Engine.from_model(str(default_model_here()), config))
        return engines[-1]

    with LiveServer(build, admission_limit=16) as live:
        live.engine = engines[0]
        yield live


def _complete(url: str, body: dict) -> dict:
    r = httpx.post(url + "/v1/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return {"text": choice["text"], "logprobs": choice["logprobs"]}


def test_twelve_concurrent_requests_under_kv_pressure_equal_their_solo_runs(server) -> None:
    # the default dtype for GGUF blocks as stored on a CPU (float32), on the default (C++
    # kernels) path
    assert server.engine.runner.kv_caches[0][0].dtype == torch.float32
    assert server.engine.describe().cpu_kernels
    reqs = bodies()
    solo = [_complete(server.url, b) for b in reqs]
    before = metric(httpx.get(server.url + "/metrics").text, "tgserve_num_preemptions_total")
    with ThreadPoolExecutor(len(reqs)) as pool:
        together = list(pool.map(lambda b: _complete(server.url, b), reqs))
    after = metric(httpx.get(server.url + "/metrics").text, "tgserve_num_preemptions_total")
    assert after > before, "the KV cache was meant to be too small for all twelve at once"
    for i, (alone, batched) in enumerate(zip(solo, together, strict=True)):
        assert batched == alone, f"request {i} ({'seeded' if reqs[i]['seed'] else 'greedy'})"
