"""Verification rules: hand-worked greedy cases; chi-square tests (small vocabulary, fixed seeds)
that the tokens speculation emits are distributed as the target's, shown able to fail with
wrong rules; and seeded speculation on a Markov-chain "model" emitting exactly the tokens of
ordinary decoding."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.sampling.inverse_cdf import sample_inverse_cdf
from engine.speculative.acceptance import (
    accept_matching,
    accept_rejection,
    rewind_draws,
)
from engine.speculative.ngram import NgramProposer

VOCAB = 5
# p_0, p_1, p_2: the target's distribution at each scored position (token 4 filtered out at 0).
TARGET = torch.tensor(
    [
        [0.35, 0.25, 0.2, 0.2, 0.0],
        [0.1, 0.4, 0.05, 0.3, 0.15],
        [0.3, 0.1, 0.2, 0.25, 0.15],
    ],
    dtype=torch.float64,
)
DRAFT = torch.tensor(  # q_0, q_1: a draft model's distributions, unlike the target's
    [[0.1, 0.5, 0.1, 0.1, 0.2], [0.3, 0.1, 0.3, 0.2, 0.1]], dtype=torch.float64
)
SAMPLES = 12000


def chi_square_p_value(counts: Counter, probs: torch.Tensor) -> float:
    """P(chi-square >= the statistic) for counts against probs; 0 when a token of
    probability 0 was counted."""
    total = sum(counts.values())
    stat, categories = 0.0, 0
    for token, p in enumerate(probs.tolist()):
        if p == 0.0:
            if counts[token]:
                return 0.0
            continue
        expected = total * p
        stat += (counts[token] - expected) ** 2 / expected
        categories += 1
    df = torch.tensor((categories - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, torch.tensor(stat / 2, dtype=torch.float64)))


def emitted_positions(verify, seed: int) -> tuple[Counter, Counter, Counter]:
    """Histograms of the first, second and third emitted tokens over SAMPLES verifications of
    two proposed tokens, each drawn from the draft's q (a fresh draw per trial)."""
    generator = torch.Generator().manual_seed(seed)
    first, second, third = Counter(), Counter(), Counter()
    for _ in range(SAMPLES):
        proposal = torch.multinomial(DRAFT, 1, generator=generator).squeeze(1).tolist()
        tokens = verify(proposal, generator)
        first[tokens[0]] += 1
        if len(tokens) > 1:
            second[tokens[1]] += 1
        if len(tokens) > 2:
            third[tokens[2]] += 1
    return first, second, third


def rejection_with_draft(proposal, generator):
    return accept_rejection(proposal, TARGET, DRAFT, generator).tokens


def coupled_matching(proposal, generator):
    """The engine's rule for point-mass proposals: ordinary draws at every position, kept
    while they equal the proposal."""
    uniform = torch.rand(3, 1, dtype=torch.float64, generator=generator)
    drawn = sample_inverse_cdf(TARGET.float(), uniform).tolist()
    return accept_matching(proposal, drawn).tokens


def point_mass_rejection(proposal, generator):
    return accept_rejection(proposal, TARGET, None, generator).tokens


@pytest.mark.parametrize("verify", [rejection_with_draft, coupled_matching, point_mass_rejection])
def test_emitted_tokens_follow_the_target(verify):
    # Each emitted position i follows p_i: given position i - 1 was kept, what comes next is
    # distributed as the target's next step, whatever the draft proposed.
    first, second, third = emitted_positions(verify, seed=1)
    assert chi_square_p_value(first, TARGET[0]) > 1e-3
    assert chi_square_p_value(second, TARGET[1]) > 1e-3
    assert chi_square_p_value(third, TARGET[2]) > 1e-3
    assert sum(third.values()) > 300  # enough proposals kept to test later positions


def wrong_resample_from_target(proposal, generator):
    """Wrong: on a reject, draw from p instead of norm(max(0, p - q))."""
    probs, q = TARGET, DRAFT
    for i, x in enumerate(proposal):
        u = torch.rand(1, dtype=torch.float64, generator=generator).item()
        if u * q[i, x] >= probs[i, x]:
            return [*proposal[:i], int(torch.multinomial(probs[i], 1, generator=generator))]
    return list(proposal) + [int(torch.multinomial(probs[2], 1, generator=generator))]


