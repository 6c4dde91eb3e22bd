"""The server process: start-up, signals, supervision, metrics, tracing and the drain,
for the surfaces it runs on one event loop and one engine: gRPC (transport/server.py)
and, with --http-port, OpenAI's HTTP API (http/surface.py). cli.py calls `serve`.

Start-up: every surface listens at once (gRPC first; readiness NOT_SERVING), then the
model loads off the event loop, then readiness turns SERVING. An address a surface
cannot listen on ends it at once: one line naming the address and its flags, exit 1.

Shutdown on SIGTERM/SIGINT: not ready; for `--drain-delay` seconds (the lame duck) new
calls are still served, so that load balancers take the replica out of rotation before it
refuses anything; then every surface refuses new calls (the shared `OpenCalls`), in-flight
turns get `--shutdown-grace` seconds to finish, the rest end (gRPC UNAVAILABLE, HTTP
503), the executor is joined, the model freed, exit 0. Whatever is stuck, the process is
gone `STOP_MARGIN_S` after the delay and the grace period (exit 1).

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
from collections.abc import Callable
from typing import NoReturn, Protocol

import structlog

from .config import ServerConfig
from .engine.engine import Engine
from .faults import injected_target
from .http.surface import HttpSurface
from .load_report import LoadReporter
from .metrics import Metrics
from .open_calls import OpenCalls
from .served_models import ServedModels
from .tracing import Tracing
from .transport.grpc_server import ListenError, check_bindable
from .transport.server import GrpcSurface

log = structlog.get_logger("llmserve.server")

STOP_MARGIN_S = 5.0
READY_STALL_S = 10.0  # no step this long with work waiting: not ready (at most half the watchdog's time)
EXIT_EXECUTOR_FAILED = 70  # EX_SOFTWARE


class Surface(Protocol):
    """A wing serving the engine on this loop, built (and, for gRPC, bound) by `Process`.
    `start`: serve (OSError, one line, if it cannot listen); `engine()` is None until the
    model serves, `ready()` the readiness. `set_health`: liveness and readiness as they
    change (None: as it was). `stop`: close; `now` gives open calls no grace."""

    async def start(self, engine: Callable[[], Engine | None], ready: Callable[[], bool]) -> None: ...
    async def set_health(self, alive: bool | None = None, ready: bool | None = None) -> None: ...
    async def stop(self, now: bool = False) -> None: ...


def _exit_now(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _hard_deadline(seconds: float) -> None:
    """Once shutdown starts: whatever blocks (a stuck step, a native call), exit by then."""

    def expire() -> None:
        log.error("shutdown_deadline_passed", seconds=seconds, detail="exiting without a clean stop")
        _exit_now(1)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


def _ready_stall_s(config: ServerConfig) -> float:
    return min(READY_STALL_S, config.watchdog_timeout_s / 2) if config.watchdog_timeout_s else READY_STALL_S


def _worst_stall(engines: list[Engine]) -> float | None:
    """The longest any executor has gone without progress with work waiting; None when one
    is dead."""
    stalls = [engine.stalled_for() for engine in engines]
    return None if None in stalls else max(s for s in stalls if s is not None)


async def _load_engine(config: ServerConfig, metrics: Metrics) -> Engine:
    """The model, loaded off the event loop. Test only: `LLMSERVE_INJECT_FAULT=slow_load:<s>`
    waits that long first, so that a loading server can be watched on any machine."""
    if (seconds := injected_target("slow_load")) is not None:
        await asyncio.sleep(float(seconds))
    return await asyncio.to_thread(Engine, config, metrics)


class Process:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.calls = OpenCalls()  # every surface's, for the drain
        self.engine: Engine | None = None  # the default model's, set once it serves
        self.models = ServedModels(config, self.metrics)  # the further models' (--model NAME=PATH)
        self.stopping = False  # shutdown began: not ready
        self.tracing = Tracing(config.otlp_traces_endpoint) if config.otlp_traces_endpoint else None
        self.load = LoadReporter(lambda: self.engine, self.metrics, self.models.others)
        self.surfaces: list[Surface] = []

    def ready(self) -> bool:
        """Serving, not shutting down, and the executor steps (as `_watch` reports it)."""
        engine = self.engine
        return (engine is not None and not self.stopping
                and (_worst_stall([engine, *self.models.others()]) or 0.0) <= _ready_stall_s(self.config))

    async def run(self) -> None:
        await self._listen()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        load = asyncio.create_task(_load_engine(self.config, self.metrics))
        await asyncio.wait([load, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
        try:
            engine = await load  # a signal during loading still waits for the load to free it
            if not stop.is_set():
                await self.models.start(engine)  # without --models-max: every further model loads now
        except RuntimeError as exc:  # llama.cpp could not load a model or create a context
            log.error("model_load_failed", error=str(exc))
            await self._fail(str(exc))
        engine.start()
        self.metrics.describe_model(engine.meta, self.config.n_ctx, self.config.n_parallel, engine.version)
        watchdog = asyncio.create_task(self._watch(lambda: [engine, *self.models.others()]))
        if self.tracing is not None:
            self.tracing.start(engine.meta, engine.embedding_model)
        if not stop.is_set():
            self.engine = engine
            await self._set_health(ready=True)
            log.info("serving", model=engine.meta.name)
            await stop.wait()
        await self._drain(engine, watchdog)

    async def _listen(self) -> None:
        """Every surface listening (gRPC first, then HTTP, then metrics), or SystemExit naming
        the address that cannot be listened on."""
        config = self.config
        try:
            if config.metrics_port is not None:
                check_bindable(config.metrics_host, config.metrics_port, "--metrics-host/--metrics-port")
            self.surfaces.append(GrpcSurface(config, self.metrics, self.calls, self.load, self.tracing, self.models))
        except ListenError as exc:
            raise SystemExit(f"llmserve: {exc}") from None
        if config.http_port is not None:
            self.surfaces.append(HttpSurface(config, self.metrics, self.calls, self.load, self.models))
        await self._set_health(alive=True, ready=False)  # alive while the model loads
        for i, surface in enumerate(self.surfaces):
            try:
                await surface.start(lambda: self.engine, self.ready)
            except OSError as exc:
                del self.surfaces[i:]  # it cleaned up after itself
                await self._fail(str(exc))
        if config.metrics_port is not None:
            try:
                self.metrics.serve(config.metrics_host, config.metrics_port)
            except OSError as exc:  # taken since the check above (or by --port itself)
                await self._fail(f"cannot listen on {config.metrics_host}:{config.metrics_port} "
                                 f"({exc.strerror or exc}): choose another address with --metrics-host/--metrics-port")
        log.info("listening", host=config.host, port=config.port, tls=config.tls_cert is not None,
                 mtls=config.tls_client_ca is not None, api_key=config.api_key is not None,
                 metrics_port=config.metrics_port, tracing=config.otlp_traces_endpoint or "off")

    async def _fail(self, reason: str) -> NoReturn:
        """Stop listening and exit 1 with `reason`, before anything was served."""
        for surface in self.surfaces:
            await surface.stop(now=True)
        raise SystemExit(f"llmserve: {reason}") from None

    async def _set_health(self, alive: bool | None = None, ready: bool | None = None) -> None:
        for surface in self.surfaces:
            await surface.set_health(alive, ready)

    async def _watch(self, engines: Callable[[], list[Engine]]) -> None:
        """Readiness off while an executor makes no progress with work waiting; exit the
        process when one is dead or stuck (see the module docstring)."""
        config, ready = self.config, True
        ready_stall_s = _ready_stall_s(config)
        while True:
            await asyncio.sleep(0.25)
            stalled = _worst_stall(engines())
            stuck = stalled is not None and stalled > ready_stall_s
            if stuck == ready and not self.stopping:  # readiness follows the executor's progress
                ready = not stuck
                await self._set_health(ready=ready)
                log.warning("executor_stalled", seconds=stalled) if stuck else log.info("executor_stepping")
            if stalled is None or (config.watchdog_timeout_s and stalled > config.watchdog_timeout_s):
                await self._set_health(alive=False, ready=False)
                reason = "the executor thread died" if stalled is None else f"no executor step for {stalled:.1f} s"
                log.critical("executor_failed", reason=reason, exit_code=EXIT_EXECUTOR_FAILED)
                _exit_now(EXIT_EXECUTOR_FAILED)

    async def _drain(self, engine: Engine, watchdog: asyncio.Task[None]) -> None:
        """The lame duck, the grace period, then everything stopped (the module docstring)."""
        config = self.config
        lame_duck_s = config.drain_delay_s if self.engine is not None else 0.0  # it never served: nothing to hand over
        _hard_deadline(lame_duck_s + config.shutdown_grace_s + STOP_MARGIN_S)
        log.info("draining", grace_s=config.shutdown_grace_s, drain_delay_s=lame_duck_s)
        self.stopping = True
        await self._set_health(ready=False)  # not ready; still alive
        if lame_duck_s > 0:
            # Still serving: a balancer routes here until its health check sees NOT_SERVING (Envoy:
            # up to one `interval`), and a replica refusing calls at once draws them (LEAST_REQUEST
            # prefers the host with the fewest active requests), which can exhaust Envoy's retries.
            await asyncio.sleep(lame_duck_s)
            log.info("refusing_new_calls")
        self.calls.begin_drain()
        if not await self.calls.wait_idle(config.shutdown_grace_s):
            log.warning("grace_period_over", detail="ending the remaining calls with UNAVAILABLE")
        watchdog.cancel()  # the executors are about to stop on purpose
        await asyncio.to_thread(engine.stop)  # open sessions fail (gRPC UNAVAILABLE, HTTP 503)
        await self.models.stop()
        await self.calls.wait_idle(5.0)
        for surface in self.surfaces:
            await surface.stop()
        await self.models.close()
        await asyncio.to_thread(engine.close)
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)  # exports the spans still batched
        log.info("stopped")


async def serve(config: ServerConfig) -> None:
    """Run the server until a signal has drained it (or start-up failed: SystemExit)."""
    await Process(config).run()
