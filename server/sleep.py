"""Sleep mode (vLLM's names, behind --enable-sleep-mode): free the engine's memory while idle.

Contract:
- `POST /sleep?level=1|2` (default 1): only when ready and no request is in flight (else 409,
  or the readiness 503). The engine's loop stops (queued K/V tier writes land first); level 1
  frees the KV pool (engine/sleep.py; the weights stay), level 2 drops the whole engine, weights
  included. `POST /wake_up`: level 1 takes the pool again, level 2 builds a new engine from the
  model source (the start-up's `engine_factory`), then the loop restarts and the server is ready.
  Both answer `{"is_sleeping": ...}` and do nothing when already in the state asked for.
  `GET /is_sleeping` -> `{"is_sleeping": bool, "level": 0|1|2}`.
- While asleep every other non-operational route answers 503 (`code` "sleeping", Retry-After)
  and /ready 503 `{"status": "sleeping"}`; /health stays 200 (the process is fine).
- `--sleep-idle-timeout S`: after S seconds with nothing in flight the server sleeps at level 1
  on its own; the next request that meets it gets the 503 and wakes it (retry shortly).
The prefix cache's K/V goes with the pool (the K/V tiers keep what they hold).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from server.errors import ApiError

logger = logging.getLogger("tgserve.server")
ROUTES = frozenset({"/sleep", "/wake_up", "/is_sleeping"})  # answered while asleep


class SleepMode:
    def __init__(
        self, state: Any, idle_timeout: float | None, rebuild: Callable[[], Awaitable[Any]]
    ) -> None:
        """`state`: the ServerState; `rebuild()`: a new engine from the model source."""
        self.state = state
        self._rebuild = rebuild
        self.idle_timeout = idle_timeout
        self.level = 0  # 0: awake
        self.by_idle = False  # asleep on the idle timeout: the next request wakes it
        self._engine: Any = None  # the Engine kept through a level-1 sleep
        self._lock = asyncio.Lock()
        self._waking: asyncio.Task | None = None

    def error(self) -> ApiError | None:
        """The 503 for a request that meets a sleeping server (it starts a wake-up after an
        idle sleep), or None when awake."""
        if not self.level:
            return None
        if self.by_idle and self._waking is None:
            self._waking = asyncio.get_running_loop().create_task(self.wake_up())
        how = "waking up; retry shortly" if self.by_idle else "POST /wake_up wakes it"
        return ApiError(
            503, f"the server is sleeping ({how})", code="sleeping", headers={"Retry-After": "5"}
        )

    async def sleep(self, level: int, by_idle: bool = False) -> None:
        from engine import release_kv_pool

        async with self._lock:
            if self.level:
                return
            self.state.require_ready()
            engine = self.state.engine
            if engine.num_pending():
                raise ApiError(
                    409,
                    f"{engine.num_pending()} request(s) in flight; sleep when idle",
                    code="busy",
                )
            self.state.ready, self.level, self.by_idle = False, level, by_idle
            core = engine.engine
            try:
                await engine.shutdown(0.0)
                self.state.engine = None
                if level == 1:
                    freed = await asyncio.to_thread(release_kv_pool, core)
                    self._engine = core
                    logger.info("asleep (level 1): KV pool freed (%d MiB)", freed >> 20)
                else:
                    del core, engine
                    await asyncio.to_thread(gc.collect)
                    logger.info("asleep (level 2): engine and weights dropped")
            except ValueError as exc:  # level 1 refused (CUDA graphs): awake again as before
                self.level, self._engine = 0, None
                self.state._adopt(core)
                self.state.ready = True
                raise ApiError(400, str(exc), param="level") from None

    async def wake_up(self) -> None:
        from engine import restore_kv_pool

        async with self._lock:
            if not self.level:
                return
            if self.level == 1:
                core = self._engine
                await asyncio.to_thread(restore_kv_pool, core)
            else:
                core = await self._rebuild()
            level, self._engine, self.level, self.by_idle = self.level, None, 0, False
            self.state._adopt(core)
            if level == 2:  # a new engine: its first steps warmed as at start-up
                await self.state._warm_up()
            self.state.ready, self._waking = True, None
            logger.info("awake")

    async def watch_idle(self) -> None:
        """Sleeps at level 1 after `idle_timeout` seconds with nothing in flight (a task)."""
        assert self.idle_timeout is not None
        last_busy = time.monotonic()
        while True:
            await asyncio.sleep(min(1.0, self.idle_timeout / 4))
            engine = self.state.engine
            if self.level or not self.state.ready or engine is None or engine.num_pending():
                last_busy = time.monotonic()
            elif time.monotonic() - last_busy >= self.idle_timeout:
                try:
                    await self.sleep(1, by_idle=True)
                except ApiError as exc:  # a request came in meanwhile, or level 1 refused
                    logger.info("idle sleep skipped: %s", exc.message)
                last_busy = time.monotonic()


def build_router(sleep: SleepMode) -> APIRouter:
    router = APIRouter()

    @router.post("/sleep")
    async def sleep_route(level: int = Query(1)) -> JSONResponse:
        if level not in (1, 2):
            raise ApiError(400, f"level must be 1 or 2, got {level}", param="level")
        await sleep.sleep(level)
        return JSONResponse({"is_sleeping": True, "level": sleep.level})

    @router.post("/wake_up")
    async def wake_up() -> JSONResponse:
        await sleep.wake_up()
        return JSONResponse({"is_sleeping": False, "level": 0})

    @router.get("/is_sleeping")
    async def is_sleeping() -> JSONResponse:
        return JSONResponse({"is_sleeping": bool(sleep.level), "level": sleep.level})

    return router