def wrong_accept_ratio_inverted(proposal, generator):
    """Wrong: keep with probability min(1, q / p)."""
    probs, q = TARGET, DRAFT
    for i, x in enumerate(proposal):
        u = torch.rand(1, dtype=torch.float64, generator=generator).item()
        if u * probs[i, x] >= q[i, x]:
            residual = (probs[i] - q[i]).clamp(min=0)
            return [*proposal[:i], int(torch.multinomial(residual, 1, generator=generator))]
    return list(proposal) + [int(torch.multinomial(probs[2], 1, generator=generator))]


@pytest.mark.parametrize("verify", [wrong_resample_from_target, wrong_accept_ratio_inverted])
def test_the_chi_square_check_rejects_wrong_rules(verify):
    first, _, _ = emitted_positions(verify, seed=1)
    assert chi_square_p_value(first, TARGET[0]) < 1e-6


def test_greedy_keeps_the_agreeing_prefix_then_the_targets_token():
    assert accept_matching([4, 5, 6], [4, 5, 6, 7]).tokens == (4, 5, 6, 7)
    verdict = accept_matching([4, 9, 6], [4, 5, 6, 7])
    assert verdict.tokens == (4, 5) and verdict.num_accepted == 1
    assert accept_matching([9], [4, 5]).tokens == (4,)
    assert accept_matching([], [3]).tokens == (3,)
    with pytest.raises(ValueError):
        accept_matching([1, 2], [1, 2])


def test_rejection_never_keeps_a_token_the_target_rules_out():
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):  # token 4 has probability 0 at position 0
        verdict = accept_rejection([4, 1], TARGET, None, generator)
        assert verdict.num_accepted == 0 and verdict.tokens[0] != 4


def test_rewind_draws_gives_back_the_unused_draws():
    generator = torch.Generator().manual_seed(7)
    reference = torch.Generator().manual_seed(7)
    expected = [torch.rand(1, dtype=torch.float64, generator=reference) for _ in range(6)]
    state = generator.get_state()
    for _ in range(4):  # a verifying step draws for every scored position
        torch.rand(1, dtype=torch.float64, generator=generator)
    rewind_draws(generator, state, 2, torch.device("cpu"))  # two tokens were emitted
    assert torch.equal(torch.rand(1, dtype=torch.float64, generator=generator), expected[2])


# A Markov chain over 5 tokens: the next token's distribution depends on the last one only.
CHAIN = torch.tensor(
    [
        [0.05, 0.8, 0.05, 0.05, 0.05],
        [0.05, 0.05, 0.8, 0.05, 0.05],
        [0.6, 0.1, 0.1, 0.1, 0.1],
        [0.2, 0.2, 0.2, 0.2, 0.2],
        [0.0, 0.5, 0.0, 0.5, 0.0],
    ],
    dtype=torch.float32,
)


def ordinary_decoding(prompt: list[int], steps: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    tokens = list(prompt)
    for _ in range(steps):
        uniform = torch.rand(1, dtype=torch.float64, generator=generator)
        tokens += sample_inverse_cdf(CHAIN[tokens[-1]].unsqueeze(0), uniform.view(1, 1)).tolist()
    return tokens[len(prompt) :]


def speculative_decoding(prompt: list[int], steps: int, seed: int, k: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    proposer = NgramProposer(k, 1, 3)
    tokens = list(prompt)
    while len(tokens) - len(prompt) < steps:
        proposal = proposer.propose(tokens, limit=steps - (len(tokens) - len(prompt)) - 1)
        context = [tokens[-1], *proposal]
        state = generator.get_state()
        drawn = []
        for prev in context:  # the sampler draws one uniform per scored row, in row order
            uniform = torch.rand(1, dtype=torch.float64, generator=generator)
            drawn += sample_inverse_cdf(CHAIN[prev].unsqueeze(0), uniform.view(1, 1)).tolist()
        verdict = accept_matching(proposal, drawn)
        rewind_draws(generator, state, len(verdict.tokens), torch.device("cpu"))
        tokens += verdict.tokens
    return tokens[len(prompt) :]


@settings(max_examples=60, deadline=None)
@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12),
    seed=st.integers(0, 2**32),
    k=st.integers(1, 5),
)
def test_seeded_speculation_emits_the_tokens_of_ordinary_decoding(prompt, seed, k):
    assert speculative_decoding(prompt, 24, seed, k) == ordinary_decoding(prompt, 24, seed)
