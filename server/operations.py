"""Operational routes: /health, /ready, /metrics, /version.

Contract: /health is 200 while the process is alive and the engine loop makes progress (the
AsyncEngine watchdog; loading counts as healthy), else 503. /ready is 200 only once weights
are loaded and the warm-up request ran, and 503 again while draining or once the engine loop
died (and on a decode server once its prefill server is gone: `prefill_unavailable`). /metrics is Prometheus text (server/metrics/). /version is `{"version"}`, tgserve's
version (as `tgserve --version` prints it), answered while the model loads too.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from server import __version__
from server.state import ServerState


def build_router(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health() -> Response:
        if state.engine is not None and not state.engine.is_healthy():
            return JSONResponse({"status": "unhealthy"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @router.get("/ready")
    async def ready() -> Response:
        lost = state.prefill_peer is not None and state.prefill_peer.lost  # server/disagg.py
        if state.ready and not lost:
            return JSONResponse({"status": "ready"})
        status = "dead" if state.dead_reason else "draining" if state.draining else "loading"
        status = "sleeping" if state.sleep is not None and state.sleep.level else status
        status = "prefill_unavailable" if state.ready else status
        return JSONResponse({"status": status}, status_code=503, headers={"Retry-After": "5"})

    @router.get("/metrics")
    async def metrics() -> Response:
        body, content_type = state.metrics.render()
        return Response(body, media_type=content_type)

    @router.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    return router
