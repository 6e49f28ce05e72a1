"""`tgserve bench burst`: N simultaneous requests against a running, idle server.

Contract: `run_burst(spec)` sends `num_requests` completions at once (every other one streaming;
random token-id prompts, greedy, `max_tokens` tokens with EOS ignored, so none finishes during
the burst) as raw HTTP/1.1 over connections opened beforehand (the client's own work per
request is a socket write, not an HTTP library's milliseconds, which 40 requests add up into
the last answer's latency), reads every response to its end, and returns a `BurstResult` per
run: the status codes, the latency of each 429 (send until the response headers, the client's
monotonic clock), the Retry-After values, whether every 429 came as JSON (no stream began)
and, given the server's in-flight limit (`--in-flight`: its max_num_seqs +
max_queued_requests), whether the arithmetic holds: exactly N - limit answers 429. Runs wait
for the server to drain in between (tgserve_num_requests_running and _waiting at 0 in
/metrics).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from bench.serve_metrics import percentile


@dataclass(frozen=True)
class BurstSpec:
    url: str
    num_requests: int
    in_flight: int | None  # the server's max_num_seqs + max_queued_requests, if known
    prompt_len: int = 16
    max_tokens: int = 64
    runs: int = 3
    seed: int = 0
    model: str | None = None
    timeout_s: float = 300.0


@dataclass(frozen=True)
class BurstResult:
    statuses: tuple[int, ...]
    rejected_latency_ms: tuple[float, ...]  # per 429: send until headers
    retry_after: tuple[int, ...]
    rejected_as_json: bool

    @property
    def num_rejected(self) -> int:
        return self.statuses.count(429)


def _request_bytes(spec: BurstSpec, i: int, run: int) -> bytes:
    rng = random.Random(spec.seed * 1_000_003 + run * 10_007 + i)
    body = {
        "prompt": [rng.randrange(100, 1000) for _ in range(spec.prompt_len)],
        "max_tokens": spec.max_tokens,
        "min_tokens": spec.max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": i % 2 == 0,
    }
    if spec.model:
        body["model"] = spec.model
    url = urlsplit(spec.url)
    payload = json.dumps(body).encode()
    head = (
        f"POST {url.path.rstrip('/')}/v1/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + payload


async def _connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    return await asyncio.open_connection(parts.hostname, port, ssl=True if tls else None)


async def _answer(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, start: float
) -> tuple[int, float, str, str]:
    """Status, seconds until the end of the headers, Retry-After, Content-Type; the body is
    read to the end (the request asked the server to close the connection after it)."""
    head = await reader.readuntil(b"\r\n\r\n")
    headers_s = time.perf_counter() - start
    await reader.read()
    writer.close()
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    status = int(status_line.split()[1])
    return status, headers_s, headers.get("retry-after", ""), headers.get("content-type", "")


async def _burst(spec: BurstSpec, run: int) -> BurstResult:
    import httpx

    async with httpx.AsyncClient(timeout=spec.timeout_s) as client:
        await _wait_idle(client, spec.url)
    # Raw HTTP/1.1 over connections opened beforehand, every request encoded before the first
    # is sent, written in one tight loop: the client's own work per request is a socket write
    # and a header parse, so the latencies are the server's (an HTTP client library spends
    # milliseconds of CPU per request, which a burst of 40 would add up into the last answer).
    requests = [_request_bytes(spec, i, run) for i in range(spec.num_requests)]
    conns = await asyncio.gather(*(_connect(spec.url) for _ in requests))
    answers = []
    for (reader, writer), request in zip(conns, requests, strict=True):
        start = time.perf_counter()
        writer.write(request)
        answers.append(_answer(reader, writer, start))
    answers = await asyncio.wait_for(asyncio.gather(*answers), spec.timeout_s)
    rejected = [a for a in answers if a[0] == 429]
    return BurstResult(
        statuses=tuple(a[0] for a in answers),
        rejected_latency_ms=tuple(1000 * a[1] for a in rejected),
        retry_after=tuple(int(a[2]) for a in rejected if a[2].isdigit()),
        rejected_as_json=all(a[3].startswith("application/json") for a in rejected),
    )


async def _wait_idle(client, url: str, timeout_s: float = 300.0) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        text = (await client.get(url + "/metrics")).text
        busy = sum(
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name in ("tgserve_num_requests_running", "tgserve_num_requests_waiting")
        )
        if busy == 0:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} did not become idle within {timeout_s:.0f} s")


def run_burst(spec: BurstSpec) -> list[BurstResult]:
    return [asyncio.run(_burst(spec, run)) for run in range(spec.runs)]


def render(spec: BurstSpec, results: list[BurstResult]) -> str:
    lines = [f"burst of {spec.num_requests} simultaneous requests against {spec.url}"]
    for i, r in enumerate(results):
        lat = sorted(r.rejected_latency_ms)
        figures = (
            f"429 latency p50 {percentile(lat, 50):.1f} ms, p99 {percentile(lat, 99):.1f} ms, "
            f"max {lat[-1]:.1f} ms; Retry-After {min(r.retry_after)}-{max(r.retry_after)} s"
            if lat
            else "no 429"
        )
        check = ""
        if spec.in_flight is not None:
            want = max(0, spec.num_requests - spec.in_flight)
            check = f" (expected {want}: {'exact' if r.num_rejected == want else 'WRONG'})"
        others = sorted(set(r.statuses) - {200, 429})
        lines.append(
            f"run {i + 1}: {r.statuses.count(200)} x 200, {r.num_rejected} x 429{check}"
            f"{', other: ' + str(others) if others else ''}; {figures}; "
            f"429 bodies JSON: {r.rejected_as_json}"
        )
    all_lat = sorted(x for r in results for x in r.rejected_latency_ms)
    if all_lat:
        lines.append(
            f"all runs: 429 latency p50 {percentile(all_lat, 50):.1f} ms, "
            f"p99 {percentile(all_lat, 99):.1f} ms over {len(all_lat)} answers"
        )
    return "\n".join(lines)
