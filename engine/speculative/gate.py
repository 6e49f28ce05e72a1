"""ProposalGate: how many of the n-gram proposer's tokens a sequence should send to the target,
from how often that sequence's proposals have been kept (0: none, an ordinary decode step).

Why: a verify step with j proposed tokens costs more than a one-token step (on the CPU path at
batch 1 a 5-row step costs ~1.85 one-row steps, PERFORMANCE.md), so proposals that are mostly
refused make decoding slower than not speculating. The gate proposes only where the expected
gain pays for the extra rows.

Model: each proposed token is kept with probability a, independently, once the tokens before
it were kept. A proposal of j tokens then emits E(j) = (1 - a^(j+1)) / (1 - a) tokens for a
step costing 1 + row_cost * j one-token steps; the gate picks the j in 0..limit maximising
E(j) / (1 + row_cost * j) (j = 0 scores 1: no speculation). a is per sequence: decayed counts
of kept tokens (successes) and of first refusals (failures), a = s / (s + f), starting from a
prior of one of each (a = 0.5: a new sequence tries).

Learning, with no hook after the step: `length(seq, proposal)` first compares the proposal it
saw last time for `seq` with the tokens `seq` got since (a refused token is the first that
differs; tokens beyond the ones since are not judged), then remembers the whole `proposal`,
also when it sends fewer tokens or none: the n-gram proposal costs no forward, so a gated
sequence keeps learning from the proposals it did not send and opens again when they would
have been kept. States of finished sequences are dropped whenever the states have doubled
since the last sweep (amortised O(1) a call, not a scan of every sequence at every call).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.requests.request import TokenSequence

DEFAULT_ROW_COST = 0.25  # one proposed row / a one-token step (CPU, batch 1, measured ~0.21)


@dataclass
class _Record:
    successes: float = 1.0  # the prior: a = 0.5
    failures: float = 1.0
    proposal: tuple[int, ...] = ()  # what was proposed (sent or not) when `seq` had ...
    at: int = 0  # ... this many tokens


class ProposalGate:
    def __init__(self, row_cost: float = DEFAULT_ROW_COST, decay: float = 0.9) -> None:
        if row_cost < 0 or not 0 < decay <= 1:
            raise ValueError(f"need row_cost >= 0 and 0 < decay <= 1, got {row_cost}, {decay}")
        self.row_cost = row_cost
        self.decay = decay
        self._records: dict[TokenSequence, _Record] = {}
        self._sweep_at = 16  # sweep finished sequences' states when there are this many

    def length(self, seq: TokenSequence, proposal: tuple[int, ...]) -> int:
        """How many of `proposal`'s tokens to send (see the module contract)."""
        if len(self._records) >= self._sweep_at:
            for done in [s for s in self._records if s.is_finished]:
                del self._records[done]
            self._sweep_at = max(16, 2 * len(self._records))
        record = self._records.setdefault(seq, _Record())
        self._learn(record, seq)
        record.proposal, record.at = proposal, seq.num_tokens
        return best_length(self.acceptance(seq), len(proposal), self.row_cost)

    def acceptance(self, seq: TokenSequence) -> float:
        """The current estimate of a for `seq` (the prior's 0.5 for one never seen)."""
        record = self._records.get(seq, _Record())
        return record.successes / (record.successes + record.failures)

    def _learn(self, record: _Record, seq: TokenSequence) -> None:
        since = seq.token_ids[record.at : record.at + len(record.proposal)]
        if not since:  # nothing proposed, or the sequence has not moved
            return
        kept = 0
        while kept < len(since) and since[kept] == record.proposal[kept]:
            kept += 1
        record.successes = self.decay * record.successes + kept
        record.failures = self.decay * record.failures + (kept < len(since))


def best_length(acceptance: float, limit: int, row_cost: float) -> int:
    """The j in 0..limit maximising E(j) / (1 + row_cost * j); of gains within 1e-9 of the
    best, the shortest (a row that buys nothing is not sent)."""
    gains = [1.0]
    expected, kept_all = 1.0, 1.0  # E(j), a^j
    for j in range(1, limit + 1):
        kept_all *= acceptance
        expected += kept_all
        gains.append(expected / (1 + row_cost * j))
    top = max(gains)
    return next(j for j, gain in enumerate(gains) if gain >= top - 1e-9)
