"""Prometheus families of a prefill or decode server's K/V transfer (engine/kv_transfer), read
from its link's `stats()` at scrape time (nothing before the model is loaded and the peer
joined).

Contract: `KVTransferCollector(link_source)` yields counters `tgserve_kv_transfer_blocks`,
`tgserve_kv_transfer_bytes` and `tgserve_kv_transfer_seconds` (sent on a prefill server: the
sender thread's time on the wire; received on a decode server: the time putting blocks into
its RAM tier), `tgserve_kv_transfer_rejected_batches` (a decode server's batches of another
forward path, recomputed instead), and gauge `tgserve_kv_transfer_up` (0 once the peer is
gone), each labelled with the server's `role`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_COUNTERS = (
    ("blocks", "blocks", "K/V blocks sent (prefill) or received (decode)."),
    ("bytes", "bytes", "K/V bytes sent (prefill) or received (decode)."),
    ("seconds", "seconds", "Seconds sending (prefill) or putting received blocks (decode)."),
    ("rejected", "rejected_batches", "Received batches of another forward path, recomputed."),
)


class KVTransferCollector(Collector):
    def __init__(self, link_source: Callable[[], Any]) -> None:
        self._link_source = link_source

    def collect(self) -> Iterator[Metric]:
        link = self._link_source()
        if link is None:
            return
        stats = link.stats()
        for field, name, doc in _COUNTERS:
            family = CounterMetricFamily(f"tgserve_kv_transfer_{name}", doc, labels=["role"])
            family.add_metric([stats.role], getattr(stats, field))
            yield family
        up = GaugeMetricFamily("tgserve_kv_transfer_up", "1 while the K/V peer is", labels=["role"])
        up.add_metric([stats.role], 0 if stats.broken else 1)
        yield up
