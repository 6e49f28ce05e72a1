"""KV exhaustion through HTTP on the real engine: preemption is invisible to clients.

A tiny Llama (2 layers, 2 KV heads, head_dim 16, fp32, block 4 -> 2 KiB per KV block) serves
12 concurrent long greedy completions (16-token prompts + 100 tokens = 29 blocks each) from a
pool of 90 blocks, about three sequences' worth, with room in the batch for all 12. Oracles:
every request answers 200 with `length`, /metrics counts preemptions > 0 and ends with no
blocks used, and each text equals that request's solo run (alone on a fresh server with a
pool that never runs out).
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from engine import Engine, EngineConfig
from tests.checkpoints import VOCAB
from tests.server.live import LiveServer, metric

BLOCK_BYTES = 2 * 2 * 2 * 16 * 4 * 4  # K and V x layers x kv heads x head_dim x block x fp32
REQUESTS, PROMPT_LEN, MAX_TOKENS = 12, 16, 100


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(3, VOCAB, (PROMPT_LEN,), generator=gen).tolist() for _ in range(REQUESTS)]


def _serve(folder, kv_blocks: int) -> LiveServer:
    config = EngineConfig(
        dtype="float32",
        kv_cache_memory_bytes=kv_blocks * BLOCK_BYTES,
        block_size=4,
        max_num_seqs=REQUESTS,
        enable_prefix_caching=False,
    )
    return LiveServer(lambda: Engine.from_model(str(folder), config), admission_limit=2 * REQUESTS)


def _body(prompt: list[int]) -> dict:
    return {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}


async def _all_at_once(url: str, prompts: list[list[int]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        calls = [http.post("/v1/completions", json=_body(p)) for p in prompts]
        return await asyncio.wait_for(asyncio.gather(*calls), timeout=180)


@pytest.fixture(scope="module")
def solo_texts(tiny_model_folder) -> list[str]:
    texts = []
    with _serve(tiny_model_folder, kv_blocks=2000) as server:
        for prompt in _prompts():  # one at a time: each request alone in the engine
            response = httpx.post(server.url + "/v1/completions", json=_body(prompt), timeout=60)
            assert response.status_code == 200, response.text
            texts.append(response.json()["choices"][0]["text"])
    return texts


def test_twelve_long_requests_in_a_pool_for_three_all_finish_as_if_alone(
    tiny_model_folder, solo_texts
):
    with _serve(tiny_model_folder, kv_blocks=90) as server:
        text = httpx.get(server.url + "/metrics").text
        assert metric(text, "tgserve_kv_cache_blocks") == 90
        preempted_before = metric(text, "tgserve_num_preemptions_total")
        responses = asyncio.run(_all_at_once(server.url, _prompts()))
        text = httpx.get(server.url + "/metrics").text
    assert [r.status_code for r in responses] == [200] * REQUESTS
    choices = [r.json()["choices"][0] for r in responses]
    assert [c["finish_reason"] for c in choices] == ["length"] * REQUESTS
    assert [r.json()["usage"]["completion_tokens"] for r in responses] == [MAX_TOKENS] * REQUESTS
    assert metric(text, "tgserve_num_preemptions_total") > preempted_before
    assert metric(text, "tgserve_kv_cache_blocks_used") == 0
    for i, (choice, solo) in enumerate(zip(choices, solo_texts, strict=True)):
        assert choice["text"] == solo, f"request {i} differs from its solo run"
