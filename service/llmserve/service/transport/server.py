"""The grpc.aio server: LLMService plus the standard health and reflection services.

Health: `""` (liveness) is SERVING from the start until the process ends or its
executor dies; `llmserve.v1.LLMService` (readiness) is SERVING only while the model is
loaded, the server is not draining and the executor steps.

Start-up: listen at once (ready: NOT_SERVING), load the model off the event
loop, then ready. An address it cannot listen on ends it at once: one line naming the
address and --host/--port, exit 1.

Shutdown on SIGTERM/SIGINT: not ready; for `--drain-delay` seconds (the lame duck) new
calls are still served, so that load balancers take the replica out of rotation
before it refuses anything; then new calls get UNAVAILABLE trailers-only (no response
headers first, so Envoy's and the SDKs' retry policies send them elsewhere), in-flight
turns get `--shutdown-grace` seconds to finish, the rest end UNAVAILABLE, the executor
is joined, the model freed, exit 0. Whatever is stuck, the process is gone
`STOP_MARGIN_S` after the delay and the grace period (exit 1).

Supervision: if the executor thread dies, or does not move for `--watchdog-timeout`
seconds while work waits, health turns NOT_SERVING and the process exits 70 at
once, so that an orchestrator restarts it: never a silent hang.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog
from grpc_health.v1 import health, health_pb2

from ..config import ServerConfig
from ..engine.engine import Engine
from ..load_report import LoadReporter
from ..metrics import Metrics
from .grpc_server import SERVICE_NAME, ListenError, build_server, check_bindable
from .servicer import LLMServicer
from .tracing import Tracing

log = structlog.get_logger("llmserve.server")

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
STOP_MARGIN_S = 5.0
READY_STALL_S = 10.0  # no step this long with work waiting: not ready (at most half the watchdog's time)
EXIT_EXECUTOR_FAILED = 70  # EX_SOFTWARE


class Surface(Protocol):
    """Another wing on this loop and engine (OpenAI HTTP, from cli.py), listening, draining and stopping with gRPC.
    `start`: OSError (one line) if it cannot listen; `engine()` None while loading; `ready()` readiness; `metrics`;
    `load` the replica's load reports (it counts the surface's calls and sends the report with each reply)."""
    async def start(self, engine: Callable[[], Engine | None], ready: Callable[[], bool], metrics: Metrics,
                    load: LoadReporter) -> None: ...
    def begin_drain(self) -> None: ...
    async def wait_idle(self, timeout: float) -> bool: ...
    async def stop(self) -> None: ...


def _exit_now(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


async def _watch(
    engine: Engine, config: ServerConfig, health_servicer: health.aio.HealthServicer, draining: asyncio.Event
) -> None:
    """Readiness off while the executor makes no progress with work waiting; exit the
    process when it is dead or stuck (see the module docstring)."""
    ready = True
    ready_stall_s = _ready_stall_s(config)
    while True:
        await asyncio.sleep(0.25)
        stalled = engine.stalled_for()
        stuck = stalled is not None and stalled > ready_stall_s
        if stuck == ready and not draining.is_set():  # readiness follows the executor's progress
            ready = not stuck
            await _set_health(health_servicer, _SERVING if ready else _NOT_SERVING, (SERVICE_NAME,))
            log.warning("executor_stalled", seconds=stalled) if stuck else log.info("executor_stepping")
        if stalled is None or (config.watchdog_timeout_s and stalled > config.watchdog_timeout_s):
            await _set_health(health_servicer, _NOT_SERVING)
            reason = "the executor thread died" if stalled is None else f"no executor step for {stalled:.1f} s"
            log.critical("executor_failed", reason=reason, exit_code=EXIT_EXECUTOR_FAILED)
            _exit_now(EXIT_EXECUTOR_FAILED)


def _ready_stall_s(config: ServerConfig) -> float:
    return min(READY_STALL_S, config.watchdog_timeout_s / 2) if config.watchdog_timeout_s else READY_STALL_S


def _hard_deadline(seconds: float) -> None:
    """Once shutdown starts: whatever blocks (a stuck step, a native call), exit by then."""

    def expire() -> None:
        log.error("shutdown_deadline_passed", seconds=seconds, detail="exiting without a clean stop")
        _exit_now(1)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


async def _set_health(servicer: health.aio.HealthServicer, status: int, names: tuple[str, ...] = ("", SERVICE_NAME)) -> None:
    """`""` is liveness (the process and its executor live), SERVICE_NAME readiness (the
    model is loaded, the server is not draining, and the executor steps)."""
    for name in names:
        await servicer.set(name, status)


async def _load_engine(config: ServerConfig, metrics: Metrics) -> Engine:
    """The model, loaded off the event loop. Test only: `LLMSERVE_INJECT_FAULT=slow_load:<s>`
    waits that long first, so that a loading server can be watched on any machine."""
    kind, _, value = os.environ.get("LLMSERVE_INJECT_FAULT", "").partition(":")
    if kind == "slow_load":
        await asyncio.sleep(float(value))
    return await asyncio.to_thread(Engine, config, metrics)


async def serve(config: ServerConfig, surfaces: Sequence[Surface] = ()) -> None:
    metrics = Metrics()
    llm = LLMServicer(metrics, config.max_queue, config.max_input_tokens)
    health_servicer = health.aio.HealthServicer()
    tracing = Tracing(config.otlp_traces_endpoint) if config.otlp_traces_endpoint else None
    try:
        if config.metrics_port is not None:
            check_bindable(config.metrics_host, config.metrics_port, "--metrics-host/--metrics-port")
        reporter = LoadReporter(lambda: llm.engine, metrics)
        server = build_server(config, llm, health_servicer, tracing, reporter)
    except ListenError as exc:
        raise SystemExit(f"llmserve: {exc}") from None
    await _set_health(health_servicer, _SERVING, ("",))  # alive while the model loads
    await _set_health(health_servicer, _NOT_SERVING, (SERVICE_NAME,))
    await server.start()
    draining = asyncio.Event()
    ready = lambda: (llm.engine is not None and not draining.is_set()  # noqa: E731 - as _watch reports it
                     and (llm.engine.stalled_for() or 0.0) <= _ready_stall_s(config))
    for surface in surfaces:
        try:
            await surface.start(lambda: llm.engine, ready, metrics, reporter)
        except OSError as exc:
            await server.stop(0)
            raise SystemExit(f"llmserve: {exc}") from None
    if config.metrics_port is not None:
        try:
            metrics.serve(config.metrics_host, config.metrics_port)
        except OSError as exc:  # taken since the check above (or by --port itself)
            await server.stop(0)
            raise SystemExit(f"llmserve: cannot listen on {config.metrics_host}:{config.metrics_port} "
                             f"({exc.strerror or exc}): choose another address with --metrics-host/--metrics-port") from None
    log.info(
        "listening",
        host=config.host,
        port=config.port,
        tls=config.tls_cert is not None,
        mtls=config.tls_client_ca is not None,
        api_key=config.api_key is not None,
        metrics_port=config.metrics_port,
        tracing=config.otlp_traces_endpoint or "off",
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    load = asyncio.create_task(_load_engine(config, metrics))
    await asyncio.wait([load, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    try:
        engine = await load  # a signal during loading still waits for the load to free it
    except RuntimeError as exc:  # llama.cpp could not load a model or create a context
        log.error("model_load_failed", error=str(exc))
        await server.stop(0)
        raise SystemExit(f"llmserve: {exc}") from None
    engine.start()
    metrics.describe_model(engine.meta, config.n_ctx, config.n_parallel, engine.version)
    watchdog = asyncio.create_task(_watch(engine, config, health_servicer, draining))
    if tracing is not None:
        tracing.start(engine.meta, engine.embedding_model)
    if not stop.is_set():
        llm.engine = engine
        await _set_health(health_servicer, _SERVING, (SERVICE_NAME,))
        log.info("serving", model=engine.meta.name)
        await stop.wait()

    lame_duck_s = config.drain_delay_s if llm.engine is not None else 0.0  # it never served: nothing to hand over
    _hard_deadline(lame_duck_s + config.shutdown_grace_s + STOP_MARGIN_S)
    log.info("draining", grace_s=config.shutdown_grace_s, drain_delay_s=lame_duck_s)
    draining.set()
    await _set_health(health_servicer, _NOT_SERVING, (SERVICE_NAME,))  # not ready; still alive
    if lame_duck_s > 0:
        # Still serving: a balancer routes here until its health check sees NOT_SERVING (Envoy:
        # up to one `interval`), and a replica refusing calls at once draws them (LEAST_REQUEST
        # prefers the host with the fewest active requests), which can exhaust Envoy's retries.
        await asyncio.sleep(lame_duck_s)
        log.info("refusing_new_calls")
    llm.begin_drain()
    for surface in surfaces:
        surface.begin_drain()
    grace = config.shutdown_grace_s
    finished = all(await asyncio.gather(llm.wait_idle(grace), *(s.wait_idle(grace) for s in surfaces)))
    if not finished:
        log.warning("grace_period_over", detail="ending the remaining calls with UNAVAILABLE")
    watchdog.cancel()  # the executor is about to stop on purpose
    await asyncio.to_thread(engine.stop)  # open sessions end UNAVAILABLE
    await llm.wait_idle(5.0)
    await server.stop(1.0)
    await asyncio.gather(*(surface.stop() for surface in surfaces))
    await asyncio.to_thread(engine.close)
    if tracing is not None:
        await asyncio.to_thread(tracing.shutdown)  # exports the spans still batched
    log.info("stopped")
