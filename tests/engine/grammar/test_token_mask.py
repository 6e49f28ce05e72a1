"""Grammar token masks in the sampler, with hand-made masks: bit layout, greedy and sampled rows
pick only allowed tokens, other rows are untouched, seeds and logprobs unaffected by masking."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.grammar.token_mask import TokenMask, allowed_tokens, bitmask_words
from engine.requests.sampling_params import SamplingParams
from engine.sampling.sampler import Sampler, seeded_generator
from engine.sampling.sampling_batch import SamplingRow

V = 70  # not a multiple of 32: the last word is partly padding
GREEDY = SamplingParams(temperature=0.0)


def bitmask_of(allowed_sets: list[set[int]], vocab: int = V) -> np.ndarray:
    """The bitmask written the slow, obvious way: word t // 32, bit t % 32."""
    words = np.zeros((len(allowed_sets), bitmask_words(vocab)), dtype=np.uint32)
    for g, allowed in enumerate(allowed_sets):
        for t in allowed:
            words[g, t // 32] |= np.uint32(1) << np.uint32(t % 32)
    return words.view(np.int32)


def mask_of(rows: list[int], allowed_sets: list[set[int]], vocab: int = V) -> TokenMask:
    return TokenMask(tuple(rows), allowed_tokens(bitmask_of(allowed_sets, vocab), vocab))


def test_allowed_tokens_are_exactly_the_set_bits():
    sets = [{0, 31, 32, 63, 64, 69}, set(), set(range(V))]
    allowed = allowed_tokens(bitmask_of(sets), V)
    assert allowed.shape == (3, V) and allowed.dtype == torch.bool
    for g, want in enumerate(sets):
        assert set(allowed[g].nonzero().flatten().tolist()) == want


def test_allowed_tokens_refuses_a_bitmask_of_the_wrong_width():
    with pytest.raises(ValueError, match="words"):
        allowed_tokens(np.zeros((1, 1), dtype=np.int32), V)


def best_allowed(row: list[float], allowed: set[int] | None) -> int:
    """The greedy pick worked by hand: the highest allowed value, lowest index on ties (torch's
    argmax rule); with nothing allowed every value is -inf and the pick is token 0."""
    candidates = range(len(row)) if allowed is None else sorted(allowed)
    best = None
    for t in candidates:
        if best is None or row[t] > row[best]:
            best = t
    return 0 if best is None else best


@pytest.mark.parametrize("seed", range(12))
def test_masked_argmax_equals_the_pick_over_allowed_tokens_ties_included(seed):
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    # Few distinct values: ties everywhere, also between allowed and refused tokens.
    logits = torch.randint(0, 4, (6, V), generator=gen).float()
    rows = sorted(rng.choice(6, size=4, replace=False).tolist())
    sets = [set(rng.choice(V, size=int(rng.integers(0, V)), replace=False).tolist()) for _ in rows]
    sets[0] = {int(logits[rows[0]].argmax())}  # the raw pick allowed
    sets[1] = set(range(V)) - {int(logits[rows[1]].argmax())}  # the raw pick refused
    sets[2] = set()  # nothing allowed (a broken grammar): every value -inf
    mask = mask_of(rows, sets)
    before = logits.clone()
    picked = mask.argmax(logits).tolist()
    assert torch.equal(logits, before)  # not modified
    allowed_of = dict(zip(rows, sets, strict=True))
    want = [best_allowed(logits[r].tolist(), allowed_of.get(r)) for r in range(6)]
    assert picked == want
    assert picked == mask.apply(logits.clone()).argmax(dim=-1).tolist()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_masked_rows_pick_only_allowed_tokens_and_others_are_untouched(temperature):
    torch.manual_seed(0)
    logits = torch.randn(4, V)
    allowed = [{5, 40, 66}, {1}]
    mask = mask_of([1, 3], allowed)
    params = SamplingParams(temperature=temperature, seed=None)
    for draw in range(30):
        out = Sampler(seed=draw)(logits, [SamplingRow(params)] * 4, mask)
        assert out.token_ids[1] in allowed[0] and out.token_ids[3] == 1
    if temperature == 0.0:  # greedy: the best allowed token, and the argmax where unmasked
        best = max(allowed[0], key=lambda t: float(logits[1, t]))
        assert out.token_ids[1] == best
        assert out.token_ids[0] == int(logits[0].argmax()) and out.token_ids[2] == int(
            logits[2].argmax()
        )


def test_sampling_under_a_mask_follows_the_renormalised_distribution():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0] + [5.0] * (V - 5)])
    allowed = {0, 1, 2}
    mask = mask_of([0], [allowed])
    gen = seeded_generator(7)
    counts = torch.zeros(3)
    row = SamplingRow(SamplingParams(temperature=1.0, seed=7), generator=gen)
    n = 3000
    for _ in range(n):
        counts[Sampler()(logits, [row], mask).token_ids[0]] += 1
    want = torch.softmax(torch.tensor([0.0, 1.0, 2.0]), 0)
    assert torch.allclose(counts / n, want, atol=0.03)


def test_a_seeded_masked_row_does_not_depend_on_the_other_rows():
    torch.manual_seed(3)
    logits = torch.randn(3, V)
    params = SamplingParams(temperature=0.9, seed=11)

    def run(batch_logits, rows_index, mask_rows):
        gen = seeded_generator(11)
        tokens = []
        for _ in range(20):
            rows = [SamplingRow(SamplingParams(temperature=1.0))] * batch_logits.shape[0]
            rows[rows_index] = SamplingRow(params, generator=gen)
            mask = mask_of(mask_rows, [set(range(0, V, 3))] * len(mask_rows))
            tokens.append(Sampler(seed=5)(batch_logits, rows, mask).token_ids[rows_index])
        return tokens

    solo = run(logits[1:2], 0, [0])
    batched = run(logits, 1, [0, 1, 2])
    assert solo == batched
    assert all(t % 3 == 0 for t in solo)


def test_logprobs_stay_those_of_the_raw_distribution():
    torch.manual_seed(4)
    logits = torch.randn(1, V)
    params = SamplingParams(temperature=0.0, logprobs=2)
    out = Sampler()(logits, [SamplingRow(params)], mask_of([0], [{9}]))
    raw = logits.log_softmax(-1)
    entry = out.logprobs[0]
    assert out.token_ids[0] == 9
    assert entry.logprob == pytest.approx(float(raw[0, 9]))
    assert [t for t, _ in entry.top] == raw[0].topk(2).indices.tolist()


def test_select_retargets_a_mask_to_reused_and_reordered_rows():
    mask = mask_of([0, 2], [{1}, {2}])
    picked = mask.select([2, 1, 0, 0])
    assert picked.rows == (0, 2, 3)
    logits = torch.zeros(4, V)
    picked.apply(logits)
    assert [int(r.argmax()) for r in logits[[0, 2, 3]]] == [2, 1, 1]
    assert torch.equal(logits[1], torch.zeros(V))
    assert mask.select([1]) is None
