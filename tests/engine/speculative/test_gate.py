"""The proposal gate: the length it sends is the argmax of the expected-tokens-per-cost model
(oracle: the closed form (1 - a^(j+1)) / (1 - a) evaluated for every j), and it learns from
what each sequence got: proposals always refused close it, ones that would have been kept
open it again (judged on proposals it did not send), always kept ones send all of them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.requests.request import TokenSequence
from engine.speculative.gate import ProposalGate, best_length


def _closed_form_best(a: float, limit: int, row_cost: float) -> int:
    def gain(j: int) -> float:
        expected = j + 1 if a == 1 else (1 - a ** (j + 1)) / (1 - a)
        return expected / (1 + row_cost * j)

    gains = [gain(j) for j in range(limit + 1)]
    top = max(gains)
    return next(j for j, g in enumerate(gains) if g >= top - 1e-9)


@given(
    st.floats(0.0, 1.0),
    st.integers(0, 16),
    st.floats(0.0, 2.0),
)
def test_the_length_maximises_expected_tokens_per_step_cost(a, limit, row_cost):
    assert best_length(a, limit, row_cost) == _closed_form_best(a, limit, row_cost)


def test_hand_worked_lengths():
    assert best_length(0.0, 4, 0.25) == 0  # nothing kept: never worth a row
    assert best_length(1.0, 4, 0.25) == 4  # all kept: (j + 1) / (1 + j / 4) grows with j
    assert best_length(0.5, 4, 0.25) == 1  # 1.5 / 1.25 = 1.2 > 1.75 / 1.5
    assert best_length(0.2, 4, 0.25) == 0  # 1.2 / 1.25 < 1: a must beat the row cost
    assert best_length(0.9, 4, 0.0) == 4  # free rows: always all


def _step(seq: TokenSequence, tokens: list[int]) -> None:
    seq.token_ids.extend(tokens)


def test_refused_proposals_close_the_gate_and_kept_ones_reopen_it():
    gate = ProposalGate(row_cost=0.25, decay=0.9)
    seq = TokenSequence(0, [5, 6, 7], 3)
    sent = []
    for _ in range(6):  # every proposal [1, 2, 3, 4] is wrong at its first token
        sent.append(gate.length(seq, (1, 2, 3, 4)))
        _step(seq, [9])  # refused at once: one token, the target's
    assert sent[0] == 1  # the prior (a = 0.5) tries one token
    assert sent[-1] == 0 and gate.acceptance(seq) < 0.2
    closed = len(sent)
    for _ in range(12):  # now the target counts up, and so do the proposals (sent or not)
        base = seq.num_tokens
        sent.append(gate.length(seq, (base, base + 1)))
        _step(seq, [base + i for i in range(sent[-1] + 1)])  # the kept ones + the target's
    assert sent[closed] == 0 and sent[-1] == 2  # open again, sending all it has
    assert gate.acceptance(seq) > 0.8


def test_an_unmoved_sequence_teaches_nothing_and_finished_ones_are_swept():
    gate = ProposalGate()
    seq = TokenSequence(0, [1, 2], 2)
    gate.length(seq, (3,))
    before = gate.acceptance(seq)
    gate.length(seq, (3,))  # not scheduled in between: no new token, nothing judged
    assert gate.acceptance(seq) == before
    seq.finish_reason = "length"
    others = [TokenSequence(i, [1], 1) for i in range(1, 40)]
    for other in others:
        gate.length(other, ())
    assert seq not in gate._records and len(gate._records) <= 2 * len(others)


@pytest.mark.parametrize("bad", [dict(row_cost=-0.1), dict(decay=0.0), dict(decay=1.5)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        ProposalGate(**bad)
