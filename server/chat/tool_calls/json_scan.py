"""CallScanner: reads one tool call's JSON object incrementally, as its text arrives.

Contract: `feed(text)` any split of the object's text, then `finish()` when no more comes.
The scanner finds the call's name (the first string member named in `name_keys`) and streams the
raw JSON text of its arguments (the member named in `argument_keys`) as the model writes it,
whitespace inside it included; a string-valued arguments member (some models quote the JSON)
gives the string's content once it is complete. Arguments are released only once the name is
known (`take(index)` returns the events since the last call), so a client always gets the name
first. A call without arguments gets "{}" at `finish()`. `is_call` says whether a name was
found; a body that is not a JSON object with a name is not a call, and the parser shows it as
content. `done` is set once the object's closing brace is read; `rest` is what followed it.
The result never depends on how the text was split: each character is read exactly once and
a decision waits until the characters that settle it are in.
"""

from __future__ import annotations

import json

from server.chat.tool_calls.events import ArgumentsDelta, CallStarted, ToolEvent

_WS = " \t\r\n"


class ValueEnd:
    """Finds where one JSON value ends, one character at a time (no validation)."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.scalar = False
        self.started = False

    def step(self, ch: str) -> tuple[bool, bool]:
        """(consumed, ended) for the next character."""
        if not self.started:
            self.started = True
            if ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth = 1
            else:
                self.scalar = True
            return True, False
        if self.in_string:
            if self.escape:
                self.escape = False
            elif ch == "\\":
                self.escape = True
            elif ch == '"':
                self.in_string = False
                return True, self.depth == 0
            return True, False
        if self.scalar:
            if ch in ",}]" or ch in _WS:
                return False, True
            return True, False
        if ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
            return True, self.depth == 0
        return True, False


def _string_end(text: str, start: int) -> int:
    """Index after the JSON string starting at text[start] == '"', or -1 if not complete."""
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i + 1
        i += 1
    return -1


class CallScanner:
    def __init__(
        self,
        name_keys: tuple[str, ...] = ("name",),
        argument_keys: tuple[str, ...] = ("arguments", "parameters"),
    ) -> None:
        self._name_keys = name_keys
        self._argument_keys = argument_keys
        self._buf = ""
        self._pos = 0
        self._state = "start"  # start | key | colon | value | raw | after | done | invalid
        self._key = ""
        self._value: ValueEnd | None = None
        self._emit_value = False  # the value being read is the raw arguments
        self._args_seen = False
        self.name: str | None = None
        self._pending: list[str] = []  # argument fragments not taken yet
        self._started_sent = False
        self.rest = ""

    @property
    def is_call(self) -> bool:
        return self.name is not None

    @property
    def done(self) -> bool:
        return self._state == "done"

    @property
    def failed(self) -> bool:
        """The text cannot be a call any more (no name found before it went wrong)."""
        return self._state == "invalid" and self.name is None

    def feed(self, text: str) -> None:
        if self._state == "done":
            self.rest += text
            return
        if self._state == "invalid":
            return
        self._buf += text
        while self._pos < len(self._buf) and self._state not in ("done", "invalid"):
            if not self._step():
                break  # waits for more text
        if self._state == "done":
            self.rest += self._buf[self._pos :]
        self._buf, self._pos = self._buf[self._pos :], 0

    def finish(self) -> None:
        if self.name is not None and not self._args_seen:
            self._pending.append("{}")
            self._args_seen = True

    def take(self, index: int) -> list[ToolEvent]:
        """The events since the last take (nothing until the name is known)."""
        if self.name is None:
            return []
        events: list[ToolEvent] = []
        if not self._started_sent:
            self._started_sent = True
            events.append(CallStarted(index, self.name))
        events.extend(ArgumentsDelta(index, t) for t in self._pending if t)
        self._pending = []
        return events

    def _step(self) -> bool:
        """Reads from self._pos; False when it needs more text to decide."""
        buf, ch = self._buf, self._buf[self._pos]
        state = self._state
        if state in ("start", "key", "colon", "value", "after") and ch in _WS:
            self._pos += 1
            return True
        if state == "start":
            self._state = "key" if ch == "{" else "invalid"
            self._pos += 1
        elif state == "key":
            if ch == "}":
                self._state, self._pos = "done", self._pos + 1
            elif ch != '"':
                self._state = "invalid"
            else:
                end = _string_end(buf, self._pos)
                if end < 0:
                    return False
                self._key = json.loads(buf[self._pos : end])
                self._state, self._pos = "colon", end
        elif state == "colon":
            self._state = "value" if ch == ":" else "invalid"
            self._pos += 1
        elif state == "value":
            return self._start_value(ch)
        elif state == "raw":
            self._read_raw()
        elif state == "after":
            if ch == ",":
                self._state = "key"
            elif ch == "}":
                self._state = "done"
            else:
                self._state = "invalid"
            self._pos += 1
        return True

    def _start_value(self, ch: str) -> bool:
        key, buf = self._key, self._buf
        wants_name = key in self._name_keys and self.name is None
        wants_args = key in self._argument_keys and not self._args_seen
        if ch == '"' and (wants_name or wants_args):
            end = _string_end(buf, self._pos)
            if end < 0:
                return False
            value = json.loads(buf[self._pos : end])
            if wants_name:
                self.name = value
            else:
                self._pending.append(value)
                self._args_seen = True
            self._state, self._pos = "after", end
            return True
        self._value, self._emit_value = ValueEnd(), wants_args
        if wants_args:
            self._args_seen = True
        self._state = "raw"
        return True

    def _read_raw(self) -> None:
        start, value = self._pos, self._value
        while self._pos < len(self._buf):
            consumed, ended = value.step(self._buf[self._pos])
            if consumed:
                self._pos += 1
            if ended:
                self._state = "after"
                break
        if self._emit_value:
            self._pending.append(self._buf[start : self._pos])
