"""TGI routes: POST /generate, POST /generate_stream, POST / (dispatch on "stream"), GET /info.

Contract: `/generate` answers `{"generated_text", "details"?}`; `POST /` answers the same
wrapped in a list when not streaming (as TGI does; huggingface_hub's InferenceClient posts
there). Streams send one event per generated token; the concatenated token texts equal the
final `generated_text` (each event carries the text that became final with its token, so
held-back bytes ride with a later token), and only the last event carries `generated_text` and
`details` (finish_reason, generated_tokens, input_length, seed). An engine error mid-stream is
sent as a `{"error", "error_type": "generation"}` event. `return_full_text` defaults to false.
Invalid input is 422 `{"error", "error_type": "validation"}`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from engine import MAX_N, MAX_STOP_STRINGS, CompletionOutput, RequestOutput
from server import schemas_tgi as tgi
from server.errors import ApiError, read_body
from server.request_params import api_fields, tgi_params
from server.state import ServerState, get_state
from server.streaming import EventStreamResponse, final_output, run_until_disconnect, sse

router = APIRouter()


async def _open(
    state: ServerState, req: tgi.TgiRequest, streamed: bool
) -> tuple[AsyncIterator[RequestOutput], list[int]]:
    if not req.inputs:
        raise ApiError(400, "`inputs` cannot be empty", param="inputs")
    params = req.parameters or tgi.TgiParameters()
    sampling = tgi_params(params, state.settings.enable_fault_injection, streamed)
    ids = await asyncio.to_thread(state.require_tokenizer().encode, req.inputs, True)
    if params.truncate is not None:
        ids = ids[-params.truncate :]
    [stream] = await state.open([ids], [sampling], params.timeout, api_fields(params))
    return stream, ids


def _tokens(state: ServerState, out: CompletionOutput) -> list[dict[str, Any]]:
    entries = out.logprobs or [None] * len(out.token_ids)
    return [
        tgi.token(
            t, state.token_texts.get(t)[0], e.logprob if e else None, state.tokenizer.is_special(t)
        )
        for t, e in zip(out.token_ids, entries, strict=True)
    ]


def _prefill(state: ServerState, final: RequestOutput) -> list[dict[str, Any]]:
    entries = final.prompt_logprobs or [None] * len(final.prompt_token_ids)
    return [
        {
            "id": t,
            "text": state.token_texts.get(t)[0],
            "logprob": tgi.clamp(e.logprob) if e else None,
        }
        for t, e in zip(final.prompt_token_ids, entries, strict=True)
    ]


def _top(
    state: ServerState, out: CompletionOutput, wanted: bool
) -> list[list[dict[str, Any]]] | None:
    if not wanted:
        return None
    return [tgi.top_tokens(e, state.token_texts, state.tokenizer) for e in out.logprobs or []]


async def _generate(request: Request, req: tgi.TgiRequest) -> dict[str, Any]:
    state = get_state(request)
    stream, _ = await _open(state, req, streamed=False)
    final = await run_until_disconnect(request.receive, final_output(stream))
    params = req.parameters or tgi.TgiParameters()
    prefix = req.inputs if params.return_full_text else ""
    best, *others = final.outputs
    body: dict[str, Any] = {"generated_text": prefix + best.text}
    if params.details:
        prefill = _prefill(state, final) if params.decoder_input_details else []
        wanted_top = bool(params.top_n_tokens)
        details = tgi.details(
            best, params.seed, _tokens(state, best), prefill, _top(state, best, wanted_top)
        )
        if others:
            details["best_of_sequences"] = [
                {
                    "generated_text": prefix + o.text,
                    **tgi.details(
                        o, params.seed, _tokens(state, o), prefill, _top(state, o, wanted_top)
                    ),
                }
                for o in others
            ]
        body["details"] = details
    return body


async def _events(
    state: ServerState, req: tgi.TgiRequest, stream: AsyncIterator[RequestOutput], input_length: int
) -> AsyncIterator[bytes]:
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
        if not new_ids:  # finished without a new token (aborted): a closing event still needs one
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


async def _stream(request: Request, req: tgi.TgiRequest) -> Response:
    state = get_state(request)
    stream, ids = await _open(state, req, streamed=True)
    return EventStreamResponse(_events(state, req, stream, len(ids)))


@router.post("/generate")
async def generate(request: Request) -> Response:
    return JSONResponse(await _generate(request, await read_body(request, tgi.TgiRequest)))


@router.post("/generate_stream")
async def generate_stream(request: Request) -> Response:
    return await _stream(request, await read_body(request, tgi.TgiRequest))


@router.post("/")
async def compat_generate(request: Request) -> Response:
    req = await read_body(request, tgi.TgiRequest)
    if req.stream:
        return await _stream(request, req)
    return JSONResponse([await _generate(request, req)])


@router.get("/info")
async def info(request: Request) -> dict[str, Any]:
    state = get_state(request)
    stats = state.engine.stats() if state.engine is not None else None
    return {
        "model_id": state.model_names[0] if state.model_names else None,
        "model_sha": None,
        "model_pipeline_tag": "text-generation",
        "max_concurrent_requests": state.admission_limit,
        "max_best_of": MAX_N,
        "max_stop_sequences": MAX_STOP_STRINGS,
        "max_input_tokens": max(0, state.max_model_len - 1),
        "max_total_tokens": state.max_model_len,
        "vocab_size": state.vocab_size,  # tgserve's: the prompt token ids it accepts, [0, this)
        "router": "tgserve",
        "version": "0.1.0",
        # tgserve's: how the steps run now (C++ kernels, or PyTorch ops while they build)
        "forward_path": stats.forward_path if stats is not None else None,
    }
