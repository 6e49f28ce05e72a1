"""ServerState: what the routes share — the engine seam once loaded, readiness, draining, metrics.

Contract:
- `start()` loads the engine in a daemon thread (`engine_factory()`; the process keeps answering
  /health meanwhile, and a signal during the load ends the process without waiting for it),
  starts the AsyncEngine, runs the warm-up (engine/warm_up.py) and only then turns ready. A
  failed load is logged and `on_fatal` (given at construction) is called. `info`: the engine's
  `EngineInfo` as it came (`tokenizer`, `max_model_len`, `vocab_size` read it).
- `open()` is how routes start generation (see server/admission.py; grammars compile on
  `workers`, within `--grammar-compile-timeout`); on a decode server `prefill_peer` first has
  the prompts computed by its prefill server (server/disagg.py).
- `require_ready()`: 503 + Retry-After until ready (loading), and while draining or dead;
  `model_name()` calls it first (a request sent while loading is told to retry), and takes a
  served name, none, or a placeholder TGI-style clients send for "the model this server
  serves" (`PLACEHOLDER_MODEL_NAMES`), which it answers with the served name.
- `drain(timeout)`: not ready any more; in-flight work gets `timeout` seconds, then is aborted.
- `sleep` (--enable-sleep-mode): asleep, `readiness_error` is its 503 (after dead, draining).
- When the engine loop dies (AsyncEngine's `on_dead`), the state turns not ready, logs why and
  calls `on_fatal` on the event loop: `tgserve serve` then exits non-zero to be restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from engine import (
    AsyncEngine,
    EngineCore,
    EngineInfo,
    RequestOutput,
    SamplingParams,
    warm_up_requests,
)
from server import tracing
from server.admission import open_streams
from server.errors import ApiError
from server.fair_share import FairShare, prompt_share
from server.metrics import ServerMetrics
from server.settings import Settings
from server.sleep import SleepMode
from server.token_texts import TokenTexts
from server.worker_pool import WorkerPool, settle

logger = logging.getLogger("tgserve.server")
# What clients of single-model servers send when they name no model: huggingface_hub's
# InferenceClient(URL).chat_completion sends "dummy", TGI's documented OpenAI examples "tgi".
PLACEHOLDER_MODEL_NAMES = frozenset({"dummy", "tgi"})
# Every 503 says when to come back: loading, draining (a restart or another replica), restarting.
RETRY_AFTER = {"Retry-After": "5"}


class ServerState:
    """What the routes share: the engine seam once loaded, readiness, draining, metrics."""

    def __init__(
        self,
        settings: Settings,
        engine_factory: Callable[[], EngineCore],
        admission_limit: int,
        on_fatal: Callable[[], None] = lambda: None,
    ):
        """`on_fatal()`: the model failed to load or the engine loop died (called on the event
        loop); `tgserve serve` exits non-zero then, to be restarted."""
        self.settings = settings
        self.engine_factory = engine_factory
        self.admission_limit = admission_limit
        self.on_fatal = on_fatal
        self.engine: AsyncEngine | None = None
        self.info: EngineInfo | None = None  # the engine's own description, once loaded
        self.token_texts: TokenTexts | None = None
        self.model_names: tuple[str, ...] = settings.served_model_name
        self.ready = self.draining = False
        self.dead_reason: str | None = None  # the engine loop died: the process is stopping
        self.prefill_peer: Any = None  # --role decode: server/disagg.py's PrefillPeer
        self.created = int(time.time())
        # Grammars compile here (server/admission.py): two threads leave the engine's loop a
        # core on a small host; as many may wait as requests may be in flight.
        self.workers = WorkerPool(threads=2, max_waiting=admission_limit)
        self.fair = FairShare(admission_limit)
        self.prompt_share = settings.max_prompts_per_request or prompt_share(admission_limit)
        # Sleep mode (server/sleep.py; None: off): the pool, or the engine, freed while idle.
        self.sleep = (
            SleepMode(self, settings.sleep_idle_timeout, self._load)
            if settings.enable_sleep_mode
            else None
        )
        self.metrics = ServerMetrics(
            lambda: self.engine.stats() if self.engine else None,
            vllm_compatible=settings.vllm_compatible_metrics,
        )

    @property
    def tokenizer(self) -> Any:
        return self.info.tokenizer if self.info is not None else None

    @property
    def max_model_len(self) -> int:
        return self.info.max_model_len if self.info is not None else 0

    @property
    def vocab_size(self) -> int | None:
        """Token ids a prompt may hold, once loaded."""
        return self.info.vocab_size if self.info is not None else None

    async def start(self) -> None:
        """Load, start the loop, warm up, turn ready; any failure is fatal (logged, no trace)."""
        if self.settings.enable_fault_injection:
            logger.warning(
                "fault injection is ON (--enable-fault-injection): requests may fail or kill the "
                "engine on purpose; for tests only, never in production"
            )
        try:
            self._adopt(await self._load())
            t0 = time.monotonic()
            await self._warm_up()
        except Exception as exc:
            logger.error("starting the engine failed: %s: %s", type(exc).__name__, exc)
            self.on_fatal()
            return
        if not self.draining:
            self.ready = True
            logger.info("ready (warm-up took %.2fs)", time.monotonic() - t0)

    async def _load(self) -> EngineCore:
        return await _in_daemon_thread(self.engine_factory)

    def _adopt(self, engine: EngineCore) -> None:
        info = self.info = engine.info
        self.token_texts = TokenTexts(info.tokenizer) if info.tokenizer is not None else None
        self.model_names = self.model_names or (info.model_name,)
        self.metrics.bind_model(self.model_names[0])
        loop = asyncio.get_running_loop()
        self.engine = AsyncEngine(
            engine,
            self.admission_limit,
            stall_timeout=self.settings.health_stall_timeout,
            on_dead=lambda reason: _call_soon(loop, self._engine_died, reason),
        )
        self.engine.start()
        if info.tokenizer is None:
            logger.warning(
                "%s has no usable tokenizer: serving token-id prompts only (text prompts, chat "
                "and the playground answer 400; /v1/models says token_ids_only)",
                info.model_name,
            )
        logger.info(
            "loaded %s (served as %s); context %d tokens; KV cache %d blocks x %d = %d tokens",
            info.model_name,
            ", ".join(self.model_names),
            info.max_model_len,
            info.kv_blocks_total,
            info.kv_block_size,
            info.kv_tokens,
        )

    def _engine_died(self, reason: str) -> None:
        self.ready, self.dead_reason = False, reason
        logger.error("the engine loop died (%s); the server stops", reason)
        self.on_fatal()

    async def _warm_up(self) -> None:
        """engine/warm_up.py's requests, one after the other (why two long prompts: there)."""
        token = getattr(self.tokenizer, "bos_token_id", None) or 0
        for request_id, prompt, params in warm_up_requests(self.info, token):
            async for output in self.engine.generate(request_id, prompt, params):
                if output.error is not None:
                    raise RuntimeError(f"the warm-up request failed: {output.error}")

    async def drain(self, timeout: float) -> None:
        """Not ready any more; in-flight work gets `timeout` seconds, then is aborted."""
        self.draining, self.ready = True, False
        if self.engine is not None:
            await self.engine.shutdown(timeout)

    def readiness_error(self) -> ApiError | None:
        """The 503 to answer while draining or loading (with Retry-After); None once ready."""
        if self.dead_reason is not None:
            return ApiError(
                503,
                "the engine has stopped; the server is restarting",
                code="dead",
                headers=RETRY_AFTER,
            )
        if self.draining:
            return ApiError(
                503, "the server is shutting down", code="draining", headers=RETRY_AFTER
            )
        if self.sleep is not None and (asleep := self.sleep.error()) is not None:
            return asleep
        if not self.ready:
            return ApiError(
                503,
                "the model is still loading; retry shortly",
                code="not_ready",
                headers=RETRY_AFTER,
            )
        return None

    def require_ready(self) -> None:
        error = self.readiness_error()
        if error is not None:
            raise error

    def model_name(self, requested: str | None) -> str:
        name = self._model_name(requested)
        trace = tracing.current()
        if trace is not None:
            trace.attributes["gen_ai.request.model"] = name
        return name

    def _model_name(self, requested: str | None) -> str:
        self.require_ready()  # before the name check: the names are known once loaded
        if requested in self.model_names or requested in self.adapter_names():
            return requested
        if requested is None or requested in PLACEHOLDER_MODEL_NAMES:
            return self.model_names[0]
        raise ApiError(
            404,
            f"the model '{requested}' does not exist; see /v1/models",
            param="model",
            code="model_not_found",
        )

    def adapter_names(self) -> list[str]:
        """The LoRA adapters served as models (engine/lora_adapters.py), each a `model` name."""
        adapters = self.engine.adapters if self.engine is not None else None
        return adapters.names() if adapters is not None else []

    def with_adapter(self, params: list[SamplingParams], model: str) -> list[SamplingParams]:
        """`params` run under the LoRA adapter `model` names (unchanged for the base model)."""
        if model not in self.adapter_names():
            return params
        return [dataclasses.replace(p, adapter=model) for p in params]

    def require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ApiError(
                400, "this model has no tokenizer: send token ids instead of text", param="prompt"
            )
        return self.tokenizer

    async def open(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        timeout: float | None,
        api_fields: dict[str, str] | None = None,
        request_id: str | None = None,
    ) -> list[AsyncIterator[RequestOutput]]:
        """Admits one engine request per prompt (all or none); raises ApiError before any byte.
        `api_fields`: engine field names -> the request's API fields, for a 400's `param`;
        `request_id`: the id the client sees (server/request_id.py), the engine's too."""
        self.require_ready()
        if self.prefill_peer is not None:
            await self.prefill_peer.prefill(prompts, params)
        return await open_streams(
            self.engine,
            self.metrics,
            prompts,
            params,
            timeout,
            self.settings.request_timeout,
            api_fields,
            self.workers,
            self.settings.grammar_compile_timeout,
            request_id,
            self.fair,
        )


async def _in_daemon_thread(work: Callable[[], Any]) -> Any:
    """`work()` in a daemon thread. Not asyncio.to_thread: its executor's threads are joined
    when the process exits, so a SIGTERM during start-up would wait for the load (or a C++
    kernel build) to end; a daemon thread is left behind, and a kernel build's child process
    is killed at exit (models/cpu_kernels/builder.py)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def run() -> None:
        try:
            result, error = work(), None
        except BaseException as exc:  # handed to the awaiting task, as to_thread does
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, done, result, error)

    threading.Thread(target=run, name="tgserve-load", daemon=True).start()
    return await done


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[str], None], arg: str) -> None:
    with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody to tell
        loop.call_soon_threadsafe(callback, arg)
