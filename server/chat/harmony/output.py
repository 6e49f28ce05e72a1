"""A harmony output (gpt-oss) read as an OpenAI assistant message, whole or as stream deltas.

Contract: `HarmonyOutputFormat(parses_calls)` is a `ChatOutputFormat` (server/chat/output.py)
whose text is harmony (parse.py; special tokens kept: `keeps_special_tokens`): `message(text,
finish_reason)` has the `analysis` messages' text as `reasoning_content`, the other messages'
as `content` (None when empty), and each call as an OpenAI tool call (arguments as written);
`stream()` gives deltas in output order that reassemble to `message`, ids aside, holding calls
from the first one on until `finish`. An output cut by the length limit has no calls (an
unfinished call is no call): its reasoning and content stand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from server.chat.harmony.parse import HarmonyReader, Piece, ReasoningDelta, read_all
from server.chat.output import (
    ChatOutputFormat,
    Delta,
    MessageStream,
    call_id,
    event_delta,
    merge_deltas,
)
from server.chat.tool_calls.events import CallStarted, fold_events


@dataclass(frozen=True)
class HarmonyOutputFormat(ChatOutputFormat):
    parses_calls: bool = True

    @property
    def plain(self) -> bool:
        return False

    @property
    def keeps_special_tokens(self) -> bool:
        return True

    def message(self, text: str, finish_reason: str | None = None) -> dict[str, Any]:
        pieces = read_all(text, self.parses_calls)
        reasoning = "".join(p.text for p in pieces if isinstance(p, ReasoningDelta))
        parsed = fold_events(p for p in pieces if not isinstance(p, ReasoningDelta))
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content or None}
        if reasoning:
            message["reasoning_content"] = reasoning
        if parsed.calls and finish_reason != "length":
            message["tool_calls"] = [
                {"id": call_id(), "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for c in parsed.calls
            ]  # fmt: skip
        return message

    def stream(self) -> HarmonyStream:
        return HarmonyStream(self)


class HarmonyStream(MessageStream):
    def __init__(self, fmt: HarmonyOutputFormat) -> None:
        super().__init__(fmt)  # no think-tag reader, no call parser: the reader below is both
        self._reader = HarmonyReader(fmt.parses_calls)

    def feed(self, text: str) -> list[Delta]:
        return self._deltas(self._reader.feed(text))

    def finish(self, finish_reason: str | None = None) -> list[Delta]:
        deltas = self._deltas(self._reader.finish())
        held, self._held = self._held or [], None
        if finish_reason == "length":  # the calls go, what else was held stays
            self.made_calls = False
            held = [d for d in held if "tool_calls" not in d]
        return merge_deltas(deltas + held)

    def _deltas(self, pieces: list[Piece]) -> list[Delta]:
        self.made_calls |= any(isinstance(p, CallStarted) for p in pieces)
        deltas = [
            {"reasoning_content": p.text} if isinstance(p, ReasoningDelta) else event_delta(p)
            for p in pieces
        ]
        return self._hold_calls(deltas)
