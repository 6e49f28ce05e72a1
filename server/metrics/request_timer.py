"""Per-request metrics: the families each request feeds, and the timer that feeds them.

Contract: `RequestFamilies.create(registry)` registers the request-level families, each with a
`model_name` label: finished requests by finish reason, aborts, time to first token,
inter-token latency, end-to-end latency and queue time (arrival to first scheduling)
histograms, prompt and generation length histograms. `RequestTimer(families, model)` observes
one request's outputs as they are delivered; `close()` records how it ended (once).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

from engine import RequestOutput

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
_MODEL = ("model_name",)


@dataclass(frozen=True)
class RequestFamilies:
    finished: Counter
    aborts: Counter
    ttft: Histogram
    itl: Histogram
    e2e: Histogram
    queue_time: Histogram
    prompt_tokens: Histogram
    generation_tokens: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry) -> RequestFamilies:
        def latency(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, _MODEL, buckets=LATENCY_BUCKETS, registry=registry)

        def lengths(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, _MODEL, buckets=_TOKEN_BUCKETS, registry=registry)

        return cls(
            finished=Counter(
                "tgserve_request_success",
                "Requests finished, by finish reason.",
                [*_MODEL, "finish_reason"],
                registry=registry,
            ),
            aborts=Counter(
                "tgserve_request_aborts",
                "Requests aborted (client gone, deadline, shutdown).",
                _MODEL,
                registry=registry,
            ),
            ttft=latency("tgserve_time_to_first_token_seconds", "Time to first token."),
            itl=Histogram(
                "tgserve_inter_token_latency_seconds",
                "Time between generated tokens.",
                _MODEL,
                buckets=_ITL_BUCKETS,
                registry=registry,
            ),
            e2e=latency("tgserve_e2e_request_latency_seconds", "Arrival to last token."),
            queue_time=latency(
                "tgserve_request_queue_time_seconds", "Arrival to first scheduling."
            ),
            prompt_tokens=lengths("tgserve_request_prompt_tokens", "Prompt length."),
            generation_tokens=lengths(
                "tgserve_request_generation_tokens",
                "Tokens generated per request (its returned sequences together).",
            ),
        )


class RequestTimer:
    """Observes one request's outputs as they are delivered; `close()` records how it ended."""

    def __init__(self, families: RequestFamilies, model: str) -> None:
        self._start = time.monotonic()
        self._finished = lambda reason: families.finished.labels(model, reason).inc()
        self._aborts = families.aborts.labels(model)
        self._ttft, self._itl = families.ttft.labels(model), families.itl.labels(model)
        self._e2e, self._queue_time = families.e2e.labels(model), families.queue_time.labels(model)
        self._prompt_tokens = families.prompt_tokens.labels(model)
        self._generation_tokens = families.generation_tokens.labels(model)
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
