"""Speculative decoding on the serving floor: its Prometheus families (values from the
engine's counters, promtool-clean, absent when the engine does not speculate) and its flags
(`tgserve serve --speculative ngram ...` -> EngineConfig.speculative)."""

from __future__ import annotations

import argparse
import subprocess
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from engine import SpeculativeConfig, speculative_config
from engine.speculative.counters import SpeculationCounters
from server import serve
from server.metrics.speculation import SpeculationCollector
from server.settings import Settings
from tests.debian_tools import debian_tool


def _scrape(stats) -> str:
    registry = CollectorRegistry()
    registry.register(SpeculationCollector(lambda: stats))
    return generate_latest(registry).decode()


def _samples(text: str) -> dict[tuple[str, str | None], float]:
    return {
        (s.name, s.labels.get("position")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_families_carry_the_engine_counters_per_position():
    counters = SpeculationCounters(3)
    for proposed, accepted in ((3, 2), (3, 0), (1, 1), (2, 2)):
        counters.record(proposed, accepted)
    text = _scrape(SimpleNamespace(speculation=counters.snapshot()))
    got = _samples(text)
    assert got[("tgserve_spec_decode_proposals_total", None)] == 4
    assert got[("tgserve_spec_decode_proposed_tokens_total", None)] == 9
    assert got[("tgserve_spec_decode_accepted_tokens_total", None)] == 5
    proposed = [
        got[("tgserve_spec_decode_proposed_tokens_per_position_total", str(i))] for i in range(3)
    ]
    accepted = [
        got[("tgserve_spec_decode_accepted_tokens_per_position_total", str(i))] for i in range(3)
    ]
    assert proposed == [4, 3, 2] and accepted == [3, 2, 0]
    rates = [got[("tgserve_spec_decode_acceptance_rate", str(i))] for i in range(3)]
    assert rates == pytest.approx([3 / 4, 2 / 3, 0.0])
    lint = subprocess.run(
        [debian_tool("promtool", "prometheus"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert lint.returncode == 0 and not lint.stdout + lint.stderr, lint


def test_nothing_is_exported_without_speculation():
    assert _scrape(SimpleNamespace(speculation=None)) == ""
    assert _scrape(None) == ""  # the model is still loading


def _settings(argv: list[str]) -> Settings:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return Settings.resolve(parser.parse_args(argv), {})


def test_flags_build_the_engines_speculative_config():
    s = _settings(["--speculative", "ngram", "--num-speculative-tokens", "3"])
    built = speculative_config(
        s.speculative,
        s.num_speculative_tokens,
        s.speculative_ngram_min,
        s.speculative_ngram_max,
        s.speculative_model,
    )
    assert built == SpeculativeConfig("ngram", num_tokens=3)
    s = _settings([])
    assert speculative_config(s.speculative) is None


def test_speculative_flags_without_speculative_are_refused():
    with pytest.raises(ValueError, match="num_speculative_tokens needs speculative"):
        speculative_config(None, num_tokens=3)
    with pytest.raises(ValueError, match="speculative must be one of"):
        speculative_config("medusa")
