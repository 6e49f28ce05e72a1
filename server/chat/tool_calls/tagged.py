"""Formats whose calls sit in tagged blocks, read a whole block at a time: the base of the
Qwen3-Coder XML and DeepSeek V3 parsers.

Contract (shared by every parser, server/chat/tool_calls/base.py): `parse(text)` is the content
outside the blocks and the calls inside them; a block runs from `open_tag` to `close_tag` (or to
the end of the output) and is calls only when `read_block(body)` reads it (else it is content,
tags included). Whitespace between a call and the text around it is not content (`assemble`).
`stream()` shows content as it comes and holds a block until its close tag (or the end), then
sends its calls, each as CallStarted + one ArgumentsDelta: the events fold to `parse` of the
same text however it was split. (The chat route holds calls until the answer ends anyway, so
reading a block whole costs a streaming client nothing.) `with_tools(functions)` is a parser
that knows the request's schemas (the XML format needs them to type its values).
"""

from __future__ import annotations

import re
from abc import abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from server.chat.tool_calls.base import FunctionSpec, ToolParser, ToolStream, assemble
from server.chat.tool_calls.events import (
    ArgumentsDelta,
    CallStarted,
    ContentDelta,
    ParsedOutput,
    ToolCall,
    ToolEvent,
)
from server.chat.tool_calls.holdback import TextUntilTag, partial_tag


class TaggedBlockParser(ToolParser):
    open_tag: ClassVar[str]
    close_tag: ClassVar[str]

    def __init__(self) -> None:
        self.schemas: dict[str, dict] = {}  # function name -> its parameters schema

    def with_tools(self, functions: Sequence[FunctionSpec]) -> TaggedBlockParser:
        parser = type(self).__new__(type(self))
        parser.__dict__.update(self.__dict__)
        parser.schemas = {f.name: f.parameters for f in functions}
        return parser

    @abstractmethod
    def read_block(self, body: str) -> tuple[ToolCall, ...] | None:
        """The calls a block's body holds, or None when it is not (only) calls."""

    def parse(self, text: str) -> ParsedOutput:
        block = re.compile(
            re.escape(self.open_tag) + r"(.*?)(?:" + re.escape(self.close_tag) + r"|\Z)", re.DOTALL
        )
        pieces: list[tuple[str, object]] = []
        last = 0
        for match in block.finditer(text):
            pieces.append(("text", text[last : match.start()]))
            calls = self.read_block(match.group(1))
            if calls:
                pieces.extend(("call", call) for call in calls)
            else:
                pieces.append(("text", match.group(0)))
            last = match.end()
        pieces.append(("text", text[last:]))
        return assemble(pieces)

    def stream(self) -> ToolStream:
        return _BlockStream(self)


class _BlockStream(ToolStream):
    def __init__(self, parser: TaggedBlockParser) -> None:
        self._parser = parser
        self._buf = ""
        self._in_block = False
        self._text = TextUntilTag(parser.open_tag)
        self._ws_before = ""  # whitespace before an open tag, content unless the block is calls
        self._body = ""
        self._calls = 0

    def feed(self, text: str) -> list[ToolEvent]:
        self._buf += text
        events: list[ToolEvent] = []
        while self._buf and self._step(events, final=False):
            pass
        return events

    def finish(self) -> list[ToolEvent]:
        events: list[ToolEvent] = []
        self._step(events, final=True)
        return events

    def _step(self, events: list[ToolEvent], final: bool) -> bool:
        """Reads what it can of the buffer; True while there may be more to read at once."""
        if not self._in_block:
            content, ws_before, self._buf = self._text.read(self._buf, final)
            if content:
                events.append(ContentDelta(content))
            if ws_before is None:
                return False
            self._ws_before, self._in_block, self._body = ws_before, True, ""
            return True
        close = self._parser.close_tag
        end = self._buf.find(close)
        if end < 0:
            keep = 0 if final else partial_tag(self._buf, (close,))
            self._body += self._buf[: len(self._buf) - keep]
            self._buf = self._buf[len(self._buf) - keep :]
            if final:
                self._close(events, closed=False)
            return False
        self._body += self._buf[:end]
        self._buf = self._buf[end + len(close) :]
        self._close(events, closed=True)
        return True

    def _close(self, events: list[ToolEvent], closed: bool) -> None:
        self._in_block = False
        calls = self._parser.read_block(self._body)
        if calls:
            for call in calls:
                events.append(CallStarted(self._calls, call.name))
                events.append(ArgumentsDelta(self._calls, call.arguments))
                self._calls += 1
            self._text.after_call = True
        else:
            block = self._parser.open_tag + self._body + (self._parser.close_tag if closed else "")
            events.append(ContentDelta(self._ws_before + block))
        self._ws_before = ""
