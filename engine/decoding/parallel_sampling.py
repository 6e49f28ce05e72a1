"""Parallel sampling (n > 1, best_of >= n): several independent samples of one prompt that share
the prompt's KV blocks.

Contract:
- A request with `num_sequences > 1` and no beam search starts as one sequence. In the step where
  that sequence samples its first token (its prompt is in the cache), `sample_targets` forks
  `num_sequences - 1` children from it (`Scheduler.fork_seq`: they share every prompt block,
  ref-counted; the block manager copies the last, partly filled block when one of them writes
  into it) and returns one `SampleTarget` per sequence to sample. The children reuse the
  parent's logits row: the distribution of the first token is the same for all.
- Child i is sequence id i; a seeded request's child i draws only from
  `seeded_generator(seed, i)` (see RequestState.generator), so n seeded samples are distinct,
  reproducible and independent of the rest of the batch; child 0 equals the n = 1 sample.
- `row_params`: with best_of > n the chosen tokens' log-probs are always computed (logprobs=0
  for the sampler), since the n kept are those with the highest cumulative log-prob.
- `select_outputs`: with best_of == n every sequence in creation order (indices never change,
  so a stream stays consistent); with best_of > n, once finished, the n sequences of highest
  cumulative log-prob, best first, re-indexed 0..n-1 (the server refuses to stream best_of > n).
  Before the fork (nothing sampled yet) the one sequence stands for all n indices.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.requests.outputs import CompletionOutput
from engine.requests.request import Request, TokenSequence
from engine.requests.sampling_params import SamplingParams
from engine.scheduling.scheduler import ScheduledChunk, Scheduler


@dataclass(frozen=True)
class SampleTarget:
    """One token to sample: for `seq` of `request`, from row `row` of the step's logits."""

    request: Request
    seq: TokenSequence
    row: int


def is_parallel(params: SamplingParams) -> bool:
    return params.num_sequences > 1 and not params.use_beam_search


def keeps_best(params: SamplingParams) -> bool:
    """best_of > n: more samples run than are returned; the best are kept."""
    return is_parallel(params) and params.num_sequences > params.n


def row_params(params: SamplingParams) -> SamplingParams:
    """The params the sampler sees for this request's rows (see the module contract)."""
    if keeps_best(params) and params.logprobs is None:
        return dataclasses.replace(params, logprobs=0)
    return params


def children_to_fork(chunk: ScheduledChunk) -> range:
    """The sequence ids of the children a parallel group forks on its first token, which
    `sample_targets` will give them (empty for any other row)."""
    request, seq = chunk.request, chunk.seq
    if not is_parallel(request.params) or seq.num_output_tokens:
        return range(0)
    return request.upcoming_seq_ids(request.params.num_sequences - len(request.seqs))


def sample_targets(scheduler: Scheduler, chunk: ScheduledChunk, row: int) -> list[SampleTarget]:
    """The sequences that sample from `row` (the chunk's logits): the chunk's own, plus the
    children forked now when a parallel group samples its first token."""
    request, seq = chunk.request, chunk.seq
    targets = [SampleTarget(request, seq, row)]
    if is_parallel(request.params) and seq.num_output_tokens == 0:
        for _ in range(request.params.num_sequences - len(request.seqs)):
            targets.append(SampleTarget(request, scheduler.fork_seq(request, seq), row))
    return targets


def select_outputs(
    completions: list[CompletionOutput], params: SamplingParams, finished: bool
) -> tuple[CompletionOutput, ...]:
    """The outputs a request reports (see the module contract); `completions` follow
    `request.seqs` order, indexed 0.. ."""
    if is_parallel(params) and len(completions) == 1:  # not forked: nothing sampled yet
        first = completions[0]
        count = params.n if finished else params.num_sequences
        return tuple(dataclasses.replace(first, index=i) for i in range(count))
    if finished and keeps_best(params):
        ranked = sorted(completions, key=lambda c: c.cumulative_logprob or 0.0, reverse=True)
        return tuple(dataclasses.replace(c, index=i) for i, c in enumerate(ranked[: params.n]))
    return tuple(completions)
