"""Prefill/decode disaggregation, the HTTP side (issue 45; the K/V side is engine/kv_transfer).

Contract:
- `open_link(settings, engine)`: in the load thread, after the model is built, a server with
  `--role` joins the K/V transfer group at --kv-transfer-addr (`engine.open_kv_link`), waiting
  --kv-transfer-timeout for its peer: a peer that never comes fails the start-up, naming the
  address. A decode server then waits (as long) for its prefill server's /ready: it turns
  ready only once its prompts can be computed.
- A prefill server serves `POST /kv_transfer/prefill` `{"prompt_token_ids": [...],
  "transfer_id": int}`: it computes the prompt (one greedy token, discarded), exports its
  blocks between two steps and queues them for the sender, then answers `{"transfer_id",
  "blocks", "prefill_seconds", "export_seconds"}` without waiting for the wire (the transfer
  overlaps the next prompt). The channel down: 503 naming the decode peer; the send queue
  full: 429 + Retry-After.
- A decode server's `PrefillPeer.prefill(prompts, params)` (ServerState.open awaits it before
  admission): every prompt with a full block before its last token and no LoRA adapter is
  computed by the prefill server, and it waits (--kv-transfer-timeout at most) until the
  blocks are in its RAM tier; its engine then loads them as a tier hit and computes only the
  tail. The prefill server unreachable, answering 5xx, or its blocks not in time or the
  channel down: 503 naming it (`code` "prefill_unavailable"), the request is not admitted; a
  429 from it (its queue full) is this server's 429. Another 4xx (a prompt it refuses):
  nothing is sent; this server's own validation answers. `lost`: the channel is down for good
  (no reconnection: restart the pair); the decode server's /ready answers 503 then.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import APIRouter
from pydantic import BaseModel

from engine import KVPeerError, KVSenderFull, SamplingParams
from server.errors import ApiError
from server.settings import Settings

logger = logging.getLogger("tgserve.server")
ROUTE = "/kv_transfer/prefill"


def open_link(settings: Settings, engine: Any) -> Any:
    from engine import open_kv_link  # imports torch: the load thread's

    link = open_kv_link(
        engine, settings.role, settings.kv_transfer_addr, settings.kv_transfer_timeout
    )
    logger.info("%s server: K/V transfer group joined at %s", settings.role, link.peer)
    if settings.role == "decode":
        wait_until_ready(settings.prefill_url.rstrip("/"), settings.kv_transfer_timeout)
    return link


def wait_until_ready(url: str, timeout: float, alive: Callable[[], bool] = lambda: True) -> None:
    """Polls a server's /ready until it answers 200 (RuntimeError past `timeout` seconds, or
    once `alive()` says its process is gone): a decode server's wait for its prefill server."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        while time.monotonic() < deadline and alive():
            try:
                if client.get(url + "/ready").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
    raise RuntimeError(f"the server {url} was not ready within {timeout:g}s")


class PrefillBody(BaseModel):
    prompt_token_ids: list[int]
    transfer_id: int


def build_router(state: Any) -> APIRouter:
    """The prefill server's route (`state`: the ServerState)."""
    router = APIRouter()

    @router.post(ROUTE, include_in_schema=False)
    async def prefill(body: PrefillBody) -> dict[str, float]:
        state.require_ready()
        link, t0 = state.engine.kv_link, time.perf_counter()
        tokens = body.prompt_token_ids
        params = SamplingParams(max_tokens=1, temperature=0.0)
        (stream,) = await state.open([tokens], [params], state.settings.kv_transfer_timeout)
        async for output in stream:
            if output.error is not None:
                raise ApiError(500, f"the prefill failed: {output.error}", code="prefill_failed")
        t1 = time.perf_counter()
        batch = await state.engine.call(lambda core: link.export(core, tokens, body.transfer_id))
        t2 = time.perf_counter()
        try:
            link.send(batch)
        except KVPeerError as exc:
            raise ApiError(503, str(exc), code="kv_peer_unavailable") from None
        except KVSenderFull as exc:
            raise ApiError(429, str(exc), code="overloaded", headers={"Retry-After": "1"}) from None
        return {
            "transfer_id": body.transfer_id,
            "blocks": len(batch.keys),
            "prefill_seconds": t1 - t0,
            "export_seconds": t2 - t1,
        }

    return router


class PrefillPeer:
    """A decode server's prefill server: asked over HTTP, its blocks awaited on the link."""

    def __init__(self, settings: Settings, state: Any) -> None:
        self.url = settings.prefill_url.rstrip("/")
        self.timeout = settings.kv_transfer_timeout
        self.state = state  # the ServerState: its engine's link and block size, once loaded
        key = settings.api_key[0] if settings.api_key else None  # the same keys on both
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.AsyncClient(headers=headers, timeout=self.timeout, trust_env=False)

    @property
    def lost(self) -> bool:
        """The K/V channel to the prefill server is down (the peer is gone: restart the pair)."""
        link = self.state.engine.kv_link if self.state.engine is not None else None
        return link is not None and link.broken is not None

    async def prefill(self, prompts: list[list[int]], params: list[SamplingParams]) -> None:
        link, block_size = self.state.engine.kv_link, self.state.info.kv_block_size
        if link.broken is not None:  # the peer went away: no prompt is sent to a lost cause
            raise self._unavailable(f"the K/V channel is down: {link.broken}")
        asks = [
            self._one(link, prompt)
            for prompt, p in zip(prompts, params, strict=True)
            if (len(prompt) - 1) // block_size and p.adapter is None
        ]
        await asyncio.gather(*asks)

    async def _one(self, link: Any, prompt: list[int]) -> None:
        transfer_id = secrets.randbits(62)
        arrived = asyncio.wrap_future(link.expect(transfer_id))  # before it may arrive
        body = {"prompt_token_ids": prompt, "transfer_id": transfer_id}
        try:
            reply = await self._client.post(self.url + ROUTE, json=body)
            if reply.status_code == 429:  # its queue is full: so is this pair's
                raise ApiError(
                    429,
                    f"the prefill server {self.url} is overloaded; retry later",
                    code="overloaded",
                    headers={"Retry-After": reply.headers.get("Retry-After", "1")},
                )
            if 400 <= reply.status_code < 500:  # this server's own validation answers
                return
            if reply.status_code != 200:
                raise self._unavailable(f"it answered {reply.status_code}")
            await asyncio.wait_for(arrived, self.timeout)
        except httpx.TransportError as exc:
            raise self._unavailable(f"it cannot be reached: {type(exc).__name__}") from None
        except TimeoutError:
            raise self._unavailable(f"its K/V did not arrive within {self.timeout:g}s") from None
        except KVPeerError as exc:
            raise self._unavailable(str(exc)) from None
        finally:
            link.forget(transfer_id)
            if not arrived.cancel() and not arrived.cancelled():
                arrived.exception()  # retrieved: asyncio logs none left unread

    def _unavailable(self, why: str) -> ApiError:
        logger.warning("prefill server %s failed a request: %s", self.url, why)
        return ApiError(
            503,
            f"the prefill server {self.url} failed this request's prompt ({why}); retry later",
            code="prefill_unavailable",
            headers={"Retry-After": "5"},
        )
