"""Summaries of a serving run: percentiles of TTFT, TPOT, ITL and end-to-end latency, throughput.

Contract:
- `percentile(values, p)` is the linear interpolation between closest ranks (numpy's default
  "linear" method): rank = p / 100 * (n - 1). ValueError on no values or p outside [0, 100].
- `summarize(values_s)` gives `Percentiles` in milliseconds (mean, p50, p90, p99); all None when
  there is no value (e.g. no request produced a second token, so no ITL).
- `summarize_run(records, duration_s, ...)` builds the `ServeResult`: only successful requests
  enter the latency figures and the throughput; failures are counted, with the first few errors.
  TPOT per request = (end-to-end - TTFT) / (output tokens - 1), for requests with > 1 token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bench.serve_load import LoadSpec, RequestRecord

MAX_ERRORS_SHOWN = 5


@dataclass(frozen=True)
class Percentiles:
    mean_ms: float | None
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None


@dataclass(frozen=True)
class ServeResult:
    kind: str  # "serve"
    url: str
    num_requests: int
    concurrency: int | None
    request_rate: float | None  # None: all at once
    completed: int
    failed: int
    duration_s: float
    requests_per_s: float
    output_tok_s: float
    total_tok_s: float
    prompt_tokens: int
    output_tokens: int
    ttft: Percentiles
    tpot: Percentiles
    itl: Percentiles
    e2e: Percentiles
    itl_p99_over_p50: float | None  # the streaming smoothness target: <= 3
    # Output tokens that reached the client inside another token's chunk (text held back).
    merged_tokens: int
    bound_s: float | None  # minimal matmul time of the run's tokens (with --model), else None
    fraction_of_bound: float | None
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    errors: tuple[str, ...]


def percentile(values: Sequence[float], p: float) -> float:
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {p}")
    ordered = sorted(values)
    rank = p / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values_s: Sequence[float]) -> Percentiles:
    if not values_s:
        return Percentiles(None, None, None, None)
    ms = [v * 1000 for v in values_s]
    return Percentiles(
        sum(ms) / len(ms), percentile(ms, 50), percentile(ms, 90), percentile(ms, 99)
    )


def summarize_run(
    spec: LoadSpec,
    records: Sequence[RequestRecord],
    duration_s: float,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
    bound_s: float | None = None,
) -> ServeResult:
    good = [r for r in records if r.ok]
    prompt_tokens = sum(r.prompt_tokens for r in good)
    output_tokens = sum(r.output_tokens for r in good)
    itl = summarize([gap for r in good for gap in r.itl_s])
    tpot = [
        (r.e2e_s - r.ttft_s) / (r.output_tokens - 1)
        for r in good
        if r.ttft_s is not None and r.output_tokens > 1
    ]
    return ServeResult(
        kind="serve",
        url=spec.url,
        num_requests=len(records),
        concurrency=spec.concurrency,
        request_rate=None if math.isinf(spec.request_rate) else spec.request_rate,
        completed=len(good),
        failed=len(records) - len(good),
        duration_s=duration_s,
        requests_per_s=len(good) / duration_s,
        output_tok_s=output_tokens / duration_s,
        total_tok_s=(prompt_tokens + output_tokens) / duration_s,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        ttft=summarize([r.ttft_s for r in good if r.ttft_s is not None]),
        tpot=summarize(tpot),
        itl=itl,
        e2e=summarize([r.e2e_s for r in good]),
        itl_p99_over_p50=itl.p99_ms / itl.p50_ms if itl.p50_ms else None,
        merged_tokens=sum(max(0, r.output_tokens - len(r.itl_s) - 1) for r in good if r.chunks),
        bound_s=bound_s,
        fraction_of_bound=bound_s / duration_s if bound_s is not None else None,
        load_before=load_before,
        load_after=load_after,
        errors=tuple(r.error for r in records if r.error)[:MAX_ERRORS_SHOWN],
    )
