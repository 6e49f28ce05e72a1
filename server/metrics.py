"""Prometheus metrics (prefix tgserve_); the only module that imports prometheus_client.

Contract: `ServerMetrics(stats_source)` owns its own registry (no global state, so several apps
can live in one process). Engine-level values (running / waiting, KV blocks, token, preemption
and prefix-cache counters) are read from `stats_source()` — the AsyncEngine's latest
EngineStats snapshot — at scrape time. Per-request values come from `RequestTimer`s and carry
a `model_name` label (the first served name, set by `bind_model` once the model is loaded):
time to first token, inter-token latency, end-to-end latency and queue time (arrival to first
scheduling) histograms, prompt and generation length histograms, finished requests by finish
reason and aborts. Rejections are counted by reason via `reject(reason)` (they may come before
any model is loaded). HTTP requests by route and status: server/http_metrics.py, on this
registry. The output passes `promtool check metrics` except for the router gauges' names.
The scheduler's view (issue #12) comes from the same snapshot: a histogram of engine step wall
times, one of prefill tokens per step, and the prefill chunk the step-time target allows now.
The standard `process_*` metrics (resident memory, open FDs, CPU seconds; Linux only) come from
prometheus_client's ProcessCollector: `tgserve bench soak` watches them for leaks.
The router gauges (last block) repeat the queue length and KV-cache use under the names LLM
routers and the Kubernetes Gateway API Inference Extension scrape from vLLM-style servers
(their `:` is the one thing promtool's lint objects to; routers need the names as they are).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from engine import FINISH_REASONS, RequestOutput
from server.speculation_metrics import SpeculationCollector

LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)
# 1-2-5 steps up to 128Ki tokens: prompt and output lengths of any model's context
_TOKEN_BUCKETS = tuple(m * 10**e for e in range(5) for m in (1, 2, 5)) + (131072,)
# (EngineStats field, metric name, help); gauges first, then cumulative counters
_GAUGES = (
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
)
_COUNTERS = (
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


class _EngineStatsCollector(Collector):
    def __init__(self, stats_source: Callable[[], Any]) -> None:
        self._stats_source = stats_source

    def collect(self) -> Iterator[Metric]:
        stats = self._stats_source()
        if stats is not None:  # None: the model is still loading
            yield from self._families(stats)

    def _families(self, stats: Any) -> Iterator[Metric]:
        for field, name, doc in _GAUGES:
            yield GaugeMetricFamily(name, doc, value=getattr(stats, field))
        for field, name, doc in _COUNTERS:
            yield CounterMetricFamily(name, doc, value=getattr(stats, field))


class ServerMetrics:
    def __init__(self, stats_source: Callable[[], Any]) -> None:
        self.registry = CollectorRegistry()
        self.model_name = ""  # the served name, once loaded (`bind_model`)
        reg, model = self.registry, ["model_name"]
        self.finished = Counter(
            "tgserve_request_success",
            "Requests finished, by finish reason.",
            [*model, "finish_reason"],
            registry=reg,
        )
        self.aborts = Counter(
            "tgserve_request_aborts",
            "Requests aborted (client gone, deadline, shutdown).",
            model,
            registry=reg,
        )
        self.rejected = Counter(
            "tgserve_request_rejected",
            "Requests refused before generation, by reason.",
            ["reason"],
            registry=reg,
        )
        self.ttft = _latency("tgserve_time_to_first_token_seconds", "Time to first token.", reg)
        self.itl = Histogram(
            "tgserve_inter_token_latency_seconds",
            "Time between generated tokens.",
            model,
            buckets=_ITL_BUCKETS,
            registry=reg,
        )
        self.e2e = _latency("tgserve_e2e_request_latency_seconds", "Arrival to last token.", reg)
        self.queue_time = _latency(
            "tgserve_request_queue_time_seconds", "Arrival to first scheduling.", reg
        )
        self.prompt_tokens = _lengths("tgserve_request_prompt_tokens", "Prompt length.", reg)
        self.generation_tokens = _lengths(
            "tgserve_request_generation_tokens",
            "Tokens generated per request (its returned sequences together).",
            reg,
        )
        reg.register(_EngineStatsCollector(stats_source))
        reg.register(_SchedulerCollector(stats_source))
        reg.register(_RouterGaugesCollector(stats_source))
        reg.register(SpeculationCollector(stats_source))  # only while the engine speculates
        ProcessCollector(registry=reg)  # process_resident_memory_bytes, process_open_fds, ...

    def bind_model(self, name: str) -> None:
        """The `model_name` label of the request-level metrics from now on; its counters
        start at 0 (a series that appears only with its first event hides the first rate)."""
        self.model_name = name
        self.aborts.labels(name)
        for reason in FINISH_REASONS:
            self.finished.labels(name, reason)

    def reject(self, reason: str) -> None:
        self.rejected.labels(reason=reason).inc()

    def timer(self) -> RequestTimer:
        return RequestTimer(self)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _latency(name: str, doc: str, registry: CollectorRegistry) -> Histogram:
    return Histogram(name, doc, ["model_name"], buckets=LATENCY_BUCKETS, registry=registry)


def _lengths(name: str, doc: str, registry: CollectorRegistry) -> Histogram:
    return Histogram(name, doc, ["model_name"], buckets=_TOKEN_BUCKETS, registry=registry)


class RequestTimer:
    """Observes one request's outputs as they are delivered; `close()` records how it ended."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._start = time.monotonic()
        model = metrics.model_name
        self._finished = lambda reason: metrics.finished.labels(model, reason).inc()
        self._aborts = metrics.aborts.labels(model)
        self._ttft, self._itl = metrics.ttft.labels(model), metrics.itl.labels(model)
        self._e2e, self._queue_time = metrics.e2e.labels(model), metrics.queue_time.labels(model)
        self._prompt_tokens = metrics.prompt_tokens.labels(model)
        self._generation_tokens = metrics.generation_tokens.labels(model)
        self._last_token_time: float | None = None
        self._tokens = 0
        self._generated: dict[int, int] = {}  # sequence index -> tokens generated
        self._finish_reason: str | None = None
        self._prompt_seen = False
        self._queue_seen = False
        self._closed = False

    def observe(self, output: RequestOutput) -> None:
        now = time.monotonic()
        if not self._prompt_seen:
            self._prompt_seen = True
            self._prompt_tokens.observe(len(output.prompt_token_ids))
        for o in output.outputs:  # an index may restart from 0 (best_of, beams): keep the most
            self._generated[o.index] = max(self._generated.get(o.index, 0), o.num_tokens)
        # per-sequence progress: n > 1 samples advance together, one token each per step
        tokens = max((o.num_tokens for o in output.outputs), default=0)
        new = tokens - self._tokens
        if new > 0:
            if self._last_token_time is None:
                self._ttft.observe(now - self._start)
                first = output.metrics.first_token_time if output.metrics else None
                if new > 1 and first is not None:  # later tokens merged into the first output
                    gap = max(0.0, time.time() - first) / (new - 1)
                    for _ in range(new - 1):
                        self._itl.observe(gap)
            else:
                gap = (now - self._last_token_time) / new  # merged deltas: spread the gap
                for _ in range(new):
                    self._itl.observe(gap)
            self._tokens, self._last_token_time = tokens, now
        times = output.metrics
        if not self._queue_seen and times is not None and times.first_scheduled_time is not None:
            self._queue_seen = True
            self._queue_time.observe(max(0.0, times.first_scheduled_time - times.arrival_time))
        if output.finished:
            self._finish_reason = output.outputs[0].finish_reason if output.outputs else "abort"

    def close(self) -> None:
        """Records the end: the finish reason seen, or an abort when the stream stopped early;
        the generation length of a request that produced any output."""
        if self._closed:
            return
        self._closed = True
        reason = self._finish_reason or "abort"
        self._finished(reason)
        if reason == "abort":
            self._aborts.inc()
        self._e2e.observe(time.monotonic() - self._start)
        if self._prompt_seen:
            self._generation_tokens.observe(sum(self._generated.values()))


