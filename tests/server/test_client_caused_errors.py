"""No 500 for what a client causes, and small things a client meets: a structured-output value
over 1 MiB is a 400 naming its field (TGI: 422), JSON text nested past Python's parser (~1000
levels) is a 400 naming its field, a client that disconnects while sending its body is an info
line (no 500, no error counted), HEAD / answers, a tool_choice naming no tool gets a bounded
message, and serving every interface without a key is warned about.

Oracles: the status codes and fields the API contract names; /metrics' own counters; the
message length bound a client can read (1 KB).
"""

from __future__ import annotations

import logging
import socket
import sys
import time

import httpx
import pytest

from server.engine_params import MAX_JSON_DEPTH, nests_too_deeply
from server.serve import exposure_warning
from server.settings import Settings
from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer, metric

MIB = 1 << 20
DEEP_OBJECT = '{"a":' * 1500 + "1" + "}" * 1500
DEEP_LIST = "[" * 5000 + "]" * 5000


@pytest.fixture(scope="module")
def server():
    with LiveServer(lambda: FakeEngine(max_model_len=4096)) as live:
        yield live


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("guided_regex", "a" * MIB + "b"),
        ("guided_grammar", 'start: "' + "a" * MIB + '"'),
        ("guided_choice", ["a" * (MIB // 2), "b" * (MIB // 2)]),
    ],
    ids=["guided_regex", "guided_grammar", "guided_choice"],
)
def test_a_structured_output_over_a_mebibyte_is_a_400_naming_its_field(server, field, value):
    answer = _post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2, field: value})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == field


def test_a_tgi_grammar_over_a_mebibyte_is_a_422(server):
    grammar = {"type": "regex", "value": "a" * MIB + "b"}
    answer = _post(server, "/generate", {"inputs": "hi", "parameters": {"grammar": grammar}})
    assert answer.status_code == 422 and "grammar" in answer.json()["error"]


@pytest.mark.parametrize("text", [DEEP_OBJECT, DEEP_LIST], ids=["object", "list"])
def test_json_text_nested_past_the_parser_is_a_400_naming_its_field(server, text):
    answer = _post(server, "/v1/completions", {"prompt": "hi", "guided_json": text})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "guided_json"
    tgi = {"inputs": "hi", "parameters": {"grammar": {"type": "json", "value": text}}}
    assert _post(server, "/generate", tgi).status_code == 422


def test_the_depth_bound_holds_whatever_the_interpreters_recursion_limit(server):
    """Another library raising the process's recursion limit (the whole suite's run did) once let
    1,500 levels parse and compile: the bound is tgserve's own."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)
    try:
        answer = _post(server, "/v1/completions", {"prompt": "hi", "guided_json": DEEP_OBJECT})
    finally:
        sys.setrecursionlimit(limit)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "guided_json"


@pytest.mark.parametrize(
    ("text", "deep"),
    [
        ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), True),
        ("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH, False),
        ('{"a": "' + "[" * 2000 + '"}', False),  # brackets inside a string nest nothing
        ('{"a": "\\"' + "[" * 600 + '", "b": 1}', False),  # an escaped quote stays in the string
        ("[" * 300 + "{}" * 400 + "]" * 300, False),  # many brackets, shallow
    ],
)
def test_nesting_depth_counts_only_the_brackets_outside_strings(text, deep):
    assert nests_too_deeply(text) is deep


def test_a_client_gone_while_sending_its_body_is_an_info_line_not_an_error(server, caplog):
    def count(status: str) -> float:
        labels = {"method": "POST", "route": "/v1/completions", "status": status}
        try:
            return metric(
                httpx.get(server.url + "/metrics").text, "tgserve_http_requests_total", labels
            )
        except KeyError:
            return 0.0

    before = count("500")
    with caplog.at_level(logging.INFO, logger="server.errors"):
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 1000\r\n\r\n{"prompt": "hi'
            )
            time.sleep(0.3)
        deadline = time.monotonic() + 10
        while "client disconnected" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
    assert "client disconnected" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert count("500") == before
    assert _post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2}).status_code == 200


def test_head_of_the_playground_answers(server):
    assert httpx.head(server.url + "/").status_code == 200


def test_a_tool_choice_naming_no_tool_gets_a_bounded_message(server):
    tools = [
        {"type": "function", "function": {"name": f"function_number_{i}", "parameters": {}}}
        for i in range(1000)
    ]
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "x" * 5000}},
    }
    answer = _post(server, "/v1/chat/completions", body)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "tool_choice"
    assert len(answer.json()["error"]["message"]) < 1024


def test_serving_every_interface_without_a_key_is_warned_about():
    assert "without an API key" in exposure_warning(Settings(host="0.0.0.0"))
    assert "without an API key" in exposure_warning(Settings(host="::"))
    assert exposure_warning(Settings(host="0.0.0.0", api_key=("k",))) is None
    assert exposure_warning(Settings(host="127.0.0.1")) is None
