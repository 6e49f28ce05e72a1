"""Batched logits processors: biases, masks, penalties and the sampling filters.

Contract: every function works on a whole batch of rows at once (`logits` is `[R, V]` float32,
per-row parameters are `[R]` tensors on the same device); none loops in Python over the
vocabulary. Functions named `apply_*` / `mask_*` modify `logits` in place and return it; the
filters return a new tensor. A row whose parameter is neutral (penalty 1, bias 0, top_k off,
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
  strictly more probable tokens is below `top_p`: the token that crosses `top_p` is kept, and
  tokens tied with the last kept one stay too. It is measured after top-k.
- min-p keeps tokens whose probability (after top-k and top-p) is >= `min_p` times the largest.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def apply_logit_bias(
    logits: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """Adds `bias[j]` to `logits[rows[j], token_ids[j]]` (pairs are unique per row)."""
    # rows, token_ids: [E] int64; bias: [E] float32
    return logits.index_put_((rows, token_ids), bias, accumulate=True)


def mask_tokens(logits: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Makes `token_ids[j]` impossible in row `rows[j]` (used for min_tokens)."""
    return logits.index_put_((rows, token_ids), torch.tensor(NEG_INF, device=logits.device))


def apply_repetition_penalty(
    logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor
) -> torch.Tensor:
    """transformers' repetition penalty on the tokens marked in `seen` ([R, V] bool)."""
    p = penalty.unsqueeze(1)  # [R, 1]
    penalised = torch.where(logits < 0, logits * p, logits / p)
    return logits.copy_(torch.where(seen, penalised, logits))


def apply_presence_frequency(
    logits: torch.Tensor, counts: torch.Tensor, presence: torch.Tensor, frequency: torch.Tensor
) -> torch.Tensor:
    """OpenAI's penalties; `counts` is [R, V] occurrences of each token in the output."""
    counts = counts.to(logits.dtype)
    logits -= presence.unsqueeze(1) * (counts > 0).to(logits.dtype)
    logits -= frequency.unsqueeze(1) * counts
    return logits


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Divides each row by its temperature (> 0; greedy rows never get here)."""
    return logits.div_(temperature.unsqueeze(1))


def mask_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Masks to -inf what top-k (`top_k` [R] int64, values <= 0 mean off) then top-p
    (`top_p` [R] float32, 1 means off) remove. Returns a new tensor."""
    num_rows, vocab = logits.shape
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)  # [R]
    if bool((top_p < 1.0).any()):
        # [R, V] descending: the threshold of both filters is a value of this sorted row.
        ordered = logits.sort(dim=-1, descending=True).values
        kth = ordered.gather(1, (k - 1).unsqueeze(1))  # [R, 1]
        ordered = ordered.masked_fill(ordered < kth, NEG_INF)
        probs = ordered.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # exclusive prefix sum; 0 at the top token
        kept = (mass_before < top_p.unsqueeze(1)).sum(dim=-1, keepdim=True)  # >= 1: a prefix
        threshold = ordered.gather(1, kept - 1)  # [R, 1] smallest kept logit
        # Rows with top_p == 1 keep all of top-k exactly (a float cumsum may not reach 1).
        threshold = torch.where(top_p.unsqueeze(1) >= 1.0, kth, threshold)
    elif bool((k < vocab).any()):
        largest = logits.topk(int(k.max()), dim=-1).values  # [R, max_k], descending
        threshold = largest.gather(1, (k - 1).unsqueeze(1))
        threshold = torch.where((k >= vocab).unsqueeze(1), NEG_INF, threshold)
    else:
        return logits.clone()
    return logits.masked_fill(logits < threshold, NEG_INF)


def mask_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Masks tokens whose probability is below `min_p` ([R]) times the row's top probability.
    Returns a new tensor; the top token always survives."""
    probs = logits.softmax(dim=-1)  # [R, V]
    floor = min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)  # [R, 1]
    return logits.masked_fill(probs < floor, NEG_INF)


def filtered_probs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    """The distribution a sampling row draws from: temperature, top-k, top-p, min-p, softmax.

    Does not modify `logits`; returns `[R, V]` probabilities (zero where masked).
    """
    scaled = apply_temperature(logits.clone(), temperature)
    scaled = mask_top_k_top_p(scaled, top_k, top_p)
    if bool((min_p > 0).any()):
        scaled = mask_min_p(scaled, min_p)
    return scaled.softmax(dim=-1)
