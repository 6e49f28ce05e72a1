"""OpenAI routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models,
GET /v1/models/{id}, and vLLM's POST /tokenize and POST /detokenize.

Contract: `build_router(state)` returns the routes, each handing its request to the serving
class of its API (server/openai/serving_completions.py, serving_chat.py): answers and errors
are theirs. /v1/models lists the served names (`token_ids_only`: the model has no usable tokenizer,
so only token-id prompts are served); /v1/models/{id} is one of them (404 in the OpenAI error
shape, param "model", for any other id; ids may hold "/"). /tokenize takes `prompt` (text) or
`messages` (through the chat template, as the chat route renders them) and returns `{"tokens",
"count", "max_model_len"}`; /detokenize turns `tokens` back into `{"prompt"}`. LoRA adapters are models too (`parent`: the
base; server/openai/lora_adapters.py), with vLLM's POST /v1/load_lora_adapter and
/v1/unload_lora_adapter under --enable-lora-runtime-updates.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.errors import ApiError, read_body
from server.openai import lora_adapters
from server.openai.protocol import DetokenizeRequest, TokenizeRequest
from server.openai.serving_chat import ChatServing
from server.openai.serving_completions import CompletionServing
from server.state import ServerState


def build_router(state: ServerState) -> APIRouter:
    router = APIRouter()
    completion_serving, chat_serving = CompletionServing(state), ChatServing(state)

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await completion_serving.create(request)

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await chat_serving.create(request)

    def card(name: str) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": state.created,
            "owned_by": "tgserve",
            "max_model_len": state.max_model_len,
            # no usable tokenizer: prompts must be token ids (text and chat answer 400)
            "token_ids_only": state.tokenizer is None,
        }

    def cards() -> list[dict[str, Any]]:
        base = [{**card(name), "root": name, "parent": None} for name in state.model_names]
        return base + lora_adapters.adapter_cards(state, card)  # LoRA: parent = the base

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": cards()}

    @router.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        state.require_ready()  # the names are known once loaded
        for found in cards():
            if found["id"] == model_id:
                return found
        raise ApiError(
            404,
            f"the model '{model_id}' does not exist; see /v1/models",
            param="model",
            code="model_not_found",
        )

    if state.settings.enable_lora_runtime_updates:  # vLLM's run-time adapter routes

        @router.post("/v1/load_lora_adapter")
        async def load_lora_adapter(request: Request) -> Response:
            return await lora_adapters.load_adapter(state, request)

        @router.post("/v1/unload_lora_adapter")
        async def unload_lora_adapter(request: Request) -> Response:
            return await lora_adapters.unload_adapter(state, request)

    @router.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        req = await read_body(request, TokenizeRequest)
        state.model_name(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise ApiError(400, "give exactly one of 'prompt' or 'messages'", param="prompt")
        if req.messages is not None:
            add_generation_prompt = req.add_generation_prompt is not False
            prompt = await chat_serving.chat_prompt(req.messages, add_generation_prompt)
            tokens = prompt.token_ids
        else:
            add_special = req.add_special_tokens is not False
            encode = state.require_tokenizer().encode
            tokens = await asyncio.to_thread(encode, req.prompt, add_special)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": state.max_model_len}

    @router.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        req = await read_body(request, DetokenizeRequest)
        state.model_name(req.model)
        tokenizer = state.require_tokenizer()
        vocab = tokenizer.vocab_size
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise ApiError(
                400, f"token id {bad[0]} is outside the vocabulary (size {vocab})", param="tokens"
            )
        return {"prompt": await asyncio.to_thread(tokenizer.decode, req.tokens, False)}

    return router
