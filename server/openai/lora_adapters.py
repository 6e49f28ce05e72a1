"""LoRA adapters over HTTP: their model cards, and vLLM's run-time load / unload routes.

Contract: `adapter_cards(state, card)` lists each served adapter as a model card whose `parent`
is the base model and `root` the adapter's path (the base's own card: `root` its name, `parent`
null). `load_adapter(state, body)` / `unload_adapter(state, body)` take vLLM's bodies
(`{"lora_name", "lora_path"}` / `{"lora_name"}`) and answer 200 with vLLM's plain-text
"Success: ..." line; a refusal is a 400 naming the reason (a name in use or not loaded, a folder
tgserve cannot apply: DoRA, embedding adapters, a base-model mismatch, ...; an adapter that
requests in flight use). The routes exist only with `--enable-lora-runtime-updates`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from server.errors import ApiError, read_body
from server.state import ServerState


class LoadLoraAdapterRequest(BaseModel):
    lora_name: str
    lora_path: str


class UnloadLoraAdapterRequest(BaseModel):
    lora_name: str
    lora_int_id: int | None = None  # vLLM's; names are what tgserve goes by


def adapter_cards(
    state: ServerState, card: Callable[[str], dict[str, Any]]
) -> list[dict[str, Any]]:
    adapters = state.engine.adapters if state.engine is not None else None
    paths = adapters.paths() if adapters is not None else {}
    base = state.model_names[0] if state.model_names else None
    return [{**card(name), "root": path, "parent": base} for name, path in paths.items()]


def _adapters(state: ServerState):
    state.require_ready()
    adapters = state.engine.adapters if state.engine is not None else None
    if adapters is None or not adapters.slots:
        raise ApiError(400, "LoRA adapters are off: start with --max-loras or --lora", param=None)
    return adapters


async def load_adapter(state: ServerState, request: Request) -> PlainTextResponse:
    body = await read_body(request, LoadLoraAdapterRequest)
    adapters = _adapters(state)
    name = body.lora_name
    if not name or "/" in name or name in state.model_names:
        raise ApiError(400, f"lora_name {name!r} cannot name an adapter", param="lora_name")
    try:
        await asyncio.to_thread(adapters.register, name, body.lora_path)
    except ValueError as exc:  # LoraRefused and a name in use say why
        raise ApiError(400, str(exc), param="lora_path") from None
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


async def unload_adapter(state: ServerState, request: Request) -> PlainTextResponse:
    body = await read_body(request, UnloadLoraAdapterRequest)
    adapters = _adapters(state)
    name = body.lora_name
    try:
        adapters.unregister(name)
    except KeyError:
        raise ApiError(404, f"the LoRA adapter '{name}' is not loaded", param="lora_name") from None
    except ValueError as exc:  # in use by requests in flight
        raise ApiError(400, str(exc), param="lora_name") from None
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")
