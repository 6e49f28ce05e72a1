"""One OpenAI request in flight: its prompts, parameters and what each choice has been sent.

Contract: a `Job` holds what a serving class parsed (prompts, one SamplingParams per prompt, n,
logprobs / usage options, the request's API field names for the engine's refusals) and, per
choice (index = prompt_index * n + sample index), a `ChoiceState` of what the client has seen.
`advance(prompt_index, out)` returns a `ChoiceUpdate`: the part of an engine output the client
has not seen yet (an output that restarts from offset 0, as best_of and beams do, is cut to its
unseen part) and whether it is the choice's first; `usage(finals)` counts the tokens of every
choice. Greedy n > 1 runs one engine sequence per prompt (server/engine_params.py): `copies_of(out)`
gives it once per choice, so the n choices are identical, as OpenAI answers. How choices render is the
serving class's (server/openai/serving_completions.py, serving_chat.py).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from engine import CompletionOutput, RequestOutput, SamplingParams
from server.chat.output import MessageStream
from server.openai.responses import CompletionLogprobs, usage


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


@dataclass(frozen=True)
class ChoiceUpdate:
    """One engine output of one choice, as far as the client has not seen it."""

    index: int  # the choice: prompt_index * n + sample index
    prompt_index: int
    seen: ChoiceState  # updated past this output already
    new: CompletionOutput  # the unseen part: text, token ids, logprobs
    first: bool  # nothing of this choice was sent before
    finish_reason: str | None


@dataclass
class Job:
    """One OpenAI request in flight."""

    model: str
    prompts: list[Prompt]
    params: list[SamplingParams]
    n: int
    logprobs: bool = False
    include_usage: bool = False
    timeout: float | None = None
    api_fields: dict[str, str] = field(default_factory=dict)  # engine field -> API field (400s)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    choices: dict[int, ChoiceState] = field(default_factory=dict)

    @property
    def copies(self) -> int:
        """Choices per engine sequence: n when greedy n > 1 runs one sequence, else 1."""
        return self.n // self.params[0].n

    def copies_of(self, out: CompletionOutput) -> tuple[CompletionOutput, ...]:
        if self.copies == 1:
            return (out,)
        if not isinstance(out, CompletionOutput):  # a one-sequence request's PlainOutput
            out = out.completion()
        return tuple(replace(out, index=k) for k in range(self.copies))

    def advance(self, prompt_index: int, out: CompletionOutput) -> ChoiceUpdate | None:
        """What the client has not seen of `out` yet; None once its choice ended."""
        index = prompt_index * self.n + out.index
        seen = self.choices.setdefault(index, ChoiceState())
        if seen.finished:
            return None
        first = seen.chars == 0 and seen.tokens == 0
        new = out.unseen(seen.chars, seen.tokens)  # a delta, or a whole output from offset 0
        seen.chars, seen.tokens = out.text_end, out.num_tokens
        seen.finished = out.finish_reason is not None
        return ChoiceUpdate(index, prompt_index, seen, new, first, out.finish_reason)

    def usage(self, finals: list[RequestOutput | None]) -> dict[str, int]:
        completion = self.copies * sum(
            o.num_tokens for f in finals if f is not None for o in f.outputs
        )
        return usage(sum(len(p.token_ids) for p in self.prompts), completion)
