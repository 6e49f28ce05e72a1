"""POST /v1/responses, GET and DELETE /v1/responses/{id}: OpenAI's Responses API on the chat engine.

Contract: `ResponsesServing(state).create(request)` parses the body (400 naming the field;
unsupported fields refused: server/responses/convert.py), puts a stored previous response's
conversation before the input (404 naming previous_response_id when it is not stored),
renders `instructions` + the conversation with the chat template (server/chat/render.py), and
answers one `response` object whose `output` lists reasoning, message and function_call items
(server/responses/items.py): status "completed", or "incomplete" with reason
"max_output_tokens" when the length limit ended it (a call it cut stays text). With `stream`,
it sends the typed events `response.created`, `response.in_progress`, the items' events and
`response.completed` (or `response.incomplete`), each with a `sequence_number`, as the openai
client's `responses.stream` reads them; an engine error ends the stream with an `error`
event (non-streamed: a 500). A client that disconnects aborts the engine request. With
`store` (default true) the response is kept (server/responses/store.py) for `retrieve` and
`delete` and for previous_response_id.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from engine import CompletionOutput, RequestOutput
from server.chat.delta_stream import message_deltas
from server.chat.output import ChatOutputFormat
from server.chat.render import ChatRenderer
from server.errors import ApiError, read_body
from server.request_id import request_id
from server.responses.convert import (
    API_FIELDS,
    input_turns,
    refuse_unsupported,
    response_params,
    tool_plan,
)
from server.responses.items import ItemStream, message_items
from server.responses.protocol import ResponsesRequest
from server.responses.store import ResponseStore, StoredResponse
from server.state import ServerState
from server.streaming import EventStreamResponse, final_output, run_until_disconnect, sse_event


class ResponsesServing:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.renderer = ChatRenderer(state)
        self.store = ResponseStore(state.settings.responses_store_size)

    async def create(self, request: Request) -> Response:
        state = self.state
        req = await read_body(request, ResponsesRequest)
        model = state.model_name(req.model)
        refuse_unsupported(req)
        conversation = self._history(req.previous_response_id) + input_turns(req)
        system = [{"role": "system", "content": req.instructions}] if req.instructions else []
        plan = tool_plan(req)
        prompt = await self.renderer.render(system + conversation, True, plan, param="input")
        effort = req.reasoning.effort if req.reasoning is not None else None
        asked = True if effort not in (None, "none") else None
        fmt, grammar = self.renderer.output_format(plan, prompt.text, asked)
        defaults = state.info.generation if state.info is not None else None
        keep = fmt.keeps_special_tokens
        params = response_params(req, grammar, keep, defaults)
        shell = _shell(req, model, "resp_" + request_id(request).unique)  # the engine's id too
        (params,) = state.with_adapter([params], model)  # `model` may name a LoRA adapter
        (stream,) = await state.open([prompt.token_ids], [params], None, API_FIELDS, shell["id"])
        prompt_tokens = len(prompt.token_ids)
        if req.stream:
            events = self._events(req, stream, fmt, shell, conversation, prompt_tokens)
            return EventStreamResponse(events, state.settings.sse_keepalive)
        final = await run_until_disconnect(request.receive, final_output(stream))
        out = final.outputs[0]
        message = await asyncio.to_thread(fmt.message, out.text, out.finish_reason)
        body = _finished(shell, message_items(message), out, prompt_tokens)
        self._remember(req, body, conversation)
        return JSONResponse(body)

    def retrieve(self, response_id: str) -> dict[str, Any]:
        self.state.require_ready()
        return self._stored(response_id, "response_id").body

    def delete(self, response_id: str) -> dict[str, Any]:
        self.state.require_ready()
        if not self.store.delete(response_id):
            self._stored(response_id, "response_id")  # the 404
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    def _stored(self, response_id: str, param: str) -> StoredResponse:
        entry = self.store.get(response_id)
        if entry is None:
            raise ApiError(
                404,
                f"no stored response {response_id!r} (responses are kept in this server's "
                f"memory, the {self.store.capacity} most recently used)",
                param=param,
                code="response_not_found",
            )
        return entry

    def _history(self, previous: str | None) -> list[dict[str, Any]]:
        return (
            [] if previous is None else self._stored(previous, "previous_response_id").conversation
        )

    def _remember(
        self, req: ResponsesRequest, body: dict[str, Any], conversation: list[dict[str, Any]]
    ) -> None:
        """Stores the response with its conversation, its answer as the chat turn its output
        items say (the calls under the call_ids the client was given)."""
        if req.store is False:
            return
        items = body["output"]
        text = "".join(p["text"] for i in items if i["type"] == "message" for p in i["content"])
        answer: dict[str, Any] = {"role": "assistant", "content": text}
        calls = [
            {
                "id": i["call_id"],
                "type": "function",
                "function": {"name": i["name"], "arguments": i["arguments"]},
            }
            for i in items
            if i["type"] == "function_call"
        ]
        if calls:
            answer["tool_calls"] = calls
        self.store.put(body["id"], StoredResponse(body, [*conversation, answer]))

    async def _events(
        self,
        req: ResponsesRequest,
        stream: AsyncIterator[RequestOutput],
        fmt: ChatOutputFormat,
        shell: dict[str, Any],
        conversation: list[dict[str, Any]],
        prompt_tokens: int,
    ) -> AsyncIterator[bytes]:
        number = iter(range(1 << 62))

        def event(kind: str, fields: dict[str, Any]) -> bytes:
            return sse_event(kind, {"type": kind, "sequence_number": next(number), **fields})

        yield event("response.created", {"response": shell})
        yield event("response.in_progress", {"response": shell})
        reader, items = fmt.stream(), ItemStream()
        async with aclosing(message_deltas(stream, reader)) as batches:
            async for batch in batches:
                if batch.failed:
                    message = batch.error or "the request was aborted before it finished"
                    yield event(
                        "error", {"code": "engine_error", "message": message, "param": None}
                    )
                    return
                for kind, fields in items.feed(batch.deltas):
                    yield event(kind, fields)
                out = batch.out
        for kind, fields in items.close():
            yield event(kind, fields)
        body = _finished(shell, items.items, out, prompt_tokens)
        self._remember(req, body, conversation)
        yield event(f"response.{body['status']}", {"response": body})


def _shell(req: ResponsesRequest, model: str, response_id: str) -> dict[str, Any]:
    """The response object before any output (status in_progress)."""
    choice = req.tool_choice or "auto"
    fmt = req.text.format if req.text is not None and req.text.format is not None else None
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "model": model,
        "output": [],
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": req.reasoning.model_dump() if req.reasoning is not None else None,
        "store": req.store is not False,
        "temperature": req.temperature,
        "text": {"format": fmt.model_dump(by_alias=True) if fmt else {"type": "text"}},
        "tool_choice": choice if isinstance(choice, str) else choice.model_dump(),
        "tools": [t.model_dump() for t in req.tools or ()],
        "top_p": req.top_p,
        "truncation": req.truncation or "disabled",
        "metadata": req.metadata or {},
        "user": req.user,
        "usage": None,
    }


def _finished(
    shell: dict[str, Any], items: list[dict[str, Any]], out: CompletionOutput, prompt_tokens: int
) -> dict[str, Any]:
    cut = out.finish_reason == "length"
    usage = {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": out.num_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + out.num_tokens,
    }
    return {
        **shell,
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": items,
        "usage": usage,
    }
