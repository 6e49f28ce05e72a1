"""StepSampler: the runner floor's half of a step: the forward's logits in, plain host data out.

Contract: `StepSampler(device, seed)`; `sample_step(logits, all_rows, sampling) -> StepOutput`
(step_io.py; `logits` [num_sampling_rows, V], `all_rows` chunk index -> [num_new_tokens, V] for
the chunks asking prompt logprobs) runs, on the logits' device, everything the engine above asks of them: the draws (sampler.py:
penalties, logit bias, min_tokens bans, the grammar masks, temperature and filters, seeded
generators kept in a `GeneratorBank`), each beam group's candidates (beam_candidates.py),
speculative acceptance (speculative/acceptance.py: a speculating sequence keeps its proposed
tokens while they match the target's draws, and its seeded generator is rewound to the draws
of the tokens kept) and prompt logprobs, and reads the device back ONCE for all of them
(`engine.host_transfer.fetch`). The grammar mask is waited for here, after the forward (it is
computed on the host while the forward runs).
Failure isolation (issue 39): a request whose grammar mask could not be made is not drawn for;
if the batched draw raises, the generators it advanced are put back and the draws are redone
one request at a time from the same logits, so only the requests that raise alone fail (named
in `StepOutput.failed`); a beam group or prompt-logprob computation that raises fails its
request alone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import torch

from engine.grammar.token_mask import TokenMask
from engine.host_transfer import fetch, to_device
from engine.sampling.beam_candidates import BeamCandidates
from engine.sampling.generator_bank import GeneratorBank
from engine.sampling.sampler import Drawn, Sampler, gather_logprobs
from engine.sampling.sampling_batch import SamplingRow
from engine.sampling.step_io import BeamAsk, StepOutput, StepSampling
from engine.speculative.acceptance import accept_matching
from engine.types import TokenLogprob

log = logging.getLogger("tgserve.engine")

GRAMMAR_FAILED = "internal error while computing this request's grammar"


def _sampling_failed(exc: Exception) -> str:
    return f"internal error while sampling this request: {type(exc).__name__}"


class StepSampler:
    def __init__(self, device: torch.device, seed: int | None) -> None:
        self.sampler = Sampler(seed=seed, device=device)
        self.bank = GeneratorBank(device, seed)

    def sample_step(
        self,
        logits: torch.Tensor,
        all_rows: Mapping[int, torch.Tensor],
        sampling: StepSampling,
    ) -> StepOutput:
        self.bank.release(sampling.released)
        self.sampler.eos_token_ids = sampling.eos_token_ids
        host = sampling.grammar.result() if sampling.grammar is not None else None
        mask = TokenMask.from_host(host) if host is not None and host.rows else None
        grammar_failed = host.failed if host is not None else ()
        failed: dict[str, str] = {}
        for draw in sampling.draws:
            if draw.row in grammar_failed:
                failed[draw.owner] = GRAMMAR_FAILED
        for ask in sampling.beams:
            if any(row in grammar_failed for row in ask.rows):
                failed[ask.owner] = GRAMMAR_FAILED
        rows = logits
        # A speculating seeded sequence's generator, before it draws (rewound after).
        rewinds = {
            i: gen.get_state()
            for i, s in enumerate(sampling.speculated)
            if not sampling.draws[s.first].params.greedy
            and (gen := self.bank.of(s.seed)) is not None
        }
        drawn = self._draw(rows, sampling, mask, failed)
        beams: list[tuple[int, BeamCandidates]] = []
        for i, ask in enumerate(sampling.beams):
            if ask.owner in failed:
                continue
            try:
                beams.append((i, self._beam(rows, ask, sampling.eos_token_ids, mask)))
            except Exception as exc:
                log.exception("the beam step of request %s failed", ask.owner)
                failed[ask.owner] = _sampling_failed(exc)
        prompt: list[tuple[int, tuple[torch.Tensor, ...]]] = []
        for i, ask in enumerate(sampling.prompt_logprobs):
            try:
                chunk_rows = all_rows[ask.chunk]
                prompt.append((i, _prompt_logprobs(chunk_rows, ask.targets, ask.top_n)))
            except Exception as exc:
                log.exception("the prompt logprobs of request %s failed", ask.owner)
                failed[ask.owner] = _sampling_failed(exc)
        # THE device-to-host read of the step.
        parts = [d.tensors() for _, _, d in drawn]
        parts += [b.tensors() for _, b in beams] + [t for _, t in prompt]
        lists = iter(fetch(*(t for part in parts for t in part)))
        tokens: list[int] = [-1] * len(sampling.draws)
        entries: list[TokenLogprob | None] = [None] * len(sampling.draws)
        for indices, group_rows, d in drawn:
            out = Drawn.read(group_rows, [next(lists) for _ in d.tensors()])
            for i, token, entry in zip(indices, out.token_ids, out.logprobs, strict=True):
                tokens[i], entries[i] = token, entry
        candidates: list[tuple] = [()] * len(sampling.beams)
        for i, b in beams:
            candidates[i] = b.read([next(lists) for _ in b.tensors()])
        prompt_out = {}
        for i, t in prompt:
            ask = sampling.prompt_logprobs[i]
            chosen, ids, vals = (next(lists) for _ in t)
            prompt_out[ask.chunk] = tuple(
                TokenLogprob(target, chosen[r], tuple(zip(ids[r], vals[r], strict=True)))
                for r, target in enumerate(ask.targets)
            )
        accepted = []
        for i, s in enumerate(sampling.speculated):
            if s.owner in failed:
                accepted.append(())
                continue
            verdict = accept_matching(s.proposal, [tokens[d] for d in s.draws])
            if i in rewinds:
                self.bank.rewind(s.seed, rewinds[i], len(verdict.tokens))
            accepted.append(verdict.tokens)
        return StepOutput(
            tokens=tuple(tokens),
            logprobs=tuple(entries),
            accepted=tuple(accepted),
            beams=tuple(candidates),
            prompt_logprobs=prompt_out,
            failed=failed,
            grammar_failed=tuple(grammar_failed),
        )

    def _draw(
        self,
        logits: torch.Tensor,
        sampling: StepSampling,
        mask: TokenMask | None,
        failed: dict[str, str],
    ) -> list[tuple[list[int], list[SamplingRow], Drawn]]:
        """(draw indices, their rows, their draw) per batch drawn: one batch, or one per request
        when the batched draw raised."""
        draws = sampling.draws
        live = [i for i, d in enumerate(draws) if d.owner not in failed]
        if not live:
            return []
        rows = {
            i: SamplingRow(
                draws[i].params,
                draws[i].prompt_token_ids,
                draws[i].output_token_ids,
                self.bank.of(draws[i].seed),
            )
            for i in live
        }
        before = self.bank.states(draws[i].seed for i in live)
        try:
            return [self._draw_batch(logits, sampling, live, rows, mask)]
        except Exception:
            log.exception("a step's batched sampling failed; sampling it request by request")
            self.bank.restore(before)  # the draws that happened are undone
        batches = []
        for owner in dict.fromkeys(draws[i].owner for i in live):
            mine = [i for i in live if draws[i].owner == owner]
            try:
                batches.append(self._draw_batch(logits, sampling, mine, rows, mask))
            except Exception as exc:
                log.exception("request %s failed in its sampling", owner)
                failed[owner] = _sampling_failed(exc)
        return batches

    def _draw_batch(
        self,
        logits: torch.Tensor,
        sampling: StepSampling,
        indices: list[int],
        rows: dict[int, SamplingRow],
        mask: TokenMask | None,
    ) -> tuple[list[int], list[SamplingRow], Drawn]:
        target_rows = [sampling.draws[i].row for i in indices]
        if target_rows != list(range(logits.shape[0])):  # forks reuse a row, failures skip some
            logits = logits[to_device(target_rows, torch.int64, logits.device)]
        batch_rows = [rows[i] for i in indices]
        grammar = mask.select(target_rows) if mask is not None else None
        return indices, batch_rows, self.sampler.draw(logits, batch_rows, grammar)

    def _beam(
        self,
        logits: torch.Tensor,
        ask: BeamAsk,
        eos_token_ids: tuple[int, ...],
        mask: TokenMask | None,
    ) -> BeamCandidates:
        rows = [SamplingRow(ask.params, prompt, output) for prompt, output in ask.histories]
        generator = self.bank.of(ask.seed)
        if generator is None:
            generator = self.bank.beams
        return BeamCandidates.start(
            logits[to_device(list(ask.rows), torch.int64, logits.device)],
            rows,
            eos_token_ids,
            ask.scores,
            ask.num_candidates,
            generator,
            mask.select(ask.rows) if mask is not None else None,
            ask.params.logprobs,
        )


def _prompt_logprobs(
    logits: torch.Tensor, targets: Sequence[int], top_n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`logits` [num_new_tokens, V]: row r predicts `targets[r]`. The chosen log-probs [T] and
    the top `top_n` ids and log-probs [T, top_n]."""
    logprobs = torch.log_softmax(logits[: len(targets)].float(), dim=-1)
    index = to_device(list(targets), torch.int64, logprobs.device)
    chosen, top_ids, top_vals = gather_logprobs(logprobs, index, max(top_n, 1))
    return chosen, top_ids[:, :top_n], top_vals[:, :top_n]
