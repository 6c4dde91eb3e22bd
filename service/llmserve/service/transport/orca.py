"""ORCA load reports (Open Request Cost Aggregation, gRPC A51/A58 and Envoy's
`client_side_weighted_round_robin`): how loaded this replica is, for the load balancers
that weight replicas by it.

* Out of band: `xds.service.orca.v3.OpenRcaService/StreamCoreMetrics` streams a report
  every `report_interval` the client asks for, kept within [MIN_INTERVAL_S,
  MAX_INTERVAL_S] (DEFAULT_INTERVAL_S when it asks for none). Envoy opens one such
  stream per replica.
* Per call: every LLMService call that ends normally carries the report as of its end
  in the `endpoint-load-metrics-bin` trailer (gRPC clients' weighted_round_robin reads
  it when they do not ask for out-of-band reports).

A report carries `application_utilization` (domain/load.py defines it; averaged over the
last UTILIZATION_WINDOW_S, or the current value when higher, so a jump shows at once;
at least MIN_UTILIZATION while calls come), `rps_fractional` (LLMService calls started
per second over the last RATE_WINDOW_S) and
`named_metrics`, as they are now: kv_cache_usage, running_sessions, waiting_sessions,
prefill_tokens_waiting, slot_wait_s. While the model loads there is no load to report: the reports
are empty, which weighted round robin reads as "no weight yet" (health checks keep the
replica out of rotation meanwhile).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport
from xds.service.orca.v3 import orca_pb2, orca_pb2_grpc

from ..engine.engine import Engine
from ..metrics import Metrics
from .handler_kinds import observed

TRAILER = "endpoint-load-metrics-bin"
SERVICE_NAME = orca_pb2.DESCRIPTOR.services_by_name["OpenRcaService"].full_name
MIN_INTERVAL_S = 0.5
MAX_INTERVAL_S = 60.0
DEFAULT_INTERVAL_S = 1.0
UTILIZATION_WINDOW_S = 5.0
# Longer: a replica whose callers all waited elsewhere for a few seconds still reports a
# call rate (0 reads as "no weight"; measured: the busy one then got 5 of 24 new calls).
RATE_WINDOW_S = 30.0
SAMPLE_S = 0.1
MIN_UTILIZATION = 0.001  # a tenth of one session on a default replica (4 slots + 64 waiting)


class Window:
    """Values added over the last `window_s` seconds, in 1-second buckets."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self.t_start = clock()
        self.buckets: deque[list[float]] = deque()  # [second, sum, count]

    def add(self, value: float = 1.0) -> None:
        second = int(self.clock())
        if self.buckets and self.buckets[-1][0] == second:
            self.buckets[-1][1] += value
            self.buckets[-1][2] += 1
        else:
            self.buckets.append([second, value, 1])
        self._expire(second)

    def per_second(self) -> float:
        """The sum per second (a young window: over its life so far)."""
        now = self.clock()
        self._expire(int(now))
        return sum(b[1] for b in self.buckets) / min(self.window_s, max(now - self.t_start, 1.0))

    def mean(self) -> float:
        self._expire(int(self.clock()))
        count = sum(b[2] for b in self.buckets)
        return sum(b[1] for b in self.buckets) / count if count else 0.0

    def _expire(self, second: int) -> None:
        while self.buckets and self.buckets[0][0] <= second - self.window_s:
            self.buckets.popleft()


class LoadReporter:
    """Builds ORCA reports from the engine's load; `engine()` is None while loading.

    Weighted round robin weights a replica by rps / utilization: calls served per
    slot-second (Little's law), the replica's capacity, which falls as its calls queue
    or slow down. An instantaneous utilization would read 0 between short calls (no
    weight at all), so it is sampled every SAMPLE_S and averaged."""

    def __init__(self, engine: Callable[[], Engine | None], metrics: Metrics) -> None:
        """On the server's event loop: samples from now on (into Prometheus too)."""
        self.engine = engine
        self.metrics = metrics
        self.rate = Window(RATE_WINDOW_S)
        self.utilization = Window(UTILIZATION_WINDOW_S)
        self._sampler = asyncio.get_running_loop().create_task(self._sample())

    def call_started(self) -> None:
        self.rate.add()

    def report(self) -> OrcaLoadReport:
        engine = self.engine()
        if engine is None:
            return OrcaLoadReport()
        load, rps = engine.load, self.rate.per_second()
        utilization = max(self.utilization.mean(), load.utilization)
        return OrcaLoadReport(
            # Never 0 while calls come: weighted round robin reads 0 as "no weight" and gives
            # the mean weight, so a replica whose calls all ended between samples would get
            # no more calls than a saturated one (measured: 4-5 of 24 went to the busy one).
            application_utilization=max(utilization, MIN_UTILIZATION) if rps > 0 else utilization,
            rps_fractional=rps,
            named_metrics={
                "kv_cache_usage": load.kv_cache_usage,
                "running_sessions": float(load.running_sessions),
                "waiting_sessions": float(load.waiting_sessions),
                "prefill_tokens_waiting": float(load.prefill_tokens_waiting),
                "slot_wait_s": load.slot_wait_s,
            },
        )

    async def _sample(self) -> None:
        while True:
            engine = self.engine()
            if engine is not None:
                load = engine.load
                self.utilization.add(load.utilization)
                self.metrics.utilization.set(load.utilization)
                self.metrics.slot_wait.set(load.slot_wait_s)
            await asyncio.sleep(SAMPLE_S)


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
