"""What one `Scheduler.schedule()` hands the engine, and what the engine must do with it.

Update protocol (what `Engine.step()` does with a `SchedulerOutput`):
    out = scheduler.schedule()
    runner: apply `out.block_copies` (copy block src -> dst in every layer's K and V),
        then one forward over `out.chunks`; a chunk computes tokens
        `seq.token_ids[start:start + num_new_tokens]` at positions start.. with
        `seq.block_table`; rows of chunks with `sample=True` produce logits (their last row;
        a chunk with a `proposal` feeds it after its known tokens, and its last
        1 + len(proposal) rows produce logits: engine/speculative/).
    scheduler.on_step_done(out)       # advances num_computed_tokens, registers cached blocks
                                      # (a proposal's rows are committed by verification)
    for each chunk with sample=True:  # in this order, per sampled sequence:
        seq.append_token(token, logprob)          # after on_step_done, never before
        if it stops: scheduler.finish_seq(request, seq, reason, stop_reason)
    forks / beam pruning (issue #4), between steps only:
        child = scheduler.fork_seq(request, parent); scheduler.remove_seq(request, seq)
    emit outputs; for ids in out.aborted emit final "abort" outputs (the engine holds the Request).
Every running sequence must have an uncomputed token at the next `schedule()`: either a token
was appended or the sequence was finished/removed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from engine.fast_frozen import fast_frozen
from engine.requests.request import Request, TokenSequence
from engine.scheduling.block_manager import BlockUsage


@dataclass(frozen=True)
class Proposals:
    """Speculative decoding's proposals, made after a step (engine/speculative) and handed to
    the scheduler as data: per sequence, the tokens guessed after its last one, valid while it
    holds `num_tokens[seq]` tokens (a proposal for a sequence that has moved on is ignored)."""

    tokens: Mapping[TokenSequence, tuple[int, ...]]
    num_tokens: Mapping[TokenSequence, int]

    @classmethod
    def of(cls, tokens: Mapping[TokenSequence, tuple[int, ...]]) -> Proposals:
        return cls(dict(tokens), {seq: seq.num_tokens for seq in tokens})

    def get(self, seq: TokenSequence) -> tuple[int, ...]:
        proposal = self.tokens.get(seq, ())
        return proposal if proposal and self.num_tokens[seq] == seq.num_tokens else ()


NO_PROPOSALS = Proposals({}, {})


@fast_frozen  # one per scheduled sequence per step
@dataclass(frozen=True)
class ScheduledChunk:
    request: Request
    seq: TokenSequence
    start: int  # num_computed_tokens before this step = position of the first new token
    num_new_tokens: int  # rows the forward computes, proposed tokens included
    sample: bool  # reaches the end of the known tokens: the runner returns its last row's logits
    # Speculative decoding: tokens proposed after the sequence's last one (engine/speculative).
    # They follow the known tokens in this chunk's rows, are never in `seq.token_ids`, and every
    # one of the last 1 + len(proposal) rows is sampled (the target's verdict on each).
    proposal: tuple[int, ...] = ()
    # The overlapped loop (engine/step_pipeline.py): the chunk's last known token, sampled by
    # the previous step, which the scheduler saw as a placeholder; the runner sets it.
    carried_input: int | None = None

    @property
    def seq_len(self) -> int:
        """Context length once this chunk is in the cache (what attention looks at)."""
        return self.start + self.num_new_tokens

    @property
    def input_ids(self) -> list[int]:
        """The token ids of this chunk's rows: known tokens, then the proposal."""
        known = self.seq.token_ids[self.start : self.seq_len - len(self.proposal)]
        if self.carried_input is not None:
            known[-1] = self.carried_input  # (a slice: the sequence is not changed)
        return known + list(self.proposal) if self.proposal else known

    @property
    def num_sampled_rows(self) -> int:
        """Rows whose logits are sampled: its last one, or all the speculated ones."""
        return 1 + len(self.proposal) if self.sample else 0


@dataclass(frozen=True)
class SchedulerOutput:
    # Decodes first, then prefill chunks: a tuple, or in a steady step the decodes as columns
    # (decode_columns.py's DecodeColumns, a Sequence of them built on demand).
    chunks: Sequence[ScheduledChunk]
    # (src, dst) block copies to apply before the forward. No block is both a src and a dst
    # in one step, so they may be applied all at once.
    block_copies: tuple[tuple[int, int], ...]
    preempted: tuple[str, ...]  # request ids sent back to waiting this step
    aborted: tuple[str, ...]  # request ids removed by abort this step
    num_batched_tokens: int  # rows through the linears
    num_pairs: int = 0  # query x key pairs through attention (step_cost.chunk_pairs summed)
    num_prefill_tokens: int = 0  # rows of prompt (or recompute) chunks, decodes excluded
    # Every chunk a one-token decode without a proposal, sampled (the steady state: the
    # passes over the rows skip the checks that cannot hold then).
    decodes_only: bool = False
    # When `decodes_only` and the chunks are every running request's decode in the decode
    # pass's order: that order's list (RequestQueues.by_priority), the same object from step
    # to step while the running set does not change, so what a step's rows were planned with
    # holds for the next step's rows while it is the same (engine/sampling_plan.py).
    running_order: list[Request] | None = None

    @property
    def is_empty(self) -> bool:
        return not self.chunks

    def sampled_rows(self) -> Iterator[tuple[int, ScheduledChunk]]:
        """(first sampling-logits row, chunk) of each chunk with `sample=True`, in order."""
        row = 0
        for chunk in self.chunks:
            if chunk.sample:
                yield row, chunk
                row += chunk.num_sampled_rows


@dataclass(frozen=True)
class SchedulerStats:
    num_running: int  # requests
    num_waiting: int
    num_preemptions: int  # cumulative
    blocks: BlockUsage
    # Prefill tokens (from position 0) the last step could take after its decodes: the
    # current chunk size the step-time target allows (the token budget when it does not apply).
    prefill_capacity: int = 0


def chunk_sizes(remaining: list[int], budget: int) -> list[int] | None:
    """Tokens per sequence of one group this step. All of them if they fit (every sequence
    samples); else chunks that stop short of every sequence's end, so the group's sequences
    still sample in the same step. None when nothing can be scheduled."""
    if sum(remaining) <= budget:
        return list(remaining)
    sizes = []
    for r in remaining:
        take = min(r - 1, budget)
        sizes.append(take)
        budget -= take
    return sizes if any(sizes) else None
