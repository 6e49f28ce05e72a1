"""One OpenAI request in flight: its prompts, what each choice has been sent, how it renders.

Contract: a `Job` holds what the routes parsed (kind "text_completion" | "chat.completion",
prompts, one SamplingParams per prompt, n, echo / logprobs / usage options, the error renames
and the chat output format). `choices_for(prompt_index, out, delta_only, prompt_lp)` turns an
engine output into choice dicts: while streaming, the chunks of what the client has not seen
yet (an output that restarts from offset 0 is cut to its unseen part; nothing when there is
nothing to show), else the one whole choice; chat outputs with tools or reasoning are read into
content, reasoning and tool calls (server/chat_output.py). `body(...)` wraps choices in the
response or chunk shape; `job_usage(job, finals)` counts the tokens.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from engine import CompletionOutput, RequestOutput, SamplingParams
from server.chat_output import ChatOutputFormat, MessageStream, finish_reason
from server.schemas_openai import CompletionLogprobs, chat_logprobs, response_body, usage
from server.state import ServerState


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    text: str | None  # None: token ids were sent; decoded only if echoed (once admitted)

    def echo_text(self, tokenizer: Any) -> str:
        if self.text is not None:
            return self.text
        return tokenizer.decode(self.token_ids, skip_special_tokens=False) if tokenizer else ""


@dataclass
class ChoiceState:
    """What was already sent for one choice of a stream."""

    chars: int = 0
    tokens: int = 0
    finished: bool = False
    logprobs: CompletionLogprobs | None = None
    message: MessageStream | None = None  # chat with tools or reasoning: what is read so far


@dataclass
class Job:
    """One OpenAI request in flight: its prompts, streams and how to render it."""

    kind: str  # "text_completion" | "chat.completion"
    state: ServerState
    model: str
    prompts: list[Prompt]
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
    choices: dict[int, ChoiceState] = field(default_factory=dict)

    def choices_for(
        self, prompt_index: int, out: CompletionOutput, delta_only: bool, prompt_lp: Any
    ) -> list[dict[str, Any]]:
        """The choice dicts for `out`: when streaming, the chunks of its delta since the last
        call (none when there is nothing to show), else the one whole choice."""
        index = prompt_index * self.n + out.index
        seen = self.choices.setdefault(index, ChoiceState())
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
        seen: ChoiceState,
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


def job_usage(job: Job, finals: list[RequestOutput | None]) -> dict[str, int]:
    completion = sum(o.num_tokens for f in finals if f is not None for o in f.outputs)
    return usage(sum(len(p.token_ids) for p in job.prompts), completion)
