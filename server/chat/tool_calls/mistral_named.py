"""Mistral's newer call form (v11+ tokenizers): `[TOOL_CALLS]name[ARGS]{...}`, one marker per call.

Contract: what follows a `[TOOL_CALLS]` marker (leading whitespace dropped) is a call when it is
a function name (`[A-Za-z0-9_.-]+`), optionally `[CALL_ID]` and an alphanumeric id (dropped:
the server gives calls its own ids), then `[ARGS]`; the call is decided once `[ARGS]` is read.
Its arguments are the JSON object after `[ARGS]` (whitespace before it dropped), as written; an
object cut off by the end of the output gives the arguments written so far, and anything but an
object gives "{}" and is read as text again. Text that is not such a head means the marker was
content (the caller decides what then). `read_named_call(head)` reads a whole output,
`NamedCall` the same text in any split (reading like call_sequence.CallSequence: events, then
`ended` with `calls` and `leftover`; ended with no call when the text is not one); both give
the same call and leftover text.
"""

from __future__ import annotations

import re

from server.chat.tool_calls.events import ArgumentsDelta, CallStarted, ToolCall, ToolEvent
from server.chat.tool_calls.holdback import WHITESPACE
from server.chat.tool_calls.json_scan import ValueEnd

ARGS, CALL_ID = "[ARGS]", "[CALL_ID]"
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_ID = re.compile(r"[A-Za-z0-9]*")
WAIT, FAIL = "wait", "fail"


def read_head(head: str) -> str | tuple[str, str]:
    """`name[ARGS]` (or `name[CALL_ID]id[ARGS]`) at the start of `head`: (name, the text after
    `[ARGS]`), FAIL when `head` cannot start that way, WAIT when more text could decide."""
    name = _NAME.match(head)
    if name is None:
        return FAIL if head else WAIT
    rest = head[name.end() :]
    if rest.startswith(CALL_ID):
        call_id = _ID.match(rest, len(CALL_ID))
        rest = rest[call_id.end() :]
    elif CALL_ID.startswith(rest):  # also the empty rest: the name may go on
        return WAIT
    if rest.startswith(ARGS):
        return name.group(), rest[len(ARGS) :]
    return WAIT if ARGS.startswith(rest) else FAIL


def object_end(text: str) -> int | None:
    """Index after the JSON object opening `text` ("{..."), None when it is cut off."""
    value = ValueEnd()
    for i, ch in enumerate(text):
        if value.step(ch)[1]:
            return i + 1
    return None


def read_named_call(head: str) -> tuple[ToolCall, str] | None:
    """The call at the start of `head` and the text after it; None when it holds no call."""
    found = read_head(head)
    if isinstance(found, str):
        return None
    name, after = found
    body = after.lstrip(WHITESPACE)
    if not body.startswith("{"):
        return ToolCall(name, "{}"), body
    end = object_end(body)
    if end is None:
        return ToolCall(name, body), ""
    return ToolCall(name, body[:end]), body[end:]


class NamedCall:
    """Streams one call of the named form; `index` numbers its events."""

    def __init__(self, index: int) -> None:
        self._index = index
        self._head = ""  # text read while the call is undecided
        self._state = "head"  # head | gap (before the object) | object | ended
        self._value = ValueEnd()
        self.calls = 0  # 1 once `[ARGS]` is read
        self.leftover = ""

    @property
    def ended(self) -> bool:
        return self._state == "ended"

    def feed(self, text: str) -> list[ToolEvent]:
        events: list[ToolEvent] = []
        if self._state == "head":
            self._head += text
            found = read_head(self._head)
            if found == WAIT:
                return events
            if found == FAIL:
                self._end("")
                return events
            name, text = found
            events.append(CallStarted(self._index, name))
            self._state, self.calls = "gap", 1
        if self._state == "gap":
            text = text.lstrip(WHITESPACE)
            if not text:
                return events
            if text[0] != "{":
                events.append(ArgumentsDelta(self._index, "{}"))
                self._end(text)
                return events
            self._state = "object"
        if self._state == "object":
            for i, ch in enumerate(text):
                if self._value.step(ch)[1]:
                    events.append(ArgumentsDelta(self._index, text[: i + 1]))
                    self._end(text[i + 1 :])
                    return events
            if text:
                events.append(ArgumentsDelta(self._index, text))
        return events

    def finish(self) -> list[ToolEvent]:
        """The output ended: an undecided head is no call, a call without its object gets "{}"."""
        events: list[ToolEvent] = []
        if self._state == "head":
            self._end("")
        elif self._state == "gap":
            events.append(ArgumentsDelta(self._index, "{}"))
            self._end("")
        elif self._state == "object":
            self._end("")
        return events

    def _end(self, leftover: str) -> None:
        self._state, self.leftover = "ended", leftover
