"""Transport security: server TLS / mTLS credentials and the API-key check.

The API key is read from `authorization: Bearer <key>` metadata on every RPC but
the health service (a load balancer probes it without credentials), compared in
constant time; anything else is UNAUTHENTICATED.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from .errors import Unauthenticated
from .handler_kinds import with_behavior

HEALTH_PREFIX = "/grpc.health.v1.Health/"
ORCA_PREFIX = "/xds.service.orca.v3.OpenRcaService/"  # load reports, read by load balancers as health checks are


def server_credentials(cert: Path, key: Path, client_ca: Path | None) -> grpc.ServerCredentials:
    """TLS with the server's certificate; with `client_ca`, clients must present a cert it signed."""
    return grpc.ssl_server_credentials(
        [(key.read_bytes(), cert.read_bytes())],
        root_certificates=client_ca.read_bytes() if client_ca else None,
        require_client_auth=client_ca is not None,
    )


def _denying_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    async def deny(request: Any, context: grpc.aio.ServicerContext) -> None:
        error = Unauthenticated("missing or invalid API key (authorization: Bearer <key>)")
        await context.abort_with_status(error.to_status())

    return with_behavior(handler, deny)


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, api_key: str) -> None:
        self._expected = f"Bearer {api_key}".encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith((HEALTH_PREFIX, ORCA_PREFIX)):
            return handler
        presented = ""
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                presented = value if isinstance(value, str) else value.decode("latin-1")
        if hmac.compare_digest(presented.encode(), self._expected):
            return handler
        return _denying_handler(handler)
