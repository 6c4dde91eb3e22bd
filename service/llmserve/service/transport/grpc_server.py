"""Building the grpc.aio server: its interceptors, services and listening address.

Interceptors, outermost first: tracing, RPC metrics (so calls the API key refuses are
traced and counted too), the API key, then ORCA load reports (only on calls it let
through). Services: LLMService, health, ORCA's OpenRcaService, reflection.
"""

from __future__ import annotations

import socket

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from llmserve.v1 import llmserve_pb2

from ..config import ServerConfig
from . import orca
from .reflection import enable_reflection
from .registration import add_servicer
from .rpc_metrics import RpcMetricsInterceptor
from .security import ApiKeyInterceptor, server_credentials
from .servicer import LLMServicer
from .tracing import Tracing, TracingInterceptor

SERVICE_NAME = llmserve_pb2.DESCRIPTOR.services_by_name["LLMService"].full_name
HEALTH_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name

def connection_options(config: ServerConfig) -> list[tuple[str, int]]:
    """Keepalive (both ways) and connection age: dead peers are found, and long-lived
    channels get a GOAWAY now and then so client-side round_robin and Envoy rebalance."""
    ms = lambda seconds: int(seconds * 1000)  # noqa: E731
    options = [
        ("grpc.keepalive_time_ms", ms(config.keepalive_time_s)),
        ("grpc.keepalive_timeout_ms", ms(config.keepalive_timeout_s)),
        ("grpc.http2.min_ping_interval_without_data_ms", ms(config.keepalive_min_time_s)),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", ms(config.keepalive_min_time_s)),
        ("grpc.keepalive_permit_without_calls", int(config.keepalive_permit_without_calls)),
        ("grpc.http2.max_ping_strikes", 2),
    ]
    if config.max_connection_age_s > 0:
        options += [
            ("grpc.max_connection_age_ms", ms(config.max_connection_age_s)),
            ("grpc.max_connection_age_grace_ms", ms(config.max_connection_age_grace_s)),
        ]
    return options


def build_server(
    config: ServerConfig, llm: LLMServicer, health_servicer: health.aio.HealthServicer, tracing: Tracing | None,
    reporter: orca.LoadReporter,
) -> grpc.aio.Server:
    interceptors: list[grpc.aio.ServerInterceptor] = [TracingInterceptor(tracing)] if tracing else []
    interceptors.append(RpcMetricsInterceptor(llm.metrics))
    if config.api_key:
        interceptors.append(ApiKeyInterceptor(config.api_key))
    interceptors.append(orca.OrcaTrailerInterceptor(reporter, SERVICE_NAME))
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", config.max_message_bytes),
            *connection_options(config),
        ],
    )
    add_servicer(llm, server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    orca.add_orca(reporter, server)
    enable_reflection((SERVICE_NAME, HEALTH_NAME, orca.SERVICE_NAME), server)
    address = f"{config.host}:{config.port}"
    check_bindable(config.host, config.port, "--host/--port")  # before grpc logs its own error lines
    try:
        if config.tls_cert and config.tls_key:
            creds = server_credentials(config.tls_cert, config.tls_key, config.tls_client_ca)
            bound = server.add_secure_port(address, creds)
        else:
            bound = server.add_insecure_port(address)
    except RuntimeError:  # grpc: "Failed to bind to address ..."
        bound = 0
    if bound == 0:
        raise ListenError(f"cannot listen on {address}: choose another address with --host/--port")
    return server


class ListenError(Exception):
    """An address the server cannot listen on: said in one line, no traceback."""


def check_bindable(host: str, port: int, flags: str) -> None:
    """Bind `host:port` as gRPC will (every address the name resolves to, SO_REUSEADDR; one
    that binds is enough), so that a port in use is named with the OS's reason."""
    try:
        addresses = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise ListenError(f"cannot listen on {host}:{port}: {exc}: choose another address with {flags}") from None
    reasons = []
    for family, kind, proto, _, sockaddr in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
                return
            except OSError as exc:
                reasons.append(exc.strerror or str(exc))
    raise ListenError(f"cannot listen on {host}:{port} ({reasons[0] if reasons else 'no address'}): "
                      f"choose another address with {flags}")
