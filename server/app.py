"""The FastAPI application factory: state, lifespan (load + warm-up), guard, error handlers, routes.

Contract: `create_app(settings, engine_factory, admission_limit)` returns a FastAPI app whose
lifespan starts `ServerState.start()` (server/state.py: load in a worker thread, warm up, turn
ready) and drains on shutdown; `Guard` (server/guard.py) answers 413 / 401 / 503 before any
route; errors render in each API's own shape (server/errors.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from engine import EngineCore
from server.errors import install_error_handlers
from server.guard import Guard
from server.settings import Settings
from server.state import ServerState, get_state

__all__ = ["ServerState", "create_app", "get_state"]


def create_app(
    settings: Settings, engine_factory: Callable[[], EngineCore], admission_limit: int
) -> FastAPI:
    from server import routes_misc, routes_openai, routes_tgi  # routes import get_state from here

    state = ServerState(settings, engine_factory, admission_limit)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loading = asyncio.create_task(state.start())
        yield
        if not loading.done():
            loading.cancel()
        await state.drain(0.0)

    app = FastAPI(
        title="tgserve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.tgserve = state
    install_error_handlers(app, state.metrics.reject)
    for module in (routes_openai, routes_tgi, routes_misc):
        app.include_router(module.router)
    app.add_middleware(Guard, state=state)
    return app
