"""Hermes / Qwen tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Contract (shared by every parser, see server/chat/tool_calls/base.py): `parse(text)` is the whole
output's content and calls; `stream()` reads the same text in any split and its events fold to
the same result. A block whose body is not a JSON object with a string `name` is content,
tags included; an unclosed block at the end (a truncated output) still counts as a call once
its name is complete, with the arguments written so far. Whitespace between a call and the text
around it is not content. `grammar()` (enforcing `required` / a named function) writes the
calls as `<tool_call>\\n{json}\\n</tool_call>`, one per line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from server.chat.tool_calls.base import (
    FunctionSpec,
    ToolParser,
    ToolStream,
    assemble,
    call_json,
    call_object,
    calls_rule,
    scan_whole,
)
from server.chat.tool_calls.events import ContentDelta, ParsedOutput, ToolCall, ToolEvent
from server.chat.tool_calls.holdback import TextUntilTag, partial_tag
from server.chat.tool_calls.json_scan import CallScanner

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|\Z)", re.DOTALL)


class HermesParser(ToolParser):
    name = "hermes"

    def parse(self, text: str) -> ParsedOutput:
        pieces: list[tuple[str, object]] = []
        last = 0
        for match in _BLOCK.finditer(text):
            pieces.append(("text", text[last : match.start()]))
            call = scan_whole(match.group(1))
            pieces.append(("call", call) if call else ("text", match.group(0)))
            last = match.end()
        pieces.append(("text", text[last:]))
        return assemble(pieces)

    def stream(self) -> ToolStream:
        return _HermesStream()

    def render_calls(self, calls: Sequence[ToolCall]) -> str:
        return "\n".join(f"{OPEN}\n{call_object(c)}\n{CLOSE}" for c in calls)

    def grammar(self, tools: Sequence[FunctionSpec], parallel: bool) -> str:
        start = calls_rule(parallel, r'"\n"')
        call = r'call: "<tool_call>\n" body "\n</tool_call>"'
        return f"{start}\n{call}\nbody: {call_json(tools)}\n"


class _HermesStream(ToolStream):
    def __init__(self) -> None:
        self._buf = ""
        self._in_call = False
        self._text = TextUntilTag(OPEN)
        self._ws_before = ""  # whitespace held before an open tag until the block is decided
        self._body = ""
        self._scanner = CallScanner()
        self._calls = 0

    def feed(self, text: str) -> list[ToolEvent]:
        self._buf += text
        events: list[ToolEvent] = []
        while self._buf:
            if self._in_call:
                if not self._read_body(events, final=False):
                    break
            elif not self._read_text(events, final=False):
                break
        return events

    def finish(self) -> list[ToolEvent]:
        events: list[ToolEvent] = []
        if self._in_call:
            self._read_body(events, final=True)
        else:
            self._read_text(events, final=True)
        return events

    def _read_text(self, events: list[ToolEvent], final: bool) -> bool:
        content, ws_before, self._buf = self._text.read(self._buf, final)
        self._emit(events, content)
        if ws_before is None:
            return False
        self._ws_before, self._in_call = ws_before, True
        self._body, self._scanner = "", CallScanner()
        return True

    def _read_body(self, events: list[ToolEvent], final: bool) -> bool:
        end = self._buf.find(CLOSE)
        if end < 0:
            keep = 0 if final else partial_tag(self._buf, (CLOSE,))
            part = self._buf[: len(self._buf) - keep]
            self._buf = self._buf[len(self._buf) - keep :]
            self._body += part
            self._scanner.feed(part)
            if final:
                self._close(events, closed=False)
            else:
                events.extend(self._scanner.take(self._calls))
            return False
        part, self._buf = self._buf[:end], self._buf[end + len(CLOSE) :]
        self._body += part
        self._scanner.feed(part)
        self._close(events, closed=True)
        return True

    def _close(self, events: list[ToolEvent], closed: bool) -> None:
        self._in_call = False
        self._scanner.finish()
        if self._scanner.is_call:
            events.extend(self._scanner.take(self._calls))
            self._calls += 1
            self._text.after_call = True
        else:  # not a call after all: the whole block is content
            block = OPEN + self._body + (CLOSE if closed else "")
            self._emit(events, self._ws_before + block)
        self._ws_before = ""

    @staticmethod
    def _emit(events: list[ToolEvent], text: str) -> None:
        if text:
            events.append(ContentDelta(text))
