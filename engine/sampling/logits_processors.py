"""Batched logits processors: biases, masks, penalties and the sampling filters.

Contract: every function works on a whole batch of rows at once (`logits` is `[R, V]` float32,
per-row parameters are `[R]` tensors on the same device); none loops in Python over the
vocabulary. Functions named `apply_*` / `mask_*` modify `logits` in place and return it;
`filtered_probs` returns a new tensor. A row whose parameter is neutral (penalty 1, bias 0, top_k off,
top_p 1, min_p 0) comes out bit-identical, so what one row gets never depends on the others.

Definitions (the tests check them against independent oracles):
- repetition penalty (transformers' `RepetitionPenaltyLogitsProcessor`): for every token seen
  in the prompt or the output, a positive logit is divided by the penalty, a negative one
  multiplied by it.
- presence / frequency penalties (OpenAI): `logit -= presence * (count > 0) + frequency * count`
  with `count` the token's occurrences in the output so far.
- top-k keeps every token whose logit is >= the k-th largest (ties at the boundary all stay,
  as in transformers' `TopKLogitsWarper`).
- top-p keeps, from the most probable down, every token for which the probability mass of the
  tokens before it is below `top_p`: the token that crosses `top_p` is kept, and tokens whose
  probability ties with the last kept one stay too; the most probable token always stays (a
  top_p that is 0 in float32 keeps it alone). It is measured after top-k.
- min-p keeps tokens whose probability (after top-k and top-p) is >= `min_p` times the largest.

No host syncs: which filters run, and the largest top-k, are host facts (`FilterPlan`, built by
the sampling batch from the requests' parameters), never read back from the device. Only a
plan made from tensors (`FilterPlan.of_tensors`, for direct calls) reads them. The top-p
boundary is found either by probing the most probable tokens first (a host decision per round:
the CPU's way, much cheaper than a full sort) or, with `plan.sort_top_p`, by one full sort of
the rows (no host decision: the device's way); both give the same bits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from models import triton_kernels

NEG_INF = float("-inf")


def apply_logit_bias(
    logits: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """Adds `bias[j]` to `logits[rows[j], token_ids[j]]` (pairs are unique per row)."""
    # rows, token_ids: [E] int64; bias: [E] float32
    return logits.index_put_((rows, token_ids), bias, accumulate=True)


def mask_tokens(logits: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Makes `token_ids[j]` impossible in row `rows[j]` (used for min_tokens)."""
    return logits.index_put_((rows, token_ids), logits.new_full((), NEG_INF))  # no host copy


def apply_repetition_penalty(
    logits: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor, penalty: torch.Tensor
) -> torch.Tensor:
    """transformers' repetition penalty on the (row, token) pairs seen, each listed once.

    rows, token_ids: [E] int64; penalty: [E] float32, the pair's row's penalty. Touches only
    those E logits: the cost follows the histories, not R * V.
    """
    seen = logits[rows, token_ids]  # [E]
    logits[rows, token_ids] = torch.where(seen < 0, seen * penalty, seen / penalty)
    return logits


def apply_presence_frequency(
    logits: torch.Tensor,
    rows: torch.Tensor,
    token_ids: torch.Tensor,
    counts: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
) -> torch.Tensor:
    """OpenAI's penalties on the (row, token) pairs of the output, each listed once with its
    `counts` [E] occurrences and its row's `presence` / `frequency` [E]."""
    penalty = presence + frequency * counts.to(logits.dtype)  # [E]; counts > 0 for every pair
    return logits.index_put_((rows, token_ids), -penalty, accumulate=True)


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Divides each row by its temperature (> 0; greedy rows never get here)."""
    return logits.div_(temperature.unsqueeze(1))


@dataclass(frozen=True)
class FilterPlan:
    """Host facts about a batch's filters: which run, and how many tokens top-k keeps at most."""

    k_max: int  # largest effective top-k of the rows using it (< vocab); 0: no row uses top-k
    all_k: bool  # every row uses top-k (no per-row restriction of its mask needed)
    any_p: bool  # some row uses top-p (< 1)
    all_p: bool
    any_min_p: bool  # some row uses min-p (> 0)
    sort_top_p: bool = False  # find the top-p boundary by a full sort: no host decision

    @classmethod
    def build(
        cls,
        top_k: Sequence[int],
        top_p: Sequence[float],
        min_p: Sequence[float],
        vocab: int,
        sort_top_p: bool = False,
    ) -> FilterPlan:
        """From the rows' host values; top_p and min_p compared as the float32 the filters'
        tensors hold (numpy, so no tensor data is read)."""
        ks = [k for k in top_k if 0 < k < vocab]
        ps = np.asarray(top_p, dtype=np.float32) < 1.0
        return cls(
            k_max=max(ks, default=0),
            all_k=len(ks) == len(top_k),
            any_p=bool(ps.any()),
            all_p=bool(ps.all()),
            any_min_p=bool((np.asarray(min_p, dtype=np.float32) > 0).any()),
            sort_top_p=sort_top_p,
        )

    @classmethod
    def of_tensors(
        cls, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor, vocab: int
    ) -> FilterPlan:
        """For direct calls without a plan: reads the parameters back (a sync on a device)."""
        return cls.build(top_k.tolist(), top_p.tolist(), min_p.tolist(), vocab)


