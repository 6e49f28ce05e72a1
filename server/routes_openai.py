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
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from engine import CompletionOutput, RequestOutput, SamplingParams
from server.chat_output import ChatOutputFormat, MessageStream, finish_reason, first_delta
from server.errors import ApiError, read_body
from server.reasoning import ReasoningParser, prompt_opens_reasoning
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
from server.tool_calls.enforce import tool_grammar
from server.tool_calls.prompt import template_inputs
from server.tool_calls.request import ToolPlan, tool_plan

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
    message: MessageStream | None = None  # chat with tools or reasoning: what is read so far


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
    output_format: ChatOutputFormat = field(default_factory=ChatOutputFormat)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    choices: dict[int, _Choice] = field(default_factory=dict)

    def choices_for(
        self, prompt_index: int, out: CompletionOutput, delta_only: bool, prompt_lp: Any
    ) -> list[dict[str, Any]]:
        """The choice dicts for `out`: when streaming, the chunks of its delta since the last
        call (none when there is nothing to show), else the one whole choice."""
        index = prompt_index * self.n + out.index
        seen = self.choices.setdefault(index, _Choice())
        if seen.finished:
            return []
        first = seen.chars == 0 and seen.tokens == 0
        new = out.unseen(seen.chars, seen.tokens)  # a delta, or a whole output from offset 0
        text, new_ids, entries = new.text, new.token_ids, list(new.logprobs or ())
        seen.chars, seen.tokens = out.text_end, out.num_tokens
        seen.finished = out.finish_reason is not None
        prompt = self.prompts[prompt_index]
        echoed = self.echo and first and self.kind != "chat.completion"
        if self.kind == "chat.completion":
            lp = chat_logprobs(self.state.token_texts, entries) if self.logprobs else None
            if not self.output_format.plain:
                return self._read_message(index, seen, out, text, lp, delta_only)
            if delta_only and not (text or out.finish_reason or (self.logprobs and new_ids)):
                return []  # e.g. only bytes of a character not complete yet: nothing to show
            body = {"content": text} if delta_only else {"role": "assistant", "content": text}
            key = "delta" if delta_only else "message"
            return [
                {
                    "index": index,
                    key: body if text or not delta_only else {},
                    "logprobs": lp,
                    "finish_reason": out.finish_reason,
                }
            ]
        if delta_only and not (text or echoed or out.finish_reason or (self.logprobs and new_ids)):
            return []
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
        return [{"index": index, "text": text, "logprobs": lp, "finish_reason": out.finish_reason}]

    def _read_message(
        self,
        index: int,
        seen: _Choice,
        out: CompletionOutput,
        text: str,
        lp: dict[str, Any] | None,
        delta_only: bool,
    ) -> list[dict[str, Any]]:
        """Chat with tools or reasoning: the text read into content, reasoning and calls."""
        if not delta_only:
            message = self.output_format.message(text)
            made_calls = bool(message.get("tool_calls"))
            reason = finish_reason(out.finish_reason, made_calls)
            return [{"index": index, "message": message, "logprobs": lp, "finish_reason": reason}]
        seen.message = seen.message or self.output_format.stream()
        deltas = seen.message.feed(text)
        if out.finish_reason is not None:
            deltas += seen.message.finish()
        if out.finish_reason is not None or (lp is not None and lp["content"]):
            deltas = deltas or [{}]
        chunks = [
            {"index": index, "delta": d, "logprobs": None, "finish_reason": None} for d in deltas
        ]
        if chunks:
            chunks[0]["logprobs"] = lp
            reason = finish_reason(out.finish_reason, seen.message.made_calls)
            chunks[-1]["finish_reason"] = reason
        return chunks

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
        choice
        for i, final in enumerate(finals)
        for out in final.outputs  # best_of > n: the engine kept the n best, re-indexed
        for choice in job.choices_for(i, out, delta_only=False, prompt_lp=final.prompt_logprobs)
    ]
    return JSONResponse(job.body(choices, _usage(job, finals), chunk=False))


async def _events(job: _Job, streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[bytes]:
    finals: list[RequestOutput | None] = [None] * len(streams)
    if job.kind == "chat.completion":  # the role comes first, once per choice
        delta = first_delta(job.output_format)
        roles = [
            {"index": i, "delta": delta, "logprobs": None, "finish_reason": None}
            for i in range(len(streams) * job.n)
        ]
        yield sse(job.body(roles, None, chunk=True))
    async with aclosing(merge_streams(streams)) as merged:
        async for prompt_index, output in merged:
            finals[prompt_index] = output
            for out in output.outputs:
                for choice in job.choices_for(
                    prompt_index, out, delta_only=True, prompt_lp=output.prompt_logprobs
                ):
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
    state: ServerState,
    messages: list[ChatMessage] | None,
    add_generation_prompt: bool,
    tools: ToolPlan | None = None,
) -> _Prompt:
    """Messages (and tools) through the model's chat template, then tokenized (off the event
    loop); see server/tool_calls/prompt.py for templates that do not render tools."""
    tokenizer = state.require_tokenizer()
    if not messages:
        raise ApiError(400, "messages must not be empty", param="messages")
    dicts, extra = template_inputs(messages, tools, state.chat.parser, state.chat.takes_tools)
    render = partial(tokenizer.apply_chat_template, dicts, add_generation_prompt, **extra)
    try:
        text = await asyncio.to_thread(render)
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
    tools = tool_plan(req)
    prompt = await chat_prompt(state, req.messages, req.add_generation_prompt is not False, tools)
    output_format, grammar = _output_format(state, tools, prompt.text or "")
    params = chat_params(
        req,
        state.settings.enable_fault_injection,
        tool_grammar=grammar,
        keep_special_tokens=bool(output_format.tools and output_format.tools.markers),
    )
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
        output_format=output_format,
    )
    return await _respond(request, job, bool(req.stream))


def _output_format(
    state: ServerState, tools: ToolPlan | None, prompt: str
) -> tuple[ChatOutputFormat, str | None]:
    """How to read the answer (reasoning, calls) and the grammar `tool_choice` asks for."""
    parser = state.chat.parser if tools is not None and tools.parses_calls else None
    reasoning, mode = None, None
    if state.chat.reasoning:
        inside = prompt_opens_reasoning(prompt)
        reasoning, mode = ReasoningParser(inside), "inside" if inside else "optional"
    return ChatOutputFormat(parser, reasoning), tool_grammar(state.chat.parser, tools, mode)


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
