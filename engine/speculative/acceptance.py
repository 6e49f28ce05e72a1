"""Which proposed tokens a sequence keeps: the verification rules of speculative decoding.

A speculating sequence scores its last token and k proposed tokens x_0..x_{k-1} in one forward,
so the target model gives k + 1 distributions p_0..p_k (p_i: the next token after x_0..x_{i-1}),
each after the request's own processors, temperature, top-k / top-p / min-p (the distribution
non-speculative decoding samples from). A verdict keeps a prefix x_0..x_{m-1} and appends one
token of the target's: 1 to k + 1 new tokens, distributed exactly as k + 1 steps of ordinary
decoding would give them.

- `accept_matching(proposal, target_tokens)`: `target_tokens[i]` is the token ordinary decoding
  draws from p_i (greedy: its argmax; sampled: its inverse-CDF draw at a fresh uniform). Keep
  x_i while x_i == target_tokens[i]; then target_tokens[m]. For greedy rows this is the greedy
  rule; for sampled rows with a point-mass proposal (n-gram lookup: q_i = 1 at x_i) it *is* the
  standard rejection rule below, with the randomness coupled: x_i is kept with probability
  p_i(x_i) = min(1, p_i(x_i) / q_i(x_i)), and on a reject the token is a draw from p_i
  conditioned on != x_i, i.e. from norm(max(0, p_i - q_i)). One uniform per emitted token, as
  ordinary decoding draws, so a seeded request gets the same tokens with or without
  speculation once its generator is rewound to the draws actually used (`rewind_draws`).
- `accept_rejection(proposal, target_probs, draft_probs, generator)`: the general rule for a
  proposal drawn from a distribution q (a draft model): keep x_i while u_i < p_i(x_i) / q_i(x_i);
  on the first reject draw from norm(max(0, p_m - q_m)); all kept: draw from p_k.
  `draft_probs=None` means point masses. Always k + 1 uniforms from `generator`, so a seeded
  request is reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.sampling.inverse_cdf import sample_inverse_cdf


@dataclass(frozen=True)
class Verdict:
    tokens: tuple[int, ...]  # the kept proposals, then the target's own token: 1..k+1 long
    num_accepted: int  # proposals kept (len(tokens) - 1)


def accept_matching(proposal: Sequence[int], target_tokens: Sequence[int]) -> Verdict:
    """Greedy, or sampled against a point-mass proposal (see the module contract)."""
    if len(target_tokens) != len(proposal) + 1:
        raise ValueError(
            f"need one target token per proposed token plus one, got {len(target_tokens)} "
            f"for {len(proposal)} proposed"
        )
    kept = 0
    while kept < len(proposal) and proposal[kept] == target_tokens[kept]:
        kept += 1
    return Verdict(tuple(target_tokens[: kept + 1]), kept)


def accept_rejection(
    proposal: Sequence[int],
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> Verdict:
    """The standard rule. target_probs: [k + 1, V] (rows need not sum to 1); draft_probs:
    [k, V], the distributions the proposal was drawn from (None: point masses)."""
    k = len(proposal)
    if target_probs.dim() != 2 or target_probs.shape[0] != k + 1:
        raise ValueError(f"target_probs must be [{k + 1}, vocab], got {tuple(target_probs.shape)}")
    device = target_probs.device
    probs = target_probs.to(torch.float64)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    index = torch.tensor(list(proposal), dtype=torch.int64, device=device)
    positions = torch.arange(k, device=device)
    p_x = probs[positions, index]  # [k]
    if draft_probs is None:
        q = torch.zeros(k, probs.shape[1], dtype=torch.float64, device=device)
        q[positions, index] = 1.0
    else:
        q = draft_probs.to(torch.float64)
        q = q / q.sum(dim=-1, keepdim=True)
    q_x = q[positions, index]  # [k]
    uniform = torch.rand(k + 1, dtype=torch.float64, device=device, generator=generator)
    rejected = (uniform[:k] * q_x >= p_x).tolist()
    kept = rejected.index(True) if True in rejected else k
    if kept < k:
        last = (probs[kept] - q[kept]).clamp(min=0.0)
        if not last.sum() > 0:  # p <= q everywhere means p == q: a reject had probability 0
            last = probs[kept]
    else:
        last = probs[k]
    (token,) = sample_inverse_cdf(last.unsqueeze(0), uniform[k:].unsqueeze(0)).tolist()
    return Verdict((*proposal[:kept], int(token)), kept)


def rewind_draws(
    generator: torch.Generator, state: torch.Tensor, num_draws: int, device: torch.device
) -> None:
    """Puts `generator` where it would be after `num_draws` of the sampler's one-uniform draws
    from `state` (its state before a step that drew for every scored position): the draws of
    the rejected positions are given back, so the next step draws what ordinary decoding
    would. Each draw is the sampler's `torch.rand(1, float64)` (engine/sampling/sampler.py)."""
    generator.set_state(state)
    for _ in range(num_draws):
        torch.rand(1, dtype=torch.float64, device=device, generator=generator)
