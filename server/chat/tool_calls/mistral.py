"""Mistral tool calls: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]` (the JSON-list
form), or `[TOOL_CALLS]name[ARGS]{...}` once per call (the named form of v11+ tokenizers, see
mistral_named.py).

Contract (see server/chat/tool_calls/base.py): text before `[TOOL_CALLS]` is content; the marker
must be followed by a JSON list whose first object is a call, or by a named call, else the
marker is content too and reading goes on after it. Text after the calls is content; whitespace
touching the calls is not. Both forms are read whatever the model's template teaches. The
markers are special tokens, so the output must keep special tokens (`markers`).
`grammar()` and `render_calls()` write the form the template teaches (`named`):
`[TOOL_CALLS][{...}, {...}]` or `[TOOL_CALLS]f[ARGS]{...}[TOOL_CALLS]g[ARGS]{...}`; a marker is
named by its token id when the tokenizer has it (`marker_ids`), since grammars match special
tokens only that way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from server.chat.tool_calls.base import (
    FunctionSpec,
    ToolParser,
    ToolStream,
    args_json,
    assemble,
    call_json,
    call_object,
    calls_rule,
)
from server.chat.tool_calls.call_sequence import CallSequence, read_sequence
from server.chat.tool_calls.events import ContentDelta, ParsedOutput, ToolCall, ToolEvent
from server.chat.tool_calls.holdback import WHITESPACE, TextUntilTag
from server.chat.tool_calls.mistral_named import ARGS, CALL_ID, NamedCall, read_named_call

TAG = "[TOOL_CALLS]"


class MistralParser(ToolParser):
    name = "mistral"
    markers = (TAG, ARGS, CALL_ID)

    def __init__(self, marker_ids: Mapping[str, int] | None = None, named: bool = False) -> None:
        self._marker_ids = dict(marker_ids or {})
        self.named = named

    def parse(self, text: str) -> ParsedOutput:
        pieces: list[tuple[str, str | ToolCall]] = []
        while (start := text.find(TAG)) >= 0:
            pieces.append(("text", text[:start]))
            head = text[start + len(TAG) :].lstrip(WHITESPACE)
            calls, leftover = ([], "")
            if head.startswith("["):
                calls, leftover = read_sequence(head[1:], ",", "]")
            elif (named := read_named_call(head)) is not None:
                calls, leftover = [named[0]], named[1]
            if not calls:  # not a call: the marker is text, reading goes on after it
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
        if self.named:
            return "".join(f"{TAG}{c.name}{ARGS}{c.arguments}" for c in calls)
        return TAG + "[" + ", ".join(call_object(c) for c in calls) + "]"

    def grammar(self, tools: Sequence[FunctionSpec], parallel: bool) -> str:
        marker, args = self._marker(TAG), self._marker(ARGS)
        if self.named:
            names = [json.dumps(tool.name) for tool in tools]
            options = " | ".join(f"{name} {args} args{i}" for i, name in enumerate(names))
            rules = "\n".join(f"args{i}: {args_json(tool)}" for i, tool in enumerate(tools))
            start = "start: call+" if parallel else "start: call"
            return f"{start}\ncall: {marker} ({options})\n{rules}\n"
        start = f'start: {marker} "[" calls "]"'
        calls = calls_rule(parallel, '", "').replace("start:", "calls:")
        return f"{start}\n{calls}\ncall: {call_json(tools)}\n"

    def _marker(self, text: str) -> str:
        """A marker in a Lark grammar: its special token, or the text when it is not one."""
        return f"<[{self._marker_ids[text]}]>" if text in self._marker_ids else json.dumps(text)


class _MistralStream(ToolStream):
    def __init__(self) -> None:
        self._text = TextUntilTag(TAG)
        self._buf = ""
        self._mode = "text"  # text | open (after the marker) | calls
        self._ws_before = ""
        self._raw = ""  # text after the marker while it is undecided whether it holds calls
        self._decided = False
        self._calls = 0
        self._reader: CallSequence | NamedCall = CallSequence(",", "]", 0)

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
            self._mode = "calls"
            if head[0] == "[":
                self._reader = CallSequence(",", "]", self._calls)
                return self._call_events(events, self._reader.feed(head[1:]), final)
            self._reader = NamedCall(self._calls)
            return self._call_events(events, self._reader.feed(head), final)
        part, self._buf = self._buf, ""
        if not self._decided:
            self._raw += part
        return self._call_events(events, self._reader.feed(part), final)

    def _call_events(self, events: list[ToolEvent], new: list[ToolEvent], final: bool) -> bool:
        reader = self._reader
        if final and not reader.ended:
            new += reader.finish()
        self._decided = self._decided or bool(new)
        events.extend(new)
        if not reader.ended:
            return False
        if not self._decided:
            return self._fail(events)
        self._calls += reader.calls
        self._mode, self._text.after_call = "text", True
        self._buf = reader.leftover + self._buf
        return True

    def _fail(self, events: list[ToolEvent]) -> bool:
        """No call after the marker: it is content; what followed it is read as text."""
        events.append(ContentDelta(self._ws_before + TAG))
        self._mode, self._buf = "text", self._raw + self._buf
        return True
