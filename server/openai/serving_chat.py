"""POST /v1/chat/completions: messages (and tools) through the chat template to an answer.

Contract: `ChatServing(state).create(request)` parses the body (400 on any invalid field),
renders the messages and tools with the model's chat template and tokenizes them off the event
loop (`chat_prompt`, also what /tokenize uses for messages), then answers through
`OpenAIServing.respond`. A stream opens with one role chunk per choice. A plain answer is
`{"role": "assistant", "content"}`; with tools or a reasoning model the text is read into
content, reasoning and tool calls (server/chat/output.py), `tool_choice` may hold the
output to a grammar, and a streamed beam search is refused (its text settles only at the end).
Rendering and the model's chat format are server/chat/render.py's, shared with the other chat APIs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from server.chat.output import ChatOutputFormat, finish_reason, first_delta
from server.chat.render import ChatRenderer
from server.chat.tool_calls.plan import ToolPlan
from server.errors import ApiError, read_body
from server.openai.job import ChoiceUpdate, Job, Prompt
from server.openai.params import api_fields, chat_params
from server.openai.protocol import ChatCompletionRequest, ChatMessage
from server.openai.responses import chat_logprobs
from server.openai.serving import Choice, OpenAIServing, include_usage
from server.openai.tool_request import tool_plan
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
        self.renderer = ChatRenderer(state)

    async def create(self, request: Request) -> Response:
        state = self.state
        req = await read_body(request, ChatCompletionRequest)
        model = state.model_name(req.model)
        tools = tool_plan(req)
        add_generation_prompt = req.add_generation_prompt is not False
        prompt = await self.chat_prompt(
            req.messages, add_generation_prompt, tools, req.reasoning_effort
        )
        output_format, grammar = self.renderer.output_format(tools, prompt.text or "")
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
            keep_special_tokens=output_format.keeps_special_tokens,
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
        reasoning_effort: str | None = None,
    ) -> Prompt:
        """Messages (and tools) through the model's chat template, then tokenized (off the event
        loop): server/chat/render.py."""
        dicts = [m.for_template() for m in messages or ()]
        rendered = await self.renderer.render(
            dicts, add_generation_prompt, tools, reasoning_effort=reasoning_effort
        )
        return Prompt(rendered.token_ids, rendered.text)

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
