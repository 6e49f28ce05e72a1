"""Anthropic routes: POST /v1/messages and POST /v1/messages/count_tokens.

Contract: `build_router(state)` returns the routes, each handing its request to
`MessagesServing` (server/anthropic/serving.py): answers and errors are its. Errors on these
paths take Anthropic's shape (server/errors.py); the guard accepts the key as `x-api-key`
beside `Authorization: Bearer`, as Anthropic's clients send it.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.anthropic.serving import MessagesServing
from server.state import ServerState


def build_router(state: ServerState) -> APIRouter:
    router = APIRouter()
    serving = MessagesServing(state)

    @router.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await serving.create(request)

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> dict[str, int]:
        return await serving.count_tokens(request)

    return router
