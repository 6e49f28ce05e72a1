"""The FastAPI application factory: state, lifespan (load + warm-up), guard, error handlers, routes.

Contract: `create_app(settings, engine_factory, admission_limit, on_fatal)` returns a FastAPI
app whose routes are each API's (`API_ROUTERS`: server/openai/, server/anthropic/, server/responses/, server/tgi/,
server/operations.py)
and whose lifespan starts `ServerState.start()` (server/state.py: load in a worker thread, warm up, turn
ready) and drains on shutdown; `Guard` (server/guard.py) answers 413 / 401 / 503 before any
route; errors render in each API's own shape (server/errors.py). With `allowed_origins`,
Starlette's CORSMiddleware wraps OUTSIDE the guard: preflights from those origins are answered
before auth, and every response the guard or a route gives them (401 / 429 / 503 included)
carries `Access-Control-Allow-Origin`, so browsers can read errors. Credentials (cookies) are
never allowed: clients send their key in the Authorization header, which is allowed.
With `--role` (server/disagg.py) a prefill server gains its K/V route, a decode server its
prefill peer, and both their transfer's figures in /metrics. GET /openapi.json serves the API's OpenAPI document (server/openapi.py), /docs and /redoc show it
(server/docs_ui.py, assets from a package: no CDN); GET / is the playground (server/playground.py).
Outermost, HttpMetricsMiddleware counts every response by route and status (server/metrics/http.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Route

from engine import EngineCore
from server import __version__, disagg, operations
from server.anthropic import router as anthropic_router
from server.docs_ui import install_docs
from server.errors import install_error_handlers
from server.guard import Guard
from server.metrics import HttpMetrics, HttpMetricsMiddleware
from server.metrics.kv_transfer import KVTransferCollector
from server.openai import router as openai_router
from server.openapi import install_openapi
from server.playground import install_playground
from server.request_id import RequestIdMiddleware
from server.responses import router as responses_router
from server.settings import Settings
from server.sleep import build_router as sleep_router
from server.state import ServerState
from server.tgi import router as tgi_router
from server.tracing import TracingMiddleware, tracer_provider

__all__ = ["API_ROUTERS", "ServerState", "create_app"]
# Each API's routes, built on the app's state: OpenAI, Anthropic, TGI, then the operational ones.
API_ROUTERS = (
    openai_router.build_router,
    anthropic_router.build_router,
    responses_router.build_router,
    tgi_router.build_router,
    operations.build_router,
)


def create_app(
    settings: Settings,
    engine_factory: Callable[[], EngineCore],
    admission_limit: int,
    on_fatal: Callable[[], None] = lambda: None,
    span_exporter: Any = None,
) -> FastAPI:
    """`span_exporter`: where traces go instead of --otlp-traces-endpoint (tests)."""
    state = ServerState(settings, engine_factory, admission_limit, on_fatal)
    traces = tracer_provider(settings.otlp_traces_endpoint, span_exporter)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loading = asyncio.create_task(state.start())
        idle = (
            state.sleep
            and state.sleep.idle_timeout
            and asyncio.create_task(state.sleep.watch_idle())
        )
        yield
        for task in (loading, idle):
            if task and not task.done():
                task.cancel()
        await state.drain(0.0)
        if traces is not None:
            traces.shutdown()  # the spans still batched are sent

    app = FastAPI(
        title="tgserve",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.state.tgserve = state
    install_error_handlers(app, state.metrics.reject)
    routers = [build(state) for build in API_ROUTERS]
    if state.sleep is not None:  # --enable-sleep-mode
        routers.append(sleep_router(state.sleep))
    if settings.role == "prefill":  # its decode server asks it for prompts' K/V
        routers.append(disagg.build_router(state))
    elif settings.role == "decode":  # prompts are computed by its prefill server
        state.prefill_peer = disagg.PrefillPeer(settings, state)
    if settings.role is not None:
        link = KVTransferCollector(lambda: state.engine.kv_link if state.engine else None)
        state.metrics.registry.register(link)
    for router in routers:
        app.include_router(router)
    install_openapi(app, settings)
    install_docs(app, app.openapi_url)
    install_playground(app)
    app.add_middleware(Guard, state=state)
    if traces is not None:  # outside the guard (its refusals are traced), inside the id
        app.add_middleware(TracingMiddleware, provider=traces)
    app.add_middleware(RequestIdMiddleware)  # outside the guard: its refusals carry the id too
    if settings.allowed_origins:  # added last: it wraps the guard
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.allowed_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["*"],
            expose_headers=["Retry-After", "X-Request-Id"],
            allow_credentials=False,
            max_age=600,
        )
    http_metrics = HttpMetrics(state.metrics.registry)  # outermost: every answer is counted
    routes = [route for router in routers for route in router.routes]
    routes += [route for route in app.router.routes if isinstance(route, Route)]  # /openapi.json
    app.add_middleware(HttpMetricsMiddleware, metrics=http_metrics, routes=routes)
    return app
