"""The Responses store: bounded, least recently used dropped first, and what a stored response
hands to `previous_response_id` (its answer as a chat turn, under the call ids the client saw).

Oracles: hand-worked sequences of puts and gets; a hand-written response body.
"""

from __future__ import annotations

from server.responses.protocol import ResponsesRequest
from server.responses.serving import ResponsesServing
from server.responses.store import ResponseStore, StoredResponse
from server.settings import Settings
from server.state import ServerState


def entry(name: str) -> StoredResponse:
    return StoredResponse({"id": name}, [])


def test_the_least_recently_used_goes_first_and_zero_keeps_none():
    store = ResponseStore(2)
    store.put("a", entry("a"))
    store.put("b", entry("b"))
    assert store.get("a") is not None  # a is now the most recent
    store.put("c", entry("c"))  # drops b
    assert [store.get(k) is not None for k in "abc"] == [True, False, True]
    assert store.delete("a") and not store.delete("a") and len(store) == 1
    empty = ResponseStore(0)
    empty.put("a", entry("a"))
    assert empty.get("a") is None and len(empty) == 0


def test_a_stored_answer_is_the_turn_its_output_items_say():
    serving = ResponsesServing(ServerState(Settings(), lambda: None, 1))
    body = {
        "id": "resp_1",
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": []},
            {"type": "message", "content": [{"type": "output_text", "text": "Let me look."}]},
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_seen",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
        ],
    }
    asked = [{"role": "user", "content": "Weather?"}]
    serving._remember(ResponsesRequest(input="Weather?"), body, asked)
    stored = serving.store.get("resp_1")
    assert stored.body is body
    assert stored.conversation == [
        *asked,
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "call_seen",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
    ]
    serving._remember(ResponsesRequest(input="x", store=False), {**body, "id": "resp_2"}, asked)
    assert serving.store.get("resp_2") is None
