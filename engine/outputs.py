"""What the engine hands back per request after each step.

Contract: every field is a snapshot (immutable strings and tuples), so a consumer on another
thread can hold an output while the engine goes on. Text and token ids are cumulative: a
streaming consumer emits `text[len(sent):]`. Merging two outputs of the same request is
"keep the newer one", which is what lets a slow reader hold one slot instead of a queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FINISH_REASONS = ("stop", "length", "abort", "error")


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # the top-N (token_id, logprob), best first


@dataclass(frozen=True)
class CompletionOutput:
    index: int
    text: str  # cumulative, stop strings removed, never ends in half a UTF-8 character
    token_ids: tuple[int, ...]  # cumulative generated ids
    cumulative_logprob: float | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per generated token when asked
    finish_reason: str | None = None  # one of FINISH_REASONS once finished
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_cached_prompt_tokens: int = 0


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    outputs: tuple[CompletionOutput, ...]
    finished: bool
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # first entry is None
    metrics: RequestMetrics | None = field(default=None, compare=False)
    error: str | None = None  # set when finish_reason is "error"
