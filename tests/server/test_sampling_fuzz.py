"""Every numeric sampling field of every generation route, at its edges, beside an innocent
greedy stream (issue 39, item 1): one client's parameters never hurt another client.

Against a live server on the real engine (the tiny random Llama with its trained tokenizer),
hypothesis draws a generation route (OpenAI completions and chat, TGI, Anthropic Messages,
OpenAI Responses), one of its numeric fields (read from the route's request model, so a
new field is fuzzed without editing this file, plus a logit_bias value), and a value from the
edges as raw JSON text: 0, -1, tiny (1e-300, 5e-324, 1e-38), huge (1e308, 1e400 which JSON
parsers read as inf, 2**63, 2**64), and the NaN / Infinity literals Python's JSON reader
accepts; sometimes with beam search or streaming. The draw and an innocent greedy stream are
sent at once. Properties: the draw gets a 200 that did not end in "error", or a 4xx naming the
field; the innocent's text equals its solo run; /health answers 200 afterwards.
Bounded in CI (tests/property_budget.py); TGSERVE_FUZZ_EXAMPLES=500 TGSERVE_FUZZ_RANDOM=1 is the
longer mode (README, Reliability suite).
"""

from __future__ import annotations

import json
import os
import types
import typing
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from server.anthropic.protocol import MessagesRequest
from server.openai.protocol import ChatCompletionRequest, CompletionRequest
from server.responses.protocol import ResponsesRequest
from server.tgi.protocol import TgiParameters
from tests.property_budget import examples
from tests.server.live import LiveServer

EXAMPLES = int(os.environ.get("TGSERVE_FUZZ_EXAMPLES", str(examples(local=60, ci=12))))
RANDOM = os.environ.get("TGSERVE_FUZZ_RANDOM") == "1"
EDGES = [
    "0", "-1", "1", "2", "0.5", "1e-300", "5e-324", "1e-40", "1e-38", "1e-5", "100", "101",
    "1000", "1e308", "-1e308", "1e400", "-1e400", str(2**31), str(2**63), str(2**64), str(-(2**63)),
    "NaN", "Infinity", "-Infinity",
]  # fmt: skip
INNOCENT = {"prompt": "Hello world", "max_tokens": 12, "temperature": 0, "ignore_eos": True}


def numeric_fields(model: type) -> list[str]:
    """The fields of a pydantic request model typed int or float (optionally None)."""
    names = []
    for name, info in model.model_fields.items():
        hint = info.annotation
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        if {a for a in args if a is not type(None)} & {int, float}:
            names.append(name)
    return names


ROUTES = {
    "/v1/completions": numeric_fields(CompletionRequest) + ["logit_bias"],
    "/v1/chat/completions": numeric_fields(ChatCompletionRequest) + ["logit_bias"],
    "/generate": numeric_fields(TgiParameters),
    "/v1/messages": numeric_fields(MessagesRequest),
    "/v1/responses": numeric_fields(ResponsesRequest),
}
OPENAI = ("/v1/completions", "/v1/chat/completions")  # beam search: their extension


def test_the_fuzzed_fields_are_the_sampling_ones():
    """A guard on the discovery above: it finds the fields the issue names."""
    for route in ("/v1/completions", "/v1/chat/completions"):
        assert {"temperature", "top_k", "top_p", "repetition_penalty", "length_penalty"} <= set(
            ROUTES[route]
        )
    assert {"temperature", "top_k", "top_p", "repetition_penalty"} <= set(ROUTES["/generate"])
    assert {"max_tokens", "temperature", "top_k", "top_p"} <= set(ROUTES["/v1/messages"])
    assert {"max_output_tokens", "temperature", "top_p"} <= set(ROUTES["/v1/responses"])


def tiny_engine(folder):
    """The engine the live server runs: room for 16 rows, so draw and innocent share steps."""
    from engine import Engine, EngineConfig  # torch: only once the fixture runs

    config = EngineConfig(dtype="float32", kv_cache_memory_bytes=8_000_000, max_num_seqs=16)
    return Engine.from_model(str(folder), config)


@pytest.fixture(scope="module")
def live(tiny_model_folder):
    with LiveServer(partial(tiny_engine, tiny_model_folder), admission_limit=64) as server:
        server.client = httpx.Client(base_url=server.url, timeout=120)
        yield server
        server.client.close()


def stream_text(client: httpx.Client, body: dict) -> tuple[str, str | None]:
    """A streamed completion's whole text and finish reason."""
    text, finish = "", None
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choice = json.loads(line[6:])["choices"][0]
                text += choice["text"]
                finish = choice["finish_reason"] or finish
    return text, finish


