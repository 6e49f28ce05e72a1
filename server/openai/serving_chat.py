"""POST /v1/chat/completions: messages (and tools) through the chat template to an answer.

Contract: `ChatServing(state).create(request)` parses the body (400 on any invalid field),
renders the messages and tools with the model's chat template and tokenizes them off the event
loop (`chat_prompt`, also what /tokenize uses for messages), then answers through
`OpenAIServing.respond`. A stream opens with one role chunk per choice. A plain answer is
`{"role": "assistant", "content"}`; with tools or a reasoning model the text is read into
content, reasoning and tool calls (server/openai/chat_output.py), `tool_choice` may hold the
output to a grammar, and a streamed beam search is refused (its text settles only at the end).
What the model's chat format is (`ChatSetup`) is read once, from the loaded tokenizer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from server.errors import ApiError, read_body
from server.openai.chat_output import ChatOutputFormat, finish_reason, first_delta
from server.openai.chat_setup import ChatSetup, chat_setup
from server.openai.job import ChoiceUpdate, Job, Prompt
from server.openai.params import api_fields, chat_params
from server.openai.protocol import ChatCompletionRequest, ChatMessage
from server.openai.reasoning import ReasoningParser, prompt_opens_reasoning
from server.openai.responses import chat_logprobs
from server.openai.serving import Choice, OpenAIServing, include_usage
from server.openai.tool_calls.enforce import tool_grammar
from server.openai.tool_calls.prompt import template_inputs
from server.openai.tool_calls.request import ToolPlan, tool_plan
from server.state import ServerState


@dataclass
class ChatJob(Job):
    output_format: ChatOutputFormat = field(default_factory=ChatOutputFormat)


class ChatServing(OpenAIServing[ChatJob]):
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def __init__(self, state: ServerState) -> None:
        super().__init__(state)
        self._setup: tuple[Any, ChatSetup] | None = None  # (tokenizer, its setup)

    @property
    def setup(self) -> ChatSetup:
        """The loaded model's chat format (computed once per tokenizer)."""
        tokenizer = self.state.tokenizer
        if self._setup is None or self._setup[0] is not tokenizer:
            self._setup = (tokenizer, chat_setup(tokenizer, self.state.settings))
        return self._setup[1]

    async def create(self, request: Request) -> Response:
        state = self.state
        req = await read_body(request, ChatCompletionRequest)
        model = state.model_name(req.model)
        tools = tool_plan(req)
        add_generation_prompt = req.add_generation_prompt is not False
        prompt = await self.chat_prompt(req.messages, add_generation_prompt, tools)
        output_format, grammar = self._output_format(tools, prompt.text or "")
        if req.stream and req.use_beam_search and not output_format.plain:
            raise ApiError(
                400,
                "a streamed beam search cannot be read into tool calls or reasoning (its text "
                "is only settled when the search ends): set stream to false, or leave out "
                "use_beam_search",
                param="use_beam_search",
            )
        params = chat_params(
            req,
            state.settings.enable_fault_injection,
            tool_grammar=grammar,
            keep_special_tokens=bool(output_format.tools and output_format.tools.markers),
            defaults=state.info.generation if state.info is not None else None,
        )
        self.check_logprobs(bool(req.logprobs))
        job = ChatJob(
            model,
            [prompt],
            [params],
            n=req.n or 1,
            logprobs=bool(req.logprobs),
            include_usage=include_usage(req),
            timeout=req.timeout,
            api_fields=api_fields(req),
            output_format=output_format,
        )
        return await self.respond(request, job, bool(req.stream))

    async def chat_prompt(
        self,
        messages: list[ChatMessage] | None,
        add_generation_prompt: bool,
        tools: ToolPlan | None = None,
    ) -> Prompt:
        """Messages (and tools) through the model's chat template, then tokenized (off the event
        loop); see server/openai/tool_calls/prompt.py for templates that do not render tools."""
        tokenizer = self.state.require_tokenizer()
        if not messages:
            raise ApiError(400, "messages must not be empty", param="messages")
        setup = self.setup
        dicts, extra = template_inputs(messages, tools, setup.parser, setup.takes_tools)
        render = partial(tokenizer.apply_chat_template, dicts, add_generation_prompt, **extra)
        try:
            text = await asyncio.to_thread(render)
        except ValueError as exc:  # e.g. the model has no chat template
            raise ApiError(400, str(exc), param="messages") from None
        except Exception as exc:  # template errors (e.g. roles out of order) are the caller's
            raise ApiError(
                400, f"the chat template rejected these messages: {exc}", param="messages"
            ) from None
        return Prompt(await asyncio.to_thread(tokenizer.encode, text, False), text)

    def _output_format(
        self, tools: ToolPlan | None, prompt: str
    ) -> tuple[ChatOutputFormat, str | None]:
        """How to read the answer (reasoning, calls) and the grammar `tool_choice` asks for."""
        setup = self.setup
        parser = setup.parser if tools is not None and tools.parses_calls else None
        reasoning, mode = None, None
        if setup.reasoning:
            inside = prompt_opens_reasoning(prompt)
            reasoning, mode = ReasoningParser(inside), "inside" if inside else "optional"
        return ChatOutputFormat(parser, reasoning), tool_grammar(setup.parser, tools, mode)

    def opening_choices(self, job: ChatJob, num_prompts: int) -> list[Choice]:
        """The role comes first, once per choice."""
        delta = first_delta(job.output_format)
        return [
            {"index": i, "delta": delta, "logprobs": None, "finish_reason": None}
            for i in range(num_prompts * job.n)
        ]

    def render(self, job: ChatJob, update: ChoiceUpdate, delta_only: bool, _: Any) -> list[Choice]:
        new, reason = update.new, update.finish_reason
        text, new_ids, entries = new.text, new.token_ids, list(new.logprobs or ())
        lp = chat_logprobs(self.state.token_texts, entries) if job.logprobs else None
        if not job.output_format.plain:
            return self._read_message(job, update, lp, delta_only)
        if delta_only and not (text or reason or (job.logprobs and new_ids)):
            return []  # e.g. only bytes of a character not complete yet: nothing to show
        body = {"content": text} if delta_only else {"role": "assistant", "content": text}
        key = "delta" if delta_only else "message"
        return [
            {
                "index": update.index,
                key: body if text or not delta_only else {},
                "logprobs": lp,
                "finish_reason": reason,
            }
        ]

    def _read_message(
        self, job: ChatJob, update: ChoiceUpdate, lp: dict[str, Any] | None, delta_only: bool
    ) -> list[Choice]:
        """Chat with tools or reasoning: the text read into content, reasoning and calls."""
        index, text, reason = update.index, update.new.text, update.finish_reason
        if not delta_only:
            message = job.output_format.message(text, reason)
            made_calls = bool(message.get("tool_calls"))
            return [
                {
                    "index": index,
                    "message": message,
                    "logprobs": lp,
                    "finish_reason": finish_reason(reason, made_calls),
                }
            ]
        seen = update.seen
        seen.message = seen.message or job.output_format.stream()
        deltas = seen.message.feed(text)
        if reason is not None:
            deltas += seen.message.finish(reason)
        if reason is not None or (lp is not None and lp["content"]):
            deltas = deltas or [{}]
        chunks = [
            {"index": index, "delta": d, "logprobs": None, "finish_reason": None} for d in deltas
        ]
        if chunks:
            chunks[0]["logprobs"] = lp
            chunks[-1]["finish_reason"] = finish_reason(reason, seen.message.made_calls)
        return chunks
