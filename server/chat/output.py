"""An assistant message read from the model's text: reasoning, content and tool calls.

Contract: a `ChatOutputFormat` says what to read out of a choice's text: a reasoning split
(server/chat/reasoning.py) and/or tool calls (a parser of server/chat/tool_calls/), applied in that order
(calls are read from the answer, never from the reasoning). `message(text)` is the whole
message: `content` (None when no answer text was written), `reasoning_content`
when the output reasoned, and `tool_calls` as OpenAI shows them (`{id, type: "function",
function: {name, arguments}}`). `stream()` gives a `MessageStream` whose `feed(text)` /
`finish()` return OpenAI chat deltas in output order (after a first delta of role and null
content: `first_delta`): `reasoning_content` and `content`
fragments, a call's `{index, id, type, function: {name, arguments: ""}}` before any of its
`{index, function: {arguments}}` fragments. Reassembled as the openai client does (strings
concatenated, tool_calls merged by index), they equal `message` of the whole text, ids aside.
`finish_reason(reason, made_calls)` is "tool_calls" for an output that ended normally with calls.
A call cut by the length limit is never a call: `message(text, "length")` has no tool_calls and the
whole answer text as content, and the stream holds calls back from the first one until `finish`
knows how the output ended (then it sends them, or the answer's remaining raw text as content).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from server.chat.reasoning import ReasoningParser
from server.chat.tool_calls import (
    ArgumentsDelta,
    CallStarted,
    ContentDelta,
    ToolEvent,
    ToolParser,
)

Delta = dict[str, Any]


def first_delta(fmt: ChatOutputFormat) -> Delta:
    """The role chunk: content starts null when the text may hold no answer (calls only)."""
    return {"role": "assistant", "content": "" if fmt.plain else None}


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def finish_reason(reason: str | None, made_calls: bool) -> str | None:
    return "tool_calls" if made_calls and reason == "stop" else reason


@dataclass(frozen=True)
class ChatOutputFormat:
    tools: ToolParser | None = None
    reasoning: ReasoningParser | None = None

    @property
    def plain(self) -> bool:
        return self.tools is None and self.reasoning is None

    @property
    def keeps_special_tokens(self) -> bool:
        """The output is read from special tokens, so its text must keep them."""
        return bool(self.tools and self.tools.markers)

    def message(self, text: str, finish_reason: str | None = None) -> dict[str, Any]:
        reasoning, content = (None, text)
        if self.reasoning is not None:
            reasoning, content = self.reasoning.parse(text)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            message["reasoning_content"] = reasoning
        if self.tools is not None and finish_reason != "length":
            parsed = self.tools.parse(content)
            calls = [
                {
                    "id": call_id(),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in parsed.calls
            ]
            message["content"] = parsed.content
            if calls:
                message["tool_calls"] = calls
        message["content"] = message["content"] or None  # as the stream's null first delta
        return message

    def stream(self) -> MessageStream:
        return MessageStream(self)


class MessageStream:
    def __init__(self, fmt: ChatOutputFormat) -> None:
        self._reasoning = fmt.reasoning.stream() if fmt.reasoning is not None else None
        self._tools = fmt.tools.stream() if fmt.tools is not None else None
        self.made_calls = False
        self._answer_text = ""  # the answer as written (after any reasoning)
        self._content_sent = 0  # characters of content deltas sent
        self._held: list[Delta] | None = None  # deltas from the first call on, until the end

    def feed(self, text: str) -> list[Delta]:
        if self._reasoning is None:
            return self._answer(text, final=False)
        return self._split(self._reasoning.feed(text), final=False)

    def finish(self, finish_reason: str | None = None) -> list[Delta]:
        """The last deltas. Calls are held from the first one on until here: when the output
        was cut by the length limit they are never sent, the rest of the answer's raw text is
        (as `message` of a cut output has no calls and the whole answer as content)."""
        if self._reasoning is None:
            deltas = self._answer("", final=True)
        else:
            deltas = self._split(self._reasoning.finish(), final=True)
        if self._held is None:
            return deltas
        if finish_reason == "length":
            self.made_calls = False
            rest = self._answer_text[self._content_sent :]
            return merge_deltas([d for d in deltas if "tool_calls" not in d] + [{"content": rest}])
        return merge_deltas(deltas + self._held)

    def _split(self, pieces: list[tuple[str, str]], final: bool) -> list[Delta]:
        deltas: list[Delta] = []
        answer = ""
        for kind, text in pieces:
            if kind == "reasoning":
                deltas.append({"reasoning_content": text})
            else:
                answer += text
        deltas.extend(self._answer(answer, final))
        return merge_deltas(deltas)

    def _answer(self, text: str, final: bool) -> list[Delta]:
        if self._tools is None:
            return [{"content": text}] if text else []
        self._answer_text += text
        events: list[ToolEvent] = self._tools.feed(text) if text else []
        if final:
            events += self._tools.finish()
        self.made_calls |= any(isinstance(event, CallStarted) for event in events)
        return self._hold_calls([event_delta(event) for event in events])

    def _hold_calls(self, deltas: list[Delta]) -> list[Delta]:
        """Deltas before the first call go out; from it on they wait for `finish`."""
        if self._held is None:
            first = next((i for i, d in enumerate(deltas) if "tool_calls" in d), len(deltas))
            sent, deltas = deltas[:first], deltas[first:]
            self._content_sent += sum(len(d.get("content", "")) for d in sent)
            if deltas:
                self._held = deltas
            return merge_deltas(sent)
        self._held += deltas
        return []


def event_delta(event: ToolEvent) -> Delta:
    """A parser's event as its chat delta: content, a call's header, or an arguments piece."""
    if isinstance(event, ContentDelta):
        return {"content": event.text}
    if isinstance(event, CallStarted):
        call = {"index": event.index, "id": call_id(), "type": "function"}
        return {"tool_calls": [{**call, "function": {"name": event.name, "arguments": ""}}]}
    assert isinstance(event, ArgumentsDelta)  # the last kind of ToolEvent
    return {"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]}


def merge_deltas(deltas: list[Delta]) -> list[Delta]:
    """Neighbouring deltas of one kind joined (fewer chunks); a call's header stays alone."""
    out: list[Delta] = []
    for delta in deltas:
        prev = out[-1] if out else None
        if prev is not None and prev.keys() == delta.keys() and _joinable(prev, delta):
            out[-1] = _join(prev, delta)
        else:
            out.append(delta)
    return out


def _joinable(a: Delta, b: Delta) -> bool:
    if "tool_calls" not in a:
        return True
    x, y = a["tool_calls"][0], b["tool_calls"][0]
    return "id" not in x and "id" not in y and x["index"] == y["index"]


def _join(a: Delta, b: Delta) -> Delta:
    if "tool_calls" not in a:
        (key,) = a.keys()
        return {key: a[key] + b[key]}
    x, y = a["tool_calls"][0], b["tool_calls"][0]
    arguments = x["function"]["arguments"] + y["function"]["arguments"]
    return {"tool_calls": [{"index": x["index"], "function": {"arguments": arguments}}]}
