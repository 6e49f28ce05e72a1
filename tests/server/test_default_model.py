"""The default model (SmolLM2-135M-Instruct) behind the HTTP API answers as the model should.

Oracle: MODELS.md records that SmolLM2 answers greedy ChatML "What is the capital of France?"
with "The capital of France is Paris." (checked with transformers); streamed and non-streamed
answers must agree and end with one finish_reason, then [DONE]. Structured outputs: the official
`openai` client's `parse` returns an object that its own pydantic model validates.
"""

from __future__ import annotations

import json

import httpx
import openai
import pydantic
import pytest

from engine import Engine, EngineConfig
from tests.server.live import LiveServer

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server():
    config = EngineConfig(kv_cache_memory_bytes=64 * 1024**2, max_model_len=2048)
    with LiveServer(lambda: Engine.from_model(None, config), admission_limit=8) as live:
        yield live


def test_default_model_answers_the_capital_question_streamed_and_not(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    answer = client.chat.completions.create(
        model=client.models.list().data[0].id, messages=QUESTION, temperature=0, max_tokens=30
    )
    assert answer.choices[0].message.content == "The capital of France is Paris."
    assert answer.choices[0].finish_reason == "stop"  # <|im_end|> ended it
    body = {"messages": QUESTION, "temperature": 0, "max_tokens": 30, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as r:
        events = [e[len("data: ") :] for e in r.read().decode().split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
    assert (
        "".join(c["delta"].get("content", "") for c in chunks) == answer.choices[0].message.content
    )
    assert [c["finish_reason"] for c in chunks if c["finish_reason"]] == ["stop"]


class City(pydantic.BaseModel):
    name: str
    country: str


def test_openai_client_parse_returns_a_validated_object(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    completion = client.chat.completions.parse(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": "Name the capital of France and its country."}],
        response_format=City,
        temperature=0,
        max_tokens=60,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"  # the grammar closed the object within the budget
    assert isinstance(choice.message.parsed, City)
    assert City.model_validate_json(choice.message.content) == choice.message.parsed
