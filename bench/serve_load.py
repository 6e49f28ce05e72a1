"""The load generator of `tgserve bench serve`: streaming requests against an OpenAI-compatible
/v1/completions endpoint, at a fixed concurrency or a Poisson request rate.

Contract: `run_load(spec, requests, on_finished)` sends every request once (greedy, `ignore_eos`,
`min_tokens = max_tokens = output_len`, `stream: true` with `stream_options.include_usage`;
prompts are token-id lists, or text when the workload carries text) and returns one
`RequestRecord` per request, in workload order, plus the wall time of the whole run.
- Arrivals: with a finite `request_rate`, inter-arrival gaps are exponential with mean
  1 / rate (a Poisson process), drawn from `random.Random(seed)`; otherwise all at once.
  `concurrency` (if set) caps the requests in flight either way.
- Timing, per request, on the client's monotonic clock: TTFT = send until the first chunk that
  carries a token; ITL = the gaps between successive token chunks (a chunk carrying several
  tokens counts once, as in `vllm bench serve`); end-to-end = send until `[DONE]`. A chunk whose
  only news is a finish reason with no text carries no token. Output tokens come from the usage
  chunk (the number of token chunks when the server sends none); `chunks` counts the token
  chunks, so output tokens - chunks tokens came inside another token's chunk (a server holds
  back the text of a token that ends inside a UTF-8 character, and sends no empty chunk).
- `token_logprobs`: each request asks for `logprobs: 0`, so every token comes in a chunk of its
  own (a chunk that carries logprobs goes out even with empty text) and ITL is per token; a
  chunk that still carries k tokens (the server merged outputs) counts as k gaps of 1/k each.
- A request fails (recorded, never raised) on a non-200 status, a transport error, an error
  payload in the stream or a stream that ends without `[DONE]`.
httpx (a runtime dependency) is imported when the load starts, with an install hint if missing.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.workload import BenchRequest


@dataclass(frozen=True)
class LoadSpec:
    url: str  # the server's base URL, e.g. http://127.0.0.1:8000
    concurrency: int | None = None  # max requests in flight; None: no cap
    request_rate: float = math.inf  # requests per second (Poisson); inf: all at once
    seed: int = 0
    model: str | None = None  # the "model" field; None: left out
    timeout_s: float = 600.0
    api_key: str | None = None
    token_logprobs: bool = False  # logprobs 0: a chunk per token, ITL per token

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"--concurrency must be >= 1, got {self.concurrency}")
        if not self.request_rate > 0:
            raise ValueError(f"--request-rate must be > 0, got {self.request_rate}")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"--url must start with http:// or https://, got {self.url!r}")


@dataclass(frozen=True)
class RequestRecord:
    ok: bool
    prompt_tokens: int
    output_tokens: int
    ttft_s: float | None
    itl_s: tuple[float, ...]
    e2e_s: float
    error: str | None = None
    chunks: int = 0  # chunks that carried tokens


def arrival_gaps(num_requests: int, request_rate: float, seed: int) -> list[float]:
    """Seconds to wait before each request (the first waits 0)."""
    if math.isinf(request_rate):
        return [0.0] * num_requests
    rng = random.Random(seed)
    return [0.0] + [rng.expovariate(request_rate) for _ in range(num_requests - 1)]


def discover_model(url: str, api_key: str | None = None) -> str | None:
    """The first model id the server lists at /v1/models, or None if it lists none."""
    resp = _get(url, "/v1/models", api_key)
    if resp.status_code != 200:
        return None
    models = resp.json().get("data") or []
    return models[0].get("id") if models else None


def discover_vocab_size(url: str, api_key: str | None = None) -> int | None:
    """The prompt vocabulary a tgserve server states at /info (`vocab_size`), or None when the
    server does not say (another server, or still loading)."""
    resp = _get(url, "/info", api_key)
    if resp.status_code != 200:
        return None
    size = resp.json().get("vocab_size")
    return size if isinstance(size, int) and size > 0 else None


def _get(url: str, path: str, api_key: str | None) -> Any:
    try:
        import httpx
    except ImportError as exc:
        raise ValueError("bench serve needs httpx: pip install httpx") from exc
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        return httpx.get(url.rstrip("/") + path, headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        raise ValueError(f"cannot reach the server at {url} ({exc}); is it running?") from exc


def run_load(
    spec: LoadSpec, requests: Sequence[BenchRequest], on_finished: Callable[[int], None]
) -> tuple[list[RequestRecord], float]:
    try:
        import httpx
    except ImportError as exc:
        raise ValueError("bench serve needs httpx: pip install httpx") from exc
    return asyncio.run(_run(httpx, spec, requests, on_finished))


async def _run(
    httpx, spec: LoadSpec, requests: Sequence[BenchRequest], on_finished
) -> tuple[list[RequestRecord], float]:
    cap = spec.concurrency or len(requests)
    semaphore = asyncio.Semaphore(cap)
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
    limits = httpx.Limits(max_connections=cap, max_keepalive_connections=cap)
    finished = 0

    async with httpx.AsyncClient(timeout=spec.timeout_s, limits=limits, headers=headers) as client:

        async def one(request: BenchRequest) -> RequestRecord:
            nonlocal finished
            async with semaphore:
                record = await _stream_one(client, spec, request)
            finished += 1
            on_finished(finished)
            return record

        start = time.perf_counter()
        tasks = []
        for gap, request in zip(
            arrival_gaps(len(requests), spec.request_rate, spec.seed), requests, strict=True
        ):
            if gap:
                await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(one(request)))
        records = await asyncio.gather(*tasks)
        return list(records), time.perf_counter() - start


def _body(spec: LoadSpec, request: BenchRequest) -> dict:
    body = {
        "prompt": request.prompt_text
        if request.prompt_text is not None
        else list(request.prompt_token_ids),
        "max_tokens": request.output_len,
        "min_tokens": request.output_len,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if spec.token_logprobs:
        body["logprobs"] = 0
    if spec.model:
        body["model"] = spec.model
    return body


async def _stream_one(client, spec: LoadSpec, request: BenchRequest) -> RequestRecord:
    prompt_tokens = len(request.prompt_token_ids)
    start = time.perf_counter()
    last = None
    ttft = None
    itl: list[float] = []
    chunks = 0
    usage_tokens = None

    def failed(message: str) -> RequestRecord:
        end = time.perf_counter() - start
        return RequestRecord(False, prompt_tokens, chunks, ttft, tuple(itl), end, message, chunks)

    try:
        async with client.stream(
            "POST", spec.url.rstrip("/") + "/v1/completions", json=_body(spec, request)
        ) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                return failed(f"HTTP {resp.status_code}: {text[:200]}")
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    tokens = usage_tokens if usage_tokens is not None else chunks
                    end = time.perf_counter() - start
                    return RequestRecord(
                        True, prompt_tokens, tokens, ttft, tuple(itl), end, None, chunks
                    )
                data = json.loads(payload)
                if "error" in data:
                    return failed(f"error in stream: {str(data['error'])[:200]}")
                if data.get("usage"):
                    usage_tokens = data["usage"].get("completion_tokens")
                choices = data.get("choices") or []
                choice = choices[0] if choices else {}
                scored = len((choice.get("logprobs") or {}).get("tokens") or ())
                if choice and (choice.get("text") or choice.get("finish_reason") is None or scored):
                    now = time.perf_counter()
                    if ttft is None:
                        ttft = now - start
                    else:
                        k = max(1, scored)
                        itl.extend([(now - last) / k] * k)
                    last = now
                    chunks += 1
        return failed("the stream ended without [DONE]")
    except Exception as exc:  # a failed request is a measurement, not a crash
        return failed(f"{type(exc).__name__}: {exc}"[:200])
