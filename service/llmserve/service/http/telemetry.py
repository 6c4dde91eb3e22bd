"""Every HTTP request counted, timed and (with `--otlp-traces-endpoint`) traced, by one
aiohttp middleware, the outermost: requests that the API key refuses, and 503s while the
model loads, count too.

Metrics: `llmserve_http_requests_total{route, method, status}` and
`llmserve_http_request_duration_seconds{route}` (to a stream's last byte). `route` is
the route template (`/v1/chat/completions`); any other path is `other`, and a method
outside HTTP's common ones is `other`, so a scanner cannot grow the series. A handler
cancelled because its client went away counts as status 499 (nginx's "client closed
request").

Tracing: a SERVER span `POST /v1/chat/completions` per `/v1/*` request (health probes
are not traced, as on gRPC), the child of the W3C `traceparent` / `tracestate` headers,
with OpenTelemetry's HTTP attributes; the root's `begin_call` makes the turns' spans
(`generate.turn` and its queue, prefill and decode) its children and binds its trace id
into the log lines. Off, no tracer exists and nothing is imported past the API.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .. import __version__
from ..metrics import Metrics
from ..tracing import SERVICE_NAME, CallTrace, begin_call
from .errors import ApiError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
TIMEOUT_HEADER = "x-request-timeout"  # seconds: the request's turns end by then, as at a gRPC deadline
CLIENT_GONE = 499
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"})
_TRACED_PREFIX = "/v1/"
_W3C = TraceContextTextMapPropagator()
_STARTED = "llmserve_started"  # the request's key: time.monotonic() when it arrived


class Telemetry:
    def __init__(self, metrics: Metrics, traced: bool) -> None:
        self.metrics = metrics
        self.routes: frozenset[str] = frozenset()  # set once the app's routes exist
        # A proxy until Tracing.start sets the provider (once the model is loaded).
        self._tracer = trace.get_tracer(SERVICE_NAME, __version__) if traced else None

    def know_routes(self, app: web.Application) -> None:
        self.routes = frozenset(resource.canonical for resource in app.router.resources())

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        request[_STARTED] = time.monotonic()
        started = time.perf_counter()
        route = request.path if request.path in self.routes else "other"
        traced = self._tracer is not None and route.startswith(_TRACED_PREFIX)
        call = self._begin(request, route) if traced else None
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        except asyncio.CancelledError:
            status = CLIENT_GONE
            raise
        finally:
            method = request.method if request.method in METHODS else "other"
            self.metrics.http_requests.labels(route, method, str(status)).inc()
            self.metrics.http_seconds.labels(route).observe(time.perf_counter() - started)
            if call is not None:
                _end(call, request, status)

    def _begin(self, request: web.Request, route: str) -> CallTrace:
        assert self._tracer is not None
        attributes = {"http.request.method": request.method, "http.route": route, "url.path": request.path,
                      "url.scheme": request.scheme}
        if agent := request.headers.get("User-Agent"):
            attributes["user_agent.original"] = agent
        parent = _W3C.extract(request.headers)
        span = self._tracer.start_span(f"{request.method} {route}", parent, SpanKind.SERVER, attributes)
        return begin_call(self._tracer, span)


def _end(call: CallTrace, request: web.Request, status: int) -> None:
    span = call.span
    span.set_attribute("http.response.status_code", status)
    if "request_id" in request:
        span.set_attribute("llmserve.request_id", request["request_id"])
    if status >= 500:  # a server span's error (OpenTelemetry's HTTP conventions): 4xx are the client's
        span.set_status(Status(StatusCode.ERROR, str(status)))
    span.end()


def request_deadline(request: web.Request) -> float | None:
    """time.monotonic() by which the request's turns must end: its arrival plus the
    `x-request-timeout` header's seconds (None without one). 400 naming the header when
    it is not a positive number."""
    value = request.headers.get(TIMEOUT_HEADER)
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise ApiError(400, f"{TIMEOUT_HEADER} must be a positive number of seconds, got {value!r}",
                       param=TIMEOUT_HEADER)
    return request.get(_STARTED, time.monotonic()) + seconds
