"""Speculative decoding counters: how much was proposed and how much of it the target kept.

Contract: `SpeculationCounters.record(num_proposed, num_accepted)` once per verified proposal
(one sequence, one step; a proposal of 0 tokens is not recorded). Verification keeps a prefix,
so position i (0-based) was accepted iff `num_accepted > i`. `snapshot()` is a frozen copy for
`EngineStats` / Prometheus: proposals, proposed and accepted tokens, and per position how
often it was proposed and accepted (the acceptance rate per position is their ratio).
`record_draft(seconds)` once per draft-model forward (one batch of sequences): how many there
were and the seconds they took, what a draft model's proposals cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SpeculationStats:
    num_proposals: int = 0  # verified proposals (sequence-steps that speculated)
    num_proposed_tokens: int = 0
    num_accepted_tokens: int = 0
    proposed_per_position: tuple[int, ...] = ()  # [k] times position i was proposed
    accepted_per_position: tuple[int, ...] = ()  # [k] times position i was accepted
    draft_forwards: int = 0  # draft-model forwards run (0 with n-gram proposals)
    draft_seconds: float = 0.0  # their wall time

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted over proposed tokens; None before any proposal."""
        if not self.num_proposed_tokens:
            return None
        return self.num_accepted_tokens / self.num_proposed_tokens

    def acceptance_rate_at(self, position: int) -> float | None:
        proposed = self.proposed_per_position
        if position >= len(proposed) or not proposed[position]:
            return None
        return self.accepted_per_position[position] / proposed[position]


@dataclass
class SpeculationCounters:
    num_speculative_tokens: int  # k: positions counted
    _proposals: int = 0
    _proposed: list[int] = field(default_factory=list)
    _accepted: list[int] = field(default_factory=list)
    _draft_forwards: int = 0
    _draft_seconds: float = 0.0

    def __post_init__(self) -> None:
        self._proposed = [0] * self.num_speculative_tokens
        self._accepted = [0] * self.num_speculative_tokens

    def record(self, num_proposed: int, num_accepted: int) -> None:
        if not 0 <= num_accepted <= num_proposed <= self.num_speculative_tokens:
            raise ValueError(
                f"accepted {num_accepted} of {num_proposed} proposed tokens "
                f"(at most {self.num_speculative_tokens})"
            )
        if not num_proposed:
            return
        self._proposals += 1
        for i in range(num_proposed):
            self._proposed[i] += 1
        for i in range(num_accepted):
            self._accepted[i] += 1

    def record_draft(self, seconds: float) -> None:
        self._draft_forwards += 1
        self._draft_seconds += seconds

    def snapshot(self) -> SpeculationStats:
        return SpeculationStats(
            num_proposals=self._proposals,
            num_proposed_tokens=sum(self._proposed),
            num_accepted_tokens=sum(self._accepted),
            proposed_per_position=tuple(self._proposed),
            accepted_per_position=tuple(self._accepted),
            draft_forwards=self._draft_forwards,
            draft_seconds=self._draft_seconds,
        )
