"""Harmony outputs (gpt-oss) read into an OpenAI assistant message: analysis -> reasoning_content,
final -> content, commentary to=functions.NAME -> tool_calls; streamed in every split, the
deltas reassemble (as the openai client does) to the whole message; a length-cut call is none."""

from __future__ import annotations

import pytest

from server.chat.harmony import HarmonyOutputFormat

THINK = "<|channel|>analysis<|message|>User wants weather. Call it.<|end|>"
CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>'
)
ANSWER = "<|start|>assistant<|channel|>final<|message|>It is sunny <|in|> Paris.<|return|>"


def reassemble(deltas: list[dict]) -> dict:
    """What the openai client's stream helper builds: strings joined, calls merged by index."""
    message: dict = {"role": "assistant", "content": None}
    calls: dict[int, dict] = {}
    for d in deltas:
        for key in ("content", "reasoning_content"):
            if d.get(key):
                message[key] = (message.get(key) or "") + d[key]
        for c in d.get("tool_calls", ()):
            call = calls.setdefault(c["index"], {"function": {"name": "", "arguments": ""}})
            call.update({k: c[k] for k in ("id", "type") if k in c})
            call["function"]["name"] += c["function"].get("name", "")
            call["function"]["arguments"] += c["function"].get("arguments", "")
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def without_ids(message: dict) -> dict:
    calls = [{k: v for k, v in c.items() if k != "id"} for c in message.get("tool_calls", ())]
    return {**message, **({"tool_calls": calls} if calls else {})}


def streamed(text: str, size: int, reason: str) -> dict:
    stream = HarmonyOutputFormat().stream()
    deltas = [d for i in range(0, len(text), size) for d in stream.feed(text[i : i + size])]
    return reassemble(deltas + stream.finish(reason)), stream.made_calls


@pytest.mark.parametrize(
    ("text", "reason", "want"),
    [
        (THINK + ANSWER, "stop", {"role": "assistant", "content": "It is sunny <|in|> Paris.",
                                  "reasoning_content": "User wants weather. Call it."}),
        (THINK + CALL, "stop", {"role": "assistant", "content": None,
                                "reasoning_content": "User wants weather. Call it.",
                                "tool_calls": [{"type": "function", "function": {
                                    "name": "get_weather", "arguments": '{"city": "Paris"}'}}]}),
        (THINK + CALL[:-20], "length", {"role": "assistant", "content": None,
                                        "reasoning_content": "User wants weather. Call it."}),
        ("just text, no harmony", "stop", {"role": "assistant",
                                           "content": "just text, no harmony"}),
    ],
)  # fmt: skip
def test_message_and_every_split_of_its_stream(text, reason, want) -> None:
    message = HarmonyOutputFormat().message(text, reason)
    assert without_ids(message) == want
    for size in (1, 2, 3, 7, len(text)):
        got, made_calls = streamed(text, size, reason)
        assert without_ids(got) == want, size
        assert made_calls == ("tool_calls" in want)


def test_recipient_before_the_channel_and_calls_off() -> None:
    """The recipient may sit in the role part of the header; without parsed calls (tool_choice
    none) a call's body is plain content."""
    text = '<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{"a": 1}<|call|>'
    text = text.removeprefix("<|start|>assistant")
    message = HarmonyOutputFormat().message(text, "stop")
    assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert HarmonyOutputFormat(parses_calls=False).message(text, "stop") == {
        "role": "assistant",
        "content": '{"a": 1}',
    }
