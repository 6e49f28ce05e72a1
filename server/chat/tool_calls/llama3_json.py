"""Llama 3.x JSON tool calls: `{"name": ..., "parameters": {...}}`, several joined by `;`,
optionally after `<|python_tag|>`.

Contract (see server/chat/tool_calls/base.py): an output is calls when, after leading whitespace, it
starts with `<|python_tag|>` or `{` and its first object is a call; otherwise it is all content,
exactly as written. Text after the calls (past the last `;`-joined object) is content, without
the whitespace that touches the calls. `grammar()` writes calls as compact JSON objects joined
by `; `, without the tag (a plain `{` is what the models answer with after a tool prompt).
"""

from __future__ import annotations

from collections.abc import Sequence

from server.chat.tool_calls.base import (
    FunctionSpec,
    ToolParser,
    ToolStream,
    call_json,
    call_object,
    calls_rule,
)
from server.chat.tool_calls.call_sequence import CallSequence, read_sequence
from server.chat.tool_calls.events import ContentDelta, ParsedOutput, ToolCall, ToolEvent
from server.chat.tool_calls.holdback import WHITESPACE

TAG = "<|python_tag|>"


def _calls_start(text: str) -> str | None:
    """What follows the tag (or the `{` itself) when `text` opens like calls, else None."""
    head = text.lstrip(WHITESPACE)
    if head.startswith(TAG):
        return head[len(TAG) :]
    return head if head.startswith("{") else None


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    markers = (TAG,)

    def parse(self, text: str) -> ParsedOutput:
        body = _calls_start(text)
        if body is None:
            return ParsedOutput(text)
        calls, leftover = read_sequence(body, ";", None)
        if not calls:
            return ParsedOutput(text)
        return ParsedOutput(leftover.lstrip(WHITESPACE), tuple(calls))

    def stream(self) -> ToolStream:
        return _Llama3Stream()

    def render_calls(self, calls: Sequence[ToolCall]) -> str:
        return "; ".join(call_object(c, "parameters") for c in calls)

    def grammar(self, tools: Sequence[FunctionSpec], parallel: bool) -> str:
        start = calls_rule(parallel, '"; "')
        return f"{start}\ncall: {call_json(tools, args_key='parameters')}\n"


class _Llama3Stream(ToolStream):
    def __init__(self) -> None:
        self._raw = ""  # all text while it is undecided whether it holds calls
        self._mode = "lead"  # lead | calls | text
        self._calls = CallSequence(";", None, 0)
        self._decided = False  # a call has started: the raw text is no longer needed

    def feed(self, text: str) -> list[ToolEvent]:
        if self._mode == "text":
            return [ContentDelta(text)] if text else []
        if self._mode == "calls":
            if not self._decided:
                self._raw += text
            return self._after(self._calls.feed(text))
        self._raw += text
        head = self._raw.lstrip(WHITESPACE)
        if not head or (TAG.startswith(head) and head != TAG):
            return []  # could still open with the tag
        body = _calls_start(self._raw)
        if body is None:
            self._mode = "text"
            return [ContentDelta(self._raw)]
        self._mode = "calls"
        return self._after(self._calls.feed(body))

    def finish(self) -> list[ToolEvent]:
        if self._mode == "calls":
            return self._after(self._calls.finish())
        if self._mode == "lead" and self._raw:
            self._mode = "text"
            return [ContentDelta(self._raw)]
        return []

    def _after(self, events: list[ToolEvent]) -> list[ToolEvent]:
        """While undecided, the raw text too; once the sequence ends, its leftover as text."""
        self._decided = self._decided or bool(events)
        if not self._decided:
            if not self._calls.ended:
                return []  # hold everything: the first object may still not be a call
            self._mode = "text"
            return [ContentDelta(self._raw)]
        if not self._calls.ended:
            return events
        self._mode = "text"
        leftover = self._calls.leftover.lstrip(WHITESPACE)
        return events + ([ContentDelta(leftover)] if leftover else [])
