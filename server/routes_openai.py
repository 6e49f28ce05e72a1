"""OpenAI routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models.

Contract: each request is parsed (400 on any invalid field), tokenized off the event loop,
admitted (400 / 429 / 503 before any byte), then answered as one JSON body or as SSE chunks
ending with `data: [DONE]`. The engine's outputs are deltas with offsets; streamed text is
their concatenation and the non-streamed text their sum (OutputAccumulator), so the two are
equal. Each choice gets exactly one chunk with a finish_reason; every chunk carries text, logprobs
asked for, or a finish_reason (never empty text alone, as while a character's bytes are held
back); `stream_options.include_usage` adds a last chunk with `choices: []` and usage.
An engine error ends a stream with its "error" finish chunk, an `{"error": {...}}` event and
`[DONE]` (non-streamed: a 500). Several prompts in one request run as separate engine requests
(choice index = prompt_index * n + sample index). A client that disconnects aborts them.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from engine import CompletionOutput, RequestOutput, SamplingParams
from server.errors import ApiError, read_body
from server.request_params import chat_params, completion_params, engine_error_renames
from server.schemas_openai import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionLogprobs,
    CompletionRequest,
    chat_logprobs,
    response_body,
    usage,
)
from server.state import ServerState, get_state
from server.streaming import (
    SSE_DONE,
    EventStreamResponse,
    final_output,
    merge_streams,
    run_until_disconnect,
    sse,
    sse_error,
)

router = APIRouter()


@dataclass(frozen=True)
class _Prompt:
    token_ids: list[int]
    text: str | None  # None: token ids were sent; decoded only if echoed (once admitted)

    def echo_text(self, tokenizer: Any) -> str:
        if self.text is not None:
            return self.text
        return tokenizer.decode(self.token_ids, skip_special_tokens=False) if tokenizer else ""


@dataclass
class _Choice:
    """What was already sent for one choice of a stream."""

    chars: int = 0
    tokens: int = 0
    finished: bool = False
    logprobs: CompletionLogprobs | None = None


@dataclass
class _Job:
    """One OpenAI request in flight: its prompts, streams and how to render it."""

    kind: str  # "text_completion" | "chat.completion"
    state: ServerState
    model: str
    prompts: list[_Prompt]
    params: list[SamplingParams]
    n: int
    echo: bool = False
    logprobs: bool = False
    include_usage: bool = False
    timeout: float | None = None
    renames: dict[str, str] = field(default_factory=dict)  # engine field -> API field (400s)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    choices: dict[int, _Choice] = field(default_factory=dict)

    def choice(
        self, prompt_index: int, out: CompletionOutput, delta_only: bool, prompt_lp: Any
    ) -> dict[str, Any] | None:
        """The choice dict for `out` (the delta since the last call when streaming)."""
        index = prompt_index * self.n + out.index
        seen = self.choices.setdefault(index, _Choice())
        if seen.finished:
            return None
        first = seen.chars == 0 and seen.tokens == 0
        new = out.unseen(seen.chars, seen.tokens)  # a delta, or a whole output from offset 0
        text, new_ids, entries = new.text, new.token_ids, list(new.logprobs or ())
        seen.chars, seen.tokens = out.text_end, out.num_tokens
        seen.finished = out.finish_reason is not None
        prompt = self.prompts[prompt_index]
        echoed = self.echo and first and self.kind != "chat.completion"
        if delta_only and not (text or echoed or out.finish_reason or (self.logprobs and new_ids)):
            return None  # e.g. only bytes of a character not complete yet: nothing to show
        if self.kind == "chat.completion":
            lp = chat_logprobs(self.state.token_texts, entries) if self.logprobs else None
            body = {"content": text} if delta_only else {"role": "assistant", "content": text}
            key = "delta" if delta_only else "message"
            return {
                "index": index,
                key: body if text or not delta_only else {},
                "logprobs": lp,
                "finish_reason": out.finish_reason,
            }
        lp = None
        if self.logprobs:
            seen.logprobs = seen.logprobs or CompletionLogprobs(self.state.token_texts)
            ids = list(new_ids)
            if self.echo and first:  # the prompt's own tokens come first, the first unscored
                prompt_entries = list(prompt_lp or [None] * len(prompt.token_ids))
                entries, ids = prompt_entries + entries, prompt.token_ids + ids
            lp = seen.logprobs.render(entries, ids)
        if echoed:
            text = prompt.echo_text(self.state.tokenizer) + text
        return {"index": index, "text": text, "logprobs": lp, "finish_reason": out.finish_reason}

    def body(
        self, choices: list[dict[str, Any]], usage_: dict[str, int] | None, chunk: bool
    ) -> dict[str, Any]:
        prefix = "chatcmpl-" if self.kind == "chat.completion" else "cmpl-"
        return response_body(
            self.kind, prefix + self.id, self.created, self.model, choices, usage_, chunk
        )


def _usage(job: _Job, finals: list[RequestOutput | None]) -> dict[str, int]:
    completion = sum(o.num_tokens for f in finals if f is not None for o in f.outputs)
    return usage(sum(len(p.token_ids) for p in job.prompts), completion)


async def _respond(request: Request, job: _Job, stream: bool) -> Response:
    streams = await job.state.open(
        [p.token_ids for p in job.prompts], job.params, job.timeout, job.renames
    )
    if stream:
        return EventStreamResponse(_events(job, streams))
    finals = await run_until_disconnect(
        request.receive, asyncio.gather(*(final_output(s) for s in streams))
    )
    choices = [
        job.choice(i, out, delta_only=False, prompt_lp=final.prompt_logprobs)
        for i, final in enumerate(finals)
        for out in final.outputs  # best_of > n: the engine kept the n best, re-indexed
    ]
    return JSONResponse(job.body(choices, _usage(job, finals), chunk=False))


async def _events(job: _Job, streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[bytes]:
    finals: list[RequestOutput | None] = [None] * len(streams)
    if job.kind == "chat.completion":  # the role comes first, once per choice
        delta = {"role": "assistant", "content": ""}
        roles = [
            {"index": i, "delta": delta, "logprobs": None, "finish_reason": None}
            for i in range(len(streams) * job.n)
        ]
        yield sse(job.body(roles, None, chunk=True))
    async with aclosing(merge_streams(streams)) as merged:
        async for prompt_index, output in merged:
            finals[prompt_index] = output
            for out in output.outputs:
                choice = job.choice(
                    prompt_index, out, delta_only=True, prompt_lp=output.prompt_logprobs
                )
                if choice is not None:
                    yield sse(job.body([choice], None, chunk=True))
            if output.error is not None:  # after its "error" finish: the error, then [DONE]
                yield sse_error(output.error)
                yield SSE_DONE
                return  # closing `merged` aborts the other prompts' requests
    if job.include_usage:
        yield sse(job.body([], _usage(job, finals), chunk=True))
    yield SSE_DONE


async def _completion_prompts(state: ServerState, prompt: Any) -> list[_Prompt]:
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise ApiError(400, "prompt must not be empty", param="prompt")
    if isinstance(prompt[0], int):
        prompt = [prompt]
    if len(prompt) > state.admission_limit:
        raise ApiError(
            400, f"at most {state.admission_limit} prompts fit in one request", param="prompt"
        )
    prompts = []
    for item in prompt:
        if not item:
            raise ApiError(400, "prompt must not be empty", param="prompt")
        if isinstance(item, str):
            ids = await asyncio.to_thread(state.require_tokenizer().encode, item, True)
            prompts.append(_Prompt(ids, item))
            continue
        prompts.append(_Prompt(list(item), None))  # ids are checked where they enter the engine
    return prompts


async def chat_prompt(
    state: ServerState, messages: list[ChatMessage] | None, add_generation_prompt: bool
) -> _Prompt:
    """Messages through the model's chat template, then tokenized (off the event loop)."""
    tokenizer = state.require_tokenizer()
    if not messages:
        raise ApiError(400, "messages must not be empty", param="messages")
    dicts = [m.for_template() for m in messages]
    try:
        text = await asyncio.to_thread(tokenizer.apply_chat_template, dicts, add_generation_prompt)
    except ValueError as exc:  # e.g. the model has no chat template
        raise ApiError(400, str(exc), param="messages") from None
    except Exception as exc:  # template errors (e.g. roles out of order) are the caller's to fix
        raise ApiError(
            400, f"the chat template rejected these messages: {exc}", param="messages"
        ) from None
    return _Prompt(await asyncio.to_thread(tokenizer.encode, text, False), text)


