"""What a tool-call parser produces: whole results and streaming events (frozen values).

Contract: a parser's whole-text `parse(text)` returns a `ParsedOutput` (content outside the
calls, concatenated in order, and the calls with their arguments as JSON text); its streaming
side turns text deltas into a list of events: `ContentDelta` (text shown as content),
`CallStarted` (call `index` gets its `name`; always before any of its arguments) and
`ArgumentsDelta` (the next fragment of call `index`'s arguments). Folding the events of a whole
stream with `fold_events` gives the `ParsedOutput` of the same text.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as the model wrote it ("{}" when it wrote none)


@dataclass(frozen=True)
class ParsedOutput:
    content: str
    calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class CallStarted:
    index: int
    name: str


@dataclass(frozen=True)
class ArgumentsDelta:
    index: int
    text: str


ToolEvent = ContentDelta | CallStarted | ArgumentsDelta


def fold_events(events: Iterable[ToolEvent]) -> ParsedOutput:
    """The whole output a stream of events adds up to (what a streaming client reassembles)."""
    content: list[str] = []
    names: list[str] = []
    arguments: list[list[str]] = []
    for event in events:
        if isinstance(event, ContentDelta):
            content.append(event.text)
        elif isinstance(event, CallStarted):
            if event.index != len(names):
                raise ValueError(f"call {event.index} started out of order")
            names.append(event.name)
            arguments.append([])
        else:
            arguments[event.index].append(event.text)
    calls = tuple(ToolCall(n, "".join(a)) for n, a in zip(names, arguments, strict=True))
    return ParsedOutput("".join(content), calls)
