"""HTTP requests and their latency by route template, method and status code (Prometheus).

Contract: `HttpMetrics(registry)` creates the two families once per app; the middleware
`HttpMetricsMiddleware(app, metrics, routes)` is pure ASGI (it never buffers a stream), added outermost, so every answer is counted: the guard's 401 / 413 / 429 / 503, CORS
preflights and the routes' own. It exports `tgserve_http_requests_total{method,route,status}`
and `tgserve_http_request_duration_seconds{method,route,status}`, timed from the request's
arrival to its last body byte (a stream's whole length). `route` is the path template of the
route that answered (Starlette's `scope["route"]`; the route of a 405 too); for an answer given
before routing (the guard's), the template of the first of `routes` the path matches; else
`unmatched`: a label value per URL a client invents would grow the registry without bound. A request whose app raised
before answering is counted as status 500.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.metrics.request_timer import LATENCY_BUCKETS

UNMATCHED = "unmatched"
_LABELS = ("method", "route", "status")


class HttpMetrics:
    """The families: responses counted and timed by (method, route template, status)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "tgserve_http_requests",
            "HTTP responses by method, route template and status code.",
            _LABELS,
            registry=registry,
        )
        self.duration = Histogram(
            "tgserve_http_request_duration_seconds",
            "HTTP request arrival to the response's last byte, by method, route and status.",
            _LABELS,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )


class HttpMetricsMiddleware:
    """Records every HTTP response of `app` into `metrics`; `routes`: the app's routes, to name
    the route of an answer given before routing."""

    def __init__(self, app: ASGIApp, metrics: HttpMetrics, routes: list[BaseRoute]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.monotonic()
        status = 500  # the app raised before it answered

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            route = scope.get("route")  # set by the router when it dispatched
            template = getattr(route, "path", None) or route_template(self.routes, scope)
            labels = (scope["method"], template, str(status))
            self.metrics.requests.labels(*labels).inc()
            self.metrics.duration.labels(*labels).observe(time.monotonic() - start)


def route_template(routes: list[BaseRoute], scope: Scope) -> str:
    """The path template of the first route matching the path (by method first), or UNMATCHED."""
    partial = None
    for route in routes:
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return getattr(route, "path", UNMATCHED)
        if match == Match.PARTIAL and partial is None:  # the path matches, the method does not
            partial = getattr(route, "path", UNMATCHED)
    return partial or UNMATCHED
