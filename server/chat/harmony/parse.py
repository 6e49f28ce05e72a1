"""The model's harmony output split into its messages, whole or streamed in any split.

Contract: `HarmonyReader(parses_calls)` reads the text generated after a prompt that ended
with `<|start|>assistant` (special tokens kept in the text): messages of a header, then
`<|message|>`, then a body ending at `<|end|>` (another `<|start|>` header may follow),
`<|call|>` or `<|return|>` (or the end of the text). `feed(text)` / `finish()` return pieces in
output order: `ReasoningDelta(text)` for an `analysis` message's body; a `CallStarted(index,
name)` then `ArgumentsDelta(index, text)` pieces for a message addressed `to=functions.NAME`
(the recipient in the header, before or after its channel), when `parses_calls`;
`ContentDelta(text)` for every other body (`final`, a commentary preamble). A body's tail that may still grow
into a closing token is held until it cannot; text between messages is dropped; an output with
no `<|message|>` at all is content, as written, at `finish`. The pieces of one text are the
same whatever its split (`read_all` reads it whole).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from server.chat.harmony.render import CALL, CHANNEL, END, MESSAGE, RETURN, START
from server.chat.tool_calls.events import ArgumentsDelta, CallStarted, ContentDelta, ToolEvent
from server.chat.tool_calls.holdback import BufferedReader, partial_tag


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


Piece = ReasoningDelta | ToolEvent
_CLOSERS = (END, CALL, RETURN)
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*(\w+)")


class HarmonyReader(BufferedReader):
    def __init__(self, parses_calls: bool) -> None:
        super().__init__()
        self.parses_calls = parses_calls
        self._state = "header"  # header | body | between
        self._kind = "content"  # the open body's: reasoning | content | call
        self._calls = 0
        self._opened = False  # a <|message|> was seen

    def _read(self, final: bool) -> list[Piece]:
        out: list[Piece] = []
        while True:
            if self._state == "header":
                at = self._buf.find(MESSAGE)
                if at < 0:
                    if final and not self._opened and self._buf:  # no harmony at all
                        out.append(ContentDelta(self._buf))
                        self._buf = ""
                    return out
                self._open(self._buf[:at], out)
                self._buf, self._state = self._buf[at + len(MESSAGE) :], "body"
            elif self._state == "body":
                hits = [(i, tag) for tag in _CLOSERS if (i := self._buf.find(tag)) >= 0]
                if not hits:
                    keep = 0 if final else partial_tag(self._buf, _CLOSERS)
                    self._emit(self._buf[: len(self._buf) - keep], out)
                    self._buf = self._buf[len(self._buf) - keep :]
                    return out
                at, tag = min(hits)
                self._emit(self._buf[:at], out)
                self._buf, self._state = self._buf[at + len(tag) :], "between"
            else:
                at = self._buf.find(START)
                if at < 0:
                    keep = 0 if final else partial_tag(self._buf, (START,))
                    self._buf = self._buf[len(self._buf) - keep :]
                    return out
                self._buf, self._state = self._buf[at + len(START) :], "header"

    def _open(self, header: str, out: list[Piece]) -> None:
        self._opened = True
        recipient = _RECIPIENT.search(header)
        channel = _CHANNEL.search(header)
        if recipient is not None and self.parses_calls:
            self._kind = "call"
            out.append(CallStarted(self._calls, recipient.group(1).removeprefix("functions.")))
            self._calls += 1
        elif channel is not None and channel.group(1) == "analysis":
            self._kind = "reasoning"
        else:
            self._kind = "content"

    def _emit(self, text: str, out: list[Piece]) -> None:
        if not text:
            return
        if self._kind == "call":
            out.append(ArgumentsDelta(self._calls - 1, text))
        elif self._kind == "reasoning":
            out.append(ReasoningDelta(text))
        else:
            out.append(ContentDelta(text))


def read_all(text: str, parses_calls: bool) -> list[Piece]:
    reader = HarmonyReader(parses_calls)
    return reader.feed(text) + reader.finish()
