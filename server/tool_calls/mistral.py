"""Mistral tool calls: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`.

Contract (see server/tool_calls/base.py): text before `[TOOL_CALLS]` is content; the marker
must be followed by a JSON list whose first object is a call, else the marker is content too and
reading goes on after it. Text after the list is content; whitespace touching the calls is not.
`[TOOL_CALLS]` is a special token, so the output must keep special tokens (`markers`).
`grammar()` writes `[TOOL_CALLS][{...}, {...}]`; the marker is named by its token id when the
tokenizer has it (`marker_ids`), since grammars match special tokens only that way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from server.tool_calls.base import (
    FunctionSpec,
    ToolParser,
    ToolStream,
    assemble,
    call_json,
    call_object,
    calls_rule,
)
from server.tool_calls.call_sequence import CallSequence, read_sequence
from server.tool_calls.events import ContentDelta, ParsedOutput, ToolCall, ToolEvent
from server.tool_calls.holdback import WHITESPACE, TextUntilTag

TAG = "[TOOL_CALLS]"


class MistralParser(ToolParser):
    name = "mistral"
    markers = (TAG,)

    def __init__(self, marker_ids: Mapping[str, int] | None = None) -> None:
        self._marker_ids = dict(marker_ids or {})

    def parse(self, text: str) -> ParsedOutput:
        pieces: list[tuple[str, str | ToolCall]] = []
        while (start := text.find(TAG)) >= 0:
            pieces.append(("text", text[:start]))
            head = text[start + len(TAG) :].lstrip(WHITESPACE)
            calls, leftover = ([], "")
            if head.startswith("["):
                calls, leftover = read_sequence(head[1:], ",", "]")
            if not calls:  # not a list of calls: the marker is text, reading goes on after it
                pieces.append(("text", TAG))
                text = text[start + len(TAG) :]
                continue
            pieces.extend(("call", call) for call in calls)
            text = leftover
        pieces.append(("text", text))
        return assemble(pieces)

    def stream(self) -> ToolStream:
        return _MistralStream()

    def render_calls(self, calls: Sequence[ToolCall]) -> str:
        return TAG + "[" + ", ".join(call_object(c) for c in calls) + "]"

    def grammar(self, tools: Sequence[FunctionSpec], parallel: bool) -> str:
        marker = f"<[{self._marker_ids[TAG]}]>" if TAG in self._marker_ids else f'"{TAG}"'
        start = f'start: {marker} "[" calls "]"'
        calls = calls_rule(parallel, '", "').replace("start:", "calls:")
        return f"{start}\n{calls}\ncall: {call_json(tools)}\n"


class _MistralStream(ToolStream):
    def __init__(self) -> None:
        self._text = TextUntilTag(TAG)
        self._buf = ""
        self._mode = "text"  # text | open (before the list's "[") | list
        self._ws_before = ""
        self._raw = ""  # text after the marker while it is undecided whether it holds calls
        self._decided = False
        self._calls = 0
        self._list = CallSequence(",", "]", 0)

    def feed(self, text: str) -> list[ToolEvent]:
        events: list[ToolEvent] = []
        self._buf += text
        while self._buf and self._step(events, final=False):
            pass
        return events

    def finish(self) -> list[ToolEvent]:
        events: list[ToolEvent] = []
        while self._step(events, final=True):
            pass
        return events

    def _step(self, events: list[ToolEvent], final: bool) -> bool:
        """One move of the state machine; False when it waits for more text (or is done)."""
        if self._mode == "text":
            content, ws_before, self._buf = self._text.read(self._buf, final)
            if content:
                events.append(ContentDelta(content))
            if ws_before is None:
                return False
            self._mode, self._ws_before, self._raw, self._decided = "open", ws_before, "", False
            return True
        if self._mode == "open":
            part, self._buf = self._buf, ""
            self._raw += part
            head = self._raw.lstrip(WHITESPACE)
            if not head:
                return self._fail(events) if final else False
            if head[0] != "[":
                return self._fail(events)
            self._mode, self._list = "list", CallSequence(",", "]", self._calls)
            return self._list_events(events, self._list.feed(head[1:]), final)
        part, self._buf = self._buf, ""
        if not self._decided:
            self._raw += part
        return self._list_events(events, self._list.feed(part), final)

    def _list_events(self, events: list[ToolEvent], new: list[ToolEvent], final: bool) -> bool:
        if final and not self._list.ended:
            new += self._list.finish()
        self._decided = self._decided or bool(new)
        events.extend(new)
        if not self._list.ended:
            return False
        if not self._decided:
            return self._fail(events)
        self._calls += self._list.calls
        self._mode, self._text.after_call = "text", True
        self._buf = self._list.leftover + self._buf
        return True

    def _fail(self, events: list[ToolEvent]) -> bool:
        """Not a list of calls: the marker is content; what followed it is read as text."""
        events.append(ContentDelta(self._ws_before + TAG))
        self._mode, self._buf = "text", self._raw + self._buf
        return True
