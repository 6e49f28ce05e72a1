"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API on the chat engine.

Contract: `MessagesServing(state)`: `create(request)` parses the body (400 naming the field, in
Anthropic's error shape), renders the conversation with the model's chat template (server/chat/
render.py: tools shown as the template or the fallback prompt shows them), reads the answer into
thinking / text / tool_use blocks (server/anthropic/blocks.py) and answers one `message` object,
or, with `stream`, the events message_start, ping, content_block_start / delta / stop per block,
message_delta (stop_reason, output usage) and message_stop (`event:` lines, as the anthropic
client reads them). Calls are never cut: a tool call cut by max_tokens stays text (server/chat/
output.py). An engine error ends a stream with an `error` event (non-streamed: a 500). A
client that disconnects aborts the engine request. `count_tokens(request)` is `{"input_tokens"}`
of the prompt /v1/messages would send.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from engine import RequestOutput
from server.anthropic.blocks import BlockStream, message_blocks, message_body, stop_reason
from server.anthropic.convert import API_FIELDS, conversation, message_params, tool_plan
from server.anthropic.protocol import ConversationFields, CountTokensRequest, MessagesRequest
from server.chat.delta_stream import message_deltas
from server.chat.output import ChatOutputFormat
from server.chat.render import ChatRenderer, RenderedPrompt
from server.errors import ApiError, read_body
from server.request_id import request_id
from server.state import ServerState
from server.streaming import EventStreamResponse, final_output, run_until_disconnect, sse_event


class MessagesServing:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.renderer = ChatRenderer(state)

    async def _prompt(self, req: ConversationFields) -> tuple[RenderedPrompt, Any]:
        plan = tool_plan(req)
        return await self.renderer.render(conversation(req), True, plan), plan

    async def count_tokens(self, request: Request) -> dict[str, int]:
        req = await read_body(request, CountTokensRequest)
        self.state.model_name(req.model)
        prompt, _ = await self._prompt(req)
        return {"input_tokens": len(prompt.token_ids)}

    async def create(self, request: Request) -> Response:
        state = self.state
        req = await read_body(request, MessagesRequest)
        model = state.model_name(req.model)
        prompt, plan = await self._prompt(req)
        thinking = req.thinking is not None and req.thinking.type != "disabled"
        fmt, grammar = self.renderer.output_format(plan, prompt.text, True if thinking else None)
        defaults = state.info.generation if state.info is not None else None
        keep = fmt.keeps_special_tokens
        params = message_params(req, grammar, keep, defaults)
        message_id = "msg_" + request_id(request).unique  # the engine's id too
        (params,) = state.with_adapter([params], model)  # `model` may name a LoRA adapter
        (stream,) = await state.open([prompt.token_ids], [params], None, API_FIELDS, message_id)
        if req.stream:
            events = self._events(stream, fmt, message_id, model, len(prompt.token_ids))
            return EventStreamResponse(events, state.settings.sse_keepalive)
        final = await run_until_disconnect(request.receive, final_output(stream))
        out = final.outputs[0]
        if out.finish_reason == "abort":
            raise ApiError(500, "the request was aborted before it finished (its deadline)")
        message = await asyncio.to_thread(fmt.message, out.text, out.finish_reason)
        reason = stop_reason(out.finish_reason, out.stop_reason, bool(message.get("tool_calls")))
        stop = out.stop_reason if reason == "stop_sequence" else None
        usage = {"input_tokens": len(prompt.token_ids), "output_tokens": out.num_tokens}
        body = message_body(message_id, model, message_blocks(message), reason, stop, usage)
        return JSONResponse(body)

    async def _events(
        self,
        stream: AsyncIterator[RequestOutput],
        fmt: ChatOutputFormat,
        message_id: str,
        model: str,
        input_tokens: int,
    ) -> AsyncIterator[bytes]:
        usage = {"input_tokens": input_tokens, "output_tokens": 0}
        start = message_body(message_id, model, [], None, None, usage)
        yield sse_event("message_start", {"type": "message_start", "message": start})
        yield sse_event("ping", {"type": "ping"})
        reader, blocks = fmt.stream(), BlockStream()
        tokens = 0
        async with aclosing(message_deltas(stream, reader)) as batches:
            async for batch in batches:
                if batch.failed:
                    error = {"type": "api_error", "message": batch.error or "aborted"}
                    yield sse_event("error", {"type": "error", "error": error})
                    return
                for kind, data in blocks.feed(batch.deltas):
                    yield sse_event(kind, data)
                out, tokens = batch.out, batch.out.num_tokens
                if batch.finished:
                    reason = stop_reason(out.finish_reason, out.stop_reason, reader.made_calls)
                    stop = out.stop_reason if reason == "stop_sequence" else None
        for kind, data in blocks.close():
            yield sse_event(kind, data)
        delta = {"stop_reason": reason, "stop_sequence": stop}
        end = {"type": "message_delta", "delta": delta, "usage": {"output_tokens": tokens}}
        yield sse_event("message_delta", end)
        yield sse_event("message_stop", {"type": "message_stop"})
