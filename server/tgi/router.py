"""TGI routes: POST /generate, POST /generate_stream, POST / (dispatch on "stream"), GET /info.

Contract: `build_router(state)` returns the routes; answers are TgiServing's
(server/tgi/serving.py). `POST /` answers as `/generate_stream` when `"stream"` is true, else
the `/generate` body wrapped in a list (as TGI does; huggingface_hub's InferenceClient posts
there). `/info` describes the served model and the server's limits in TGI's shape.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from engine import MAX_N, MAX_STOP_STRINGS
from server.errors import read_body
from server.state import ServerState
from server.tgi.protocol import TgiRequest
from server.tgi.serving import TgiServing


def build_router(state: ServerState) -> APIRouter:
    router = APIRouter()
    serving = TgiServing(state)

    @router.post("/generate")
    async def generate(request: Request) -> Response:
        return JSONResponse(await serving.generate(request, await read_body(request, TgiRequest)))

    @router.post("/generate_stream")
    async def generate_stream(request: Request) -> Response:
        return await serving.stream(request, await read_body(request, TgiRequest))

    @router.post("/")
    async def compat_generate(request: Request) -> Response:
        req = await read_body(request, TgiRequest)
        if req.stream:
            return await serving.stream(request, req)
        return JSONResponse([await serving.generate(request, req)])

    @router.get("/info")
    async def info() -> dict[str, Any]:
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

    return router
