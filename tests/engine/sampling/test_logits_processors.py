"""Logits processors against hand-worked masks, OpenAI's formula and transformers' processors."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from transformers import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from engine.requests.sampling_params import SamplingParams
from engine.sampling.logits_processors import (
    apply_logit_bias,
    apply_presence_frequency,
    apply_repetition_penalty,
    filtered_probs,
    mask_min_p,
    mask_tokens,
    mask_top_k_top_p,
)
from engine.sampling.sampling_batch import SamplingBatch, SamplingRow

INF = float("inf")


def kept(masked: torch.Tensor) -> list[list[int]]:
    return [torch.nonzero(row > -INF).flatten().tolist() for row in masked]


def logits_of(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log().float()


def test_top_k_keeps_the_k_largest_and_ties_at_the_boundary():
    logits = torch.tensor(
        [[1.0, 5.0, 3.0, 3.0, 0.0], [1.0, 5.0, 3.0, 3.0, 0.0], [2.0, 1.0, 0.0, -1.0, -2.0]]
    )
    out = mask_top_k_top_p(logits.clone(), torch.tensor([2, 3, 0]), torch.ones(3))
    assert kept(out) == [[1, 2, 3], [1, 2, 3], [0, 1, 2, 3, 4]]
    assert torch.equal(out[0, [1, 2, 3]], logits[0, [1, 2, 3]])  # survivors untouched


def test_top_p_keeps_the_token_that_crosses_the_threshold():
    # probs 0.5, 0.3, 0.15, 0.05: mass before each is 0, 0.5, 0.8, 0.95
    logits = logits_of([0.15, 0.5, 0.05, 0.3]).repeat(4, 1)
    out = mask_top_k_top_p(
        logits, torch.zeros(4, dtype=torch.int64), torch.tensor([0.4, 0.6, 0.85, 0.96])
    )
    assert kept(out) == [[1], [1, 3], [0, 1, 3], [0, 1, 2, 3]]


def test_top_p_keeps_all_tokens_tied_with_the_last_kept_one():
    # 0.4, 0.2, 0.2, 0.2: top_p 0.5 keeps the first 0.2 (mass before 0.4), so all three ties.
    logits = logits_of([0.2, 0.4, 0.2, 0.2]).unsqueeze(0)
    out = mask_top_k_top_p(logits.clone(), torch.zeros(1, dtype=torch.int64), torch.tensor([0.5]))
    assert kept(out) == [[0, 1, 2, 3]]
    out = mask_top_k_top_p(logits.clone(), torch.zeros(1, dtype=torch.int64), torch.tensor([0.35]))
    assert kept(out) == [[1]]


def test_top_p_is_measured_after_top_k():
    # top-k 2 leaves 0.5 and 0.3 -> renormalised 0.625, 0.375: top_p 0.6 keeps only the first.
    logits = logits_of([0.15, 0.5, 0.05, 0.3]).unsqueeze(0)
    out = mask_top_k_top_p(logits.clone(), torch.tensor([2]), torch.tensor([0.6]))
    assert kept(out) == [[1]]
    out = mask_top_k_top_p(logits.clone(), torch.tensor([0]), torch.tensor([0.6]))
    assert kept(out) == [[1, 3]]


def test_top_p_does_not_depend_on_how_far_the_boundary_probe_reaches():
    torch.manual_seed(3)
    # Flat and peaked rows: nuclei from one token to most of the vocabulary.
    logits = torch.randn(6, 400) * torch.tensor([0.05, 0.3, 1.0, 3.0, 8.0, 1.0]).unsqueeze(1)
    top_k = torch.tensor([0, 0, 0, 0, 0, 50])
    top_p = torch.tensor([0.9, 0.95, 0.5, 0.99, 0.9, 0.97])
    full = mask_top_k_top_p(logits.clone(), top_k, top_p, probe=400)  # probe = vocab: always sorted
    assert sorted(len(k) for k in kept(full))[-1] > 300  # some nucleus far beyond small probes
    for probe in (1, 2, 16, 128):
        assert torch.equal(mask_top_k_top_p(logits.clone(), top_k, top_p, probe=probe), full)


def test_min_p_is_relative_to_the_top_probability():
    # probs 0.5, 0.3, 0.15, 0.05; min_p 0.3 -> floor 0.15 keeps 0.5, 0.3 and 0.15.
    logits = logits_of([0.15, 0.5, 0.05, 0.3]).repeat(3, 1)
    out = mask_min_p(logits.clone(), torch.tensor([0.3, 0.0, 1.0]))
    assert kept(out) == [[0, 1, 3], [0, 1, 2, 3], [1]]


def test_filters_match_transformers_warpers_on_random_logits():
    torch.manual_seed(0)
    cases = [
        (0.7, 0, 1.0, 0.0),
        (1.3, 50, 1.0, 0.0),
        (1.0, 0, 0.8, 0.0),
        (0.5, 0, 1.0, 0.05),
        (0.9, 40, 0.9, 0.02),
        (2.0, 5, 0.5, 0.1),
        (1.0, 1, 1.0, 0.0),
    ]
    logits = torch.randn(len(cases), 1000) * 3
    temperature, top_k, top_p, min_p = (torch.tensor(c) for c in zip(*cases, strict=True))
    ours = filtered_probs(logits, temperature.float(), top_k, top_p.float(), min_p.float())
    for i, (t, k, p, m) in enumerate(cases):
        warpers = [TemperatureLogitsWarper(t)]
        if k > 0:
            warpers.append(TopKLogitsWarper(k))
        if p < 1.0:
            warpers.append(TopPLogitsWarper(p))
        if m > 0:
            warpers.append(MinPLogitsWarper(m))
        scores = logits[i : i + 1].clone()
        for warper in warpers:
            scores = warper(None, scores)
        theirs = scores.softmax(-1)[0]
        assert torch.equal(ours[i] > 0, theirs > 0), f"case {cases[i]}: different token sets"
        torch.testing.assert_close(ours[i], theirs, rtol=1e-5, atol=1e-7)


def penalty_batch(rows: list[SamplingRow], vocab: int) -> SamplingBatch:
    return SamplingBatch.build(rows, vocab, torch.device("cpu"))


@pytest.mark.parametrize("penalty", [1.3, 0.7])
def test_repetition_penalty_matches_transformers(penalty):
    torch.manual_seed(1)
    logits = torch.randn(4, 50) * 2
    prompts, outputs = (
        [[1, 2], [], [10, 11, 12], [5]],
        [[2, 2, 7, 49], [0, 0], list(range(12, 40)), []],
    )
    params = SamplingParams(temperature=0.0, repetition_penalty=penalty)
    rows = [SamplingRow(params, p, o) for p, o in zip(prompts, outputs, strict=True)]
    ours = apply_repetition_penalty(logits.clone(), *penalty_batch(rows, 50).repetition)
    oracle = RepetitionPenaltyLogitsProcessor(penalty)
    for i, (p, o) in enumerate(zip(prompts, outputs, strict=True)):
        theirs = oracle(torch.tensor([p + o]), logits[i : i + 1].clone())[0]
        torch.testing.assert_close(ours[i], theirs, rtol=0, atol=0)


def test_rows_without_penalties_are_left_bit_identical():
    torch.manual_seed(4)
    logits = torch.randn(3, 30)
    rows = [
        SamplingRow(SamplingParams(repetition_penalty=1.5, frequency_penalty=1.0), [1, 2], [3, 3]),
        SamplingRow(SamplingParams(), [1, 2], [3, 3]),
        SamplingRow(
            SamplingParams(repetition_penalty=1.0, presence_penalty=0.0), list(range(30)), [4]
        ),
    ]
    batch = penalty_batch(rows, 30)
    ours = apply_repetition_penalty(logits.clone(), *batch.repetition)
    ours = apply_presence_frequency(ours, *batch.presence_frequency)
    assert torch.equal(ours[1:], logits[1:]) and not torch.equal(ours[0], logits[0])


def test_presence_and_frequency_penalties_follow_openai_formula():
    torch.manual_seed(2)
    logits = torch.randn(3, 20)
    outputs = [[3, 3, 3, 5, 19], [0, 1, 1], []]
    presence, frequency = [0.5, -1.0, 2.0], [0.25, 1.5, 2.0]
    rows = [
        SamplingRow(SamplingParams(presence_penalty=p, frequency_penalty=f), [3, 4], o)
        for p, f, o in zip(presence, frequency, outputs, strict=True)
    ]
    ours = apply_presence_frequency(logits.clone(), *penalty_batch(rows, 20).presence_frequency)
    for i, out in enumerate(outputs):
        c = Counter(out)  # the output only: prompt tokens 3 and 4 are not counted
        for token in range(20):
            # mu[j] -> mu[j] - c[j] * alpha_frequency - float(c[j] > 0) * alpha_presence
            want = (
                logits[i, token].item()
                - c[token] * frequency[i]
                - float(c[token] > 0) * presence[i]
            )
            assert math.isclose(ours[i, token].item(), want, rel_tol=1e-6, abs_tol=1e-6)


def test_logit_bias_adds_to_named_tokens_only():
    logits = torch.zeros(2, 6)
    apply_logit_bias(
        logits, torch.tensor([0, 0, 1]), torch.tensor([1, 5, 1]), torch.tensor([2.0, -100.0, 0.5])
    )
    assert logits.tolist() == [[0, 2, 0, 0, 0, -100], [0, 0.5, 0, 0, 0, 0]]


def test_mask_tokens_forbids_exactly_the_named_tokens():
    logits = torch.zeros(2, 4)
    mask_tokens(logits, torch.tensor([0, 1, 1]), torch.tensor([3, 0, 2]))
    assert kept(logits) == [[0, 1, 2], [1, 3]]
