"""Verifying a speculating sequence inside the engine's per-token update (step_update.py).

Contract:
- `ScoredProposal(request, seq, first_row, proposal)`: a chunk whose rows first_row ..
  first_row + len(proposal) of the step's sampling logits score the sequence's next token and
  one token past each proposed one.
- `position_rows(row, proposal)`: the `Draw` (engine/sampling/step_io.py) of each scored
  position, built from the
  sequence's ordinary row: position i sees the output so far plus proposal[:i] (so penalties,
  min_tokens and the rest act as ordinary decoding would, had those tokens been emitted),
  and every position shares the sequence's generator. The runner floor draws for them in row
  order (position i's draw is the one ordinary decoding makes for that token), applies the
  verdict (acceptance.accept_matching) and rewinds a seeded sampled sequence's generator to the
  draws of the tokens kept (engine/sampling/step_sampler.py).
- `commit(scored, accepted, entries, scheduler, append)`: the runner's verdict (`accepted`: the
  kept proposals, then the target's token), emitted token by token through
  `append(token, entry)` (the ordinary update: logprobs, stop checks, grammar); each kept
  proposal's K/V counts as computed before the next token is appended, and a sequence that
  finishes mid-way emits no more. Then the scheduler settles the sequence (prefix cache, blocks
  of rejected tokens freed). Returns (proposed, accepted) for the counters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.requests.request import Request, TokenSequence
from engine.sampling.step_io import Draw
from engine.scheduling.scheduler import Scheduler
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


def position_rows(row: Draw, proposal: Sequence[int]) -> list[Draw]:
    """One `Draw` per scored position (see the module contract); they read consecutive
    logits rows from `row.row`."""
    rows = [row]
    history = list(row.output_token_ids)
    for i, token in enumerate(proposal, start=1):
        history.append(token)
        rows.append(dataclasses.replace(row, row=row.row + i, output_token_ids=tuple(history)))
    return rows


def commit(
    scored: ScoredProposal,
    accepted: Sequence[int],
    entries: Sequence[TokenLogprob | None],
    scheduler: Scheduler,
    append: Callable[[int, TokenLogprob | None], None],
) -> tuple[int, int]:
    seq = scored.seq
    for emitted, (token, entry) in enumerate(zip(accepted, entries, strict=False)):
        if emitted:
            scheduler.accept_proposed(seq)
        append(token, entry)
        if seq.is_finished:
            break
    scheduler.settle_proposed(seq)
    return len(scored.proposal), len(accepted) - 1
