"""Every check the engine makes on a request comes back as a 400 naming the field in the route's
own API: OpenAI's `param` on the completion and chat routes, TGI's names in its 422 message.
The server reads the field from the engine's `InvalidRequest.field` (never from the message),
so this walks each check on the real engine (the tiny llama with its BPE tokenizer: vocabulary
320, context 256, a 40-block KV cache of 4-token blocks, 4 sequences at most)."""

from __future__ import annotations

import httpx
import pytest

from engine import Engine, EngineConfig
from tests.checkpoints import VOCAB
from tests.server.live import LiveServer

LONG_TEXT = " ".join(str(i) for i in range(400))  # far more than 256 tokens
SAMPLED = {"temperature": 1.0, "seed": 1}


def ids(n: int) -> list[int]:
    return [3 + i % 300 for i in range(n)]


def completion(**fields) -> dict:
    return {"prompt": ids(4), "max_tokens": 2, **fields}


def chat(**fields) -> dict:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}


# (case, route, body, the OpenAI param)
OPENAI_CASES = [
    ("out-of-vocabulary id", "/v1/completions", completion(prompt=[-1]), "prompt"),
    ("id past the vocabulary", "/v1/completions", completion(prompt=[[5, VOCAB]]), "prompt"),
    ("prompt fills the context", "/v1/completions", completion(prompt=ids(256)), "prompt"),
    ("max_tokens past the context", "/v1/completions", completion(max_tokens=300), "max_tokens"),
    (
        "messages fill the context",
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": LONG_TEXT}]),
        "messages",
    ),
    (
        "chat max_tokens past the context",
        "/v1/chat/completions",
        chat(max_tokens=300),
        "max_tokens",
    ),
    (
        "chat max_completion_tokens past the context",
        "/v1/chat/completions",
        {**chat(), "max_tokens": None, "max_completion_tokens": 300},
        "max_completion_tokens",
    ),
    ("logit_bias id", "/v1/completions", completion(logit_bias={str(VOCAB): 1}), "logit_bias"),
    ("logit_bias value", "/v1/chat/completions", chat(logit_bias={"5": 200}), "logit_bias"),
    ("stop_token_ids id", "/v1/completions", completion(stop_token_ids=[VOCAB]), "stop_token_ids"),
    ("stop string too long", "/v1/completions", completion(stop=["x" * 300]), "stop"),
    (
        "beam search with stop strings",
        "/v1/chat/completions",
        chat(use_beam_search=True, n=2, stop=["x"]),
        "stop",
    ),
    ("n wider than the batch", "/v1/completions", completion(n=5, **SAMPLED), "n"),
    (
        "best_of wider than the batch",
        "/v1/completions",
        completion(best_of=5, **SAMPLED),
        "best_of",
    ),
    (
        "prompt larger than the KV cache",
        "/v1/completions",
        completion(prompt=ids(170), max_tokens=1),
        "prompt",
    ),
    (
        "max_tokens past the KV cache",
        "/v1/completions",
        completion(prompt=ids(100), max_tokens=100),
        "max_tokens",
    ),
    (
        "n past the KV cache",
        "/v1/completions",
        completion(prompt=ids(20), max_tokens=30, n=4, **SAMPLED),
        "n",
    ),
    (
        "chat logprobs range",
        "/v1/chat/completions",
        chat(logprobs=True, top_logprobs=21),
        "top_logprobs",
    ),
    ("echo logprobs range", "/v1/completions", completion(echo=True, logprobs=21), "logprobs"),
    ("min_tokens past max_tokens", "/v1/completions", completion(min_tokens=5), "min_tokens"),
    (
        "guided regex that does not compile",
        "/v1/completions",
        completion(guided_regex="("),
        "guided_regex",
    ),
]

# (case, body, the TGI field its 422 message must open with)
TGI_CASES = [
    ("inputs fill the context", {"inputs": LONG_TEXT}, "inputs"),
    (
        "max_new_tokens past the context",
        {"inputs": "hi", "parameters": {"max_new_tokens": 300}},
        "max_new_tokens",
    ),
    (
        "max_new_tokens past the KV cache",
        {"inputs": "hi", "parameters": {"max_new_tokens": 200}},
        "max_new_tokens",
    ),
    (
        "best_of wider than the batch",
        {"inputs": "hi", "parameters": {"best_of": 5, "do_sample": True}},
        "best_of",
    ),
    ("stop string too long", {"inputs": "hi", "parameters": {"stop": ["x" * 300]}}, "stop"),
    ("top_n_tokens range", {"inputs": "hi", "parameters": {"top_n_tokens": 21}}, "top_n_tokens"),
    (
        "grammar that does not compile",
        {"inputs": "hi", "parameters": {"grammar": {"type": "regex", "value": "("}}},
        "grammar",
    ),
]


@pytest.fixture(scope="module")
def server(tiny_model_folder):
    config = EngineConfig(
        dtype="float32", kv_cache_memory_bytes=40 * 2048, block_size=4, max_num_seqs=4
    )
    with LiveServer(lambda: Engine.from_model(str(tiny_model_folder), config)) as live:
        assert live.state.engine.info.kv_blocks_total == 40
        yield live


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [case[1:] for case in OPENAI_CASES],
    ids=[case[0] for case in OPENAI_CASES],
)
def test_each_engine_check_is_a_400_whose_param_is_the_openai_field(server, route, body, param):
    for stream in (False, True):
        response = httpx.post(server.url + route, json={**body, "stream": stream}, timeout=60)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param, error
        assert error["message"].startswith(param), error


@pytest.mark.parametrize(
    ("body", "field"), [case[1:] for case in TGI_CASES], ids=[case[0] for case in TGI_CASES]
)
def test_each_engine_check_is_a_422_naming_the_tgi_field(server, body, field):
    for route in ("/generate", "/generate_stream"):
        response = httpx.post(server.url + route, json=body, timeout=60)
        assert response.status_code == 422, response.text
        error = response.json()
        assert error["error_type"] == "validation"
        assert error["error"].startswith(field), error


def test_the_server_still_serves_after_the_refusals(server):
    response = httpx.post(server.url + "/v1/completions", json=completion(), timeout=60)
    assert response.status_code == 200, response.text
