"""An answer as Anthropic content blocks: whole, or as the stream's events.

Contract: `message_blocks(message)` turns a chat message read by server/chat/output.py (reasoning,
content, tool_calls) into blocks in that order: `thinking` (signature ""), `text`, one `tool_use`
per call (`toolu_` id, the arguments parsed into `input`). `BlockStream` turns the same reader's
stream deltas into `content_block_start` / `content_block_delta` (thinking_delta, text_delta,
input_json_delta) / `content_block_stop` events, numbered from 0; `close()` ends the open block.
Reassembled as the anthropic client does, the events give the blocks of the whole message.
`stop_reason(finish, stop, made_calls)` is Anthropic's: end_turn, stop_sequence, max_tokens,
tool_use. `message_body(...)` is the whole response object (`type: "message"`).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

Event = tuple[str, dict[str, Any]]  # (event type, data)


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def message_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        blocks.append(
            {"type": "thinking", "thinking": message["reasoning_content"], "signature": ""}
        )
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        function = call["function"]
        blocks.append(
            {
                "type": "tool_use",
                "id": new_id("toolu_"),
                "name": function["name"],
                "input": json.loads(function["arguments"] or "{}"),
            }
        )
    return blocks


def stop_reason(finish: str | None, stop: int | str | None, made_calls: bool) -> str:
    if finish == "length":
        return "max_tokens"
    if made_calls:
        return "tool_use"
    return "stop_sequence" if isinstance(stop, str) else "end_turn"


def message_body(
    message_id: str,
    model: str,
    blocks: list[dict[str, Any]],
    reason: str | None,
    stop: str | None,
    usage: dict[str, int],
) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": reason,
        "stop_sequence": stop,
        "usage": usage,
    }


class BlockStream:
    def __init__(self) -> None:
        self._index = -1
        self._open: str | None = None  # "thinking" | "text" | "tool_use" | None

    def feed(self, deltas: list[dict[str, Any]]) -> list[Event]:
        events: list[Event] = []
        for delta in deltas:
            if delta.get("reasoning_content"):
                events += self._ensure("thinking", {"thinking": "", "signature": ""})
                events.append(self._delta("thinking_delta", thinking=delta["reasoning_content"]))
            if delta.get("content"):
                events += self._ensure("text", {"text": ""})
                events.append(self._delta("text_delta", text=delta["content"]))
            for call in delta.get("tool_calls") or ():
                if "id" in call:  # a new call: a block of its own
                    events += self.close()
                    start = {"id": new_id("toolu_"), "name": call["function"]["name"], "input": {}}
                    events += self._ensure("tool_use", start)
                fragment = call["function"].get("arguments")
                if fragment:
                    events.append(self._delta("input_json_delta", partial_json=fragment))
        return events

    def close(self) -> list[Event]:
        if self._open is None:
            return []
        self._open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self._index})]

    def _ensure(self, kind: str, fields: dict[str, Any]) -> list[Event]:
        if self._open == kind and kind != "tool_use":
            return []
        events = self.close()
        self._index += 1
        self._open = kind
        block = {"type": kind, **fields}
        start = {"type": "content_block_start", "index": self._index, "content_block": block}
        return [*events, ("content_block_start", start)]

    def _delta(self, kind: str, **fields: str) -> Event:
        delta = {"type": kind, **fields}
        return (
            "content_block_delta",
            {"type": "content_block_delta", "index": self._index, "delta": delta},
        )
