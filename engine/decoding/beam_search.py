"""Beam search inside the engine: a request's beams are its sequences, on forked block tables.

API mapping (vLLM's legacy fields): `use_beam_search=True`; the beam width W is `best_of`, or
`n` when best_of is unset; the request returns the `n` <= W best hypotheses, best first.
`temperature == 0` is plain beam search (deterministic); `temperature > 0` is beam sampling
(transformers' `do_sample=True` with `num_beams`): candidates are drawn without replacement, by
the request's own generator, from the softmax of the accumulated scores, each beam's
distribution first shaped by temperature / top-k / top-p / min-p. In both modes logit_bias,
min_tokens and the penalties apply to each beam's logits first, as in the sampler. A sequence
ends on EOS or a stop token id, or at max_tokens; stop strings are refused (`check_beam_params`).

One step of a group whose live beams just had their last token computed (the loop body of
transformers' `_beam_search`, generation/utils.py, with the same constants):
1. candidate score = beam score + the token's search log-prob (log of the shaped, renormalised
   distribution; with nothing to shape, `log_softmax(logits)`). The best K = max(2, 1 + number
   of stop ids) * W candidates over all beams are taken, best first (sampled ones are sorted).
2. A candidate that ends its sequence and ranks among the first W becomes a hypothesis scored
   `score / num_generated_tokens ** length_penalty` (the prompt does not count, the ending token
   does): transformers' `sequences_scores`. The W best hypotheses are kept.
3. The first W candidates that do not end are the next beams (forked from their parents).
4. The search is over when no beam is left; with `early_stopping=True` as soon as W hypotheses
   are kept; otherwise once W are kept and the best beam's score / L ** length_penalty cannot
   beat the worst of them, with L its current length (max_tokens when early_stopping="never"
   and length_penalty > 0).
A hypothesis' `cumulative_logprob` is the raw model log-prob sum (as for sampling); for plain
beam search without penalties it equals score * len ** length_penalty. What a beam request shows
while it runs and at the end is beam_stream.py's business.

The logits are read below the runner (engine/sampling/beam_candidates.py): `ask(...)` is what a
group hands the runner (its beams' rows, histories and scores, K), and `step(...)` takes the
K candidates back as host data, best first, and does the rest (steps 2-4) here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.decoding.stop_checker import StopCriteria, check_stop
from engine.errors import InvalidRequest
from engine.requests.request import Request, TokenSequence
from engine.requests.sampling_params import SamplingParams
from engine.sampling.step_io import BeamAsk, BeamCandidate, SeedKey
from engine.scheduling.scheduler import Scheduler
from engine.types import TokenLogprob

EARLY_STOPPING = (False, True, "never")


def check_beam_params(params: SamplingParams) -> None:
    """Raises InvalidRequest for beam-search settings this engine cannot honour."""
    if params.stop:
        raise InvalidRequest(
            "stop", "stop strings are not supported with beam search; use stop_token_ids"
        )
    if params.early_stopping not in EARLY_STOPPING or not isinstance(
        params.early_stopping, bool | str
    ):
        raise InvalidRequest(
            "early_stopping",
            f'early_stopping must be true, false or "never", got {params.early_stopping!r}',
        )


@dataclass(frozen=True)
class Hypothesis:
    token_ids: tuple[int, ...]  # generated tokens, the ending one included
    score: float  # search log-prob sum / len(token_ids) ** length_penalty
    cumulative_logprob: float  # raw model log-prob sum
    logprobs: tuple[TokenLogprob, ...]  # one per token when the request asked, else ()
    finish_reason: str  # "stop" | "length"
    stop_reason: int | None


@dataclass(frozen=True)
class Candidate:
    parent: TokenSequence
    token_id: int
    score: float  # the parent's beam score + this token's search log-prob
    logprob: float  # the token's raw model log-prob
    entry: TokenLogprob | None  # when the request asked for logprobs


class BeamSearch:
    """The search state of one request: beam scores and the kept hypotheses."""

    def __init__(
        self, params: SamplingParams, criteria: StopCriteria, eos_token_ids: tuple[int, ...]
    ) -> None:
        self.params = params
        self.width = params.num_sequences
        self.criteria = criteria
        self.eos_token_ids = eos_token_ids
        self.num_candidates = (
            max(2, 1 + len(criteria.stop_token_ids | criteria.eos_token_ids)) * self.width
        )
        self.hypotheses: list[Hypothesis] = []  # best first, at most `width`
        self.done = False
        self._scores: dict[int, float] = {}  # live beam seq_id -> beam score (0 for the prompt)

    # ----- one step -------------------------------------------------------------------------
    def ask(
        self,
        request_id: str,
        beams: list[TokenSequence],
        rows: Sequence[int],
        params: SamplingParams,
        seed: SeedKey | None,
    ) -> BeamAsk:
        """What the runner computes for this step of the group: `beams` (the group's live
        sequences, all just computed) read logits `rows`; `params` the sampler's view."""
        return BeamAsk(
            owner=request_id,
            rows=tuple(rows),
            params=params,
            histories=tuple((s.prompt_token_ids, s.output_view()) for s in beams),
            scores=tuple(self._scores.get(s.seq_id, 0.0) for s in beams),
            num_candidates=self.num_candidates,
            seed=seed,
        )

    def step(
        self,
        scheduler: Scheduler,
        request: Request,
        beams: list[TokenSequence],
        candidates: Sequence[BeamCandidate],
    ) -> list[tuple[TokenSequence, TokenSequence]]:
        """`candidates`: the runner's answer to `ask` (best first). Chooses the next beams and
        hypotheses and applies them to the request's sequences. Returns (beam, parent) per
        beam that took a token, a forked beam's parent being the sequence it was forked from
        (itself otherwise): the grammar state follows it."""
        next_beams = self._choose(beams, candidates)
        if self.done:
            for seq in request.live_seqs:
                scheduler.remove_seq(request, seq)  # the last removal retires the request
            return []
        return self._advance(scheduler, request, next_beams)

    def _choose(
        self, beams: list[TokenSequence], candidates: Sequence[BeamCandidate]
    ) -> list[Candidate]:
        num_out = beams[0].num_output_tokens + 1  # the lockstep group's new length
        asked = self.params.logprobs is not None
        next_beams: list[Candidate] = []
        for rank, c in enumerate(candidates):
            if rank >= self.width and len(next_beams) == self.width:
                break  # nothing later can become a beam or a hypothesis
            finish = check_stop(self.criteria, c.token_id, num_out)
            if (finish is None and len(next_beams) == self.width) or (
                finish and rank >= self.width
            ):
                continue
            entry = TokenLogprob(c.token_id, c.logprob, c.top or ()) if asked else None
            cand = Candidate(beams[c.beam], c.token_id, c.score, c.logprob, entry)
            if finish is None:
                next_beams.append(cand)
            else:
                self._keep(cand, num_out, finish.reason, finish.stop_reason)
        self.done = self._is_done(next_beams, num_out)
        return next_beams

    def _keep(self, cand: Candidate, length: int, reason: str, stop_reason) -> None:
        parent = cand.parent
        hyp = Hypothesis(
            token_ids=(*parent.output_token_ids, cand.token_id),
            score=cand.score / length**self.params.length_penalty,
            cumulative_logprob=parent.cumulative_logprob + cand.logprob,
            logprobs=(*parent.logprobs, cand.entry) if cand.entry is not None else (),
            finish_reason=reason,
            stop_reason=stop_reason,
        )
        self.hypotheses.append(hyp)
        self.hypotheses.sort(key=lambda h: h.score, reverse=True)  # stable: earlier wins ties
        del self.hypotheses[self.width :]

    def _is_done(self, next_beams: list[Candidate], length: int) -> bool:
        if not next_beams:
            return True
        if len(self.hypotheses) < self.width:
            return False
        if self.params.early_stopping is True:
            return True
        penalty = self.params.length_penalty
        if self.params.early_stopping == "never" and penalty > 0.0:
            length = self.params.max_tokens
        return next_beams[0].score / length**penalty <= self.hypotheses[-1].score

    def _advance(
        self, scheduler: Scheduler, request: Request, next_beams: list[Candidate]
    ) -> list[tuple[TokenSequence, TokenSequence]]:
        """Scheduler protocol: fork the surviving parents, drop the others, then append."""
        children: dict[TokenSequence, list[Candidate]] = {}
        for cand in next_beams:
            children.setdefault(cand.parent, []).append(cand)
        dropped = [s for s in request.live_seqs if s not in children]
        pairs = []
        for parent, cands in children.items():
            pairs += [(scheduler.fork_seq(request, parent), c) for c in cands[1:]]
            pairs.append((parent, cands[0]))
        for seq in dropped:
            scheduler.remove_seq(request, seq)
        self._scores = {}
        for seq, cand in pairs:
            seq.append_token(cand.token_id, cand.logprob, cand.entry)
            self._scores[seq.seq_id] = cand.score
        return [(seq, cand.parent) for seq, cand in pairs]
