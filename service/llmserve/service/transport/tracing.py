"""gRPC's side of tracing (the shared part is the root's tracing.py): `TracingInterceptor`,
the outermost interceptor, opens a SERVER span for every LLMService call, the child of the
W3C `traceparent` / `tracestate` in the request metadata, and hands it to `begin_call`
(its turns and embedding batches become its children; its log lines carry its trace id).
Installed only when tracing is on (`--otlp-traces-endpoint`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import structlog
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..tracing import CallTrace, Tracing, begin_call, end_embed_batches, note_embed, trace_turn
from .errors import call_status
from .handler_kinds import observed

__all__ = ["Tracing", "TracingInterceptor", "note_embed", "trace_turn"]  # the first and last two: the root's

_TRACED_PREFIX = "/llmserve.v1.LLMService/"  # health and reflection calls are not traced
_W3C = TraceContextTextMapPropagator()
# gRPC codes that make a server span an error (OpenTelemetry's RPC conventions).
_SERVER_ERRORS = {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}


class TracingInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, tracing: Tracing) -> None:
        self._tracing = tracing

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        tracer = self._tracing.tracer
        if handler is None or tracer is None or not details.method.startswith(_TRACED_PREFIX):
            return handler
        return _traced_handler(handler, tracer, details)


def _traced_handler(handler: grpc.RpcMethodHandler, tracer: trace.Tracer, details: grpc.HandlerCallDetails) -> Any:
    carrier = {key: value for key, value in details.invocation_metadata or () if isinstance(value, str)}
    parent = _W3C.extract(carrier)
    method = details.method.rsplit("/", 1)[-1]

    def begin() -> CallTrace:
        attributes = {"rpc.system": "grpc", "rpc.service": "llmserve.v1.LLMService", "rpc.method": method}
        return begin_call(tracer, tracer.start_span(details.method[1:], parent, SpanKind.SERVER, attributes))

    return observed(handler, begin, _end)


def _end(rpc: CallTrace, context: grpc.aio.ServicerContext, error: BaseException | None) -> None:
    span = rpc.span
    end_embed_batches(rpc)
    status = call_status(context, error)
    span.set_attribute("rpc.grpc.status_code", getattr(grpc.StatusCode, status).value[0])
    request_id = structlog.contextvars.get_contextvars().get("request_id")
    if request_id:
        span.set_attribute("llmserve.request_id", request_id)
    if status in _SERVER_ERRORS:
        span.set_status(Status(StatusCode.ERROR, status))
    span.end()
