"""Operational routes: /health, /ready, /metrics, /tokenize, /detokenize.

Contract: /health is 200 while the process is alive and the engine loop makes progress (the
AsyncEngine watchdog; loading counts as healthy), else 503. /ready is 200 only once weights
are loaded and the warm-up request ran, and 503 again while draining or once the engine loop
died. /metrics is Prometheus text. /tokenize takes `prompt` (text) or `messages` (through the
chat template) and returns `{"tokens", "count", "max_model_len"}`; /detokenize turns `tokens`
back into `{"prompt"}`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from server.errors import ApiError, read_body
from server.routes_openai import chat_prompt
from server.schemas_openai import DetokenizeRequest, TokenizeRequest
from server.state import get_state

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> Response:
    engine = get_state(request).engine
    if engine is not None and not engine.is_healthy():
        return JSONResponse({"status": "unhealthy"}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/ready")
async def ready(request: Request) -> Response:
    state = get_state(request)
    if state.ready:
        return JSONResponse({"status": "ready"})
    status = "dead" if state.dead_reason else "draining" if state.draining else "loading"
    return JSONResponse({"status": status}, status_code=503, headers={"Retry-After": "5"})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    body, content_type = get_state(request).metrics.render()
    return Response(body, media_type=content_type)


@router.post("/tokenize")
async def tokenize(request: Request) -> dict[str, Any]:
    state = get_state(request)
    req = await read_body(request, TokenizeRequest)
    state.model_name(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise ApiError(400, "give exactly one of 'prompt' or 'messages'", param="prompt")
    if req.messages is not None:
        tokens = (
            await chat_prompt(state, req.messages, req.add_generation_prompt is not False)
        ).token_ids
    else:
        add_special = req.add_special_tokens is not False
        tokens = await asyncio.to_thread(state.require_tokenizer().encode, req.prompt, add_special)
    return {"tokens": tokens, "count": len(tokens), "max_model_len": state.max_model_len}


@router.post("/detokenize")
async def detokenize(request: Request) -> dict[str, Any]:
    state = get_state(request)
    req = await read_body(request, DetokenizeRequest)
    state.model_name(req.model)
    tokenizer = state.require_tokenizer()
    vocab = tokenizer.vocab_size
    bad = [t for t in req.tokens if not 0 <= t < vocab]
    if bad:
        raise ApiError(
            400, f"token id {bad[0]} is outside the vocabulary (size {vocab})", param="tokens"
        )
    return {"prompt": await asyncio.to_thread(tokenizer.decode, req.tokens, False)}