@pytest.fixture(scope="module")
def innocent_solo(live):
    return stream_text(live.client, INNOCENT)


def draw_body(route: str, field: str, raw: str, beam: bool, stream: bool) -> str:
    """The draw's JSON text: `raw` is spliced in as written (NaN, 1e400, 2**64 stay so)."""
    mark = "__value__"
    value: object = {"5": mark} if field == "logit_bias" else mark
    if route == "/generate":
        params = {"max_new_tokens": 4, "do_sample": True, field: value}
        body: dict = {"inputs": "Once upon a time", "parameters": params}
    elif route == "/v1/responses":
        body = {"input": "Once upon a time", "max_output_tokens": 4, field: value, "stream": stream}
    elif route == "/v1/messages":
        text = [{"role": "user", "content": "Once upon a time"}]
        body = {"messages": text, "max_tokens": 4, field: value, "stream": stream}
    else:
        body = {"max_tokens": 4, field: value}
        if route == "/v1/completions":
            body["prompt"] = "Once upon a time"
        else:
            body["messages"] = [{"role": "user", "content": "Once upon a time"}]
        if beam:
            body.update(use_beam_search=True, best_of=2)
        if stream:
            body["stream"] = True
    return json.dumps(body).replace(f'"{mark}"', raw)


def check_draw(response: httpx.Response, route: str, field: str, beam: bool, stream: bool) -> None:
    """200 without an "error" finish, or a 4xx naming the drawn field (or, for a combination
    the draw made invalid, a field it set with it: beam search's, stream)."""
    if response.status_code == 200:
        if route not in (*OPENAI, "/generate"):  # whole: an engine error would be a 500
            assert not stream or "engine_error" not in response.text, response.text
            assert not stream or "event: error" not in response.text, response.text
            return
        if stream:
            assert '"finish_reason": "error"' not in response.text.replace('":"', '": "')
        else:
            body = response.json()
            reasons = (
                [body["details"]["finish_reason"]]
                if route == "/generate" and body.get("details")
                else [c["finish_reason"] for c in body.get("choices", [])]
            )
            assert "error" not in reasons, body
        return
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    error = response.json()["error"]
    if route == "/generate":
        assert field in error, error  # TGI's body: {"error": message, "error_type"}
    elif route == "/v1/messages":
        assert field in error["message"], error  # Anthropic's: {"type", "message"}
    else:
        named = error.get("param")
        also = ({"best_of", "use_beam_search", "n"} if beam else set()) | (
            {"stream", "best_of", "n"} if stream else set()
        )
        assert named == field or named in also, error


PAIRS = [(route, field) for route, fields in sorted(ROUTES.items()) for field in fields]
COMPLETIONS = "/v1/completions"


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not RANDOM,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    pair=st.sampled_from(PAIRS),
    raw=st.sampled_from(EDGES),
    beam=st.booleans(),
    stream=st.booleans(),
)
# The repros (each failed the innocent's stream before): always run.
@example(pair=(COMPLETIONS, "top_k"), raw=str(2**63), beam=False, stream=False)
@example(pair=(COMPLETIONS, "temperature"), raw="1e-300", beam=False, stream=True)
@example(pair=(COMPLETIONS, "top_p"), raw="1e-300", beam=False, stream=False)
@example(pair=(COMPLETIONS, "repetition_penalty"), raw="1e-40", beam=False, stream=False)
@example(pair=(COMPLETIONS, "length_penalty"), raw="1000", beam=True, stream=False)
@example(pair=(COMPLETIONS, "length_penalty"), raw="-1e308", beam=True, stream=False)
@example(pair=(COMPLETIONS, "length_penalty"), raw="NaN", beam=True, stream=False)
@example(pair=("/generate", "top_k"), raw=str(2**64), beam=False, stream=False)
@example(pair=("/v1/messages", "top_k"), raw=str(2**63), beam=False, stream=True)
@example(pair=("/v1/responses", "top_p"), raw="1e-300", beam=False, stream=False)
def test_edge_values_never_hurt_an_innocent_stream(live, innocent_solo, pair, raw, beam, stream):
    route, field = pair
    beam = beam and route in OPENAI
    stream = stream and route != "/generate"
    content = draw_body(route, field, raw, beam, stream)
    headers = {"content-type": "application/json"}
    with ThreadPoolExecutor(2) as pool:
        innocent = pool.submit(stream_text, live.client, INNOCENT)
        draw = pool.submit(live.client.post, route, content=content, headers=headers)
        check_draw(draw.result(), route, field, beam, stream)
        assert innocent.result() == innocent_solo
    assert live.client.get("/health").status_code == 200
