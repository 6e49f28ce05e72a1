"""Reasoning split and whole chat messages: streamed in any split, reassembled the way the
official openai client reassembles a stream, they equal the message read from the whole text.

Oracles: the reasoning split of a drawn `<think>` output is the drawn reasoning and answer; the
reassembly is openai's own `ChatCompletionStreamState`, fed the chunks the route would send.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from server.chat.output import ChatOutputFormat, finish_reason, first_delta
from server.chat.reasoning import ReasoningParser, prompt_opens_reasoning, uses_reasoning
from server.chat.tool_calls import make_parser
from tests.server.chat.tool_calls.outputs import PROSE, calls, fragment_text, split_at

WORDS = st.text(alphabet="ab \n<>/thinké", max_size=20)


def streamed_reasoning(parser: ReasoningParser, chunks: list[str]) -> tuple[str, str]:
    stream = parser.stream()
    pieces = [p for chunk in chunks for p in stream.feed(chunk)] + stream.finish()
    return (
        "".join(t for kind, t in pieces if kind == "reasoning"),
        "".join(t for kind, t in pieces if kind == "content"),
    )


@settings(max_examples=80, deadline=None)
@given(reasoning=PROSE, answer=PROSE, lead=st.sampled_from(["", " ", "\n"]))
def test_think_block_is_split_from_the_answer(reasoning, answer, lead):
    text = f"{lead}<think>{reasoning}</think>{answer}"
    assert ReasoningParser().parse(text) == (reasoning.strip(), answer.lstrip())
    assert ReasoningParser(starts_inside=True).parse(f"{reasoning}</think>{answer}") == (
        reasoning.strip(),
        answer.lstrip(),
    )


@pytest.mark.parametrize("inside", [False, True])
@settings(max_examples=120, deadline=None)
@given(text=WORDS, cuts=st.lists(st.integers(0, 1000), max_size=6))
def test_reasoning_streamed_in_any_split_equals_the_whole_split(inside, text, cuts):
    parser = ReasoningParser(inside)
    reasoning, content = parser.parse(text)
    whole = (reasoning or "", content)
    assert streamed_reasoning(parser, list(text)) == whole
    assert streamed_reasoning(parser, split_at(text, cuts)) == whole
    for k in range(len(text) + 1):
        assert streamed_reasoning(parser, [text[:k], text[k:]]) == whole


def test_reasoning_detection_from_template_and_prompt():
    assert uses_reasoning("{% if x %}<think>{{ r }}</think>{% endif %}")
    assert not uses_reasoning("<|im_start|>assistant\n")
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")


def reassembled(fmt: ChatOutputFormat, chunks: list[str], reason: str) -> dict:
    """What the openai client's stream helper makes of the chunks the route sends."""
    state = ChatCompletionStreamState()
    stream = fmt.stream()

    def send(deltas: list[dict], finish: str | None) -> None:
        for i, delta in enumerate(deltas):
            last = i == len(deltas) - 1
            chunk = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": "m",
                "choices": [
                    {"index": 0, "delta": delta, "finish_reason": finish if last else None}
                ],
            }
            state.handle_chunk(ChatCompletionChunk.model_validate(chunk))

    send([first_delta(fmt)], None)
    for text in chunks:
        send(stream.feed(text), None)
    send(stream.finish(reason) or [{}], finish_reason(reason, stream.made_calls))
    # the client's final completion refuses a length finish; its snapshot is the same message
    done = state.get_final_completion() if reason != "length" else state.current_completion_snapshot
    choice = done.choices[0]
    message = choice.message.model_dump(exclude_none=True, exclude={"parsed"})
    for call in message.get("tool_calls", []):
        call.pop("id")
        call.pop("index")  # the client keeps the stream's index; a message has none
    return {"message": message, "finish_reason": choice.finish_reason}


def whole(fmt: ChatOutputFormat, text: str, reason: str = "stop") -> dict:
    message = {k: v for k, v in fmt.message(text, reason).items() if v is not None}
    for call in message.get("tool_calls", []):
        call.pop("id")
    made_calls = bool(message.get("tool_calls"))
    return {"message": message, "finish_reason": finish_reason(reason, made_calls)}


def each_format(max_examples: int):
    """A property test over every call format, with and without reasoning, given a drawn
    output (`data`) and cut points (`cuts`); it receives the parser and the output format."""

    def wrap(test):
        @pytest.mark.parametrize("name", ["hermes", "llama3_json", "mistral"])
        @pytest.mark.parametrize("reasoning", [False, True])
        @settings(max_examples=max_examples, deadline=None)
        @given(data=st.data(), cuts=st.lists(st.integers(0, 10_000), max_size=10))
        def run(name, reasoning, data, cuts):
            parser = make_parser(name)
            fmt = ChatOutputFormat(parser, ReasoningParser() if reasoning else None)
            test(name, parser, fmt, reasoning, data, cuts)

        run.__name__ = test.__name__
        return run

    return wrap


@each_format(max_examples=40)
def test_streamed_message_reassembled_by_openai_equals_the_whole_message(
    name, parser, fmt, reasoning, data, cuts
):
    answer = data.draw(
        st.one_of(
            fragment_text(name),
            calls().map(lambda pairs: parser.render_calls([c for c, _ in pairs])),
        )
    )
    think = f"<think>{data.draw(PROSE)}</think>\n" if reasoning else ""
    text = data.draw(PROSE) + think + answer if not reasoning else think + answer
    expected = whole(fmt, text)
    assert reassembled(fmt, split_at(text, cuts), "stop") == expected
    assert reassembled(fmt, list(text), "stop") == expected


@each_format(max_examples=30)
def test_calls_cut_by_the_length_limit_are_raw_content_streamed_and_whole(
    name, parser, fmt, reasoning, data, cuts
):
    # Oracle: the answer as the model wrote it (after the think block), cut anywhere.
    calls_text = data.draw(calls().map(lambda pairs: parser.render_calls([c for c, _ in pairs])))
    answer = data.draw(PROSE) + "\n" + calls_text
    answer = answer[: data.draw(st.integers(0, len(answer)))]
    thought = data.draw(PROSE).strip()
    text = f"<think>{thought}</think>\n{answer}" if reasoning else answer
    message = {"role": "assistant"}
    content = answer.lstrip() if reasoning else answer
    if content:
        message["content"] = content
    if reasoning and thought:
        message["reasoning_content"] = thought
    expected = {"message": message, "finish_reason": "length"}
    assert whole(fmt, text, "length") == expected
    assert reassembled(fmt, split_at(text, cuts), "length") == expected
    assert reassembled(fmt, list(text), "length") == expected


def test_a_message_with_calls_and_no_text_has_null_content_and_finishes_with_tool_calls():
    parser = make_parser("hermes")
    text = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    message = ChatOutputFormat(parser).message(text)
    assert message["content"] is None
    assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"x": 1}'}
    assert message["tool_calls"][0]["id"].startswith("call_")
    assert finish_reason("stop", True) == "tool_calls"
    assert finish_reason("length", True) == "length"  # a cut-off call says it was cut off
