"""Prometheus families of speculative decoding, read from `EngineStats.speculation` at scrape
time (nothing when the engine does not speculate, or before the model is loaded).

Contract: `SpeculationCollector(stats_source)` is a prometheus_client collector yielding
- counters `tgserve_spec_decode_proposals` (sequence-steps that verified a proposal),
  `tgserve_spec_decode_proposed_tokens`, `tgserve_spec_decode_accepted_tokens`, and per
  `position` (0-based place in the proposal) `tgserve_spec_decode_proposed_tokens_per_position`
  and `tgserve_spec_decode_accepted_tokens_per_position`;
- gauge `tgserve_spec_decode_acceptance_rate` per `position`: accepted over proposed since
  start (the counters' ratio; `rate()` of the two counters gives it over a window).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_TOTALS = (
    ("num_proposals", "proposals", "Speculative proposals verified (one sequence, one step)."),
    ("num_proposed_tokens", "proposed_tokens", "Tokens proposed by speculative decoding."),
    ("num_accepted_tokens", "accepted_tokens", "Proposed tokens the target model accepted."),
)


class SpeculationCollector(Collector):
    def __init__(self, stats_source: Callable[[], Any]) -> None:
        self._stats_source = stats_source

    def collect(self) -> Iterator[Metric]:
        stats = self._stats_source()
        spec = getattr(stats, "speculation", None)
        if spec is None:
            return
        for field, name, doc in _TOTALS:
            yield CounterMetricFamily(f"tgserve_spec_decode_{name}", doc, getattr(spec, field))
        proposed = CounterMetricFamily(
            "tgserve_spec_decode_proposed_tokens_per_position",
            "Proposed tokens at each position of a proposal (0: the first).",
            labels=["position"],
        )
        accepted = CounterMetricFamily(
            "tgserve_spec_decode_accepted_tokens_per_position",
            "Accepted tokens at each position of a proposal (0: the first).",
            labels=["position"],
        )
        rate = GaugeMetricFamily(
            "tgserve_spec_decode_acceptance_rate",
            "Accepted over proposed tokens at each position of a proposal, since start.",
            labels=["position"],
        )
        for i, (p, a) in enumerate(
            zip(spec.proposed_per_position, spec.accepted_per_position, strict=True)
        ):
            proposed.add_metric([str(i)], p)
            accepted.add_metric([str(i)], a)
            rate.add_metric([str(i)], a / p if p else 0.0)
        yield from (proposed, accepted, rate)
