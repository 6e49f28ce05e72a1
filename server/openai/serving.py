"""What both OpenAI generation routes share: admitting a Job's prompts and answering it as one
JSON body or as SSE chunks.

Contract: a serving class (`CompletionServing`, `ChatServing`) parses its request into a `Job`
and says how the unseen part of one engine output renders as choices (`render`, given a
`ChoiceUpdate` from `Job.advance`), what opens a stream (`opening_choices`: chat's role chunk)
and its object names; `respond(request, job, stream)`
does the rest. The engine's outputs are deltas with offsets; streamed text is their
concatenation and the non-streamed text their sum (`final_output`), so the two are equal. Each
choice gets exactly one chunk with a finish_reason; a choice with nothing to show (as while a
character's bytes are held back) sends no chunk; `stream_options.include_usage` adds a last
chunk with `choices: []` and usage. An engine error ends a stream with its "error" finish chunk,
an `{"error": {...}}` event and `[DONE]` (non-streamed: a 500). Several prompts in one request
run as separate engine requests. A client that disconnects aborts them.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, ClassVar, Generic, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from engine import CompletionOutput, RequestOutput
from server.errors import ApiError
from server.openai.job import ChoiceUpdate, Job
from server.openai.protocol import ChatCompletionRequest, CompletionRequest
from server.openai.responses import response_body
from server.request_id import request_id
from server.state import ServerState
from server.streaming import (
    SSE_DONE,
    EventStreamResponse,
    final_output,
    merge_streams,
    run_until_disconnect,
    sse,
    sse_error,
)

JobT = TypeVar("JobT", bound=Job)
Choice = dict[str, Any]


class OpenAIServing(ABC, Generic[JobT]):
    object_name: ClassVar[str]  # the `object` of a whole response
    chunk_object_name: ClassVar[str]  # the `object` of a stream chunk
    id_prefix: ClassVar[str]

    def __init__(self, state: ServerState) -> None:
        self.state = state

    @abstractmethod
    def render(
        self, job: JobT, update: ChoiceUpdate, delta_only: bool, prompt_lp: Any
    ) -> list[Choice]:
        """The choice dicts of `update`: when streaming, the chunks of what the client has not
        seen yet (none when there is nothing to show), else the one whole choice."""

    def choices_for(
        self, job: JobT, prompt_index: int, out: CompletionOutput, delta_only: bool, prompt_lp: Any
    ) -> list[Choice]:
        choices = []
        for copy in job.copies_of(out):  # greedy n > 1: one sequence, n identical choices
            update = job.advance(prompt_index, copy)
            if update is not None:
                choices += self.render(job, update, delta_only, prompt_lp)
        return choices

    def opening_choices(self, job: JobT, num_prompts: int) -> list[Choice]:
        """The choices of a stream's first chunk, before any output (none by default)."""
        return []

    async def respond(self, request: Request, job: JobT, stream: bool) -> Response:
        prompts = [p.token_ids for p in job.prompts]
        job.id = request_id(request).unique  # the body's id is the engine's: one id per request
        engine_id = self.id_prefix + job.id
        params = self.state.with_adapter(job.params, job.model)  # `model` may name a LoRA adapter
        streams = await self.state.open(prompts, params, job.timeout, job.api_fields, engine_id)
        if stream:
            keepalive = self.state.settings.sse_keepalive
            return EventStreamResponse(self._events(job, streams), keepalive)
        finals = await run_until_disconnect(
            request.receive, asyncio.gather(*(final_output(s) for s in streams))
        )
        choices = [
            choice
            for i, final in enumerate(finals)
            for out in final.outputs  # best_of > n: the engine kept the n best, re-indexed
            for choice in self.choices_for(job, i, out, False, final.prompt_logprobs)
        ]
        return JSONResponse(self.body(job, choices, job.usage(finals), chunk=False))

    async def _events(
        self, job: JobT, streams: list[AsyncIterator[RequestOutput]]
    ) -> AsyncIterator[bytes]:
        finals: list[RequestOutput | None] = [None] * len(streams)
        opening = self.opening_choices(job, len(streams))
        if opening:
            yield sse(self.body(job, opening, None, chunk=True))
        async with aclosing(merge_streams(streams)) as merged:
            async for prompt_index, output in merged:
                finals[prompt_index] = output
                for out in output.outputs:
                    for choice in self.choices_for(
                        job, prompt_index, out, True, output.prompt_logprobs
                    ):
                        yield sse(self.body(job, [choice], None, chunk=True))
                if output.error is not None:  # after its "error" finish: the error, then [DONE]
                    yield sse_error(output.error)
                    yield SSE_DONE
                    return  # closing `merged` aborts the other prompts' requests
        if job.include_usage:
            yield sse(self.body(job, [], job.usage(finals), chunk=True))
        yield SSE_DONE

    def body(
        self, job: JobT, choices: list[dict[str, Any]], usage: dict[str, int] | None, chunk: bool
    ) -> dict[str, Any]:
        name = self.chunk_object_name if chunk else self.object_name
        return response_body(
            name, self.id_prefix + job.id, job.created, job.model, choices, usage, chunk
        )

    def check_logprobs(self, wanted: bool) -> None:
        if wanted and self.state.token_texts is None:
            raise ApiError(
                400, "logprobs need a tokenizer, and this model has none", param="logprobs"
            )


def include_usage(req: CompletionRequest | ChatCompletionRequest) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)
