"""POST routes take JSON only: a body sent as text/plain, form data or with no Content-Type is
refused with 415 (OpenAI shape on /v1/* and the tokenizer routes, TGI shape on TGI routes);
application/json with parameters and application/*+json are accepted; the official clients
(openai, huggingface_hub) send application/json and keep working.
"""

from __future__ import annotations

import json

import httpx
import pytest
from huggingface_hub import InferenceClient
from openai import OpenAI

from tests.server.fake_engine import FakeEngine, expected_greedy_text
from tests.server.live import LiveServer, metric

BODY = {"model": "fake-model", "prompt": "hi", "max_tokens": 3, "temperature": 0}


@pytest.fixture(scope="module")
def server():
    with LiveServer(FakeEngine) as live:
        yield live


def send(live: LiveServer, route: str, body: dict, content_type: str | None) -> httpx.Response:
    headers = {"content-type": content_type} if content_type is not None else {}
    return httpx.post(live.url + route, content=json.dumps(body).encode(), headers=headers)


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/x-www-form-urlencoded", "application/jsonx"]
)
@pytest.mark.parametrize(
    "route", ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"]
)
def test_non_json_bodies_are_415_in_the_openai_shape(server, route, content_type):
    r = send(server, route, BODY, content_type)
    assert r.status_code == 415
    error = r.json()["error"]
    assert error["code"] == "unsupported_media_type" and "application/json" in error["message"]
    assert error["type"] == "invalid_request_error" and "param" in error


@pytest.mark.parametrize("route", ["/generate", "/generate_stream", "/"])
def test_non_json_bodies_are_415_in_the_tgi_shape(server, route):
    r = send(server, route, {"inputs": "hi"}, "text/plain")
    assert r.status_code == 415
    assert r.json()["error_type"] == "validation" and "application/json" in r.json()["error"]


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/vnd.api+json",
    ],
)
def test_json_media_types_are_accepted(server, content_type):
    r = send(server, "/v1/completions", BODY, content_type)
    assert r.status_code == 200
    ids = server.state.tokenizer.encode("hi", True)
    assert r.json()["choices"][0]["text"] == expected_greedy_text(ids, 3)


def rejected(live: LiveServer) -> float:
    text = httpx.get(live.url + "/metrics").text
    try:
        return metric(text, "tgserve_request_rejected_total", {"reason": "unsupported_media_type"})
    except KeyError:  # no refusal counted yet
        return 0.0


def test_refusals_are_counted_and_official_clients_still_work(server):
    before = rejected(server)
    send(server, "/v1/completions", BODY, "text/plain")
    assert rejected(server) == before + 1
    ids = server.state.tokenizer.encode("hi", True)
    openai = OpenAI(base_url=server.url + "/v1", api_key="unused")
    result = openai.completions.create(model="fake-model", prompt="hi", max_tokens=3, temperature=0)
    assert result.choices[0].text == expected_greedy_text(ids, 3)
    hf = InferenceClient(server.url)
    assert hf.text_generation("hi", max_new_tokens=3) == expected_greedy_text(ids, 3)
