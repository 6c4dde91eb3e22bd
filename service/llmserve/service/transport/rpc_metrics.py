"""Per-RPC Prometheus series under the names go-grpc-prometheus made standard.

`grpc_server_started_total`, `grpc_server_handled_total{grpc_code}` and
`grpc_server_handling_seconds`, labelled by `grpc_type` (unary, server_stream,
client_stream, bidi_stream), `grpc_service` and `grpc_method`. The interceptor runs
first, so calls that a later interceptor refuses (a wrong API key) are counted too,
as are the health and reflection services.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from ..metrics import Metrics

_TYPES = {
    (False, False): ("unary", "unary_unary", grpc.unary_unary_rpc_method_handler),
    (False, True): ("server_stream", "unary_stream", grpc.unary_stream_rpc_method_handler),
    (True, False): ("client_stream", "stream_unary", grpc.stream_unary_rpc_method_handler),
    (True, True): ("bidi_stream", "stream_stream", grpc.stream_stream_rpc_method_handler),
}


def _code(context: grpc.aio.ServicerContext, error: BaseException | None) -> str:
    if isinstance(error, asyncio.CancelledError):
        remaining = context.time_remaining()
        return "DEADLINE_EXCEEDED" if remaining is not None and remaining <= 0 else "CANCELLED"
    code = context.code()
    if code is None or code == 0:
        return "OK" if error is None or isinstance(error, GeneratorExit) else "UNKNOWN"
    return code.name if isinstance(code, grpc.StatusCode) else grpc.StatusCode(code).name  # type: ignore[call-arg]


class RpcMetricsInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        service, _, method = details.method.lstrip("/").rpartition("/")
        kind, attribute, make = _TYPES[(handler.request_streaming, handler.response_streaming)]
        labels = (kind, service, method)
        behavior = getattr(handler, attribute)
        wrapped = self._wrap_stream(behavior, labels) if inspect.isasyncgenfunction(behavior) else self._wrap(behavior, labels)
        return make(wrapped, request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer)

    def _finish(self, labels: tuple[str, str, str], context: grpc.aio.ServicerContext,
                started: float, error: BaseException | None) -> None:
        self.metrics.rpc_handled.labels(*labels, _code(context, error)).inc()
        self.metrics.rpc_seconds.labels(*labels).observe(time.perf_counter() - started)

    def _wrap(self, behavior: Callable[..., Awaitable[Any]], labels: tuple[str, str, str]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(behavior)
        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            self.metrics.rpc_started.labels(*labels).inc()
            started, error = time.perf_counter(), None
            try:
                return await behavior(request, context)
            except BaseException as exc:
                error = exc
                raise
            finally:
                self._finish(labels, context, started, error)

        return call

    def _wrap_stream(self, behavior: Callable[..., AsyncIterator[Any]], labels: tuple[str, str, str]) -> Callable[..., AsyncIterator[Any]]:
        @functools.wraps(behavior)
        async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            self.metrics.rpc_started.labels(*labels).inc()
            started, error = time.perf_counter(), None
            try:
                async for response in behavior(request, context):
                    yield response
            except BaseException as exc:
                error = exc
                raise
            finally:
                self._finish(labels, context, started, error)

        return call
