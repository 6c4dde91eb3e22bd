"""ORCA load reports over gRPC (Open Request Cost Aggregation, gRPC A51/A58 and Envoy's
`client_side_weighted_round_robin`): how loaded this replica is, for the load balancers
that weight replicas by it. What a report holds: load_report.py.

* Out of band: `xds.service.orca.v3.OpenRcaService/StreamCoreMetrics` streams a report
  every `report_interval` the client asks for, kept within [MIN_INTERVAL_S,
  MAX_INTERVAL_S] (DEFAULT_INTERVAL_S when it asks for none). Envoy opens one such
  stream per replica.
* Per call: every LLMService call that ends normally carries the report as of its end
  in the `endpoint-load-metrics-bin` trailer (gRPC clients' weighted_round_robin reads
  it when they do not ask for out-of-band reports).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport
from xds.service.orca.v3 import orca_pb2, orca_pb2_grpc

from ..load_report import TRAILER, LoadReporter
from .handler_kinds import observed

__all__ = ["TRAILER", "LoadReporter", "OrcaService", "OrcaTrailerInterceptor", "add_orca"]

SERVICE_NAME = orca_pb2.DESCRIPTOR.services_by_name["OpenRcaService"].full_name
MIN_INTERVAL_S = 0.5
MAX_INTERVAL_S = 60.0
DEFAULT_INTERVAL_S = 1.0
def report_interval_s(request: orca_pb2.OrcaLoadReportRequest) -> float:
    asked = request.report_interval.ToTimedelta().total_seconds() if request.HasField("report_interval") else 0.0
    if asked <= 0:
        return DEFAULT_INTERVAL_S
    return min(max(asked, MIN_INTERVAL_S), MAX_INTERVAL_S)


class OrcaService(orca_pb2_grpc.OpenRcaServiceServicer):
    """Out-of-band reports until the client goes away (or the server stops)."""

    def __init__(self, reporter: LoadReporter) -> None:
        self.reporter = reporter

    async def StreamCoreMetrics(  # noqa: N802 - the proto's method name
        self, request: orca_pb2.OrcaLoadReportRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[OrcaLoadReport]:
        interval_s = report_interval_s(request)
        while True:
            yield self.reporter.report()
            await asyncio.sleep(interval_s)


class OrcaTrailerInterceptor(grpc.aio.ServerInterceptor):
    """Counts the calls to `service` and ends each with a load report in its trailers."""

    def __init__(self, reporter: LoadReporter, service: str) -> None:
        self.reporter = reporter
        self.prefix = f"/{service}/"

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(self.prefix):
            return handler

        def end(_: None, context: grpc.aio.ServicerContext, error: BaseException | None) -> None:
            trailers = tuple(context.trailing_metadata() or ())
            report = self.reporter.report().SerializeToString()
            context.set_trailing_metadata((*trailers, (TRAILER, report)))

        return observed(handler, self.reporter.call_started, end)


def add_orca(reporter: LoadReporter, server: grpc.aio.Server) -> None:
    orca_pb2_grpc.add_OpenRcaServiceServicer_to_server(OrcaService(reporter), server)
