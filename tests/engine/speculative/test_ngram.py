"""The n-gram prompt-lookup proposer: hand-worked cases, and a property test against a
brute-force reading of its contract (every n from max to min, every earlier end position)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.speculative.ngram import NgramProposer


@pytest.mark.parametrize(
    ("tokens", "k", "min_n", "max_n", "expected"),
    [
        # suffix [1, 2] recurs at the start: what followed it
        ([1, 2, 3, 4, 1, 2], 3, 1, 3, (3, 4, 1)),
        # [5, 6] occurs twice before the end: the most recent occurrence wins
        ([5, 6, 9, 5, 6, 7, 5, 6], 2, 1, 3, (7, 5)),
        # the longer match [1, 2, 3] beats the more recent shorter [2, 3]
        ([1, 2, 3, 9, 7, 2, 3, 8, 1, 2, 3], 3, 1, 3, (9, 7, 2)),
        # max_n 2 caps the match length: then [2, 3] at its most recent place
        ([1, 2, 3, 9, 7, 2, 3, 8, 1, 2, 3], 3, 1, 2, (8, 1, 2)),
        # only a 1-gram recurs, and min_n is 2: nothing
        ([1, 2, 3, 1], 3, 2, 4, ()),
        # the occurrence ends near the end: fewer than k tokens follow it
        ([1, 2, 1], 3, 1, 2, (2, 1)),
        # a run of one token: the last token matches itself one back
        ([7, 7, 7, 7], 3, 1, 4, (7,)),
        # nothing recurs
        ([1, 2, 3, 4], 3, 1, 4, ()),
        # one token: nothing earlier to match
        ([5], 2, 1, 1, ()),
    ],
)
def test_hand_worked_proposals(tokens, k, min_n, max_n, expected):
    assert NgramProposer(k, min_n, max_n).propose(tokens) == expected


def test_limit_caps_the_proposal():
    proposer = NgramProposer(4, 1, 3)
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    assert proposer.propose(tokens) == (3, 4, 5, 6)
    assert proposer.propose(tokens, limit=2) == (3, 4)
    assert proposer.propose(tokens, limit=0) == ()


@pytest.mark.parametrize(("k", "min_n", "max_n"), [(0, 1, 2), (2, 0, 2), (2, 3, 2)])
def test_bad_settings_are_refused(k, min_n, max_n):
    with pytest.raises(ValueError):
        NgramProposer(k, min_n, max_n)


def brute_force(tokens: list[int], k: int, min_n: int, max_n: int) -> tuple[int, ...]:
    """The contract, literally: longest n first, latest end first, end before the last token."""
    length = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if n > length - 1:
            continue
        suffix = tokens[length - n :]
        for end in range(length - 1, n - 1, -1):
            if tokens[end - n : end] == suffix:
                return tuple(tokens[end : end + k])
    return ()


@settings(max_examples=400)
@given(
    tokens=st.lists(st.integers(0, 4), min_size=1, max_size=60),
    k=st.integers(1, 6),
    min_n=st.integers(1, 4),
    extra=st.integers(0, 3),
)
def test_matches_the_brute_force_reading(tokens, k, min_n, extra):
    max_n = min_n + extra
    got = NgramProposer(k, min_n, max_n).propose(tokens)
    assert got == brute_force(tokens, k, min_n, max_n)
    assert len(got) <= k
