"""Responses routes: POST /v1/responses, GET /v1/responses/{id}, DELETE /v1/responses/{id}.

Contract: `build_router(state)` returns the routes, each handing its request to
`ResponsesServing` (server/responses/serving.py): answers and errors (the OpenAI error shape)
are its.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.responses.serving import ResponsesServing
from server.state import ServerState


def build_router(state: ServerState) -> APIRouter:
    router = APIRouter()
    serving = ResponsesServing(state)

    @router.post("/v1/responses")
    async def create(request: Request) -> Response:
        return await serving.create(request)

    @router.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str) -> dict[str, Any]:
        return serving.retrieve(response_id)

    @router.delete("/v1/responses/{response_id}")
    async def delete(response_id: str) -> dict[str, Any]:
        return serving.delete(response_id)

    return router
