"""The TGI (text-generation-inference) API's serving: /generate answers and /generate_stream
events from engine outputs.

Contract: `TgiServing(state)`: `generate(request, req)` answers `{"generated_text",
"details"?}` (with `best_of_sequences` when best_of > 1); `stream(request, req)` sends one event
per generated token; the concatenated token texts equal the final `generated_text` (each event
carries the text that became final with its token, so held-back bytes ride with a later token),
and only the last event carries `generated_text` and `details` (finish_reason,
generated_tokens, input_length, seed). An engine error mid-stream is sent as a
`{"error", "error_type": "generation"}` event. `return_full_text` defaults to false. Invalid
input is a 400 naming the field, which TGI's routes render as 422 (server/errors.py). A client
that disconnects aborts its request.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from engine import CompletionOutput, RequestOutput
from server.errors import ApiError
from server.request_id import request_id
from server.state import ServerState
from server.streaming import EventStreamResponse, final_output, run_until_disconnect, sse
from server.tgi import protocol as tgi
from server.tgi.params import api_fields, tgi_params
from server.token_texts import clamp


class TgiServing:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def _open(
        self, request: Request, req: tgi.TgiRequest, streamed: bool
    ) -> tuple[AsyncIterator[RequestOutput], list[int]]:
        state = self.state
        if not req.inputs:
            raise ApiError(400, "`inputs` cannot be empty", param="inputs")
        params = req.parameters or tgi.TgiParameters()
        sampling = tgi_params(params, state.settings.enable_fault_injection, streamed)
        if params.adapter_id is not None:  # TGI's choice of a LoRA adapter (its served name)
            if params.adapter_id not in state.adapter_names():
                raise ApiError(400, f"adapter_id {params.adapter_id!r} is not a LoRA adapter "
                               "being served; see /v1/models", param="adapter_id")  # fmt: skip
            sampling = dataclasses.replace(sampling, adapter=params.adapter_id)
        ids = await asyncio.to_thread(state.require_tokenizer().encode, req.inputs, True)
        if params.truncate is not None:
            ids = ids[-params.truncate :]
        rid = request_id(request).unique  # the engine's id: the one in X-Request-Id's logs
        [stream] = await state.open([ids], [sampling], params.timeout, api_fields(params), rid)
        return stream, ids

    def _tokens(self, out: CompletionOutput) -> list[dict[str, Any]]:
        texts, tokenizer = self.state.token_texts, self.state.tokenizer
        entries = out.logprobs or [None] * len(out.token_ids)
        return [
            tgi.token(t, texts.get(t)[0], e.logprob if e else None, tokenizer.is_special(t))
            for t, e in zip(out.token_ids, entries, strict=True)
        ]

    def _prefill(self, final: RequestOutput) -> list[dict[str, Any]]:
        entries = final.prompt_logprobs or [None] * len(final.prompt_token_ids)
        return [
            {
                "id": t,
                "text": self.state.token_texts.get(t)[0],
                "logprob": clamp(e.logprob) if e else None,
            }
            for t, e in zip(final.prompt_token_ids, entries, strict=True)
        ]

    def _top(self, out: CompletionOutput, wanted: bool) -> list[list[dict[str, Any]]] | None:
        if not wanted:
            return None
        state = self.state
        return [tgi.top_tokens(e, state.token_texts, state.tokenizer) for e in out.logprobs or []]

    async def generate(self, request: Request, req: tgi.TgiRequest) -> dict[str, Any]:
        stream, _ = await self._open(request, req, streamed=False)
        final = await run_until_disconnect(request.receive, final_output(stream))
        params = req.parameters or tgi.TgiParameters()
        prefix = req.inputs if params.return_full_text else ""
        best, *others = final.outputs
        body: dict[str, Any] = {"generated_text": prefix + best.text}
        if params.details:
            prefill = self._prefill(final) if params.decoder_input_details else []
            wanted_top = bool(params.top_n_tokens)

            def details(out: CompletionOutput) -> dict[str, Any]:
                top = self._top(out, wanted_top)
                return tgi.details(out, params.seed, self._tokens(out), prefill, top)

            body["details"] = details(best)
            if others:
                body["details"]["best_of_sequences"] = [
                    {"generated_text": prefix + o.text, **details(o)} for o in others
                ]
        return body

    async def stream(self, request: Request, req: tgi.TgiRequest) -> Response:
        stream, ids = await self._open(request, req, streamed=True)
        keepalive = self.state.settings.sse_keepalive
        return EventStreamResponse(self._events(req, stream, len(ids)), keepalive)

    async def _events(
        self, req: tgi.TgiRequest, stream: AsyncIterator[RequestOutput], input_length: int
    ) -> AsyncIterator[bytes]:
        state = self.state
        params = req.parameters or tgi.TgiParameters()
        prefix = req.inputs if params.return_full_text else ""
        chars = tokens = index = last_id = 0
        generated: list[str] = []  # the whole text, for the last event's generated_text
        async for output in stream:
            out = output.outputs[0]
            if output.error is not None:
                yield sse({"error": output.error, "error_type": "generation"})
                return
            new = out.unseen(chars, tokens)  # `out` is a delta from its offsets
            new_ids = list(new.token_ids)
            entries = list(new.logprobs) if new.logprobs is not None else [None] * len(new_ids)
            if not new_ids and not output.finished:
                continue
            if (
                not new_ids
            ):  # finished without a new token (aborted): a closing event still needs one
                new_ids, entries = [last_id], [None]
            delta = new.text
            chars, tokens, last_id = out.text_end, out.num_tokens, new_ids[-1]
            generated.append(delta)
            for k, (token_id, entry) in enumerate(zip(new_ids, entries, strict=True)):
                last = k == len(new_ids) - 1
                index += 1
                tok = tgi.token(
                    token_id,
                    delta if last else "",
                    entry.logprob if entry else None,
                    state.tokenizer.is_special(token_id),
                )
                top = (
                    tgi.top_tokens(entry, state.token_texts, state.tokenizer)
                    if params.top_n_tokens
                    else None
                )
                done = last and output.finished
                details = (
                    {
                        "finish_reason": tgi.finish_reason(out),
                        "generated_tokens": out.num_tokens,
                        "input_length": input_length,
                        "seed": params.seed,
                    }
                    if done
                    else None
                )
                yield sse(
                    tgi.stream_event(
                        index, tok, top, prefix + "".join(generated) if done else None, details
                    )
                )
