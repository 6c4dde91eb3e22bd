"""An OTLP/gRPC trace collector in the test process (opentelemetry-proto's TraceService):
it keeps every span the server exports to it (`--otlp-traces-endpoint`). The spans are
parsed into `Span`s; `TRACEPARENT` is the W3C context the tests send."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    start: int
    end: int
    attributes: dict[str, Any]
    resource: dict[str, Any]


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    return getattr(v, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every span exported to it."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.num_exports = 0
        self._lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method's name
        with self._lock:
            self.num_exports += 1
            for resource_spans in request.resource_spans:
                resource = _attributes(resource_spans.resource.attributes)
                for scope in resource_spans.scope_spans:
                    self.spans.extend(
                        Span(s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.kind,
                             s.start_time_unix_nano, s.end_time_unix_nano, _attributes(s.attributes), resource)
                        for s in scope.spans
                    )
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait_for(self, names: set[str], timeout: float = 20.0) -> list[Span]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                mine = [s for s in self.spans if s.trace_id == TRACE_ID]
            if names <= {s.name for s in mine}:
                return mine
            time.sleep(0.1)
        raise AssertionError(f"spans {names} not exported; got {[s.name for s in mine]}")


def start_collector() -> tuple[Collector, grpc.Server, int]:
    collector = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return collector, server, port
