"""Prometheus metrics (prefix tgserve_); the only package that imports prometheus_client.

Contract: `ServerMetrics` (server_metrics.py) is the app's registry: engine gauges and counters
(engine_collectors.py), per-request histograms and counters (request_timer.py), rejections,
HTTP requests by route and status (http.py) and, with `--vllm-compatible-metrics`, the router
gauges under vLLM's names (router_gauges.py).
"""

from server.metrics.http import HttpMetrics, HttpMetricsMiddleware
from server.metrics.request_timer import LATENCY_BUCKETS, RequestTimer
from server.metrics.server_metrics import ServerMetrics

__all__ = [
    "LATENCY_BUCKETS",
    "HttpMetrics",
    "HttpMetricsMiddleware",
    "RequestTimer",
    "ServerMetrics",
]
