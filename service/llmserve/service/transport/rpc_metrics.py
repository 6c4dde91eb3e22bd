"""Per-RPC Prometheus series under the names go-grpc-prometheus made standard.

`grpc_server_started_total`, `grpc_server_handled_total{grpc_code}` and
`grpc_server_handling_seconds`, labelled by `grpc_type` (unary, server_stream,
client_stream, bidi_stream), `grpc_service` and `grpc_method`. The interceptor runs
first, so calls that a later interceptor refuses (a wrong API key) are counted too,
as are the health and reflection services.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import grpc

from ..metrics import Metrics
from .errors import call_status
from .handler_kinds import kind_label, observed


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
        labels = (kind_label(handler), service, method)

        def begin() -> float:
            self.metrics.rpc_started.labels(*labels).inc()
            return time.perf_counter()

        def end(started: float, context: grpc.aio.ServicerContext, error: BaseException | None) -> None:
            self.metrics.rpc_handled.labels(*labels, call_status(context, error)).inc()
            self.metrics.rpc_seconds.labels(*labels).observe(time.perf_counter() - started)

        return observed(handler, begin, end)