# ----- the scheduler's view (issue #12): step times, prefill per step, current chunk size -----


def _histogram(name: str, doc: str, snapshot: Any) -> HistogramMetricFamily:
    """A Prometheus histogram from an engine `Histogram` snapshot (per-bucket counts)."""
    buckets, running = [], 0
    for bound, count in zip((*snapshot.bounds, float("inf")), snapshot.counts, strict=True):
        running += count
        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=snapshot.total)


class _SchedulerCollector(Collector):
    def __init__(self, stats_source: Callable[[], Any]) -> None:
        self._stats_source = stats_source

    def collect(self) -> Iterator[Metric]:
        stats = self._stats_source()
        if stats is None or getattr(stats, "step_seconds", None) is None:
            return  # loading, or an engine without step timings (the tests' fake)
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


# ---- Router gauges --------------------------------------------------------------------------
# Load-aware routers and the Gateway API Inference Extension's endpoint picker read a model
# server's queue and KV-cache use from /metrics under vLLM's names (its "model server protocol").
# tgserve exports the same values under those names too, so such a router can pick among tgserve
# replicas (and an HPA can scale on the queue) without a name map. Usage is a fraction in [0, 1]:
# blocks held by sequences over the pool; parked prefix-cache blocks are free, as in vLLM.
_ROUTER_GAUGES = (
    ("vllm:num_requests_waiting", "Requests waiting to be scheduled."),
    ("vllm:num_requests_running", "Requests in the running batch."),
    ("vllm:kv_cache_usage_perc", "KV-cache usage as a fraction: 1 means every block is in use."),
    ("vllm:gpu_cache_usage_perc", "Older name of vllm:kv_cache_usage_perc, read by older routers."),
)


class _RouterGaugesCollector(_EngineStatsCollector):
    def _families(self, stats: Any) -> Iterator[Metric]:
        total = stats.kv_blocks_total
        usage = stats.kv_blocks_used / total if total else 0.0
        values = (stats.num_waiting, stats.num_running, usage, usage)
        for (name, doc), value in zip(_ROUTER_GAUGES, values, strict=True):
            yield GaugeMetricFamily(name, doc, value=value)
