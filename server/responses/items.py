"""An answer as Responses API output items, and the stream's typed events that build them.

Contract: `ItemStream` turns the deltas of a chat answer reader (server/chat/output.py:
`reasoning_content`, `content`, `tool_calls` headers then argument fragments) into output items,
in output order: `reasoning` (`rs_` id, the text as one `reasoning_text` content part, no
summary), `message` (`msg_` id, one `output_text` part) and one `function_call` per call (`fc_`
id, `call_id`, name, arguments). `feed(deltas)` returns the events of the Responses stream
(`response.output_item.added`, `response.content_part.added`, `response.output_text.delta`,
`response.reasoning_text.delta`, `response.function_call_arguments.delta`, then per item its
`.done` events and `response.output_item.done`), `close()` ends the open item, and `items` is
what they add up to, the same objects the final response lists. `message_items(message)` is the
items of a whole message, built the same way. Events are (type, fields) without the sequence
number, which the serving class numbers.
"""

from __future__ import annotations

import uuid
from typing import Any

Event = tuple[str, dict[str, Any]]
_PART = {"message": "output_text", "reasoning": "reasoning_text"}


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def message_deltas(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole chat message as the reader's deltas would bring it."""
    deltas: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        deltas.append({"reasoning_content": message["reasoning_content"]})
    if message.get("content"):
        deltas.append({"content": message["content"]})
    for k, call in enumerate(message.get("tool_calls") or ()):
        function = call["function"]
        header = {"index": k, "id": call["id"], "function": {"name": function["name"]}}
        fragment = {"index": k, "function": {"arguments": function["arguments"]}}
        deltas += [{"tool_calls": [header]}, {"tool_calls": [fragment]}]
    return deltas


def message_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    items = ItemStream()
    items.feed(message_deltas(message))
    items.close()
    return items.items


class ItemStream:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []  # finished items, in output order
        self._open: dict[str, Any] | None = None
        self._text = ""  # the open item's text (reasoning, message) or arguments (call)

    def feed(self, deltas: list[dict[str, Any]]) -> list[Event]:
        events: list[Event] = []
        for delta in deltas:
            if delta.get("reasoning_content"):
                events += self._text_delta("reasoning", delta["reasoning_content"])
            if delta.get("content"):
                events += self._text_delta("message", delta["content"])
            for call in delta.get("tool_calls") or ():
                if "id" in call:
                    events += self._open_call(call["id"], call["function"]["name"])
                fragment = call["function"].get("arguments")
                if fragment:
                    self._text += fragment
                    events.append(
                        ("response.function_call_arguments.delta", self._at(delta=fragment))
                    )
        return events

    def close(self) -> list[Event]:
        item = self._open
        if item is None:
            return []
        self._open, text, self._text = None, self._text, ""
        events: list[Event] = []
        if item["type"] == "function_call":
            item["arguments"] = text
            done = self._at(item, arguments=text, name=item["name"])
            events.append(("response.function_call_arguments.done", done))
        else:
            part = self._part(item["type"], text)
            kind = "output_text" if item["type"] == "message" else "reasoning_text"
            extra = {"logprobs": []} if kind == "output_text" else {}
            events.append(
                (f"response.{kind}.done", self._at(item, content_index=0, text=text, **extra))
            )
            events.append(
                ("response.content_part.done", self._at(item, content_index=0, part=part))
            )
            item["content"] = [part]
        if "status" in item:
            item["status"] = "completed"
        self.items.append(item)
        index = len(self.items) - 1
        events.append(("response.output_item.done", {"output_index": index, "item": item}))
        return events

    def _text_delta(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if self._open is None or self._open["type"] != kind:
            events += self.close()
            if kind == "message":
                item = {"type": "message", "id": new_id("msg_"), "status": "in_progress"}
                item |= {"role": "assistant", "content": []}
            else:
                item = {"type": "reasoning", "id": new_id("rs_"), "summary": [], "content": []}
            events += self._start(item)
            part = self._part(kind, "")
            events.append(("response.content_part.added", self._at(content_index=0, part=part)))
        self._text += text
        name = "output_text" if kind == "message" else "reasoning_text"
        extra = {"logprobs": []} if kind == "message" else {}
        events.append((f"response.{name}.delta", self._at(content_index=0, delta=text, **extra)))
        return events

    def _open_call(self, call_id: str, name: str) -> list[Event]:
        item = {"type": "function_call", "id": new_id("fc_"), "call_id": call_id, "name": name}
        item |= {"arguments": "", "status": "in_progress"}
        return self.close() + self._start(item)

    def _start(self, item: dict[str, Any]) -> list[Event]:
        self._open = item
        added = {"output_index": len(self.items), "item": dict(item)}
        return [("response.output_item.added", added)]

    def _at(self, item: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
        """Fields of an event about the open item (or `item`, being closed)."""
        item = item or self._open
        return {"item_id": item["id"], "output_index": len(self.items), **fields}

    @staticmethod
    def _part(kind: str, text: str) -> dict[str, Any]:
        if kind == "message":
            return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        return {"type": "reasoning_text", "text": text}
