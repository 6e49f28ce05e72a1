"""Engine-level metrics, read from the engine's latest stats snapshot at scrape time.

Contract: `EngineStatsCollector(stats_source)` yields the running / waiting gauges, KV blocks,
the C++-kernel flag (`ENGINE_GAUGES`) and the token, preemption and prefix-cache counters
(`ENGINE_COUNTERS`); `SchedulerCollector(stats_source)` the scheduler's view (issue #12): a
histogram of engine step wall times, one of prefill tokens per step, and the prefill chunk the
step-time target allows now. `stats_source()` returns an `EngineStats` or None while the model
loads (nothing is yielded then). Gauges are never named `_total` (promtool's lint).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

# (EngineStats field, metric name, help)
ENGINE_GAUGES = (
    ("num_running", "tgserve_num_requests_running", "Requests in the running batch."),
    ("num_waiting", "tgserve_num_requests_waiting", "Requests waiting to be scheduled."),
    ("kv_blocks_used", "tgserve_kv_cache_blocks_used", "KV cache blocks in use."),
    ("kv_blocks_total", "tgserve_kv_cache_blocks", "KV cache blocks in the pool."),
    (
        "cpu_kernels_active",
        "tgserve_cpu_kernels_active",
        "1 while tgserve's C++ CPU kernels run the steps; 0 on PyTorch ops (while they build, "
        "or turned off).",
    ),
    (
        "grammar_cache_bytes",
        "tgserve_grammar_cache_bytes",
        "Estimated bytes of the compiled grammars kept for reuse (--grammar-cache-bytes).",
    ),
)
ENGINE_COUNTERS = (
    ("prompt_tokens_total", "tgserve_prompt_tokens", "Prompt tokens processed."),
    ("generation_tokens_total", "tgserve_generation_tokens", "Tokens generated."),
    ("num_preemptions", "tgserve_num_preemptions", "Requests preempted (recomputed later)."),
    (
        "prefix_cache_queries",
        "tgserve_prefix_cache_queries",
        "Prompt blocks looked up in the prefix cache.",
    ),
    ("prefix_cache_hits", "tgserve_prefix_cache_hits", "Prompt blocks found in the prefix cache."),
)


class EngineStatsCollector(Collector):
    """Families computed from one stats snapshot per scrape; subclasses override `_families`."""

    def __init__(self, stats_source: Callable[[], Any]) -> None:
        self._stats_source = stats_source

    def collect(self) -> Iterator[Metric]:
        stats = self._stats_source()
        if stats is not None:  # None: the model is still loading
            yield from self._families(stats)

    def _families(self, stats: Any) -> Iterator[Metric]:
        for field, name, doc in ENGINE_GAUGES:
            yield GaugeMetricFamily(name, doc, value=getattr(stats, field))
        for field, name, doc in ENGINE_COUNTERS:
            yield CounterMetricFamily(name, doc, value=getattr(stats, field))


def _histogram(name: str, doc: str, snapshot: Any) -> HistogramMetricFamily:
    """A Prometheus histogram from an engine `Histogram` snapshot (per-bucket counts)."""
    buckets, running = [], 0
    for bound, count in zip((*snapshot.bounds, float("inf")), snapshot.counts, strict=True):
        running += count
        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=snapshot.total)


class SchedulerCollector(EngineStatsCollector):
    def _families(self, stats: Any) -> Iterator[Metric]:
        if getattr(stats, "step_seconds", None) is None:
            return  # an engine without step timings (the tests' fake)
        yield _histogram(
            "tgserve_engine_step_seconds",
            "Wall time of engine steps that ran a forward (what one inter-token gap costs).",
            stats.step_seconds,
        )
        yield _histogram(
            "tgserve_prefill_tokens_per_step",
            "Prompt (and recompute) tokens computed per engine step.",
            stats.prefill_tokens_per_step,
        )
        yield GaugeMetricFamily(
            "tgserve_prefill_chunk_tokens",
            "Prefill tokens the last step could take after its decodes: the chunk size the "
            "step-time target (--target-itl-ms) allows now.",
            value=stats.prefill_chunk_tokens,
        )
