"""The batched sampler: greedy, masks, penalties, seeds, the sampled distribution, logprobs."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from engine.requests.sampling_params import SamplingParams
from engine.sampling.inverse_cdf import sample_inverse_cdf
from engine.sampling.sampler import Sampler, seeded_generator
from engine.sampling.sampling_batch import SamplingRow

EOS = 0
GREEDY = SamplingParams(temperature=0.0)


def test_plain_greedy_batch_takes_the_argmax():
    torch.manual_seed(0)
    logits = torch.randn(8, 300)
    out = Sampler()(logits, [SamplingRow(GREEDY)] * 8)
    assert list(out.token_ids) == logits.argmax(-1).tolist()
    assert out.logprobs == (None,) * 8


def test_sampler_does_not_modify_the_callers_logits():
    torch.manual_seed(0)
    logits = torch.randn(2, 50)
    before = logits.clone()
    params = SamplingParams(temperature=0.8, top_k=5, repetition_penalty=1.5, logit_bias={3: 4.0})
    Sampler(seed=0)(logits, [SamplingRow(params, [1, 2], [3]), SamplingRow(GREEDY)])
    assert torch.equal(logits, before)


def test_greedy_row_with_repetition_penalty_takes_argmax_of_penalised_logits():
    torch.manual_seed(1)
    logits = torch.randn(4, 40)
    prompt, output = [int(t) for t in logits[0].topk(3).indices], [int(logits[1].argmax())]
    rows = [
        SamplingRow(SamplingParams(temperature=0.0, repetition_penalty=2.0), prompt, output)
    ] * 4
    out = Sampler()(logits, rows)
    oracle = RepetitionPenaltyLogitsProcessor(2.0)
    want = oracle(torch.tensor([prompt + output] * 4), logits.clone()).argmax(-1).tolist()
    assert list(out.token_ids) == want


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logit_bias_of_100_forces_the_token(temperature):
    torch.manual_seed(2)
    logits = torch.randn(16, 100)
    params = SamplingParams(temperature=temperature, logit_bias={37: 100.0})
    out = Sampler(seed=0)(logits, [SamplingRow(params)] * 16)
    assert set(out.token_ids) == {37}


def test_min_tokens_masks_eos_and_stop_token_ids_until_reached():
    logits = torch.tensor([[9.0, 8.0, 7.0, 1.0]])  # EOS (0) best, then stop id 1, then 2
    params = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=(1,))
    sampler = Sampler(eos_token_ids=[EOS])
    assert sampler(logits, [SamplingRow(params, [5], [3])]).token_ids == (2,)  # 1 out < 2
    assert sampler(logits, [SamplingRow(params, [5], [3, 3])]).token_ids == (0,)  # 2 out: free
    ignore = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=(1,), ignore_eos=True)
    # With ignore_eos, EOS does not stop, so it is not masked; stop ids still are.
    assert sampler(logits, [SamplingRow(ignore, [5], [])]).token_ids == (0,)
    masked_eos_only = torch.tensor([[9.0, 8.0, 7.0, 1.0]])
    no_stop_ids = SamplingParams(temperature=0.0, min_tokens=1)
    assert sampler(masked_eos_only, [SamplingRow(no_stop_ids)]).token_ids == (1,)


def test_sampling_never_picks_a_token_outside_top_k():
    torch.manual_seed(3)
    logits = torch.randn(1, 50).repeat(2000, 1)
    out = Sampler(seed=1)(logits, [SamplingRow(SamplingParams(temperature=1.5, top_k=3))] * 2000)
    top3 = set(logits[0].topk(3).indices.tolist())
    assert set(out.token_ids) == top3  # all three are reached, nothing else is


def test_top_k_one_sampling_equals_greedy():
    torch.manual_seed(4)
    logits = torch.randn(32, 200)
    out = Sampler(seed=2)(logits, [SamplingRow(SamplingParams(temperature=1.0, top_k=1))] * 32)
    assert list(out.token_ids) == logits.argmax(-1).tolist()


def test_sampled_frequencies_match_the_analytic_distribution():
    logits = torch.tensor([2.0, 1.5, 1.0, 0.0, -1.0])
    temperature, top_p, draws = 0.7, 0.9, 20_000
    # Independent computation: softmax(l / T), keep the most probable tokens until the mass
    # before the next one reaches top_p, renormalise.
    weights = [math.exp(x / temperature) for x in logits.tolist()]
    probs = [w / sum(weights) for w in weights]
    kept, mass = [], 0.0
    for p in sorted(probs, reverse=True):
        if mass >= top_p:
            break
        kept.append(p)
        mass += p
    expected = [p / sum(kept) if p in kept else 0.0 for p in probs]
    assert expected[3] == expected[4] == 0.0 and expected[2] > 0  # the cut this test is about
    params = SamplingParams(temperature=temperature, top_p=top_p)
    out = Sampler(seed=3)(logits.repeat(draws, 1), [SamplingRow(params)] * draws)
    counts = [out.token_ids.count(t) for t in range(5)]
    assert counts[3] == counts[4] == 0
    chi2 = sum((counts[t] - draws * expected[t]) ** 2 / (draws * expected[t]) for t in range(3))
    assert chi2 < 13.8, (
        f"chi-square {chi2:.1f} on 2 dof (p < 0.001): counts {counts}, expected {expected}"
    )


@pytest.mark.parametrize("block", [1, 3, 16, 256])
def test_blocked_inverse_cdf_equals_a_plain_cdf_search(block):
    torch.manual_seed(7)
    probs = torch.rand(64, 203) * (torch.rand(64, 203) < 0.3)  # unnormalised, mostly zeros
    probs[:, 0] += 1e-3  # no empty row
    uniform = torch.rand(64, 1, dtype=torch.float64)
    uniform[:4] = torch.tensor([[0.0], [1 - 2**-53], [0.5], [1e-12]], dtype=torch.float64)
    cdf = probs.double().cumsum(-1)
    target = uniform * cdf[:, -1:]
    want = [int(torch.nonzero(cdf[r] > target[r]).min()) for r in range(64)]  # first cdf above u
    got = sample_inverse_cdf(probs, uniform, block=block).tolist()
    assert got == want
    assert all(probs[r, t] > 0 for r, t in enumerate(got))


def _seeded_run(
    seed: int, logits_per_step: list[torch.Tensor], position: int, batch: int
) -> list[int]:
    """Samples one seeded row at `position` of a batch of `batch` rows for several steps."""
    generator = seeded_generator(seed)
    noise_generator = torch.Generator().manual_seed(position * 1000 + batch)
    sampler = Sampler(seed=position)
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=40, seed=seed, presence_penalty=0.3)
    output: list[int] = []
    for step_logits in logits_per_step:
        rows, stacked = [], []
        for i in range(batch):
            if i == position:
                rows.append(SamplingRow(params, [1, 2, 3], list(output), generator))
                stacked.append(step_logits)
            else:  # neighbours: unseeded, other seeds, greedy
                other = [
                    SamplingParams(temperature=1.0),
                    GREEDY,
                    SamplingParams(temperature=0.5, seed=i),
                    SamplingParams(temperature=1.2, top_k=200, top_p=0.5, min_p=0.1, logprobs=3),
                ][i % 4]
                rows.append(
                    SamplingRow(
                        other, [], [], seeded_generator(i) if other.seed is not None else None
                    )
                )
                stacked.append(torch.randn(step_logits.shape, generator=noise_generator))
        output.append(sampler(torch.stack(stacked), rows).token_ids[position])
    return output


def test_seeded_row_is_reproducible_and_independent_of_batch_composition():
    torch.manual_seed(5)
    steps = [torch.randn(500) * 2 for _ in range(12)]
    alone = _seeded_run(1234, steps, position=0, batch=1)
    assert _seeded_run(1234, steps, position=0, batch=1) == alone
    assert _seeded_run(1234, steps, position=3, batch=7) == alone
    assert _seeded_run(1234, steps, position=1, batch=4) == alone
    assert _seeded_run(999, steps, position=0, batch=1) != alone  # the seed matters


def test_seeded_generator_index_zero_is_the_plain_seed():
    a = torch.rand(4, generator=seeded_generator(7))
    b = torch.rand(4, generator=torch.Generator().manual_seed(7))
    c = torch.rand(4, generator=seeded_generator(7, index=1))
    assert torch.equal(a, b) and not torch.equal(a, c)
    with pytest.raises(ValueError, match="seed"):
        seeded_generator(-1)


def test_logprobs_are_raw_log_softmax_with_top_n_best_first():
    torch.manual_seed(6)
    logits = torch.randn(3, 64)
    rows = [
        SamplingRow(
            SamplingParams(
                temperature=0.5, logprobs=5, logit_bias={1: 3.0}, repetition_penalty=1.2
            ),
            [4],
            [5],
        ),
        SamplingRow(GREEDY),
        SamplingRow(SamplingParams(temperature=0.0, logprobs=0)),
    ]
    out = Sampler(seed=4)(logits, rows)
    raw = torch.log_softmax(logits.double(), dim=-1)
    assert out.logprobs[1] is None
    for i in (0, 2):
        lp = out.logprobs[i]
        assert lp.token_id == out.token_ids[i]
        assert math.isclose(lp.logprob, raw[i, lp.token_id].item(), abs_tol=1e-5)
        assert len(lp.top) == rows[i].params.logprobs
        ids = [t for t, _ in lp.top]
        assert ids == raw[i].argsort(descending=True)[: len(ids)].tolist()
        for t, value in lp.top:
            assert math.isclose(value, raw[i, t].item(), abs_tol=1e-5)
        assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)


def test_rejects_logits_that_do_not_match_the_rows():
    with pytest.raises(ValueError, match="rows"):
        Sampler()(torch.zeros(3, 10), [SamplingRow(GREEDY)] * 2)
    with pytest.raises(ValueError, match="vocabulary"):
        Sampler()(torch.zeros(1, 10), [SamplingRow(SamplingParams(logit_bias={10: 1.0}))])
