"""The gRPC surface: LLMService plus the standard health and reflection services, one
of the surfaces the process (process.py) runs.

Health: `""` (liveness) is SERVING from the start until the process ends or its
executor dies; `llmserve.v1.LLMService` (readiness) is SERVING only while the model is
loaded, the server is not draining and the executor steps. The process decides both
(`set_health`); this surface says them in grpc.health.v1.

Listening: the port is bound when the surface is built (`ListenError`: one line naming
the address and --host/--port), and served from `start`. Draining (the shared
`OpenCalls`): new calls get UNAVAILABLE trailers-only (no response headers first, so
Envoy's and the SDKs' retry policies send them elsewhere), and each open session ends
UNAVAILABLE once its open turn is done.
"""

from __future__ import annotations

from collections.abc import Callable

from grpc_health.v1 import health, health_pb2

from ..config import ServerConfig
from ..engine.engine import Engine
from ..load_report import LoadReporter
from ..metrics import Metrics
from ..open_calls import OpenCalls
from ..served_models import ServedModels
from ..tracing import Tracing
from .grpc_server import SERVICE_NAME, build_server
from .servicer import LLMServicer

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class GrpcSurface:
    def __init__(self, config: ServerConfig, metrics: Metrics, calls: OpenCalls, load: LoadReporter,
                 tracing: Tracing | None, models: ServedModels) -> None:
        """Binds --host/--port (ListenError if it cannot)."""
        self.servicer = LLMServicer(metrics, calls, config.max_queue, models)
        self._health = health.aio.HealthServicer()
        self._server = build_server(config, self.servicer, self._health, tracing, load)

    async def start(self, engine: Callable[[], Engine | None], ready: Callable[[], bool]) -> None:
        """Serve; `engine()` is None while the model loads (readiness comes from `set_health`)."""
        self.servicer.engine = engine
        await self._server.start()

    async def set_health(self, alive: bool | None = None, ready: bool | None = None) -> None:
        """`""` is liveness (the process and its executor live), SERVICE_NAME readiness (the
        model is loaded, the server is not draining, and the executor steps); None: as it was."""
        for name, serving in (("", alive), (SERVICE_NAME, ready)):
            if serving is not None:
                await self._health.set(name, _SERVING if serving else _NOT_SERVING)

    async def stop(self, now: bool = False) -> None:
        """Calls still open get 1 s (none with `now`), then end CANCELLED."""
        await self._server.stop(0 if now else 1.0)
