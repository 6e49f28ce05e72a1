"""The `fault` request field through HTTP (fake engine): refused with a 400 naming it unless the
server runs with --enable-fault-injection; when on, a faulted request fails mid-stream with an
error event in its API's shape (non-streamed: a 500) while its batch-mates finish normally.
The engine loop kill is tested in a subprocess (test_engine_death.py).
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from tests.server.fake_engine import BOS, FakeEngine, expected_greedy_text
from tests.server.live import LiveServer

FAIL_3 = {"fail_after_tokens": 3}


@pytest.fixture(scope="module")
def faulty():
    with LiveServer(lambda: FakeEngine(step_delay=0.01), enable_fault_injection=True) as live:
        yield live


def events(url: str, body: dict) -> list[str]:
    with httpx.stream("POST", url, json=body, timeout=30) as response:
        assert response.status_code == 200
        return [line for line in response.iter_lines() if line]


def test_the_fault_field_is_refused_by_name_when_the_flag_is_off():
    with LiveServer(FakeEngine) as live:
        for route, body in (
            ("/v1/completions", {"prompt": "hi", "fault": FAIL_3}),
            (
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "hi"}], "fault": {}},
            ),
        ):
            error = httpx.post(live.url + route, json=body).json()["error"]
            assert error["param"] == "fault" and "--enable-fault-injection" in error["message"]
        tgi = httpx.post(
            live.url + "/generate", json={"inputs": "hi", "parameters": {"fault": FAIL_3}}
        )
        assert tgi.status_code == 422 and "--enable-fault-injection" in tgi.json()["error"]


@pytest.mark.parametrize(
    "fault", [{}, {"fail_after_tokens": 0}, {**FAIL_3, "kill_engine_after_tokens": 1}, {"x": 1}]
)
def test_a_malformed_fault_is_a_400_naming_it(faulty, fault):
    response = httpx.post(faulty.url + "/v1/completions", json={"prompt": "hi", "fault": fault})
    assert response.status_code == 400 and response.json()["error"]["param"].startswith("fault")


def test_a_faulted_stream_ends_with_an_error_event_while_its_batch_mate_finishes(faulty):
    url = faulty.url + "/v1/completions"
    other: list[str] = []
    plain = {"prompt": "other", "max_tokens": 40, "temperature": 0, "stream": True}
    reader = threading.Thread(target=lambda: other.extend(events(url, plain)))
    reader.start()
    faulted = events(url, {**plain, "prompt": "faulted", "fault": FAIL_3})
    reader.join(30)
    assert faulted[-1] == "data: [DONE]"
    error = json.loads(faulted[-2][6:])["error"]
    assert error["code"] == "engine_error" and "after 3 generated token(s)" in error["message"]
    assert set(error) == {"message", "type", "param", "code"}
    chunks = [json.loads(e[6:]) for e in faulted[:-2]]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "error"
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert expected_greedy_text([BOS, *b"faulted"], 3).startswith(text)
    assert other[-1] == "data: [DONE]" and "error" not in "".join(other)
    chunks = [json.loads(e[6:]) for e in other[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected_greedy_text(
        [BOS, *b"other"], 40
    )
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_a_faulted_chat_stream_ends_with_an_error_event_then_done(faulty):
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "fault": FAIL_3}
    lines = events(faulty.url + "/v1/chat/completions", {**body, "max_tokens": 20})
    assert (
        lines[-1] == "data: [DONE]" and json.loads(lines[-2][6:])["error"]["code"] == "engine_error"
    )


def test_a_faulted_request_without_streaming_is_a_500_in_each_api_shape(faulty):
    openai = httpx.post(
        faulty.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 9, "fault": FAIL_3}
    )
    assert openai.status_code == 500 and openai.json()["error"]["code"] == "engine_error"
    tgi_body = {"inputs": "hi", "parameters": {"max_new_tokens": 9, "fault": FAIL_3}}
    tgi = httpx.post(faulty.url + "/generate", json=tgi_body)
    assert tgi.status_code == 500 and "after 3 generated token(s)" in tgi.json()["error"]
    lines = events(faulty.url + "/generate_stream", tgi_body)
    last = json.loads(lines[-1][6:])
    assert last["error_type"] == "generation" and "after 3" in last["error"]
    assert all("token" in json.loads(line[6:]) for line in lines[:-1])
    ok = httpx.post(faulty.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3})
    assert ok.status_code == 200  # the engine goes on
