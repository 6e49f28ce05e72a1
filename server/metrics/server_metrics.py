"""ServerMetrics: the app's Prometheus registry (prefix tgserve_) and what feeds it.

Contract: `ServerMetrics(stats_source, vllm_compatible=False)` owns its own registry (no global
state, so several apps can live in one process). Engine-level values come from `stats_source()`
— the AsyncEngine's latest EngineStats snapshot — at scrape time (engine_collectors.py);
per-request values from `timer()`s (request_timer.py), labelled with the first served name once
`bind_model` set it, or with the LoRA adapter a request runs under (`timer(adapter)`); rejections are counted by reason via `reject(reason)` (they may come before
any model is loaded). HTTP requests by route and status: http.py, on this registry. The standard
`process_*` metrics (resident memory, open FDs, CPU seconds; Linux only) come from
prometheus_client's ProcessCollector: `tgserve bench soak` watches them for leaks. With
`vllm_compatible` the router gauges (router_gauges.py) are exported too; without it the output
passes `promtool check metrics` clean.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    ProcessCollector,
    generate_latest,
)

from engine import FINISH_REASONS
from server.metrics.engine_collectors import EngineStatsCollector, SchedulerCollector
from server.metrics.kv_tiers import KVTierCollector
from server.metrics.request_timer import RequestFamilies, RequestTimer
from server.metrics.router_gauges import RouterGaugesCollector
from server.metrics.speculation import SpeculationCollector


class ServerMetrics:
    def __init__(self, stats_source: Callable[[], Any], vllm_compatible: bool = False) -> None:
        self.registry = CollectorRegistry()
        self.model_name = ""  # the served name, once loaded (`bind_model`)
        self.requests = RequestFamilies.create(self.registry)
        self.rejected = Counter(
            "tgserve_request_rejected",
            "Requests refused before generation, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.registry.register(EngineStatsCollector(stats_source))
        self.registry.register(SchedulerCollector(stats_source))
        if vllm_compatible:
            self.registry.register(RouterGaugesCollector(stats_source))
        self.registry.register(SpeculationCollector(stats_source))  # only while speculating
        self.registry.register(KVTierCollector(stats_source))  # only with K/V tiers
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, ...

    def bind_model(self, name: str) -> None:
        """The `model_name` label of the request-level metrics from now on; its counters
        start at 0 (a series that appears only with its first event hides the first rate)."""
        self.model_name = name
        self.requests.aborts.labels(name)
        for reason in FINISH_REASONS:
            self.requests.finished.labels(name, reason)

    def reject(self, reason: str) -> None:
        self.rejected.labels(reason=reason).inc()

    def timer(self, model: str | None = None) -> RequestTimer:
        """A request's timer, its series labelled `model` (a LoRA adapter's name) or the
        served model's name."""
        return RequestTimer(self.requests, model or self.model_name)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
