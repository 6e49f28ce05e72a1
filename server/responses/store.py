"""The in-process store of responses, for GET /v1/responses/{id} and previous_response_id.

Contract: `ResponseStore(capacity)` keeps at most `capacity` responses (--responses-store-size;
0 keeps none): each is the response body and the conversation it ended (its input turns, as
chat message dicts, followed by its answer), so a later request can continue it. Eviction: the
least recently used one goes first (storing and reading, `get`, both count as a use). `delete`
says whether it was there. Everything lives in this process's memory: a restart, or another
replica, does not have it. The store is touched only on the event loop (no lock).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StoredResponse:
    body: dict[str, Any]  # the response object as answered
    conversation: list[dict[str, Any]]  # the chat turns it saw, then its own answer


class ResponseStore:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response_id: str, entry: StoredResponse) -> None:
        if self.capacity <= 0:
            return
        self._entries[response_id] = entry
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)  # the least recently used

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        return self._entries.pop(response_id, None) is not None
