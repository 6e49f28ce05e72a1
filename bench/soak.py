"""The soak load of `tgserve bench soak`: a fixed request rate for a duration, some clients leaving
mid-stream, while the server process's memory and open file descriptors are sampled.

Contract: `run_soak(spec) -> SoakRun` (httpx + asyncio; every loop is bounded in count and time):
- Arrivals: one streaming /v1/completions request every 1 / `request_rate` seconds for
  `duration_s` (greedy, `ignore_eos`, random token-id prompts below `vocab_size`), at most
  `max_in_flight` at once (an arrival finding the cap full is counted as `skipped`, not queued,
  so the rate never drifts). A `disconnect_fraction` of them (drawn from `seed`) close their
  stream after a random number of chunks. Each request is bounded by `timeout_s`.
- Outcomes (`RequestOutcome`): status, finish time, TTFT and end-to-end latency, whether it left
  on purpose, and an error for a 5xx, a transport failure or a stream without `[DONE]`.
- Samples (`Sample`), every `sample_interval_s`, before, during and after the load (until the
  server is idle again or `drain_s` passes): RSS and open FDs of the server process, from
  `process_resident_memory_bytes` / `process_open_fds` in /metrics (any URL), or from
  /proc/`pid` when a pid is given; and the tgserve_ running / waiting / KV-blocks-used gauges.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

_GAUGES = {
    "process_resident_memory_bytes": "rss_bytes",
    "process_open_fds": "open_fds",
    "tgserve_num_requests_running": "running",
    "tgserve_num_requests_waiting": "waiting",
    "tgserve_kv_cache_blocks_used": "kv_blocks_used",
}


@dataclass(frozen=True)
class SoakSpec:
    url: str = "http://127.0.0.1:8000"
    duration_s: float = 600.0
    request_rate: float = 4.0  # requests per second, evenly spaced
    disconnect_fraction: float = 0.2
    prompt_len: int = 32
    max_tokens: int = 64
    vocab_size: int = 1000
    max_in_flight: int = 256
    timeout_s: float = 120.0
    sample_interval_s: float = 2.0
    drain_s: float = 60.0  # after the load: how long the server gets to be idle again
    seed: int = 0
    pid: int | None = None  # read RSS / FDs from /proc/<pid> instead of /metrics
    model: str | None = None
    api_key: str | None = None

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"--url must start with http:// or https://, got {self.url!r}")
        if not (self.duration_s > 0 and math.isfinite(self.duration_s)):
            raise ValueError(f"--duration must be a positive number of seconds: {self.duration_s}")
        if not (0 < self.request_rate < 10_000):
            raise ValueError(f"--request-rate must be in (0, 10000), got {self.request_rate}")
        if not 0 <= self.disconnect_fraction <= 1:
            raise ValueError(f"--disconnect-fraction must be in [0, 1]: {self.disconnect_fraction}")
        if min(self.prompt_len, self.max_tokens, self.max_in_flight, self.vocab_size) < 1:
            raise ValueError("--prompt-len, --max-tokens, --max-in-flight, --vocab-size: >= 1")
        if not self.sample_interval_s > 0:
            raise ValueError(f"--sample-interval must be > 0, got {self.sample_interval_s}")


@dataclass
class RequestOutcome:
    start_s: float  # since the load began
    leaves: bool  # this client was drawn to disconnect mid-stream
    end_s: float = 0.0
    status: int | None = None
    ttft_s: float | None = None
    error: str | None = None
    left: bool = False  # it did disconnect before the end

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def e2e_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class Sample:
    t_s: float  # since the load began (negative: before it)
    phase: str  # "before" | "load" | "drain"
    rss_bytes: float | None = None
    open_fds: float | None = None
    running: float | None = None
    waiting: float | None = None
    kv_blocks_used: float | None = None


@dataclass
class SoakRun:
    spec: SoakSpec
    outcomes: list[RequestOutcome] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    skipped: int = 0
    load_s: float = 0.0


def run_soak(spec: SoakSpec) -> SoakRun:
    return asyncio.run(_soak(spec))


async def _soak(spec: SoakSpec) -> SoakRun:
    import httpx

    run = SoakRun(spec)
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
    # no keep-alive: every request's connection closes, so idle server FDs stay comparable
    limits = httpx.Limits(max_connections=spec.max_in_flight + 1, max_keepalive_connections=0)
    timeout = httpx.Timeout(spec.timeout_s, connect=10.0)
    async with (
        httpx.AsyncClient(
            base_url=spec.url, headers=headers, limits=limits, timeout=timeout
        ) as load,
        httpx.AsyncClient(base_url=spec.url, headers=headers, timeout=10.0) as probe,
    ):
        t0 = time.monotonic()
        run.samples.append(await _sample(probe, spec, -0.0, "before"))
        stop = asyncio.Event()
        sampler = asyncio.create_task(_sample_until(probe, spec, run, t0, stop))
        tasks = await _arrivals(load, spec, run, t0)
        if tasks:  # the last arrivals get their own timeout to finish; stragglers are cancelled
            _, pending = await asyncio.wait(tasks, timeout=spec.timeout_s + 5)
            for task in pending:
                task.cancel()
        run.load_s = time.monotonic() - t0
        stop.set()
        await sampler
        await _drain(probe, spec, run, t0)
    return run


async def _arrivals(load: Any, spec: SoakSpec, run: SoakRun, t0: float) -> list[asyncio.Task]:
    rng = random.Random(spec.seed)
    count = math.floor(spec.duration_s * spec.request_rate)
    tasks: list[asyncio.Task] = []
    in_flight: set[asyncio.Task] = set()
    for i in range(count):
        delay = t0 + i / spec.request_rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(in_flight) >= spec.max_in_flight:
            run.skipped += 1
            continue
        leaves = rng.random() < spec.disconnect_fraction
        outcome = RequestOutcome(time.monotonic() - t0, leaves)
        run.outcomes.append(outcome)
        prompt = [rng.randrange(spec.vocab_size) for _ in range(spec.prompt_len)]
        leave_after = rng.randint(1, max(1, spec.max_tokens // 2)) if leaves else None
        task = asyncio.create_task(_one(load, spec, prompt, leave_after, outcome, t0))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
        tasks.append(task)
    return tasks


async def _one(
    load: Any,
    spec: SoakSpec,
    prompt: list[int],
    leave_after: int | None,
    out: RequestOutcome,
    t0: float,
) -> None:
    body: dict[str, Any] = {
        "prompt": prompt,
        "max_tokens": spec.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
    }
    if spec.model:
        body["model"] = spec.model
    chunks = 0
    try:
        async with load.stream("POST", "/v1/completions", json=body) as response:
            out.status = response.status_code
            if response.status_code != 200:
                await response.aread()
                return
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    return
                chunks += 1
                if out.ttft_s is None:
                    out.ttft_s = time.monotonic() - t0 - out.start_s
                if "error" in json.loads(payload):
                    out.error = "an error event in the stream"
                    return
                if leave_after is not None and chunks >= leave_after:
                    out.left = True
                    return  # leaving the block closes the connection mid-stream
            out.error = "the stream ended without [DONE]"
    except Exception as exc:  # a failed request is a finding, not a crash
        out.error = f"{type(exc).__name__}: {exc}"[:200]
    finally:
        out.end_s = time.monotonic() - t0


async def _sample_until(probe: Any, spec: SoakSpec, run: SoakRun, t0: float, stop: asyncio.Event):
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=spec.sample_interval_s)
        except TimeoutError:
            run.samples.append(await _sample(probe, spec, time.monotonic() - t0, "load"))


async def _drain(probe: Any, spec: SoakSpec, run: SoakRun, t0: float) -> None:
    """Samples until the server is idle (twice in a row) or `drain_s` passes."""
    deadline, idle = time.monotonic() + spec.drain_s, 0
    while time.monotonic() < deadline and idle < 2:
        await asyncio.sleep(min(spec.sample_interval_s, 1.0))
        sample = await _sample(probe, spec, time.monotonic() - t0, "drain")
        run.samples.append(sample)
        idle = idle + 1 if sample.running == 0 and sample.waiting == 0 else 0


async def _sample(probe: Any, spec: SoakSpec, t_s: float, phase: str) -> Sample:
    values: dict[str, float] = {}
    try:
        response = await probe.get("/metrics")
        if response.status_code == 200:
            for family in text_string_to_metric_families(response.text):
                for s in family.samples:
                    if s.name in _GAUGES and not s.labels:
                        values[_GAUGES[s.name]] = s.value
    except Exception:  # a missed sample is a gap, not a failure
        pass
    if spec.pid is not None:
        values.update(_proc_sample(spec.pid))
    return Sample(t_s, phase, **values)


def _proc_sample(pid: int) -> dict[str, float]:
    """RSS and open FDs of `pid` from /proc (Linux); empty when it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            pages = int(f.read().split()[1])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError, IndexError):
        return {}
    return {"rss_bytes": float(pages * os.sysconf("SC_PAGE_SIZE")), "open_fds": float(fds)}
