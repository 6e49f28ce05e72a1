"""What crosses the runner boundary for a step's sampling: plain host data both ways (issue 38).

Contract (frozen dataclasses, no tensors; the runner floor, step_sampler.py, owns the device):
- In, `StepSampling`: per token to draw a `Draw` (the logits row it reads, its request — the
  unit a failure ends —, its parameters, the token history the penalties read, and a `SeedKey`
  when the request is seeded: the floor keeps that sequence's generator); per speculating
  sequence a `Speculated` (its scored positions are `draws[first : first + len(proposal) + 1]`);
  per beam group a `BeamAsk` (its beams' rows, histories and scores); per chunk that asked for
  prompt logprobs a `PromptAsk` (the prompt tokens its rows predict); the step's grammar masks
  (a pending `HostMask`, computed on the host while the forward runs, keyed by logits row);
  the EOS ids (min_tokens bans them) and the requests that ended since the last step (their
  generators go).
- Out, `StepOutput`: per draw the token and its `TokenLogprob` (when asked); per `Speculated`
  the tokens to append (the kept proposals, then the target's own token); per `BeamAsk` its
  candidates, best first; per asking chunk its prompt logprobs; `failed`, request id -> why,
  for the requests whose draws or beam step raised (they alone fail); `grammar_failed`, the
  logits rows whose grammar mask could not be made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from engine.grammar.host_mask import PendingHostMask
from engine.sampling.sampling_batch import RowParams
from engine.types import TokenLogprob


@dataclass(frozen=True)
class Argmax:
    """`RowParams` of a plain greedy row (a draft model's proposal)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    logprobs: int | None = None
    logit_bias: Mapping[int, float] = field(default_factory=lambda: MappingProxyType({}))
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = True
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return True


@dataclass(frozen=True)
class SeedKey:
    """A seeded sequence's generator: `seeded_generator(seed, seq_id)`, kept by the floor."""

    request_id: str
    seq_id: int
    seed: int


@dataclass(frozen=True)
class Draw:
    row: int  # the logits row it reads (forks of a parallel group share one)
    owner: str  # its request's id
    params: RowParams
    prompt_token_ids: Sequence[int] = ()  # read by the repetition penalty only
    output_token_ids: Sequence[int] = ()
    seed: SeedKey | None = None


@dataclass(frozen=True)
class Speculated:
    owner: str
    first: int  # index in `StepSampling.draws` of the position after the sequence's last token
    proposal: tuple[int, ...]
    seed: SeedKey | None  # rewound to the draws of the tokens kept

    @property
    def draws(self) -> range:
        return range(self.first, self.first + len(self.proposal) + 1)


@dataclass(frozen=True)
class BeamAsk:
    owner: str
    rows: tuple[int, ...]  # [B] the logits rows of the group's live beams
    params: RowParams
    histories: tuple[tuple[Sequence[int], Sequence[int]], ...]  # [B] (prompt, output) ids
    scores: tuple[float, ...]  # [B] each beam's score so far
    num_candidates: int  # K: how many candidates to return at most
    seed: SeedKey | None  # beam sampling's generator (None: the floor's shared one)


@dataclass(frozen=True)
class PromptAsk:
    owner: str
    chunk: int  # index of the chunk in the step
    targets: tuple[int, ...]  # the prompt token row r predicts, for its first len(targets) rows
    top_n: int


@dataclass(frozen=True)
class StepSampling:
    draws: tuple[Draw, ...] = ()
    speculated: tuple[Speculated, ...] = ()
    beams: tuple[BeamAsk, ...] = ()
    prompt_logprobs: tuple[PromptAsk, ...] = ()
    grammar: PendingHostMask | None = None
    eos_token_ids: tuple[int, ...] = ()
    released: tuple[str, ...] = ()  # requests that ended: their generators go
    # (chunk index, draw index of the previous step): that chunk's last input is the token
    # the previous step drew there (the overlapped loop scheduled it before the token reached
    # the host; the runner resolves it, engine/carried_inputs.py)
    carried: tuple[tuple[int, int], ...] = ()

    @property
    def full_logits_for(self) -> frozenset[int]:
        return frozenset(ask.chunk for ask in self.prompt_logprobs)

    @classmethod
    def argmax(cls, num_rows: int) -> StepSampling:
        """The argmax of each of `num_rows` logits rows (a draft model's proposals)."""
        params = Argmax()
        return cls(draws=tuple(Draw(row, "", params) for row in range(num_rows)))


@dataclass(frozen=True)
class BeamCandidate:
    beam: int  # index in the group's beams
    token_id: int
    score: float  # the beam's score + the token's search log-prob
    logprob: float  # the token's raw model log-prob
    top: tuple[tuple[int, float], ...] | None  # the beam's top-N raw log-probs, when asked


@dataclass(frozen=True)
class StepOutput:
    tokens: tuple[int, ...] = ()  # per draw
    logprobs: tuple[TokenLogprob | None, ...] = ()  # per draw
    accepted: tuple[tuple[int, ...], ...] = ()  # per Speculated: the tokens to append
    beams: tuple[tuple[BeamCandidate, ...], ...] = ()  # per BeamAsk, best first
    prompt_logprobs: Mapping[int, tuple[TokenLogprob, ...]] = field(default_factory=dict)
    failed: Mapping[str, str] = field(default_factory=dict)  # request id -> what broke
    grammar_failed: tuple[int, ...] = ()  # logits rows
