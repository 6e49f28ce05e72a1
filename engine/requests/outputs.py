"""What the engine hands back per request after each step: deltas, not whole sequences.

Contract:
- Every field is a snapshot (immutable strings and tuples), so a consumer on another thread can
  hold an output while the engine goes on.
- A `CompletionOutput` carries what is new for its `index` since that index's previous output:
  `text` starts at character `text_offset` of the completion's text, `token_ids` (and
  `logprobs`, one entry per id when asked) start at token `token_offset`. In the common case the
  offsets equal what was already sent, so a streaming consumer emits the fields as they are.
  An output may restart an index from offset 0 (the finished output of a `best_of > n` request,
  whose n best samples are re-indexed, and the finished hypotheses of a beam search): the rule
  "what I hold, cut at the offset, plus the new part" covers both cases (`OutputAccumulator`).
- `cumulative_logprob` and the finish fields are the index's current totals, not deltas.
- `RequestOutput.prompt_logprobs` appears once, in the first output after the whole prompt has
  been computed (first entry None: the first prompt token is unscored).
- A one-sequence request's outputs come as `PlainOutput`s (plain_output.py): one object that
  reads as a `RequestOutput` whose only `CompletionOutput` is itself (`general()` converts).
- Merging two unread outputs of one request (`RequestOutput.merge`) gives the output that
  carries both deltas, which is what lets a slow reader hold one slot instead of a queue.
Cost: an output is O(new tokens) to build and to merge in order, so a request of L tokens costs
O(L) in total, never O(L^2).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from engine.fast_frozen import fast_frozen
from engine.types import TokenLogprob


@fast_frozen  # one per returned sequence per step
@dataclass(frozen=True)
class CompletionOutput:
    index: int
    text: str  # new text from text_offset on; never ends in half a UTF-8 character
    token_ids: tuple[int, ...]  # new generated ids from token_offset on
    cumulative_logprob: float | None = None  # total so far
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per id in token_ids, when asked
    finish_reason: str | None = None  # one of FINISH_REASONS once finished
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    text_offset: int = 0  # characters of this completion's text before `text`
    token_offset: int = 0  # generated ids before `token_ids`

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_tokens(self) -> int:
        """Generated ids in total, up to and including this delta."""
        return self.token_offset + len(self.token_ids)

    @property
    def text_end(self) -> int:
        return self.text_offset + len(self.text)

    def unseen(self, chars: int, tokens: int) -> CompletionOutput:
        """The part of this output a reader holding `chars` characters and `tokens` ids of
        this index does not have yet (its offsets move to where the reader stands)."""
        cut_chars = max(0, chars - self.text_offset)
        cut_tokens = max(0, tokens - self.token_offset)
        return replace(
            self,
            text=self.text[cut_chars:],
            token_ids=self.token_ids[cut_tokens:],
            logprobs=self.logprobs[cut_tokens:] if self.logprobs is not None else None,
            text_offset=self.text_offset + cut_chars,
            token_offset=self.token_offset + cut_tokens,
        )

    def merge(self, newer: CompletionOutput) -> CompletionOutput:
        """One output carrying this delta and the newer one (which may restart from 0)."""
        if newer.text_offset < self.text_offset or newer.token_offset < self.token_offset:
            return newer  # it starts no later than this one: it covers all a reader lacks
        text_cut = newer.text_offset - self.text_offset
        token_cut = newer.token_offset - self.token_offset
        logprobs = newer.logprobs
        if self.logprobs is not None and newer.logprobs is not None:
            logprobs = self.logprobs[:token_cut] + newer.logprobs
        return replace(
            newer,
            text=self.text[:text_cut] + newer.text,
            token_ids=self.token_ids[:token_cut] + newer.token_ids,
            logprobs=logprobs,
            text_offset=self.text_offset,
            token_offset=self.token_offset,
        )


@dataclass(frozen=True)
class StepEvent:
    """Something a step did to a request, for traces (the server turns these into span
    events; the engine imports no tracing library). `name`: "prefill_chunk" (`start`: the
    first prompt position computed, `tokens`: how many) or "recompute_after_preemption" (the
    request's KV cache was dropped and it was scheduled again from `start`)."""

    name: str
    time: float  # time.time() of the step that ran it
    start: int = 0
    tokens: int = 0


@dataclass(frozen=True)
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_cached_prompt_tokens: int = 0
    events: tuple[StepEvent, ...] = ()  # every StepEvent so far, in order


@fast_frozen  # one per moved request per step
@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    outputs: tuple[CompletionOutput, ...]  # one per index, in index order (deltas may be empty)
    finished: bool
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # once; first entry is None
    metrics: RequestMetrics | None = field(default=None, compare=False)
    error: str | None = None  # set when finish_reason is "error"

    def merge(self, newer: RequestOutput) -> RequestOutput:
        """The output carrying this one's deltas and the newer one's (same request; the newer
        may be a one-sequence request's `PlainOutput`, plain_output.py)."""
        if type(newer) is not RequestOutput:
            newer = newer.general()
        by_index = {o.index: o for o in self.outputs}
        for o in newer.outputs:
            by_index[o.index] = by_index[o.index].merge(o) if o.index in by_index else o
        return replace(
            newer,
            outputs=tuple(by_index[i] for i in sorted(by_index)),
            prompt_logprobs=newer.prompt_logprobs
            if newer.prompt_logprobs is not None
            else self.prompt_logprobs,
        )


class OutputAccumulator:
    """Folds one request's outputs into whole ones (offset 0), for consumers that answer once
    at the end (non-streaming routes, offline `generate`). O(total length) for in-order deltas."""

    def __init__(self) -> None:
        self._texts: dict[int, list[str]] = {}
        self._text_lens: dict[int, int] = {}
        self._ids: dict[int, list[int]] = {}
        self._logprobs: dict[int, list[TokenLogprob]] = {}
        self._last: RequestOutput | None = None
        self._prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None

    def add(self, output: RequestOutput) -> None:
        for c in output.outputs:
            texts = self._texts.setdefault(c.index, [])
            if c.text_offset != self._text_lens.get(c.index, 0):  # a restart: cut, then append
                texts[:] = ["".join(texts)[: c.text_offset]]
            texts.append(c.text)
            self._text_lens[c.index] = c.text_end
            ids = self._ids.setdefault(c.index, [])
            logprobs = self._logprobs.setdefault(c.index, [])
            del ids[c.token_offset :], logprobs[c.token_offset :]
            ids.extend(c.token_ids)
            logprobs.extend(c.logprobs or ())
        if output.prompt_logprobs is not None:
            self._prompt_logprobs = output.prompt_logprobs
        self._last = output

    def result(self) -> RequestOutput:
        """The whole output so far; raises if nothing was added."""
        last = self._last
        if last is None:
            raise ValueError("no output was added")
        if type(last) is not RequestOutput:  # a PlainOutput (plain_output.py)
            last = last.general()
        outputs = tuple(
            replace(
                c,
                text="".join(self._texts[c.index]),
                token_ids=tuple(self._ids[c.index]),
                logprobs=tuple(self._logprobs[c.index]) if c.logprobs is not None else None,
                text_offset=0,
                token_offset=0,
            )
            for c in last.outputs
        )
        return replace(last, outputs=outputs, prompt_logprobs=self._prompt_logprobs)


def closing_output(
    request_id: str, last: RequestOutput | None, finish_reason: str, error: str | None
) -> RequestOutput:
    """A finished output adding nothing to what was put before (`last`, the previous delta)
    but how it ended: every index closes at the offsets it had reached."""
    if last is None:
        outputs = (CompletionOutput(index=0, text="", token_ids=(), finish_reason=finish_reason),)
        return RequestOutput(request_id, (), outputs, finished=True, error=error)
    outputs = tuple(
        CompletionOutput(
            index=o.index,
            text="",
            token_ids=(),
            cumulative_logprob=o.cumulative_logprob,
            logprobs=() if o.logprobs is not None else None,
            finish_reason=o.finish_reason or finish_reason,
            stop_reason=o.stop_reason,
            text_offset=o.text_end,
            token_offset=o.num_tokens,
        )
        for o in last.outputs
    )
    return RequestOutput(
        request_id, last.prompt_token_ids, outputs, finished=True, metrics=last.metrics, error=error
    )
