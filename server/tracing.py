"""OpenTelemetry traces of generation requests (`--otlp-traces-endpoint`, off by default).

Contract: `tracer_provider(endpoint, exporter)` builds the SDK's provider, exporting over
OTLP/HTTP to `endpoint` (or to `exporter`, as tests give an in-memory one) in batches; None when
both are None, and then nothing here is installed or imported (opentelemetry is the optional
`otel` extra). `TracingMiddleware` (pure ASGI, inside the request-id middleware) traces every
POST to a generation route (`OPERATIONS`), refusals included: while the request is handled,
`current()` is its `RequestTrace`, which the server's pieces feed as data (the model name from
ServerState.model_name, the parameters, prompt sizes, engine ids and grammar compile time from
server/admission.py, each engine output's `RequestMetrics`); when the response's last byte is
sent the middleware writes one SERVER span from it, a child of the client's W3C `traceparent`
when it sent one: named "<operation> <model>", with GenAI semantic-convention attributes
(gen_ai.operation.name, gen_ai.request.model / max_tokens / temperature / top_p / top_k / seed /
choice.count, gen_ai.response.id / model / finish_reasons, gen_ai.usage.input_tokens /
output_tokens), the HTTP status (an error status and `error.type` from 400 on), `tgserve.
request_id` (the X-Request-Id echoed), events (queued, scheduled, prefill_chunk per chunk,
recompute_after_preemption, grammar_compile, first_token, finish) and, per engine request,
child spans "queue", "prefill" and "decode" that show where its time went. The engine never
imports opentelemetry: its timings arrive as data (engine StepEvent, RequestMetrics).
"""

from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine import RequestMetrics, RequestOutput, SamplingParams
from server.request_id import request_id

OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/messages": "chat",
    "/v1/responses": "chat",
    "/v1/completions": "text_completion",
    "/generate": "text_completion",
    "/generate_stream": "text_completion",
    "/": "text_completion",
}
_CURRENT: contextvars.ContextVar[RequestTrace | None] = contextvars.ContextVar(
    "request_trace", default=None
)


@dataclass
class RequestTrace:
    """What one traced request's span will say, gathered while it is handled."""

    start: float  # time.time() at arrival
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, float, dict[str, Any]]] = field(default_factory=list)
    metrics: dict[str, RequestMetrics] = field(default_factory=dict)  # engine id -> latest
    output_tokens: dict[tuple[str, int], int] = field(default_factory=dict)
    finish_reasons: dict[tuple[str, int], str] = field(default_factory=dict)

    def admitted(self, ids: list[str], prompts: list[list[int]], params: SamplingParams) -> None:
        self.attributes["gen_ai.response.id"] = (
            ids[0] if len(ids) == 1 else ids[0].rsplit("-", 1)[0]
        )
        self.attributes["gen_ai.usage.input_tokens"] = sum(len(p) for p in prompts)
        asked = {
            "gen_ai.request.max_tokens": params.max_tokens,
            "gen_ai.request.temperature": params.temperature,
            "gen_ai.request.top_p": params.top_p,
            "gen_ai.request.top_k": params.top_k if params.top_k > 0 else None,
            "gen_ai.request.seed": params.seed,
            "gen_ai.request.choice.count": params.n,
        }
        self.attributes.update({k: v for k, v in asked.items() if v is not None})

    def observe(self, output: RequestOutput) -> None:
        if output.metrics is not None:
            self.metrics[output.request_id] = output.metrics
        for out in output.outputs:
            self.output_tokens[(output.request_id, out.index)] = out.num_tokens
            if out.finish_reason is not None:
                self.finish_reasons[(output.request_id, out.index)] = out.finish_reason


def current() -> RequestTrace | None:
    """The trace of the request being handled, or None (tracing off, or not a traced route)."""
    return _CURRENT.get()


