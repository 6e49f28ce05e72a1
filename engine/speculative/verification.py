"""Verifying a speculating sequence inside the engine's per-token update (step_update.py).

Contract:
- `ScoredProposal(request, seq, first_row, proposal)`: a chunk whose rows first_row ..
  first_row + len(proposal) of the step's sampling logits score the sequence's next token and
  one token past each proposed one.
- `position_rows(row, proposal)`: the `SamplingRow` of each scored position, built from the
  sequence's ordinary row: position i sees the output so far plus proposal[:i] (so penalties,
  min_tokens and the rest act as ordinary decoding would, had those tokens been emitted),
  and every position shares the sequence's generator. The sampler draws for them in row
  order: position i's draw is the one ordinary decoding makes for that token.
- `commit(scored, tokens, entries, scheduler, append, rewind_from)`: the verdict
  (acceptance.accept_matching) on the sampler's tokens, emitted token by token through
  `append(token, entry)` (the ordinary update: logprobs, stop checks, grammar); each kept
  proposal's K/V counts as computed before the next token is appended, and a sequence that
  finishes mid-way emits no more. Then the scheduler settles the sequence (prefix cache, blocks
  of rejected tokens freed) and, for a seeded sampled request, the generator is rewound
  (`rewind_from`: its state before the sampler drew) to the draws of the emitted tokens.
  Returns (proposed, accepted) for the counters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from engine.requests.request import Request, TokenSequence
from engine.sampling.sampling_batch import SamplingRow
from engine.scheduling.scheduler import Scheduler
from engine.speculative.acceptance import accept_matching, rewind_draws
from engine.types import TokenLogprob


@dataclass(frozen=True)
class ScoredProposal:
    request: Request
    seq: TokenSequence
    first_row: int  # the row scoring the token after the sequence's last one
    proposal: tuple[int, ...]

    @property
    def rows(self) -> range:
        return range(self.first_row, self.first_row + len(self.proposal) + 1)


def position_rows(row: SamplingRow, proposal: Sequence[int]) -> list[SamplingRow]:
    """One `SamplingRow` per scored position (see the module contract)."""
    rows = [row]
    history = list(row.output_token_ids)
    for token in proposal:
        history.append(token)
        rows.append(dataclasses.replace(row, output_token_ids=tuple(history)))
    return rows


def commit(
    scored: ScoredProposal,
    tokens: Sequence[int],
    entries: Sequence[TokenLogprob | None],
    scheduler: Scheduler,
    append: Callable[[int, TokenLogprob | None], None],
    rewind_from: tuple[torch.Generator, torch.Tensor] | None,
) -> tuple[int, int]:
    seq = scored.seq
    verdict = accept_matching(scored.proposal, tokens)
    emitted = 0
    for token, entry in zip(verdict.tokens, entries, strict=False):
        if emitted:
            scheduler.accept_proposed(seq)
        append(token, entry)
        emitted += 1
        if seq.is_finished:
            break
    scheduler.settle_proposed(seq)
    if rewind_from is not None:
        generator, state = rewind_from
        rewind_draws(generator, state, emitted, generator.device)
    return len(scored.proposal), verdict.num_accepted
