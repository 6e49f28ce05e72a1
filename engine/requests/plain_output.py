"""PlainOutput: the output of a one-sequence request (no n > 1, no beams) in ONE object per
step, where the general shape takes two (a `RequestOutput` holding a `CompletionOutput`):
built per streamed row per step, so its cost is a decode step's host time (issue 38).

Contract: a `PlainOutput` reads as the `RequestOutput` of outputs.py whose only completion is
itself: the request's fields (`request_id`, `prompt_token_ids`, `finished`, `prompt_logprobs`,
`metrics`, `error`), `outputs == (self,)`, and index 0's fields (`index` 0, `text`,
`token_ids`, `cumulative_logprob`, `logprobs`, `finish_reason`, `stop_reason`, `text_offset`,
`token_offset`, `num_tokens`, `text_end`) with their meaning in outputs.py, and `unseen` /
`merge` as theirs. `completion()` and `general()` are the same output in the general shape
(for what builds new outputs from one: `dataclasses.replace`); equality is the general
shape's (metrics not compared), or the completion's against a `CompletionOutput`. A snapshot like the general shape (immutable strings and
tuples), but a slotted class, not a frozen dataclass: a frozen class's constructor costs
two to three times as much (engine/fast_frozen.py), and nothing writes an output after it is
built (the engine builds it, readers only read).
"""

from __future__ import annotations

from engine.requests.outputs import CompletionOutput, RequestMetrics, RequestOutput
from engine.types import TokenLogprob


class PlainOutput:
    __slots__ = (
        "request_id",
        "prompt_token_ids",
        "text",
        "token_ids",
        "cumulative_logprob",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "text_offset",
        "token_offset",
        "finished",
        "prompt_logprobs",
        "metrics",
        "error",
    )
    index = 0  # the request's only completion

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: tuple[int, ...],
        text: str,
        token_ids: tuple[int, ...],
        cumulative_logprob: float | None,
        logprobs: tuple[TokenLogprob, ...] | None,
        finish_reason: str | None,
        stop_reason: int | str | None,
        text_offset: int,
        token_offset: int,
        finished: bool,
        prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None,
        metrics: RequestMetrics | None = None,
        error: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.text = text
        self.token_ids = token_ids
        self.cumulative_logprob = cumulative_logprob
        self.logprobs = logprobs
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason
        self.text_offset = text_offset
        self.token_offset = token_offset
        self.finished = finished
        self.prompt_logprobs = prompt_logprobs
        self.metrics = metrics
        self.error = error

    @property
    def outputs(self) -> tuple[PlainOutput, ...]:
        return (self,)

    num_tokens = CompletionOutput.num_tokens  # (the same properties: the same fields)
    text_end = CompletionOutput.text_end

    def completion(self) -> CompletionOutput:
        return CompletionOutput(
            0,
            self.text,
            self.token_ids,
            self.cumulative_logprob,
            self.logprobs,
            self.finish_reason,
            self.stop_reason,
            self.text_offset,
            self.token_offset,
        )

    def general(self) -> RequestOutput:
        return RequestOutput(
            self.request_id,
            self.prompt_token_ids,
            (self.completion(),),
            self.finished,
            self.prompt_logprobs,
            self.metrics,
            self.error,
        )

    def unseen(self, chars: int, tokens: int) -> PlainOutput | CompletionOutput:
        """CompletionOutput.unseen; itself when the reader has none of it yet (the stream)."""
        if chars <= self.text_offset and tokens <= self.token_offset:
            return self
        return self.completion().unseen(chars, tokens)

    def merge(self, newer: PlainOutput | RequestOutput) -> PlainOutput | RequestOutput:
        """RequestOutput.merge: one output carrying both deltas (the newer's totals)."""
        if (
            type(newer) is not PlainOutput
            or newer.text_offset < self.text_offset
            or newer.token_offset < self.token_offset
        ):
            return self.general().merge(newer)
        text_cut = newer.text_offset - self.text_offset
        token_cut = newer.token_offset - self.token_offset
        logprobs = newer.logprobs
        if self.logprobs is not None and logprobs is not None:
            logprobs = self.logprobs[:token_cut] + logprobs
        return PlainOutput(
            newer.request_id,
            newer.prompt_token_ids,
            self.text[:text_cut] + newer.text,
            self.token_ids[:token_cut] + newer.token_ids,
            newer.cumulative_logprob,
            logprobs,
            newer.finish_reason,
            newer.stop_reason,
            self.text_offset,
            self.token_offset,
            newer.finished,
            newer.prompt_logprobs if newer.prompt_logprobs is not None else self.prompt_logprobs,
            newer.metrics,
            newer.error,
        )

    def __eq__(self, other: object) -> bool:
        if type(other) is CompletionOutput:  # as index 0's completion
            return self.completion() == other
        if type(other) is PlainOutput:
            other = other.general()
        return self.general() == other

    def __hash__(self) -> int:
        return hash(self.general())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"PlainOutput({fields})"
