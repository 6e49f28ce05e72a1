"""Request and TokenSequence: the per-request state the scheduler and block manager keep (no torch).

The one token-accounting rule: a `TokenSequence` knows `num_tokens` (prompt + generated, i.e.
`len(token_ids)`) and `num_computed_tokens` (how many of them already have K/V in the cache).
Every step the scheduler gives it a chunk of `num_tokens - num_computed_tokens` to compute; once
all known tokens are computed the engine samples one more, which `append_token` adds. Prefill,
chunked prefill, decode, prefix-cache hits (start with computed > 0) and preemption by recompute
(computed reset to 0) are all that one rule.

A `Request` is a sequence group: one prompt, its `SamplingParams`, and `seqs`. It starts with one
sequence; for n > 1 / best_of / beam search the engine forks more after the prompt is computed
(`Scheduler.fork_seq`), and they share KV blocks. The group is admitted, scheduled and preempted
as one unit. Sequences compare by identity (`eq=False`): the block manager keys on them.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.requests.sampling_params import SamplingParams
from engine.types import TokenLogprob

# Where a sequence's next token will be once the step that samples it is read back (the
# overlapped loop: engine/step_pipeline.py); never a vocabulary id.
PLACEHOLDER = -1


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class TokenSequence:
    seq_id: int  # unique within its request; never reused
    token_ids: list[int]  # prompt + generated
    num_prompt_tokens: int
    num_computed_tokens: int = 0  # tokens whose K/V sit in the cache
    block_table: list[int] = field(default_factory=list)  # owned by the BlockManager
    cumulative_logprob: float = 0.0
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per generated token, when asked
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" once finished
    stop_reason: int | str | None = None  # the stop token id or stop string
    # Encoder-decoder models: the decoder's tokens start here, after the encoder region.
    decoder_start: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def prompt_token_ids(self) -> tuple[int, ...]:
        """The prompt the model continues (an encoder-decoder's: its decoder prompt, which is
        what sampling's repetition penalty reads, as in transformers)."""
        return tuple(self.token_ids[self.decoder_start : self.num_prompt_tokens])

    @property
    def output_token_ids(self) -> tuple[int, ...]:
        return tuple(self.token_ids[self.num_prompt_tokens :])

    def output_view(self) -> OutputIds:
        """The generated ids without a copy (O(1); `output_token_ids` copies them)."""
        return OutputIds(self.token_ids, self.num_prompt_tokens)

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def append_token(
        self, token_id: int, logprob: float = 0.0, entry: TokenLogprob | None = None
    ) -> None:
        """Adds the token sampled from this sequence's last row (after `on_step_done`)."""
        if self.num_computed_tokens != len(self.token_ids):
            raise RuntimeError(
                f"sequence {self.seq_id}: append_token before all {len(self.token_ids)} known "
                f"tokens are computed ({self.num_computed_tokens}); call "
                "Scheduler.on_step_done(output) first"
            )
        self.token_ids.append(token_id)
        self.cumulative_logprob += logprob
        if entry is not None:
            self.logprobs.append(entry)

    def put_token(
        self, index: int, token_id: int, logprob: float = 0.0, entry: TokenLogprob | None = None
    ) -> None:
        """`append_token` for a token whose place was held: the overlapped loop appended
        PLACEHOLDER at `index` when it scheduled the next step before this token was known."""
        if self.token_ids[index] != PLACEHOLDER:
            raise RuntimeError(f"sequence {self.seq_id}: no placeholder at {index}")
        self.token_ids[index] = token_id
        self.cumulative_logprob += logprob
        if entry is not None:
            self.logprobs.append(entry)

    def clone(self, seq_id: int) -> TokenSequence:
        """A copy of the token state without blocks (the block manager shares them on fork)."""
        return TokenSequence(
            seq_id=seq_id,
            token_ids=list(self.token_ids),
            num_prompt_tokens=self.num_prompt_tokens,
            num_computed_tokens=self.num_computed_tokens,
            cumulative_logprob=self.cumulative_logprob,
            decoder_start=self.decoder_start,
            logprobs=list(self.logprobs),
        )


class OutputIds(Sequence[int]):
    """A read-only view of a sequence's generated ids (its token list from the prompt's end)."""

    def __init__(self, token_ids: list[int], start: int) -> None:
        self._ids = token_ids
        self._start = start

    def __len__(self) -> int:
        return len(self._ids) - self._start

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return self._ids[self._start :][i]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._ids[self._start + i]

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(self._ids, self._start, None)


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    arrival_time: float = 0.0
    status: RequestStatus = RequestStatus.WAITING
    seqs: list[TokenSequence] = field(default_factory=list)
    num_preemptions: int = 0  # times this request was preempted by recompute
    num_cached_prompt_tokens: int = 0  # prefix-cache hit of the first admission
    # Encoder-decoder models: the encoder's input, and where the decoder's tokens begin in the
    # prompt (after the encoder region: engine/encoder_layout.py); () and 0 otherwise.
    encoder_token_ids: tuple[int, ...] = ()
    decoder_start: int = 0
    # The CompiledGrammar of params.structured_output (engine/sampling), made by new_request off
    # the engine's thread; the engine's cache may have dropped it since, so it travels here.
    grammar: Any = field(default=None, repr=False)
    # Its LoRA adapter (params.adapter) while it holds one (engine/lora_adapters.py): the bank
    # slot its rows use and the key its prefix-cache blocks chain from; -1 / None: the base.
    lora_slot: int = -1
    lora_key: str | None = None
    _next_seq_id: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        self.prompt_token_ids = tuple(self.prompt_token_ids)
        if not self.prompt_token_ids:
            raise ValueError(
                f"request {self.request_id!r}: the prompt must hold at least one token"
            )
        if not self.seqs:
            self.seqs.append(
                TokenSequence(
                    seq_id=self.new_seq_id(),
                    token_ids=list(self.prompt_token_ids),
                    num_prompt_tokens=len(self.prompt_token_ids),
                    decoder_start=self.decoder_start,
                )
            )

    def new_seq_id(self) -> int:
        seq_id = self._next_seq_id
        self._next_seq_id += 1
        return seq_id

    def upcoming_seq_ids(self, count: int) -> range:
        """The ids the next `count` `new_seq_id` calls give (a fork's generator is keyed by its
        sequence id before the fork happens)."""
        return range(self._next_seq_id, self._next_seq_id + count)

    @property
    def live_seqs(self) -> list[TokenSequence]:
        """The sequences still generating, in creation order (scheduled together each step)."""
        return [s for s in self.seqs if not s.is_finished]

    def awaiting_decode(self) -> list[TokenSequence]:
        """The live sequences of a running request whose next step is a one-token decode
        (the sequences speculative decoding proposes for)."""
        if self.status is not RequestStatus.RUNNING:
            return []
        return [s for s in self.live_seqs if s.num_uncomputed_tokens == 1]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def input_token_ids(self) -> tuple[int, ...]:
        """The prompt as the client gave it (an encoder-decoder's: the encoder input)."""
        return self.encoder_token_ids or self.prompt_token_ids

    @property
    def num_seq_slots(self) -> int:
        """Batch rows this group may occupy: its planned width until it has forked."""
        seqs = self.seqs
        if len(seqs) == 1 and seqs[0].finish_reason is None:  # the common case, every step
            return max(1, self.params.num_sequences)
        num_finished = sum(1 for s in seqs if s.is_finished)
        return max(len(seqs) - num_finished, self.params.num_sequences - num_finished)

    def max_kv_tokens(self) -> int:
        """K/V slots one sequence can need: the last sampled token is never computed."""
        return len(self.prompt_token_ids) + self.params.max_tokens - 1
