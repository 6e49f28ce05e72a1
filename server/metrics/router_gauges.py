"""The router gauges: the queue and KV-cache use under vLLM's metric names, behind an option.

Contract: `RouterGaugesCollector(stats_source)` yields `vllm:num_requests_waiting`,
`vllm:num_requests_running`, `vllm:kv_cache_usage_perc` and its older name
`vllm:gpu_cache_usage_perc`, from the same stats snapshot as tgserve's own gauges. Load-aware
routers and the Kubernetes Gateway API Inference Extension's endpoint picker read a model
server's load under these names (vLLM's "model server protocol"), so such a router can pick
among tgserve replicas without a name map. Their `:` is what promtool's lint objects to, so
they are exported only with `--vllm-compatible-metrics` (ServerMetrics). Usage is a fraction in
[0, 1]: blocks held by sequences over the pool; parked prefix-cache blocks are free, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from server.metrics.engine_collectors import EngineStatsCollector

ROUTER_GAUGES = (
    ("vllm:num_requests_waiting", "Requests waiting to be scheduled."),
    ("vllm:num_requests_running", "Requests in the running batch."),
    ("vllm:kv_cache_usage_perc", "KV-cache usage as a fraction: 1 means every block is in use."),
    ("vllm:gpu_cache_usage_perc", "Older name of vllm:kv_cache_usage_perc, read by older routers."),
)


class RouterGaugesCollector(EngineStatsCollector):
    def _families(self, stats: Any) -> Iterator[Metric]:
        total = stats.kv_blocks_total
        usage = stats.kv_blocks_used / total if total else 0.0
        values = (stats.num_waiting, stats.num_running, usage, usage)
        for (name, doc), value in zip(ROUTER_GAUGES, values, strict=True):
            yield GaugeMetricFamily(name, doc, value=value)
