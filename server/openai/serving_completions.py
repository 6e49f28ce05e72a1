"""POST /v1/completions: prompts (text, token ids, or lists of either) to text completions.

Contract: `CompletionServing(state).create(request)` parses the body (400 on any invalid
field), tokenizes text prompts off the event loop, and answers through `OpenAIServing.respond`.
Several prompts run as separate engine requests (choice index = prompt_index * n + sample
index), at most the admission limit of them. Each choice is `{index, text, logprobs,
finish_reason}`; with `echo` its prompt text comes first (and with logprobs, the prompt's own
token logprobs, the first unscored), once per choice.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from server.errors import ApiError, read_body
from server.openai.job import ChoiceUpdate, Job, Prompt
from server.openai.params import api_fields, completion_params
from server.openai.protocol import CompletionRequest
from server.openai.responses import CompletionLogprobs
from server.openai.serving import Choice, OpenAIServing, include_usage


@dataclass
class CompletionJob(Job):
    echo: bool = False


class CompletionServing(OpenAIServing[CompletionJob]):
    object_name = chunk_object_name = "text_completion"
    id_prefix = "cmpl-"

    async def create(self, request: Request) -> Response:
        state = self.state
        req = await read_body(request, CompletionRequest)
        model = state.model_name(req.model)
        if req.echo and state.info is not None and state.info.encoder_decoder:
            raise ApiError(
                400,
                "echo is not supported by encoder-decoder models (the prompt is the encoder's "
                "input, not the start of the answer); leave echo unset",
                param="echo",
            )
        prompts = await self._prompts(req.prompt)
        defaults = state.info.generation if state.info is not None else None
        allow_faults = state.settings.enable_fault_injection
        params = [completion_params(req, allow_faults, defaults) for _ in prompts]
        self.check_logprobs(req.logprobs is not None)
        job = CompletionJob(
            model,
            prompts,
            params,
            n=req.n or 1,
            logprobs=req.logprobs is not None,
            include_usage=include_usage(req),
            timeout=req.timeout,
            api_fields=api_fields(req),
            echo=bool(req.echo),
        )
        return await self.respond(request, job, bool(req.stream))

    async def _prompts(self, prompt: Any) -> list[Prompt]:
        if isinstance(prompt, str):
            prompt = [prompt]
        if not prompt:
            raise ApiError(400, "prompt must not be empty", param="prompt")
        if isinstance(prompt[0], int):
            prompt = [prompt]
        limit = self.state.prompt_share  # a share of the in-flight limit: server/fair_share.py
        if len(prompt) > limit:
            raise ApiError(400, f"at most {limit} prompts fit in one request", param="prompt")
        prompts = []
        for item in prompt:
            if not item:
                raise ApiError(400, "prompt must not be empty", param="prompt")
            if isinstance(item, str):
                encode = self.state.require_tokenizer().encode
                prompts.append(Prompt(await asyncio.to_thread(encode, item, True), item))
                continue
            prompts.append(Prompt(list(item), None))  # ids are checked where they enter the engine
        return prompts

    def render(
        self, job: CompletionJob, update: ChoiceUpdate, delta_only: bool, prompt_lp: Any
    ) -> list[Choice]:
        new, reason = update.new, update.finish_reason
        text, new_ids, entries = new.text, list(new.token_ids), list(new.logprobs or ())
        echoed = job.echo and update.first
        if delta_only and not (text or echoed or reason or (job.logprobs and new_ids)):
            return []  # e.g. only bytes of a character not complete yet: nothing to show
        prompt = job.prompts[update.prompt_index]
        lp = None
        if job.logprobs:
            seen = update.seen
            seen.logprobs = seen.logprobs or CompletionLogprobs(self.state.token_texts)
            if echoed:  # the prompt's own tokens come first, the first unscored
                prompt_entries = list(prompt_lp or [None] * len(prompt.token_ids))
                entries, new_ids = prompt_entries + entries, prompt.token_ids + new_ids
            lp = seen.logprobs.render(entries, new_ids)
        if echoed:
            text = prompt.echo_text(self.state.tokenizer) + text
        return [{"index": update.index, "text": text, "logprobs": lp, "finish_reason": reason}]
