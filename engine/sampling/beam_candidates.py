"""A beam group's candidates on the device: the part of a beam-search step that reads logits
(the runner floor; the search itself, hypotheses and forks, is engine/decoding/beam_search.py).

Contract: `beam_logprobs(logits, rows, eos_token_ids, grammar)` -> (raw, search) log-probs
`[B, V]`: raw = log_softmax(logits); search = the log of the distribution after bias / masks /
penalties / the grammar's mask and, when sampling, temperature and top-k / top-p / min-p (the
sampler's pipeline). `BeamCandidates.start(...)` computes, with no read of device data, the
K = `num_candidates` best candidates over all beams (candidate score = the beam's score + the
token's search log-prob), as fixed-size device tensors; `tensors()` go into the step's one
fetch and `read(lists)` turns the host lists into `BeamCandidate`s, best first, dropping the
padding a fixed size needs (candidates of score -inf, or of probability 0 when sampling).
- plain beam search (greedy): the global top K lie within each beam's own top K;
- beam sampling: K draws without replacement from the softmax of all candidate scores, by the
  group's generator, then sorted by score (stable). The draws are torch.multinomial's own
  (its no-replacement path is the top K of probs / Exp(1) noise, which this computes without
  the count of non-zero probabilities, a host read): the same tokens from the same generator.
- each candidate's raw log-prob, and with `top_n` each beam's top-N raw log-probs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.grammar.token_mask import TokenMask
from engine.host_transfer import to_device
from engine.sampling.logits_processors import filtered_probs, softmax_rows
from engine.sampling.sampler import process_logits
from engine.sampling.sampling_batch import SamplingBatch, SamplingRow
from engine.sampling.step_io import BeamCandidate


def beam_logprobs(
    logits: torch.Tensor,
    rows: list[SamplingRow],
    eos_token_ids: tuple[int, ...],
    grammar: TokenMask | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(raw, search) log-probs [B, V] of a group's beams (see the module contract)."""
    raw = softmax_rows(logits, log=True)
    batch = SamplingBatch.build(rows, logits.shape[1], logits.device, eos_token_ids, grammar)
    processed = process_logits(logits, batch)  # the sampler's bias / masks / penalties
    f = batch.filters
    if f is None:
        return raw, raw if processed is logits else processed.log_softmax(dim=-1)
    return raw, filtered_probs(processed, f.temperature, f.top_k, f.top_p, f.min_p, f.plan).log()


@dataclass(frozen=True)
class BeamCandidates:
    """One group's candidates, on the device until the step's fetch."""

    vocab: int
    greedy: bool
    flat: torch.Tensor  # [K] beam * V + token
    scores: torch.Tensor  # [K] float64
    keep: torch.Tensor  # [K] bool: a real candidate (finite score / non-zero probability)
    logprobs: torch.Tensor  # [K] raw log-prob of each candidate
    top: tuple[torch.Tensor, torch.Tensor] | None  # [B, N] ids and raw log-probs

    @classmethod
    def start(
        cls,
        logits: torch.Tensor,
        rows: list[SamplingRow],
        eos_token_ids: tuple[int, ...],
        scores: Sequence[float],
        num_candidates: int,
        generator: torch.Generator | None,
        grammar: TokenMask | None = None,
        top_n: int | None = None,
    ) -> BeamCandidates:
        """`logits` [B, V]: the beams' rows; `scores` [B]: the beams' scores so far."""
        raw, search = beam_logprobs(logits, rows, eos_token_ids, grammar)
        base = to_device(list(scores), torch.float64, search.device).unsqueeze(1)  # [B, 1]
        vocab = search.shape[1]
        greedy = rows[0].params.greedy
        if greedy:
            top = search.topk(min(num_candidates, vocab), dim=-1)  # [B, k] float32
            cand = (top.values.to(torch.float64) + base).flatten()  # [B * k]
            best = cand.topk(min(num_candidates, cand.shape[0]))
            beams = best.indices // top.values.shape[1]
            flat = beams * vocab + top.indices.flatten()[best.indices]
            chosen, keep = best.values, torch.isfinite(best.values)
        else:
            all_scores = (search.to(torch.float64) + base).flatten()  # [B * V]
            probs = all_scores.softmax(dim=0).to(torch.float32)
            noise = torch.empty_like(probs).exponential_(1, generator=generator)
            k = min(num_candidates, probs.shape[0])
            flat = (probs / noise).topk(k).indices  # torch.multinomial's no-replacement draw
            chosen, keep = all_scores[flat], probs[flat] > 0
        tops = None
        if top_n is not None:
            t = raw.topk(top_n, dim=-1)
            tops = (t.indices, t.values)
        return cls(vocab, greedy, flat, chosen, keep, raw.flatten()[flat], tops)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.flat, self.scores, self.keep, self.logprobs, *(self.top or ()))

    def read(self, lists: Sequence) -> tuple[BeamCandidate, ...]:
        """The candidates, best first, from the host lists of `tensors()`."""
        flat, scores, keep, logprobs, *top = lists
        real = [i for i in range(len(flat)) if keep[i]]
        if not self.greedy:  # drawn in draw order: best score first, ties in draw order
            real.sort(key=lambda i: scores[i], reverse=True)
        tops = [tuple(zip(ids, vals, strict=True)) for ids, vals in zip(*top, strict=True)]
        return tuple(
            BeamCandidate(
                beam=flat[i] // self.vocab,
                token_id=flat[i] % self.vocab,
                score=scores[i],
                logprob=logprobs[i],
                top=tops[flat[i] // self.vocab] if tops else None,
            )
            for i in real
        )