def _include_usage(req: CompletionRequest | ChatCompletionRequest) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)


def _check_logprobs(state: ServerState, wanted: bool) -> None:
    if wanted and state.token_texts is None:
        raise ApiError(400, "logprobs need a tokenizer, and this model has none", param="logprobs")


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    state = get_state(request)
    req = await read_body(request, CompletionRequest)
    model = state.model_name(req.model)
    prompts = await _completion_prompts(state, req.prompt)
    params = [completion_params(req, state.settings.enable_fault_injection) for _ in prompts]
    _check_logprobs(state, req.logprobs is not None)
    job = _Job(
        "text_completion",
        state,
        model,
        prompts,
        params,
        n=params[0].n,
        echo=bool(req.echo),
        logprobs=req.logprobs is not None,
        include_usage=_include_usage(req),
        timeout=req.timeout,
        renames=engine_error_renames(req),
    )
    return await _respond(request, job, bool(req.stream))


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    state = get_state(request)
    req = await read_body(request, ChatCompletionRequest)
    model = state.model_name(req.model)
    prompt = await chat_prompt(state, req.messages, req.add_generation_prompt is not False)
    params = chat_params(req, state.settings.enable_fault_injection)
    _check_logprobs(state, bool(req.logprobs))
    job = _Job(
        "chat.completion",
        state,
        model,
        [prompt],
        [params],
        n=params.n,
        logprobs=bool(req.logprobs),
        include_usage=_include_usage(req),
        timeout=req.timeout,
        renames=engine_error_renames(req),
    )
    return await _respond(request, job, bool(req.stream))


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    state = get_state(request)
    data = [
        {
            "id": name,
            "object": "model",
            "created": state.created,
            "owned_by": "tgserve",
            "max_model_len": state.max_model_len,
        }
        for name in state.model_names
    ]
    return {"object": "list", "data": data}
