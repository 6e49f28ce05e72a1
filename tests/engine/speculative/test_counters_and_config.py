"""Speculation counters (per-position acceptance) and SpeculativeConfig validation."""

from __future__ import annotations

import pytest

from engine.speculative.config import SpeculativeConfig
from engine.speculative.counters import SpeculationCounters


def test_counters_count_each_position_of_the_kept_prefix():
    counters = SpeculationCounters(3)
    counters.record(3, 1)  # positions 0, 1, 2 proposed; 0 kept
    counters.record(2, 2)  # positions 0, 1 proposed and kept
    counters.record(0, 0)  # nothing proposed: not a proposal
    stats = counters.snapshot()
    assert stats.num_proposals == 2
    assert (stats.num_proposed_tokens, stats.num_accepted_tokens) == (5, 3)
    assert stats.proposed_per_position == (2, 2, 1)
    assert stats.accepted_per_position == (2, 1, 0)
    assert stats.acceptance_rate == pytest.approx(3 / 5)
    assert [stats.acceptance_rate_at(i) for i in range(4)] == [1.0, 0.5, 0.0, None]


def test_counters_refuse_impossible_records():
    with pytest.raises(ValueError):
        SpeculationCounters(2).record(2, 3)
    with pytest.raises(ValueError):
        SpeculationCounters(2).record(3, 1)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"method": "medusa"}, "speculative"),
        ({"num_tokens": 0}, "num_speculative_tokens"),
        ({"num_tokens": 17}, "num_speculative_tokens"),
        ({"ngram_min": 3, "ngram_max": 2}, "speculative_ngram_min"),
        ({"method": "draft"}, "speculative_model"),
        ({"model": "/some/draft"}, "speculative_model"),
    ],
)
def test_config_names_the_bad_flag(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SpeculativeConfig(**kwargs)


def test_config_defaults_are_valid():
    config = SpeculativeConfig()
    assert (config.method, config.num_tokens, config.ngram_min, config.ngram_max) == (
        "ngram",
        4,
        1,
        4,
    )
    assert SpeculativeConfig(method="draft", model="/draft").model == "/draft"


def test_engine_config_takes_a_speculative_config_only():
    from engine.config import EngineConfig

    assert EngineConfig(speculative=SpeculativeConfig()).speculative.method == "ngram"
    with pytest.raises(ValueError, match="speculative must be a SpeculativeConfig"):
        EngineConfig(speculative="ngram")
