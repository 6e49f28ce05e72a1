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
from collections.abc import AsyncIterator
from contextlib import aclosing
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from engine import RequestOutput
from server.chat_output import ChatOutputFormat, first_delta
from server.errors import ApiError, read_body
from server.openai_job import Job, Prompt, job_usage
from server.reasoning import ReasoningParser, prompt_opens_reasoning
from server.request_params import api_fields, chat_params, completion_params
from server.schemas_openai import ChatCompletionRequest, ChatMessage, CompletionRequest
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


async def _respond(request: Request, job: Job, stream: bool) -> Response:
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
    return JSONResponse(job.body(choices, job_usage(job, finals), chunk=False))


async def _events(job: Job, streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[bytes]:
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
        yield sse(job.body([], job_usage(job, finals), chunk=True))
    yield SSE_DONE


async def _completion_prompts(state: ServerState, prompt: Any) -> list[Prompt]:
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
            prompts.append(Prompt(ids, item))
            continue
        prompts.append(Prompt(list(item), None))  # ids are checked where they enter the engine
    return prompts


async def chat_prompt(
    state: ServerState,
    messages: list[ChatMessage] | None,
    add_generation_prompt: bool,
    tools: ToolPlan | None = None,
) -> Prompt:
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
    return Prompt(await asyncio.to_thread(tokenizer.encode, text, False), text)


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
    if req.echo and state.encoder_decoder:
        raise ApiError(
            400,
            "echo is not supported by encoder-decoder models (the prompt is the encoder's "
            "input, not the start of the answer); leave echo unset",
            param="echo",
        )
    prompts = await _completion_prompts(state, req.prompt)
    params = [completion_params(req, state.settings.enable_fault_injection) for _ in prompts]
    _check_logprobs(state, req.logprobs is not None)
    job = Job(
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
        renames=api_fields(req),
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
    if req.stream and req.use_beam_search and not output_format.plain:
        raise ApiError(
            400,
            "a streamed beam search cannot be read into tool calls or reasoning (its text is "
            "only settled when the search ends): set stream to false, or leave out "
            "use_beam_search",
            param="use_beam_search",
        )
    params = chat_params(
        req,
        state.settings.enable_fault_injection,
        tool_grammar=grammar,
        keep_special_tokens=bool(output_format.tools and output_format.tools.markers),
    )
    _check_logprobs(state, bool(req.logprobs))
    job = Job(
        "chat.completion",
        state,
        model,
        [prompt],
        [params],
        n=params.n,
        logprobs=bool(req.logprobs),
        include_usage=_include_usage(req),
        timeout=req.timeout,
        renames=api_fields(req),
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
