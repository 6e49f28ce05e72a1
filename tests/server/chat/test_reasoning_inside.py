"""Reasoning without an opening tag (`--reasoning-parser think_inside`, as Qwen3 and DeepSeek-R1
write it): everything before `</think>` is reasoning, on every chat route, whole and streamed.

Oracles: the scripted answer's own reasoning and text (the fake engine writes it byte by byte),
and for the splitter, the text before and after `</think>` as drawn.
"""

from __future__ import annotations

import anthropic
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.chat.reasoning import ReasoningParser
from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer

THOUGHT, ANSWER = "Two and two make four.", "The answer is 4."
TEXT = st.text(alphabet="ab .\n<>/", max_size=12).filter(lambda s: "</think>" not in s)


@settings(max_examples=60, deadline=None)
@given(thought=TEXT, answer=TEXT, opened=st.booleans(), cut=st.integers(0, 200))
def test_everything_before_the_close_tag_is_reasoning_streamed_alike(thought, answer, opened, cut):
    text = ("<think>" if opened else "") + thought + "</think>" + answer
    parser = ReasoningParser(starts_inside=True)
    reasoning, content = parser.parse(text)
    assert (reasoning, content) == (thought.strip(), answer.lstrip())
    stream = parser.stream()
    k = cut % (len(text) + 1)
    pieces = stream.feed(text[:k]) + stream.feed(text[k:]) + stream.finish()
    assert "".join(t for kind, t in pieces if kind == "reasoning") == reasoning
    assert "".join(t for kind, t in pieces if kind == "content") == content


@pytest.fixture(scope="module")
def live():
    engine = lambda: FakeEngine(  # noqa: E731
        max_model_len=4096, num_blocks=4096, script=lambda _: f"{THOUGHT}</think>\n\n{ANSWER}"
    )
    with LiveServer(engine, reasoning_parser="think_inside") as server:
        yield server


def test_every_chat_route_reads_the_reasoning(live):
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0)
    hi = [{"role": "user", "content": "hi"}]
    message = client.chat.completions.create(model="fake-model", messages=hi).choices[0].message
    assert (message.reasoning_content, message.content) == (THOUGHT, ANSWER)
    streamed = {"reasoning_content": "", "content": ""}
    for chunk in client.chat.completions.create(model="fake-model", messages=hi, stream=True):
        delta = chunk.choices[0].delta.model_dump()
        for key in streamed:
            streamed[key] += delta.get(key) or ""
    assert streamed == {"reasoning_content": THOUGHT, "content": ANSWER}
    response = client.responses.create(model="fake-model", input="hi")
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].content[0].text == THOUGHT and response.output_text == ANSWER
    claude = anthropic.Anthropic(base_url=live.url, api_key="x", max_retries=0)
    blocks = claude.messages.create(model="fake-model", max_tokens=200, messages=hi).content
    assert [(b.type, getattr(b, "thinking", None) or b.text) for b in blocks] == [
        ("thinking", THOUGHT),
        ("text", ANSWER),
    ]
