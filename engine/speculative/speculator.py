"""Speculator: who speculates, how far, and what it proposes (the engine's one speculative
object; None when `EngineConfig.speculative` is None).

Contract:
- `propose_all(wanted)`: after a step (the scheduler never calls it), for each
  `(request, seq, matcher)` of a running sequence awaiting a one-token decode, up to k tokens
  continuing `seq` (n-gram lookup, or the draft model's greedy continuation, drafted for all of
  them in one batch), or () when the sequence does not speculate; the engine hands the result
  to the scheduler (`Scheduler.take_proposals`) as data. n-gram
  proposals are cut to the length `gate` (gate.py) finds pays for its rows, from how often
  the sequence's proposals were kept (none when they mostly are not); a draft model's are not
  (its cost is the draft's forwards, paid before the gate could cut). Beam search never does
  (a beam step compares all beams at one position). At most
  `max_tokens - num_output - 1` tokens, so the tokens a verification emits (kept proposals +
  one) never pass max_tokens and their K/V slots stay within what admission reserved. Under a
  grammar (`matcher`, the sequence's llguidance matcher, fed its output) the proposal is cut
  at the first token the grammar refuses.
- `grammar_jobs(matcher, proposal, first_row)`: the (row, matcher) mask jobs of a sampled
  chunk under a grammar: row first_row + i gets a copy of the matcher fed proposal[:i] (the
  grammar's state had those tokens been emitted), so every scored position is masked as
  ordinary decoding would mask it.
- `counters` counts proposals and acceptances (counters.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance

from engine.requests.request import Request, TokenSequence
from engine.speculative.config import SpeculativeConfig
from engine.speculative.counters import SpeculationCounters
from engine.speculative.draft import DraftProposer
from engine.speculative.gate import ProposalGate
from engine.speculative.ngram import NgramProposer


class Speculator:
    def __init__(self, config: SpeculativeConfig, draft: DraftProposer | None = None) -> None:
        """`draft`: the draft model's proposer (engine/speculative/draft.py), needed for and
        only for method "draft"."""
        if (config.method == "draft") != (draft is not None):
            raise ValueError("speculative 'draft' needs the draft model's proposer, and only it")
        self.config = config
        self.draft = draft
        self.ngram = NgramProposer(config.num_tokens, config.ngram_min, config.ngram_max)
        self.gate = ProposalGate()  # n-gram proposals: sent as far as they pay (gate.py)
        self.counters = SpeculationCounters(config.num_tokens)
        if draft is not None:
            draft.on_forward = self.counters.record_draft

    def propose_all(
        self, wanted: Sequence[tuple[Request, TokenSequence, llguidance.LLMatcher | None]]
    ) -> dict[TokenSequence, tuple[int, ...]]:
        limits = {seq: _limit(request, seq) for request, seq, _ in wanted}
        if self.draft is not None:
            proposals = self.draft.propose_all({s: n for s, n in limits.items() if n > 0})
        else:
            proposals = {}
            for seq, limit in limits.items():
                if limit > 0:
                    proposal = self.ngram.propose(seq.token_ids, limit)
                    proposals[seq] = proposal[: self.gate.length(seq, proposal)]
        for _, seq, matcher in wanted:
            proposal = proposals.get(seq, ())
            if proposal and matcher is not None:
                proposals[seq] = proposal[: matcher.validate_tokens(list(proposal))]
        return {seq: p for seq, p in proposals.items() if p}


def _limit(request: Request, seq: TokenSequence) -> int:
    """How many tokens `seq` may be proposed (0: it does not speculate)."""
    params = request.params
    if params.use_beam_search or params.max_tokens is None:
        return 0
    return max(params.max_tokens - seq.num_output_tokens - 1, 0)


def grammar_jobs(
    matcher: llguidance.LLMatcher, proposal: Sequence[int], first_row: int
) -> list[tuple[int, llguidance.LLMatcher]]:
    """The mask jobs of a sampled chunk under a grammar (see the module contract)."""
    jobs = [(first_row, matcher)]
    for i in range(1, len(proposal) + 1):
        ahead = matcher.deep_copy()
        ahead.consume_tokens(list(proposal[:i]))
        jobs.append((first_row + i, ahead))
    return jobs
