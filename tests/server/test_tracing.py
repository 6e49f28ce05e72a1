"""OpenTelemetry traces: the spans a streamed and a refused request leave in the SDK's in-memory
exporter, on the tiny real model (its engine chunks a prompt, so prefill chunks show).

Oracles: what the client itself sent and got (its traceparent, its X-Request-Id, the ids of its
chunks, the usage chunk's token counts, its finish reason, the status of the refusal), the step
budget given to the engine (the chunk sizes it allows), and the time order the events must have.
"""

from __future__ import annotations

import json

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from engine import Engine, EngineConfig
from server.tracing import TracingMiddleware
from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
BUDGET = 16  # tokens per engine step: a longer prompt is prefilled in chunks of at most this
PROMPT = "Serving language models means batching requests and caching keys and values."


@pytest.fixture(scope="module")
def traced(tiny_model_folder):
    exporter = InMemorySpanExporter()
    config = EngineConfig(
        dtype="float32",
        kv_cache_memory_bytes=4_000_000,
        block_size=4,
        max_num_seqs=4,
        max_num_batched_tokens=BUDGET,
        target_itl_ms=None,
    )
    factory = lambda: Engine.from_model(str(tiny_model_folder), config)  # noqa: E731
    got = {}
    with LiveServer(factory, span_exporter=exporter) as live:
        body = {
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 5,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        headers = {"X-Request-Id": "trace-me", "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
        url = live.url + "/v1/chat/completions"
        with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as response:
            got["chunks"] = [
                json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")
            ]
        refused = {"prompt": "x", "max_tokens": -1}
        got["refused"] = httpx.post(
            live.url + "/v1/completions", json=refused, headers={"X-Request-Id": "refused-1"}
        )
        httpx.get(live.url + "/v1/models")  # not a generation route: no span
    spans = exporter.get_finished_spans()  # the server's shutdown flushed the batch
    return spans, got


def _server_span(spans, request_id):
    (span,) = [
        s
        for s in spans
        if s.kind == SpanKind.SERVER and s.attributes["tgserve.request_id"] == request_id
    ]
    return span


def test_a_streamed_request_has_one_span_under_the_clients_trace(traced):
    spans, got = traced
    span = _server_span(spans, "trace-me")
    assert f"{span.context.trace_id:032x}" == TRACE_ID  # W3C traceparent honoured
    assert f"{span.parent.span_id:016x}" == PARENT_ID
    assert span.name == "chat " + got["chunks"][0]["model"]
    usage = got["chunks"][-1]["usage"]
    attributes = span.attributes
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == got["chunks"][0]["model"]
    assert attributes["gen_ai.response.id"] == got["chunks"][0]["id"]  # the id the client got
    assert attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"] == 5
    assert attributes["gen_ai.response.finish_reasons"] == ("length",)
    assert attributes["gen_ai.request.max_tokens"] == 5
    assert attributes["gen_ai.request.temperature"] == 0
    assert attributes["http.response.status_code"] == 200
    assert span.status.status_code != StatusCode.ERROR
    servers = [s for s in spans if s.kind == SpanKind.SERVER]
    assert len(servers) == 2  # the chat and the refusal; GET /v1/models is not traced


def test_its_events_say_where_the_time_went_in_order(traced):
    spans, got = traced
    span = _server_span(spans, "trace-me")
    names = [e.name for e in span.events]
    assert names[:2] == ["queued", "scheduled"] and names[-2:] == ["first_token", "finish"]
    chunks = [e for e in span.events if e.name == "prefill_chunk"]
    prompt_tokens = got["chunks"][-1]["usage"]["prompt_tokens"]
    assert prompt_tokens > BUDGET  # so the prompt is chunked
    sizes = [e.attributes["tgserve.prompt.tokens"] for e in chunks]
    assert sum(sizes) == prompt_tokens and max(sizes) <= BUDGET and len(sizes) >= 2
    starts = [e.attributes["tgserve.prompt.start"] for e in chunks]
    assert starts == [sum(sizes[:i]) for i in range(len(sizes))]  # they tile the prompt
    times = [e.timestamp for e in span.events]
    assert times == sorted(times) and span.start_time <= times[0] <= times[-1] <= span.end_time


def test_queue_prefill_and_decode_child_spans_follow_each_other(traced):
    spans, _ = traced
    parent = _server_span(spans, "trace-me")
    children = {s.name: s for s in spans if s.parent and s.parent.span_id == parent.context.span_id}
    assert set(children) == {"queue", "prefill", "decode"}
    queue, prefill, decode = children["queue"], children["prefill"], children["decode"]
    assert queue.end_time == prefill.start_time and prefill.end_time == decode.start_time
    events = {e.name: e.timestamp for e in parent.events}
    assert (queue.start_time, decode.start_time) == (events["queued"], events["first_token"])


def test_a_refused_request_has_an_error_span_with_the_clients_id(traced):
    spans, got = traced
    assert got["refused"].status_code == 400
    span = _server_span(spans, "refused-1")
    assert span.name.startswith("text_completion")
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["error.type"] == "400"
    assert span.attributes["http.response.status_code"] == 400
    assert "gen_ai.usage.output_tokens" not in span.attributes
    assert not span.events  # it never reached the engine


def test_without_an_endpoint_nothing_is_traced():
    with LiveServer(FakeEngine) as live:
        assert not any(m.cls is TracingMiddleware for m in live.app.user_middleware)


def test_spans_reach_an_otlp_receiver_over_http():
    """--otlp-traces-endpoint end to end: an in-process OTLP/HTTP receiver decodes what the
    exporter sends (protobuf ExportTraceServiceRequest) and finds the request's span."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    received: list[ExportTraceServiceRequest] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(ExportTraceServiceRequest.FromString(body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{receiver.server_address[1]}/v1/traces"
    try:
        with LiveServer(FakeEngine, otlp_traces_endpoint=endpoint) as live:
            body = {"prompt": "hi", "max_tokens": 3}
            answer = httpx.post(
                live.url + "/v1/completions", json=body, headers={"X-Request-Id": "w"}
            )
    finally:
        receiver.shutdown()
    spans = [
        span
        for request in received
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    (span,) = [s for s in spans if s.kind == s.SPAN_KIND_SERVER]
    attributes = {a.key: a.value for a in span.attributes}
    assert attributes["tgserve.request_id"].string_value == "w"
    assert attributes["gen_ai.response.id"].string_value == answer.json()["id"]
    assert attributes["gen_ai.usage.output_tokens"].int_value == 3
    service = {
        a.key: a.value.string_value for a in received[0].resource_spans[0].resource.attributes
    }
    assert service["service.name"] == "tgserve"


def test_without_the_otel_extra_the_flag_says_what_to_install(monkeypatch):
    import sys

    from server.tracing import tracer_provider

    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if not installed
    with pytest.raises(ValueError, match=r"pip install 'tgserve\[otel\]'"):
        tracer_provider("http://127.0.0.1:4318/v1/traces")
    assert tracer_provider(None) is None  # off: nothing imported, nothing needed
    with pytest.raises(ValueError, match="http"):
        tracer_provider("collector:4317")  # a gRPC-style address: this exporter speaks HTTP
