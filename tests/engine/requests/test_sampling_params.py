"""SamplingParams refuses greedy decoding with several sequences (they would all be the same),
as vLLM does, and keeps beam search (deterministic, several distinct hypotheses) allowed."""

from __future__ import annotations

import pytest

from engine import SamplingParams


@pytest.mark.parametrize(
    ("values", "field"),
    [({"n": 2}, "n"), ({"best_of": 3}, "best_of"), ({"n": 2, "best_of": 2}, "n")],
)
def test_greedy_with_several_sequences_is_refused_naming_the_field(values, field):
    with pytest.raises(ValueError, match=rf"^{field} must be 1 with temperature 0"):
        SamplingParams(temperature=0.0, **values)


def test_sampling_and_beam_search_keep_several_sequences():
    assert SamplingParams(temperature=0.7, n=2, best_of=3).num_sequences == 3
    beams = SamplingParams(temperature=0.0, n=2, best_of=4, use_beam_search=True)
    assert beams.num_sequences == 4 and beams.greedy
    assert SamplingParams(temperature=0.0, n=1, best_of=1).num_sequences == 1
