"""Prometheus families of the K/V tiers behind the pool, read from `EngineStats.kv_tiers` at
scrape time (nothing when no tier is configured, or before the model is loaded).

Contract: `KVTierCollector(stats_source)` is a prometheus_client collector yielding, per `tier`
("ram", "disk"): counters `tgserve_kv_offload_hits` (blocks served by the tier: loaded into the
pool from RAM, read from disk) and `tgserve_kv_offload_hit_bytes` (their K/V bytes), and gauge
`tgserve_kv_offload_bytes` (bytes the tier holds now); plus counters
`tgserve_kv_offload_saved_blocks` (blocks copied out of the pool on eviction),
`tgserve_kv_offload_written_bytes` (bytes written to disk) and
`tgserve_kv_offload_rejected_files` (corrupt, truncated or stale files ignored).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_PER_TIER = (  # (kind, name, help, ram field, disk field)
    (CounterMetricFamily, "hits", "Blocks served by a K/V tier.", "ram_hits", "disk_hits"),
    (
        CounterMetricFamily,
        "hit_bytes",
        "K/V bytes served by a tier.",
        "ram_hit_bytes",
        "disk_hit_bytes",
    ),
    (GaugeMetricFamily, "bytes", "Bytes a K/V tier holds.", "ram_bytes", "disk_bytes"),
)
_TOTALS = (
    ("saved_blocks", "saved_blocks", "K/V blocks copied out of the pool on eviction."),
    ("disk_written_bytes", "written_bytes", "K/V bytes written to the disk tier."),
    ("disk_rejected", "rejected_files", "Corrupt, truncated or stale K/V files ignored."),
)


class KVTierCollector(Collector):
    def __init__(self, stats_source: Callable[[], Any]) -> None:
        self._stats_source = stats_source

    def collect(self) -> Iterator[Metric]:
        tiers = getattr(self._stats_source(), "kv_tiers", None)
        if tiers is None:
            return
        for kind, name, doc, ram, disk in _PER_TIER:
            family = kind(f"tgserve_kv_offload_{name}", doc, labels=["tier"])
            family.add_metric(["ram"], getattr(tiers, ram))
            family.add_metric(["disk"], getattr(tiers, disk))
            yield family
        for field, name, doc in _TOTALS:
            yield CounterMetricFamily(f"tgserve_kv_offload_{name}", doc, getattr(tiers, field))
