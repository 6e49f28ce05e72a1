"""The FastAPI application: runtime state, lifespan (load + warm-up), guard middleware, routes.

Contract:
- `create_app(settings, engine_factory, admission_limit)` returns a FastAPI app
  whose lifespan loads the engine in a worker thread (`engine_factory()`, the process keeps
  answering /health meanwhile), starts the AsyncEngine, runs one warm-up request and only
  then turns ready. A failed load is logged and `ServerState.on_fatal` is called.
- The guard (outermost after error handling) answers, before any route runs: 413 when the
  body is larger than `max_body_bytes` (Content-Length or counted while reading), 401 without
  a valid `Authorization: Bearer` key (constant-time comparison; the key is never logged), and
  503 while loading or draining. `settings.public_routes` skip auth and readiness.
- `ServerState.open()` is how routes start generation: admission errors become ApiErrors
  (400 invalid, 429 + Retry-After overloaded, 503 unavailable) before any response byte, and
  each returned stream records its timings into the metrics.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine import (
    AsyncEngine,
    EngineCore,
    EngineUnavailable,
    Overloaded,
    RequestOutput,
    RequestStream,
    SamplingParams,
)
from server.errors import ApiError, error_response, install_error_handlers, rejection_reason
from server.metrics import RequestTimer, ServerMetrics
from server.schemas import to_api_error
from server.schemas_openai import TokenTexts
from server.settings import Settings

logger = logging.getLogger("tgserve.server")


class ServerState:
    """What the routes share: the engine seam once loaded, readiness, draining, metrics."""

    def __init__(
        self,
        settings: Settings,
        engine_factory: Callable[[], EngineCore],
        admission_limit: int,
    ):
        self.settings = settings
        self.engine_factory = engine_factory
        self.admission_limit = admission_limit
        self.engine: AsyncEngine | None = None
        self.tokenizer: Any = None
        self.token_texts: TokenTexts | None = None
        self.max_model_len = 0
        self.model_names: tuple[str, ...] = settings.served_model_name
        self.ready = False
        self.draining = False
        self.created = int(time.time())
        self.metrics = ServerMetrics(lambda: self.engine.stats() if self.engine else None)
        self.on_fatal: Callable[[], None] = lambda: None

    async def start(self) -> None:
        """Load, start the loop, warm up, turn ready; any failure is fatal (logged, no trace)."""
        try:
            engine = await asyncio.to_thread(self.engine_factory)
            self._adopt(engine)
            t0 = time.monotonic()
            await self._warm_up()
        except Exception as exc:
            logger.error("starting the engine failed: %s: %s", type(exc).__name__, exc)
            self.on_fatal()
            return
        if not self.draining:
            self.ready = True
            logger.info("ready (warm-up took %.2fs)", time.monotonic() - t0)

    def _adopt(self, engine: EngineCore) -> None:
        info = engine.info
        self.tokenizer = info.tokenizer
        self.token_texts = TokenTexts(info.tokenizer) if info.tokenizer is not None else None
        self.max_model_len = info.max_model_len
        self.model_names = self.model_names or (info.model_name,)
        self.engine = AsyncEngine(
            engine, self.admission_limit, stall_timeout=self.settings.health_stall_timeout
        )
        self.engine.start()
        logger.info(
            "loaded %s (served as %s); context %d tokens; KV cache %d blocks x %d = %d tokens",
            info.model_name,
            ", ".join(self.model_names),
            info.max_model_len,
            info.kv_blocks_total,
            info.kv_block_size,
            info.kv_tokens,
        )

    async def _warm_up(self) -> None:
        token = getattr(self.tokenizer, "bos_token_id", None) or 0
        stream = self.engine.generate(
            "warm-up", [token], SamplingParams(max_tokens=1, temperature=0.0)
        )
        async for output in stream:
            if output.error is not None:
                raise RuntimeError(f"the warm-up request failed: {output.error}")

    async def drain(self, timeout: float) -> None:
        """Not ready any more; in-flight work gets `timeout` seconds, then is aborted."""
        self.draining, self.ready = True, False
        if self.engine is not None:
            await self.engine.shutdown(timeout)

    def model_name(self, requested: str | None) -> str:
        if requested is None or requested in self.model_names:
            return requested or self.model_names[0]
        raise ApiError(
            404,
            f"the model '{requested}' does not exist; see /v1/models",
            param="model",
            code="model_not_found",
        )

    def require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ApiError(
                400, "this model has no tokenizer: send token ids instead of text", param="prompt"
            )
        return self.tokenizer

    async def open(
        self, prompts: list[list[int]], params: list[SamplingParams], timeout: float | None
    ) -> list[AsyncIterator[RequestOutput]]:
        """Admits one engine request per prompt (all or none); raises ApiError before any byte."""
        if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
            raise ApiError(
                400, f"timeout must be a positive number of seconds, got {timeout}", param="timeout"
            )
        timeouts = [t for t in (timeout, self.settings.request_timeout) if t is not None]
        deadline = time.monotonic() + min(timeouts) if timeouts else None
        if self.engine is None:
            raise ApiError(503, "the model is still loading", code="not_ready")
        streams: list[RequestStream] = []
        try:
            for prompt, sampling in zip(prompts, params, strict=True):
                streams.append(self._admit(self.engine, prompt, sampling, deadline))
            for stream in streams:
                await self._admitted(stream)
        except BaseException:
            for stream in streams:
                stream.close()
            raise
        return [self._tracked(stream, self.metrics.timer()) for stream in streams]

    def _admit(
        self,
        engine: AsyncEngine,
        prompt: list[int],
        sampling: SamplingParams,
        deadline: float | None,
    ) -> RequestStream:
        try:
            return engine.generate(uuid.uuid4().hex, prompt, sampling, deadline)
        except Overloaded as exc:
            raise self._overloaded(exc) from None
        except EngineUnavailable as exc:
            raise ApiError(503, str(exc), code="unavailable") from None
        except ValueError as exc:
            raise to_api_error(exc) from None

    async def _admitted(self, stream: RequestStream) -> None:
        try:
            await stream.admitted()
        except Overloaded as exc:
            raise self._overloaded(exc) from None
        except ValueError as exc:
            raise to_api_error(exc) from None

    @staticmethod
    def _overloaded(exc: Overloaded) -> ApiError:
        retry = str(max(1, math.ceil(exc.retry_after)))
        return ApiError(
            429,
            f"the server is overloaded ({exc}); retry later",
            code="overloaded",
            headers={"Retry-After": retry},
        )

    @staticmethod
    async def _tracked(stream: RequestStream, timer: RequestTimer) -> AsyncIterator[RequestOutput]:
        try:
            async for output in stream:
                timer.observe(output)
                yield output
        finally:
            stream.close()
            timer.close()


def get_state(request: Request) -> ServerState:
    return request.app.state.tgserve


class Guard:
    """Pure ASGI middleware (it must not buffer streams): body limit, auth, readiness."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state
        self.keys = [key.encode() for key in state.settings.api_key]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, state = scope["path"], self.state
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        limit = state.settings.max_body_bytes
        error = None
        if _content_length(headers) > limit:
            error = ApiError(
                413, f"the request body is larger than {limit} bytes", code="request_too_large"
            )
        elif path not in state.settings.public_routes:
            if self.keys and not self._authorized(headers.get("authorization", "")):
                error = ApiError(
                    401,
                    "a valid API key is needed: 'Authorization: Bearer <key>'",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
            elif state.draining:
                error = ApiError(503, "the server is shutting down", code="draining")
            elif not state.ready:
                error = ApiError(
                    503,
                    "the model is still loading; retry shortly",
                    code="not_ready",
                    headers={"Retry-After": "5"},
                )
        if error is not None:
            state.metrics.reject(rejection_reason(error.status))
            return await error_response(path, error)(scope, receive, send)
        await self.app(scope, _limited(receive, limit), send)

    def _authorized(self, header: str) -> bool:
        scheme, _, token = header.partition(" ")
        given = token.strip().encode()
        matched = False
        for key in self.keys:  # no early exit: the time taken does not depend on which key
            matched |= hmac.compare_digest(given, key)
        return matched and scheme.lower() == "bearer"


def _content_length(headers: dict[str, str]) -> int:
    try:
        return int(headers.get("content-length", "0"))
    except ValueError:
        return 0  # malformed: the streamed byte count still enforces the limit


def _limited(receive: Receive, limit: int) -> Receive:
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:  # raised inside the route: the error handlers render and count it
                raise ApiError(
                    413, f"the request body is larger than {limit} bytes", code="request_too_large"
                )
        return message

    return wrapped


def create_app(
    settings: Settings, engine_factory: Callable[[], Any], admission_limit: int
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
