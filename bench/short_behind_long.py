"""`tgserve bench short-behind-long`: the TTFT of a short request sent while long prompts prefill.

Contract: `run_probe(spec)` against a running server: first the short request alone (`runs`
times, one after another: its idle TTFT), then, for each `long_streams` setting (streamed and
not, by default), `runs` times: `num_long` requests of `long_len` random prompt tokens
(max_tokens 1, with that `stream` setting) are sent at once, after `delay_s` the short one
(`short_len` tokens, max_tokens 2, streamed), whose TTFT (send until its first token chunk, the
client's monotonic clock) is recorded; then the long requests are closed (the server aborts
them) and the probe waits until the server is idle. From /metrics it reads the engine step histogram around
each loaded run: the mean step, and the bound of the largest bucket a step fell in (the longest
step is at most that); and the steps that ended while the short request waited (2 when it was
scheduled in the step after it arrived: the one it landed in and its own) with their seconds.
The issue's target: loaded TTFT <= 2 x idle TTFT + one step.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass

from bench.burst import _wait_idle


@dataclass(frozen=True)
class ProbeSpec:
    url: str
    num_long: int = 4
    long_len: int = 8190
    short_len: int = 5
    delay_s: float = 5.0
    runs: int = 3
    seed: int = 0
    model: str | None = None
    long_streams: tuple[bool, ...] = (True, False)  # the long requests' `stream` settings


@dataclass(frozen=True)
class ProbeRun:
    long_streamed: bool
    ttft_s: float
    mean_step_s: float | None
    max_step_bound_s: float | None  # upper bound of the highest bucket a step fell in
    # Steps that ended while the short request waited for its first token (sent .. answered):
    # the step it landed in and its own when it is scheduled at once, and their total seconds.
    waited_steps: int = 0
    waited_s: float = 0.0


def _prompt(rng: random.Random, n: int, vocab: int = 1000) -> list[int]:
    """Random ids in [100, 1000), below the served vocabulary (`vocab`) where it is smaller."""
    high = min(1000, vocab)
    return [rng.randrange(min(100, high // 2), high) for _ in range(n)]


async def _vocab_size(client, url: str) -> int:
    """The served vocabulary (/info's `vocab_size`), 1000 when the server does not state it."""
    response = await client.get(url + "/info")
    size = response.json().get("vocab_size") if response.status_code == 200 else None
    return size if isinstance(size, int) and size > 1 else 1000


async def _ttft(client, spec: ProbeSpec, prompt: list[int], max_tokens: int) -> float:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True}
    if spec.model:
        body["model"] = spec.model
    start = time.perf_counter()
    async with client.stream("POST", spec.url + "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
        async for line in response.aiter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                choices = json.loads(line[5:]).get("choices") or []
                if choices and choices[0].get("text"):
                    return time.perf_counter() - start
    raise RuntimeError("the short request produced no token")


async def _long(client, spec: ProbeSpec, prompt: list[int], streamed: bool) -> None:
    """One long request (max_tokens 1) with that `stream` setting, read to its end."""
    if streamed:
        await _ttft(client, spec, prompt, 1)
        return
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0.0, "stream": False}
    if spec.model:
        body["model"] = spec.model
    response = await client.post(spec.url + "/v1/completions", json=body)
    if response.status_code != 200:
        raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]!r}")


async def _steps(client, url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = (await client.get(url + "/metrics")).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "tgserve_engine_step_seconds":
            for s in family.samples:
                key = s.name if "le" not in s.labels else f"le={s.labels['le']}"
                out[key] = s.value
    return out


def _step_figures(before: dict[str, float], after: dict[str, float]) -> tuple[float | None, ...]:
    count = after.get("tgserve_engine_step_seconds_count", 0) - before.get(
        "tgserve_engine_step_seconds_count", 0
    )
    if count <= 0:
        return None, None
    total = after["tgserve_engine_step_seconds_sum"] - before["tgserve_engine_step_seconds_sum"]
    bounds = sorted(
        (float(k[3:]), after[k] - before.get(k, 0)) for k in after if k.startswith("le=")
    )
    below = [b for b, c in bounds if c >= count]  # cumulative: every step is at or below b
    return total / count, (below[0] if below else None)


async def _loaded(client, spec: ProbeSpec, run: int, long_streamed: bool, vocab: int) -> ProbeRun:
    rng = random.Random(spec.seed * 7919 + run * 2 + long_streamed)
    longs = [_prompt(rng, spec.long_len, vocab) for _ in range(spec.num_long)]
    short = _prompt(rng, spec.short_len, vocab)
    await _wait_idle(client, spec.url)
    before = await _steps(client, spec.url)
    tasks = [asyncio.create_task(_long(client, spec, p, long_streamed)) for p in longs]
    await asyncio.sleep(spec.delay_s)
    sent = await _steps(client, spec.url)
    ttft = await _ttft(client, spec, short, 2)
    after = await _steps(client, spec.url)
    for task in tasks:  # closing the connections aborts the long prompts on the server
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    mean, bound = _step_figures(before, after)
    count, total = ("tgserve_engine_step_seconds_" + k for k in ("count", "sum"))
    waited = int(after.get(count, 0) - sent.get(count, 0))
    waited_s = after.get(total, 0) - sent.get(total, 0)
    return ProbeRun(long_streamed, ttft, mean, bound, waited, waited_s)


async def _probe(spec: ProbeSpec) -> tuple[list[float], list[ProbeRun]]:
    import httpx

    async with httpx.AsyncClient(timeout=3600, limits=httpx.Limits(max_connections=16)) as client:
        await _wait_idle(client, spec.url)
        vocab = await _vocab_size(client, spec.url)
        rng = random.Random(spec.seed)
        idle = [
            await _ttft(client, spec, _prompt(rng, spec.short_len, vocab), 2)
            for _ in range(spec.runs)
        ]
        loaded = [
            await _loaded(client, spec, run, streamed, vocab)
            for streamed in spec.long_streams
            for run in range(spec.runs)
        ]
    return idle, loaded


def run_probe(spec: ProbeSpec) -> tuple[list[float], list[ProbeRun]]:
    return asyncio.run(_probe(spec))


def render(spec: ProbeSpec, idle: list[float], loaded: list[ProbeRun]) -> str:
    idle_ms = statistics.median(idle) * 1000
    lines = [
        f"short ({spec.short_len} tokens) behind {spec.num_long} x {spec.long_len}-token prompts "
        f"(sent {spec.delay_s:g} s after them) against {spec.url}",
        f"idle TTFT: median {idle_ms:.1f} ms ({', '.join(f'{t * 1000:.1f}' for t in idle)})",
    ]
    for streamed in spec.long_streams:
        runs = [r for r in loaded if r.long_streamed == streamed]
        lines.append(f"long prompts {'streamed' if streamed else 'not streamed'}:")
        for i, r in enumerate(runs):
            step = "no step seen"
            if r.mean_step_s is not None:
                bound = f"<= {r.max_step_bound_s * 1000:.0f} ms" if r.max_step_bound_s else "> 10 s"
                step = f"steps meanwhile: mean {r.mean_step_s * 1000:.0f} ms, longest {bound}"
            waited = f"{r.waited_steps} steps ended meanwhile ({r.waited_s * 1000:.0f} ms in all)"
            lines.append(f"  run {i + 1}: TTFT {r.ttft_s * 1000:.1f} ms; {waited}; {step}")
        med = statistics.median(r.ttft_s for r in runs) * 1000
        lines.append(f"  loaded TTFT median {med:.1f} ms = idle + {med - idle_ms:.1f} ms")
    return "\n".join(lines)
