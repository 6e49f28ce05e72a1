"""Calls written as a sequence of JSON objects: `{...}; {...}` (Llama) or `{...}, {...}]`
(Mistral, after its opening bracket).

Contract: `read_sequence(text, sep, close)` reads a whole sequence and returns its calls and the
text left after it (after `close` when the sequence was closed by it); `CallSequence` reads the
same text in any split: `feed(text)` / `finish()` return events (numbered from `first_index`),
and once `ended` its `leftover` equals read_sequence's. A sequence ends at `close`, at text that
is neither a separator nor an object, or at an object that is not a call (that object's text is
then part of the leftover); an object cut off by the end of the output is a call once its name
is complete.
"""

from __future__ import annotations

from server.chat.tool_calls.events import ToolCall, ToolEvent, fold_events
from server.chat.tool_calls.holdback import WHITESPACE
from server.chat.tool_calls.json_scan import CallScanner


def read_sequence(text: str, sep: str, close: str | None) -> tuple[list[ToolCall], str]:
    calls: list[ToolCall] = []
    rest = text
    while True:
        head = rest.lstrip(WHITESPACE)
        if close and head.startswith(close):
            return calls, head[len(close) :]
        if not head.startswith("{"):
            return calls, head
        scanner = CallScanner()
        scanner.feed(head)
        scanner.finish()
        if not scanner.is_call:
            return calls, head
        calls.append(fold_events(scanner.take(0)).calls[0])
        if not scanner.done:
            return calls, ""
        after = scanner.rest.lstrip(WHITESPACE)
        if after.startswith(sep):
            rest = after[len(sep) :]
            continue
        if close and after.startswith(close):
            return calls, after[len(close) :]
        return calls, after


class CallSequence:
    def __init__(self, sep: str, close: str | None, first_index: int) -> None:
        self._sep, self._close = sep, close
        self._index = first_index
        self.calls = 0
        self._state = "expect"  # expect (an object) | object | after (a separator or close)
        self._buf = ""
        self._object = ""  # text of the object being read, for when it is not a call
        self._scanner = CallScanner()
        self.ended = False
        self.leftover = ""

    def feed(self, text: str) -> list[ToolEvent]:
        events: list[ToolEvent] = []
        self._buf += text
        while self._buf and not self.ended:
            if not self._step(events):
                break
        return events

    def finish(self) -> list[ToolEvent]:
        events: list[ToolEvent] = []
        if self.ended:
            return events
        if self._state == "object":
            self._scanner.finish()
            if self._scanner.is_call:
                events.extend(self._scanner.take(self._index + self.calls))
                self.calls += 1
                self._end("")
            else:
                self._end(self._object)
        else:
            self._end(self._buf.lstrip(WHITESPACE))
        return events

    def _end(self, leftover: str) -> None:
        self.ended, self.leftover, self._buf = True, leftover, ""

    def _step(self, events: list[ToolEvent]) -> bool:
        if self._state == "object":
            return self._read_object(events)
        head = self._buf.lstrip(WHITESPACE)
        if not head:
            self._buf = ""
            return False
        if self._close and head.startswith(self._close):
            self._end(head[len(self._close) :])
        elif self._state == "after" and head.startswith(self._sep):
            self._state, self._buf = "expect", head[len(self._sep) :]
        elif self._state == "expect" and head[0] == "{":
            self._state, self._buf = "object", head
            self._object, self._scanner = "", CallScanner()
        else:
            self._end(head)
        return True

    def _read_object(self, events: list[ToolEvent]) -> bool:
        part, self._buf = self._buf, ""
        self._object += part
        self._scanner.feed(part)
        events.extend(self._scanner.take(self._index + self.calls))
        if self._scanner.failed or (self._scanner.done and not self._scanner.is_call):
            self._end(self._object)
            return False
        if self._scanner.done:
            self._scanner.finish()
            events.extend(self._scanner.take(self._index + self.calls))
            self.calls += 1
            self._state, self._buf = "after", self._scanner.rest
            return True
        return False
