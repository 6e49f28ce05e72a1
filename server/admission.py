"""Admission: turning prompts into engine streams, or into the HTTP error that says why not.

Contract: `open_streams(...)` admits one engine request per prompt, all or none. Admission errors
become ApiErrors before any response byte: 400 invalid (the engine's ValueError, validated once
where the request enters the engine), 429 + Retry-After overloaded, 503 unavailable. Each
returned stream records its timings into the metrics and aborts its request when closed early.
A request's deadline is the smaller of its own `timeout` and the server's default. Fairness
(server/fair_share.py): a `priority` below 0 from an untrusted client is raised to 0, and a
client holding requests is refused (429) the last places kept for clients holding none.
A request is refused (429 / 503) before any validation when the engine is full now (it may
have filled since the guard let it in), so a refusal never pays for compiling a grammar. Every
prompt is validated before any is admitted; one with a structured output is validated
(its grammar compiled) on `workers` (server/worker_pool.py), never on the event loop, within
`compile_timeout` seconds: past it a 400 naming the field (the grammar is too costly), or a
429 + Retry-After when the workers were too busy to start on it.
`early_refusal(engine)`: the same 429 / 503, for the guard to answer before any body is read.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from functools import partial

from engine import (
    AsyncEngine,
    EngineUnavailable,
    InvalidRequest,
    Overloaded,
    Request,
    RequestOutput,
    RequestStream,
    SamplingParams,
)
from server import tracing
from server.engine_params import to_api_error
from server.errors import ApiError
from server.fair_share import CLIENT, FairShare, capped_priority
from server.metrics import RequestTimer, ServerMetrics
from server.worker_pool import PoolBusy, WorkerPool, WorkTimedOut


async def open_streams(
    engine: AsyncEngine,
    metrics: ServerMetrics,
    prompts: list[list[int]],
    params: list[SamplingParams],
    timeout: float | None,
    default_timeout: float | None,
    api_fields: dict[str, str] | None = None,
    workers: WorkerPool | None = None,
    compile_timeout: float = 10.0,
    request_id: str | None = None,
    fair: FairShare | None = None,
) -> list[AsyncIterator[RequestOutput]]:
    """Admits one engine request per prompt (all or none); raises ApiError before any byte.
    `api_fields`: engine field names -> the API's, for the `param` of a 400. `workers`: where
    grammars compile (None: on the event loop, for callers without a server). `request_id`:
    the engine's id for the request (`<id>-<i>` per prompt when there are several; None: fresh
    ones). `fair`: the per-client share (server/fair_share.py; None: none)."""
    if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
        raise ApiError(
            400, f"timeout must be a positive number of seconds, got {timeout}", param="timeout"
        )
    timeouts = [t for t in (timeout, default_timeout) if t is not None]
    deadline = time.monotonic() + min(timeouts) if timeouts else None
    refusal = early_refusal(engine)  # full since the guard let it in: refused before any work
    if refusal is not None:
        raise refusal
    params = [_capped(sampling) for sampling in params]
    ids = engine_ids(request_id, len(prompts))
    requests = [
        await _validate(engine, rid, prompt, sampling, api_fields, workers, compile_timeout)
        for rid, prompt, sampling in zip(ids, prompts, params, strict=True)
    ]
    client = CLIENT.get()
    if fair is not None:  # no await from here to the admissions it decides on
        fair.check(client, engine.num_pending(), len(requests))
    trace = tracing.current()
    if trace is not None:
        trace.admitted(ids, prompts, params[0])
    streams: list[RequestStream] = []
    try:
        for request in requests:
            streams.append(_admit(engine, request, deadline))
        for stream in streams:
            await _admitted(stream, api_fields)
    except BaseException:
        for stream in streams:
            stream.close()
        raise
    held = [fair.hold(client, 1) if fair is not None else _nothing for _ in streams]
    return [
        _tracked(s, metrics.timer(p.adapter), release, trace)  # labelled by adapter, if any
        for s, release, p in zip(streams, held, params, strict=True)
    ]


def _nothing() -> None:
    pass


def _capped(sampling: SamplingParams) -> SamplingParams:
    priority = capped_priority(sampling.priority)
    return sampling if priority == sampling.priority else replace(sampling, priority=priority)


def engine_ids(request_id: str | None, count: int) -> list[str]:
    """The engine's ids of a request's `count` prompts: the request's id itself for one."""
    base = request_id or uuid.uuid4().hex
    return [base] if count == 1 else [f"{base}-{i}" for i in range(count)]


def early_refusal(engine: AsyncEngine) -> ApiError | None:
    """The 429 (or 503) `open_streams` would answer now, or None. Nothing is reserved: a
    request let through is decided by `open_streams`; one refused here met the in-flight limit
    at that instant, as `generate()` would have seen it."""
    refusal = engine.refusal()
    return None if refusal is None else _refused(refusal)


def _refused(exc: Overloaded | EngineUnavailable) -> ApiError:
    if isinstance(exc, Overloaded):
        return _overloaded(exc)
    return ApiError(503, str(exc), code="unavailable", headers={"Retry-After": "5"})


async def _validate(
    engine: AsyncEngine,
    request_id: str,
    prompt: list[int],
    sampling: SamplingParams,
    api_fields: dict[str, str] | None,
    workers: WorkerPool | None,
    compile_timeout: float,
) -> Request:
    build = partial(engine.new_request, request_id, prompt, sampling)
    try:
        if workers is None or sampling.structured_output is None:
            return build()  # cheap: checks of the prompt and the parameters
        started = time.time()
        built = await workers.run(build, compile_timeout)
        trace = tracing.current()
        if trace is not None:  # the grammar compiled (or came from the cache) meanwhile
            seconds = {"tgserve.grammar.seconds": time.time() - started}
            trace.events.append(("grammar_compile", started, seconds))
        return built
    except ValueError as exc:
        raise to_api_error(exc, api_fields) from None
    except WorkTimedOut as exc:
        if not exc.started:
            raise _busy() from None
        message = (
            f"structured_output: the constraint did not compile within {compile_timeout:g}s; "
            "use fewer alternatives or a smaller schema"
        )
        raise to_api_error(InvalidRequest("structured_output", message), api_fields) from None
    except PoolBusy:
        raise _busy() from None


def _busy() -> ApiError:
    return ApiError(
        429,
        "the server is busy compiling other requests' grammars; retry later",
        code="overloaded",
        headers={"Retry-After": "1"},
    )


def _admit(engine: AsyncEngine, request: Request, deadline: float | None) -> RequestStream:
    try:
        return engine.submit(request, deadline)
    except (Overloaded, EngineUnavailable) as exc:
        raise _refused(exc) from None


async def _admitted(stream: RequestStream, api_fields: dict[str, str] | None) -> None:
    try:
        await stream.admitted()
    except Overloaded as exc:
        raise _overloaded(exc) from None
    except ValueError as exc:
        raise to_api_error(exc, api_fields) from None


def _overloaded(exc: Overloaded) -> ApiError:
    retry = str(max(1, math.ceil(exc.retry_after)))
    return ApiError(
        429,
        f"the server is overloaded ({exc}); retry later",
        code="overloaded",
        headers={"Retry-After": retry},
    )


async def _tracked(
    stream: RequestStream,
    timer: RequestTimer,
    release: Callable[[], None],
    trace: tracing.RequestTrace | None,
) -> AsyncIterator[RequestOutput]:
    try:
        async for output in stream:
            timer.observe(output)
            if trace is not None:
                trace.observe(output)
            yield output
    finally:
        stream.close()
        timer.close()
        release()
