"""The grpc.aio server: LLMService plus the standard health and reflection services.

Start-up: listen at once with health NOT_SERVING, load the model off the event
loop, then SERVING. Shutdown (SIGTERM/SIGINT): NOT_SERVING, stop taking calls,
let in-flight calls finish within the grace period, join the executor, free the
model.
"""

from __future__ import annotations

import asyncio
import signal

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from llmserve.v1 import llmserve_pb2, llmserve_pb2_grpc

from .config import ServerConfig
from .engine import Engine
from .servicer import LLMServicer

log = structlog.get_logger("llmserve.server")

SERVICE_NAME = llmserve_pb2.DESCRIPTOR.services_by_name["LLMService"].full_name
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _set_health(servicer: health.aio.HealthServicer, status: int) -> None:
    for name in ("", SERVICE_NAME):
        await servicer.set(name, status)


async def serve(config: ServerConfig) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    llm = LLMServicer()
    llmserve_pb2_grpc.add_LLMServiceServicer_to_server(llm, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
    address = f"{config.host}:{config.port}"
    if server.add_insecure_port(address) == 0:
        raise RuntimeError(f"cannot listen on {address}")
    await _set_health(health_servicer, _NOT_SERVING)
    await server.start()
    log.info("listening", address=address)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    engine = await asyncio.to_thread(Engine, config)
    engine.start()
    llm.engine = engine
    await _set_health(health_servicer, _SERVING)
    log.info("serving", address=address, model=engine.meta.name)

    await stop.wait()
    log.info("draining", grace_s=config.shutdown_grace_s)
    await _set_health(health_servicer, _NOT_SERVING)
    await server.stop(config.shutdown_grace_s)
    await asyncio.to_thread(engine.stop)
    log.info("stopped")