def tracer_provider(endpoint: str | None, exporter: Any = None) -> Any:
    if endpoint is None and exporter is None:
        return None
    if exporter is None and not endpoint.startswith(("http://", "https://")):
        raise ValueError(
            f"--otlp-traces-endpoint must be an http(s) URL such as "
            f"http://collector:4318/v1/traces (OTLP over HTTP), got {endpoint!r}"
        )
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise ValueError(
            "--otlp-traces-endpoint needs OpenTelemetry: pip install 'tgserve[otel]'"
        ) from None
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=endpoint)
    from server import __version__

    resource = Resource.create({"service.name": "tgserve", "service.version": __version__})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


class TracingMiddleware:
    def __init__(self, app: ASGIApp, provider: Any) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.app = app
        self.tracer = provider.get_tracer("tgserve")
        self.propagator = TraceContextTextMapPropagator()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        operation = OPERATIONS.get(scope["path"]) if scope["type"] == "http" else None
        if operation is None or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        trace = RequestTrace(time.time())
        status = 500

        async def send_traced(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        token = _CURRENT.set(trace)
        try:
            await self.app(scope, receive, send_traced)
        finally:
            _CURRENT.reset(token)
            self._write(scope, operation, trace, status)

    def _write(self, scope: Scope, operation: str, trace: RequestTrace, status: int) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        model = trace.attributes.get("gen_ai.request.model")
        attributes = {
            "gen_ai.operation.name": operation,
            "http.request.method": scope["method"],
            "url.path": scope["path"],
            "http.response.status_code": status,
            "tgserve.request_id": request_id(Request(scope)).echo,
            **trace.attributes,
        }
        if model is not None:
            attributes["gen_ai.response.model"] = model
        if trace.metrics:
            attributes["gen_ai.usage.output_tokens"] = sum(trace.output_tokens.values())
            attributes["gen_ai.response.finish_reasons"] = sorted(
                set(trace.finish_reasons.values())
            )
        span = self.tracer.start_span(
            f"{operation} {model}" if model else operation,
            context=self.propagator.extract(headers),
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=_ns(trace.start),
        )
        events = list(trace.events)
        for engine_id, metrics in trace.metrics.items():
            events += _engine_events(engine_id, metrics, len(trace.metrics) > 1)
            _phase_spans(self.tracer, set_span_in_context(span), engine_id, metrics)
        for name, at, event_attributes in sorted(events, key=lambda e: e[1]):
            span.add_event(name, event_attributes, timestamp=_ns(at))
        if status >= 400:
            span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
            span.set_attribute("error.type", str(status))
        span.end(end_time=_ns(time.time()))


def _engine_events(
    engine_id: str, metrics: RequestMetrics, several: bool
) -> list[tuple[str, float, dict[str, Any]]]:
    """One engine request's timings as span events (the engine id named when there are several)."""
    tag = {"tgserve.engine_request_id": engine_id} if several else {}
    found = [("queued", metrics.arrival_time, dict(tag))]
    if metrics.first_scheduled_time is not None:
        cached = {"tgserve.prefix_cache.hit_tokens": metrics.num_cached_prompt_tokens}
        found.append(("scheduled", metrics.first_scheduled_time, {**tag, **cached}))
    for step in metrics.events:
        extra = {"tgserve.prompt.start": step.start}
        if step.name == "prefill_chunk":
            extra["tgserve.prompt.tokens"] = step.tokens
        found.append((step.name, step.time, {**tag, **extra}))
    if metrics.first_token_time is not None:
        found.append(("first_token", metrics.first_token_time, dict(tag)))
    if metrics.finished_time is not None:
        found.append(("finish", metrics.finished_time, dict(tag)))
    return found


def _phase_spans(tracer: Any, parent: Any, engine_id: str, metrics: RequestMetrics) -> None:
    """Child spans queue (arrival -> first scheduled), prefill (-> first token), decode (-> end)."""
    marks = [
        ("queue", metrics.arrival_time, metrics.first_scheduled_time),
        ("prefill", metrics.first_scheduled_time, metrics.first_token_time),
        ("decode", metrics.first_token_time, metrics.finished_time),
    ]
    for name, start, end in marks:
        if start is not None and end is not None:
            child = tracer.start_span(
                name,
                context=parent,
                attributes={"tgserve.engine_request_id": engine_id},
                start_time=_ns(start),
            )
            child.end(end_time=_ns(end))


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)
