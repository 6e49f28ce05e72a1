"""Continuous batching for llama.cpp's low-level API, as plain Python (no llama_cpp import).

Contract: `ContinuousBatcher(requests, max_seqs, max_tokens)` plans the `llama_decode` calls that
serve `requests` the way llama.cpp's own server does. `next_step()` returns the tokens of one call:
first one token for every running sequence that is decoding (its last generated token), then
prompt tokens of sequences still prefilling and of newly admitted ones, in order, until
`max_tokens` tokens are in the step (long prompts are split across steps: chunked prefill).
At most `max_seqs` sequences are alive at once; each owns a `slot` (the llama.cpp `seq_id`, in
`[0, max_seqs)`) from admission until it finishes. A token's `pos` is its position in its own
sequence. `wants_logits` is set on decode tokens and on the last prompt token, in step order.
`accept(sampled)` takes one sampled token per `wants_logits` entry of the last step, in that order,
and returns the sequences that reached their `output_len` (their slots are free again: the caller
must clear that seq_id's KV cells before the next step). `outputs[i]` holds request i's tokens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.workload import BenchRequest


@dataclass(frozen=True)
class StepToken:
    slot: int  # llama.cpp seq_id
    token: int
    pos: int  # position within its sequence
    wants_logits: bool


@dataclass(frozen=True)
class Finished:
    request_index: int
    slot: int


@dataclass
class _Live:
    index: int
    slot: int
    prompt: tuple[int, ...]
    output_len: int
    fed: int = 0  # prompt tokens already planned into a step
    generated: list[int] = field(default_factory=list)

    @property
    def decoding(self) -> bool:
        return self.fed == len(self.prompt)


class ContinuousBatcher:
    def __init__(self, requests: Sequence[BenchRequest], max_seqs: int, max_tokens: int) -> None:
        if max_seqs < 1 or max_tokens < 1:
            raise ValueError(
                f"max_seqs and max_tokens must be at least 1, got {max_seqs} and {max_tokens}"
            )
        for i, request in enumerate(requests):
            if not request.prompt_token_ids or request.output_len < 1:
                raise ValueError(
                    f"request {i} needs a non-empty prompt and output_len >= 1 for llama.cpp"
                )
        self.requests = tuple(requests)
        # Every decoding sequence takes one token of the step: never run more than fit.
        self.max_seqs = min(max_seqs, max_tokens)
        self.max_tokens = max_tokens
        self.outputs: list[list[int]] = [[] for _ in self.requests]
        self._waiting = deque(range(len(self.requests)))
        self._free_slots = list(range(self.max_seqs - 1, -1, -1))  # pop() hands out slot 0 first
        self._running: list[_Live] = []  # in admission order
        self._pending: list[_Live] = []  # the sequences whose logits the last step asked for

    def done(self) -> bool:
        return not self._waiting and not self._running

    def next_step(self) -> list[StepToken]:
        if self._pending:
            raise ValueError("accept() the sampled tokens of the last step before planning another")
        step: list[StepToken] = []
        for live in self._running:
            if live.decoding:
                pos = len(live.prompt) + len(live.generated) - 1
                step.append(StepToken(live.slot, live.generated[-1], pos, True))
                self._pending.append(live)
        for live in self._prefilling():
            budget = self.max_tokens - len(step)
            if budget == 0:
                break
            chunk = live.prompt[live.fed : live.fed + budget]
            for j, token in enumerate(chunk):
                last = live.fed + j == len(live.prompt) - 1
                step.append(StepToken(live.slot, token, live.fed + j, last))
            live.fed += len(chunk)
            if live.decoding:
                self._pending.append(live)
        return step

    def accept(self, sampled: Sequence[int]) -> list[Finished]:
        if len(sampled) != len(self._pending):
            raise ValueError(
                f"the last step asked for {len(self._pending)} tokens, got {len(sampled)}"
            )
        finished = []
        for live, token in zip(self._pending, sampled, strict=True):
            live.generated.append(int(token))
            if len(live.generated) == live.output_len:
                self.outputs[live.index] = live.generated
                self._running.remove(live)
                self._free_slots.append(live.slot)
                finished.append(Finished(live.index, live.slot))
        self._pending = []
        return finished

    def _prefilling(self):
        """Running sequences with prompt left, then new admissions while slots are free."""
        yield from [live for live in self._running if not live.decoding]
        while self._waiting and self._free_slots:
            index = self._waiting.popleft()
            request = self.requests[index]
            live = _Live(
                index, self._free_slots.pop(), request.prompt_token_ids, request.output_len
            )
            self._running.append(live)
            yield live
