"""Every invalid input is a 4xx in the contract's shape, naming the field, with no traceback or
path in the body, and the server goes on serving afterwards.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer

OK_COMPLETION = {"model": "fake-model", "prompt": "hi", "max_tokens": 2}
OK_CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

# (route, body: dict or raw bytes, status, param expected in the error (None: none to name), words
# in the message)
OPENAI_CASES = [
    ("/v1/completions", b"{not json", 400, None, "JSON"),
    ("/v1/completions", b"[1, 2]", 400, None, "object"),
    ("/v1/completions", b"", 400, None, "object"),
    ("/v1/completions", {"model": "fake-model"}, 400, "prompt", "required"),
    ("/v1/completions", {**OK_COMPLETION, "max_tokens": "ten"}, 400, "max_tokens", "integer"),
    ("/v1/completions", {**OK_COMPLETION, "temperature": "hot"}, 400, "temperature", "number"),
    ("/v1/completions", {**OK_COMPLETION, "prompt": [1, "a"]}, 400, "prompt", ""),
    ("/v1/completions", {**OK_COMPLETION, "stream": "yes"}, 400, "stream", "boolean"),
    ("/v1/completions", {**OK_COMPLETION, "temperature": -1}, 400, "temperature", "[0, 100]"),
    ("/v1/completions", {**OK_COMPLETION, "top_p": 0}, 400, "top_p", "top_p"),
    ("/v1/completions", {**OK_COMPLETION, "max_tokens": 0}, 400, "max_tokens", "at least 1"),
    ("/v1/completions", {**OK_COMPLETION, "logprobs": 50}, 400, "logprobs", "logprobs"),
    ("/v1/completions", {**OK_COMPLETION, "n": 1000}, 400, "n", "n must be"),
    ("/v1/completions", {**OK_COMPLETION, "best_of": 1, "n": 2}, 400, "best_of", "best_of"),
    ("/v1/completions", {**OK_COMPLETION, "best_of": 2, "temperature": 0}, 400, "best_of", "same"),
    (
        "/v1/chat/completions",
        {**OK_CHAT, "n": 3, "best_of": 4, "temperature": 0},
        400,
        "best_of",
        "same",
    ),
    ("/v1/completions", {**OK_COMPLETION, "stop": ["x" * 1000]}, 400, "stop", "stop"),
    (
        "/v1/completions",
        {**OK_COMPLETION, "logit_bias": {"abc": 1}},
        400,
        "logit_bias",
        "token ids",
    ),
    (
        "/v1/completions",
        {**OK_COMPLETION, "logit_bias": {"99999": 1}},
        400,
        "logit_bias",
        "vocabulary",
    ),
    ("/v1/completions", {**OK_COMPLETION, "prompt": ""}, 400, "prompt", "empty"),
    ("/v1/completions", {**OK_COMPLETION, "prompt": []}, 400, "prompt", "empty"),
    ("/v1/completions", {**OK_COMPLETION, "prompt": "x" * 200}, 400, "prompt", "context length"),
    ("/v1/completions", {**OK_COMPLETION, "prompt": [[5, 999999]]}, 400, "prompt", "vocabulary"),
    ("/v1/completions", {**OK_COMPLETION, "model": "gpt-17"}, 404, "model", "does not exist"),
    ("/v1/completions", {**OK_COMPLETION, "suffix": "tail"}, 400, "suffix", "not supported"),
    ("/v1/completions", {**OK_COMPLETION, "timeout": -3}, 400, "timeout", "positive"),
    ("/v1/chat/completions", {"model": "fake-model", "messages": []}, 400, "messages", "empty"),
    (
        "/v1/chat/completions",
        {**OK_CHAT, "messages": [{"role": "wizard", "content": "x"}]},
        400,
        "messages.0.role",
        "",
    ),
    ("/v1/chat/completions", {**OK_CHAT, "messages": "hello"}, 400, "messages", "array"),
    ("/v1/chat/completions", {**OK_CHAT, "top_logprobs": 2}, 400, "top_logprobs", "logprobs"),
    (
        "/v1/chat/completions",
        {**OK_CHAT, "logprobs": True, "top_logprobs": 99},
        400,
        "top_logprobs",
        "top_logprobs",
    ),
    (
        "/v1/chat/completions",
        {**OK_CHAT, "tools": [{"type": "function"}]},
        400,
        "tools.0.function",
        "required",
    ),
    (
        "/v1/chat/completions",
        {**OK_CHAT, "use_beam_search": True, "stop": ["x"]},
        400,
        "stop",
        "beam",
    ),
    (
        "/v1/chat/completions",
        {**OK_CHAT, "max_tokens": 10_000},
        400,
        "max_tokens",
        "context length",
    ),
    ("/tokenize", {}, 400, "prompt", "exactly one"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens", "vocabulary"),
]

TGI_CASES = [
    ("/generate", b"{", "JSON"),
    ("/generate", {"parameters": {}}, "inputs"),
    ("/generate", {"inputs": ""}, "empty"),
    ("/generate", {"inputs": "x", "parameters": {"temperature": 0}}, "strictly positive"),
    ("/generate", {"inputs": "x", "parameters": {"top_p": 1.0}}, "top_p"),
    ("/generate", {"inputs": "x", "parameters": {"max_new_tokens": 0}}, "max_new_tokens"),
    ("/generate", {"inputs": "x", "parameters": {"max_new_tokens": "many"}}, "max_new_tokens"),
    ("/generate", {"inputs": "x", "parameters": {"grammar": {"type": "json"}}}, "field required"),
    ("/generate_stream", {"inputs": "x" * 300}, "context length"),
    ("/", {"inputs": "x", "stream": True, "parameters": {"top_k": -2}}, "top_k"),
]


@pytest.fixture(scope="module")
def server():
    with LiveServer(FakeEngine, max_body_bytes=4096) as live:
        yield live


def post(server, route: str, body) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(
            server.url + route, content=body, headers={"content-type": "application/json"}
        )
    return httpx.post(server.url + route, json=body)


def assert_clean(response: httpx.Response) -> None:
    text = response.text
    assert "Traceback" not in text and ".py" not in text and "/work" not in text


@pytest.mark.parametrize(("route", "body", "status", "param", "words"), OPENAI_CASES)
def test_invalid_openai_input_is_a_4xx_in_openai_shape(server, route, body, status, param, words):
    response = post(server, route, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert words.lower() in error["message"].lower()
    assert error["param"] == param
    assert_clean(response)


@pytest.mark.parametrize(("route", "body", "words"), TGI_CASES)
def test_invalid_tgi_input_is_a_422_in_tgi_shape(server, route, body, words):
    response = post(server, route, body)
    assert response.status_code == 422, response.text
    assert response.json()["error_type"] == "validation"
    assert words.lower() in response.json()["error"].lower()
    assert_clean(response)


def test_unknown_routes_and_methods_use_the_error_shape(server):
    missing = httpx.get(server.url + "/v1/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    wrong = httpx.get(server.url + "/v1/completions")
    assert wrong.status_code == 405 and "error" in wrong.json()


def test_bodies_over_the_limit_are_413_whether_declared_or_streamed(server):
    big = {"prompt": "x" * 5000, "max_tokens": 1}
    declared = httpx.post(server.url + "/v1/completions", json=big)
    assert declared.status_code == 413 and declared.json()["error"]["code"] == "request_too_large"

    def chunks():
        yield b'{"prompt": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    streamed = httpx.post(  # chunked: no length
        server.url + "/v1/completions",
        content=chunks(),
        headers={"content-type": "application/json"},
    )
    assert streamed.status_code == 413
    tgi = httpx.post(server.url + "/generate", json={"inputs": "x" * 5000})
    assert tgi.status_code == 413 and "error_type" in tgi.json()


def test_server_still_serves_after_all_the_bad_requests(server):
    for route, body, *_ in OPENAI_CASES[:5] + TGI_CASES[:3]:
        post(server, route, body)
    assert post(server, "/v1/completions", OK_COMPLETION).status_code == 200
    assert post(server, "/generate", {"inputs": "ok"}).status_code == 200


def test_an_engine_failure_is_a_clean_500_or_an_error_finish_in_streams(server):
    fake = server.state.engine.engine  # the FakeEngine behind the AsyncEngine

    def fail_next_step() -> None:
        deadline = time.monotonic() + 5
        while fake.has_unfinished_requests():  # let the previous failure's cleanup step run
            assert time.monotonic() < deadline
            time.sleep(0.01)
        fake.fail_steps = 1

    fail_next_step()
    failed = post(server, "/v1/completions", OK_COMPLETION)
    assert failed.status_code == 500 and failed.json()["error"]["code"] == "engine_error"
    assert_clean(failed)
    fail_next_step()
    with httpx.stream(
        "POST", server.url + "/v1/completions", json={**OK_COMPLETION, "stream": True}
    ) as r:
        body = r.read().decode()
    assert '"finish_reason":"error"' in body and body.endswith("data: [DONE]\n\n")
    assert "Traceback" not in body and ".py" not in body
    fail_next_step()
    with httpx.stream("POST", server.url + "/generate_stream", json={"inputs": "x"}) as r:
        body = r.read().decode()
    assert '"error_type":"generation"' in body
    assert post(server, "/v1/completions", OK_COMPLETION).status_code == 200  # and it goes on