def mask_top_k_top_p(
    logits: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    probe: int = 256,
    plan: FilterPlan | None = None,
) -> torch.Tensor:
    """Masks to -inf what top-k (`top_k` [R] int64, values <= 0 mean off) then top-p
    (`top_p` [R] float32, 1 means off) remove, in place.

    Never sorts a whole row when it can help it: top-k needs the `max(top_k)` largest, and the
    top-p boundary is first looked for among the `probe` most probable tokens; only rows whose
    nucleus is larger than that are sorted in full (same result either way; with
    `plan.sort_top_p` every top-p row is sorted in full, without asking the host).
    """
    vocab = logits.shape[1]
    if plan is None:
        plan = FilterPlan.of_tensors(top_k, top_p, torch.zeros(0), vocab)
    if plan.k_max:
        k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)  # [R]
        largest = logits.topk(plan.k_max, dim=-1).values  # [R, k_max], descending
        kth = largest.gather(1, (k.clamp(max=plan.k_max) - 1).unsqueeze(1))  # [R, 1]
        logits.masked_fill_(_only(logits < kth, k < vocab, plan.all_k), NEG_INF)
    if plan.any_p:
        probs = logits.softmax(dim=-1)  # [R, V], zero where top-k masked
        if plan.sort_top_p:
            floor = _top_p_floor_sorted(probs, top_p)
        else:
            floor = _top_p_floor(probs, top_p, min(probe, vocab))  # [R, 1]
        logits.masked_fill_(_only(probs < floor, top_p < 1.0, plan.all_p), NEG_INF)
    return logits


def _only(mask: torch.Tensor, rows: torch.Tensor, all_rows: bool) -> torch.Tensor:
    """`mask` [R, V] restricted to the rows flagged in `rows` [R] (no copy when all are)."""
    return mask if all_rows else mask & rows.unsqueeze(1)


def _top_p_floor_sorted(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """`_top_p_floor` with the probe at the full vocabulary: one sort, no host decision."""
    values = probs.sort(dim=-1, descending=True).values  # [R, V]
    mass_before = values.cumsum(dim=-1) - values  # exclusive prefix sum
    kept = _at_least_one((mass_before < top_p.unsqueeze(1)).sum(dim=-1, keepdim=True))  # [R, 1]
    return torch.where(top_p.unsqueeze(1) < 1.0, values.gather(1, kept - 1), 0.0)


def _top_p_floor(probs: torch.Tensor, top_p: torch.Tensor, probe: int) -> torch.Tensor:
    """[R, 1] the smallest probability top-p keeps in each row (0 where top_p is off).

    The boundary is looked for among the `probe` most probable tokens; rows whose nucleus is
    larger try 16 times as many, and so on up to a full sort. The top-n values are exactly the
    head of the sorted row, so every probe size gives the same answer."""
    vocab = probs.shape[1]
    floor = torch.zeros(probs.shape[0], 1, dtype=probs.dtype, device=probs.device)
    todo = torch.nonzero(top_p < 1.0).squeeze(1)  # rows still to resolve
    while todo.numel():
        probe = min(probe, vocab)
        head = probs[todo]
        head = head.sort(dim=-1, descending=True) if probe == vocab else head.topk(probe, dim=-1)
        mass_before = head.values.cumsum(dim=-1) - head.values  # exclusive prefix sum
        kept = _at_least_one((mass_before < top_p[todo].unsqueeze(1)).sum(dim=-1, keepdim=True))
        # kept == probe: the boundary may lie beyond the probe (unless it is the whole row).
        done = (kept.squeeze(1) < probe) | (probe == vocab)
        floor[todo[done]] = head.values.gather(1, kept - 1)[done]
        todo, probe = todo[~done], probe * 16
    return floor


def _at_least_one(kept: torch.Tensor) -> torch.Tensor:
    """The top token is always kept: a top_p that rounds to 0 in float32 (1e-300 does) has no
    token whose preceding mass is below it, and keeping none would leave nothing to draw."""
    return kept.clamp(min=1)


def mask_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Masks tokens whose probability is below `min_p` ([R]) times the row's top probability.
    In place; the top token always survives."""
    probs = logits.softmax(dim=-1)  # [R, V]
    floor = min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)  # [R, 1]
    return logits.masked_fill_(probs < floor, NEG_INF)


def filtered_probs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    plan: FilterPlan | None = None,
) -> torch.Tensor:
    """The distribution a sampling row draws from: temperature, top-k, top-p, min-p, softmax.

    Does not modify `logits`; returns `[R, V]` probabilities (zero where masked). `plan`: the
    host facts of the filters (None: read from the tensors).
    """
    if plan is None:
        plan = FilterPlan.of_tensors(top_k, top_p, min_p, logits.shape[1])
    if not (plan.k_max or plan.any_p or plan.any_min_p):  # temperature alone: one row op
        return softmax_rows(logits, temperature)
    scaled = logits / temperature.unsqueeze(1)  # a new tensor: the caller's stays intact
    scaled = mask_top_k_top_p(scaled, top_k, top_p, plan=plan)
    if plan.any_min_p:
        scaled = mask_min_p(scaled, min_p)
    return scaled.softmax(dim=-1)


def softmax_rows(
    logits: torch.Tensor, temperature: torch.Tensor | None = None, log: bool = False
) -> torch.Tensor:
    """softmax (log_softmax with `log`) of each row of `logits` [R, V] divided by its
    `temperature` [R] (None: 1), as a new tensor. On CUDA one fused Triton launch per call
    (models/triton_kernels/row_softmax.py, row-invariant); elsewhere torch's ops."""
    if triton_kernels.enabled(logits):
        from models.triton_kernels.row_softmax import row_softmax

        return row_softmax(logits, temperature, log)
    scaled = logits if temperature is None else logits / temperature.unsqueeze(1)
    return scaled.log_softmax(dim=-1) if log else scaled.softmax(dim=-1)
